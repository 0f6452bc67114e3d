"""A real Prometheus for a local cluster: its config, file-based service discovery and the process.

`gregor cluster up --prometheus` starts it; every time cluster.json is saved, the targets file
is rewritten (file_sd), so processes added later are scraped within the refresh interval. It
loads deploy/prometheus/gregor-rules.yaml, the same rules the Helm chart ships.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterable

SCRAPE_INTERVAL_S = 5  # local default; tests pass 1 s to see data sooner
FILE_SD_REFRESH_S = 5  # how often Prometheus re-reads targets.json besides its inotify watch
READY_TIMEOUT_S = 30.0  # a cold Prometheus opens its TSDB and loads rules well within this
RULES_ENV = "GREGOR_PROMETHEUS_RULES"


def prometheus_binary(name: str = "prometheus") -> str:
    """prometheus/promtool from the virtualenv (`make prometheus` builds them there) or PATH."""
    for candidate in (os.path.join(os.path.dirname(sys.executable), name), shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    from gregor.cli.local_cluster import ClusterError

    raise ClusterError(f"{name} not found: run `make prometheus` (builds Prometheus into .venv/bin)")


def rules_file() -> str:
    """deploy/prometheus/gregor-rules.yaml of this checkout (or $GREGOR_PROMETHEUS_RULES)."""
    override = os.environ.get(RULES_ENV)
    if override:
        return os.path.abspath(override)
    path = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "gregor-rules.yaml"
    if not path.exists():
        from gregor.cli.local_cluster import ClusterError

        raise ClusterError(f"rules file not found at {path}; set {RULES_ENV}")
    return str(path)


def prometheus_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "prometheus")


def targets(processes: Iterable[Any], cluster: str) -> list[dict[str, Any]]:
    """file_sd target groups: one per process (role and id as labels), Prometheus itself excluded."""
    out = []
    for p in processes:
        if p.role == "prometheus" or not p.metrics:
            continue
        address = p.metrics.split("://", 1)[-1].split("/", 1)[0]
        labels = {"cluster": cluster, "role": p.role, "id": str(p.id)}
        if p.metrics.startswith("https://"):  # a --tls cluster serves /metrics over HTTPS (tls_config below)
            labels["__scheme__"] = "https"
        out.append({"targets": [address], "labels": labels})
    return out


def write_targets(data_dir: str, processes: Iterable[Any], cluster: str = "gregor") -> str:
    """Atomically (re)write DIR/prometheus/targets.json; Prometheus picks the change up by itself."""
    path = os.path.join(prometheus_dir(data_dir), "targets.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(targets(processes, cluster), f, indent=2)
    os.replace(tmp, path)
    return path


def write_config(data_dir: str, scrape_interval_s: float, port: int, cluster: str,
                 tls: dict[str, str] | None = None) -> str:
    """prometheus.yml: file_sd over targets.json, Prometheus itself, and the shared rules file. tls (a --tls
    cluster): the `tls_config` HTTPS targets are scraped with: ca_file, and cert_file / key_file (the CLI's
    client certificate, for services with metrics.ssl.client.auth=required)."""
    # Prometheus resolves a relative file_sd path against its config file's folder, not our working
    # directory: a relative --data-dir would point it at DIR/prometheus/DIR/prometheus/targets.json.
    pdir = os.path.abspath(prometheus_dir(data_dir))
    config = {
        "global": {"scrape_interval": f"{scrape_interval_s:g}s", "evaluation_interval": f"{scrape_interval_s:g}s"},
        "rule_files": [rules_file()],
        "scrape_configs": [
            {"job_name": "gregor", "file_sd_configs": [{"files": [os.path.join(pdir, "targets.json")],
                                                        "refresh_interval": f"{FILE_SD_REFRESH_S}s"}],
             **({"tls_config": tls} if tls else {})},
            {"job_name": "prometheus", "static_configs": [
                {"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": cluster, "role": "prometheus", "id": "0"}}]},
        ],
    }
    path = os.path.join(pdir, "prometheus.yml")
    with open(path, "w") as f:  # JSON is YAML: no YAML library needed
        json.dump(config, f, indent=2)
    return path


def wait_ready(url: str, proc: Any, log_path: str) -> None:
    from gregor.cli.local_cluster import ClusterError

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = open(log_path, errors="replace").read()[-2000:]
            raise ClusterError(f"prometheus exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise ClusterError(f"prometheus not ready within {READY_TIMEOUT_S:.0f} s; see {log_path}")
