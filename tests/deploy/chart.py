"""Helpers of the chart tests: the real `helm` binary (built by `make chart-tools`) and its rendered YAML."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gregor"
CI_VALUES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
HELM = Path(os.environ.get("HELM", ROOT / ".tools" / "bin" / "helm"))
CHECKOV = Path(os.environ.get("CHECKOV", ROOT / ".venv-checkov" / "bin" / "checkov"))
RELEASE = "gregor"
NAMESPACE = "streaming"
HELM_TIMEOUT_S = 120  # one helm call; a cold helm on a loaded 2-core machine takes a few seconds


def min_kube_version() -> str:
    """The lowest Kubernetes version Chart.yaml's kubeVersion admits (what the schemas are checked against)."""
    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    m = re.match(r">=\s*(\d+\.\d+\.\d+)", constraint)
    if not m:
        raise AssertionError(f"kubeVersion {constraint!r} has no lower bound this test understands")
    return m.group(1)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm; it must exist (make chart-tools builds it), a missing binary is a failure, not a skip."""
    if not HELM.exists():
        raise AssertionError(f"{HELM} not found: run `make chart-tools` (builds helm from the Go module proxy)")
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=HELM_TIMEOUT_S)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def template_args(chart: Path = CHART, *values: str, sets: tuple[str, ...] = ()) -> list[str]:
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, "--kube-version", min_kube_version()]
    for v in values:
        args += ["-f", v]
    for s in sets:
        args += ["--set", s]
    return args


@functools.lru_cache(maxsize=None)
def render_text(ci_file: str | None = None, sets: tuple[str, ...] = ()) -> str:
    values = [str(CHART / "ci" / ci_file)] if ci_file else []
    return helm(*template_args(CHART, *values, sets=sets)).stdout


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(ci_file: str | None = None, *sets: str) -> list[dict[str, Any]]:
    """The manifests `helm template` renders for a ci/ values file (and --set overrides), parsed."""
    return docs(render_text(ci_file, tuple(sets)))


def find(manifests: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]


def one(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(manifests: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The long-running workloads (StatefulSets and Deployments)."""
    return (m for m in manifests if m["kind"] in ("StatefulSet", "Deployment"))


def component(m: dict[str, Any]) -> str:
    return str(m["metadata"]["labels"].get("app.kubernetes.io/component", ""))


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"] if "template" in workload["spec"] else workload["spec"]
    return list(spec["containers"])


def arg(container: dict[str, Any], flag: str) -> str:
    """The value of `--flag=value` in a container's args."""
    values = [a.split("=", 1)[1] for a in container.get("args", []) if a.startswith(flag + "=")]
    assert len(values) == 1, f"{container['name']}: expected one {flag}=..., got {values}"
    return values[0]


def name(suffix: str) -> str:
    return f"{RELEASE}-{suffix}"
