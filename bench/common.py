"""Shared helpers for the benchmarks: CPU clocks, machine info, result files and
"ratio vs baseline" lines. Benchmarks compare against a baseline measured in the
same run and never gate on an absolute time (STYLE.md)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
MIB = 1 << 20
GIB = 1 << 30


# ---------------------------------------------------------------- clocks
def process_cpu_s() -> float:
    """User + system CPU of the whole process (every thread)."""
    return time.process_time()


def thread_cpu_s() -> float:
    """User + system CPU of the calling thread only (CLOCK_THREAD_CPUTIME_ID);
    kernel time of a sendfile(2) made by this thread counts here."""
    return time.thread_time()


def thread_rusage_s() -> tuple[float, float]:
    """(user, system) CPU seconds of the calling thread (Linux RUSAGE_THREAD)."""
    usage = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return usage.ru_utime, usage.ru_stime


@dataclass
class Measurement:
    """Wall and CPU time of one timed block."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@contextmanager
def measure(thread_only: bool = False) -> Iterator[Measurement]:
    """Times the block: wall clock plus process (or, with thread_only, thread) CPU."""
    clock = thread_cpu_s if thread_only else process_cpu_s
    m = Measurement()
    wall0, cpu0 = time.perf_counter(), clock()
    try:
        yield m
    finally:
        m.wall_s = time.perf_counter() - wall0
        m.cpu_s = clock() - cpu0


def median(values: list[float]) -> float:
    return statistics.median(values)


def mb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / MIB / seconds if seconds > 0 else float("inf")


# ---------------------------------------------------------------- machine info and results
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem_of(path: Path) -> str:
    """The mount (device, type) holding path, from /proc/mounts."""
    try:
        best = ("", "?", "?")
        target = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
                best = (mount, device, fstype)
        return f"{best[1]} ({best[2]}) on {best[0]}"
    except OSError:
        return "unknown"


def machine_info(data_dir: Optional[Path] = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }
    if data_dir is not None:
        info["data_dir"] = str(data_dir)
        info["filesystem"] = _filesystem_of(data_dir)
    try:
        import gregor_native

        info["gregor_native"] = getattr(gregor_native, "__version__", "installed")
    except ImportError:
        info["gregor_native"] = "missing"
    return info


def write_results(name: str, params: dict[str, Any], results: Any, data_dir: Optional[Path] = None) -> Path:
    """bench/results/<name>.json: parameters, results, machine info and a UTC timestamp."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    doc = {
        "benchmark": name,
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(data_dir),
        "params": params,
        "results": results,
    }
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


# ---------------------------------------------------------------- printing
def print_ratio(label: str, value: float, baseline: float, unit: str, *, target: Optional[float] = None,
                higher_is_better: bool = True) -> float:
    """Prints "label: V unit vs baseline B unit = ratio R" and returns R = value / baseline.
    With a target, says whether the ratio meets it (>= for higher_is_better, else <=)."""
    ratio = value / baseline if baseline else float("inf")
    line = f"{label}: {value:,.3f} {unit} vs baseline {baseline:,.3f} {unit} = ratio {ratio:.3f}"
    if target is not None:
        ok = ratio >= target if higher_is_better else ratio <= target
        line += f" (target {'>=' if higher_is_better else '<='} {target}: {'OK' if ok else 'MISSED'})"
    print(line, flush=True)
    return ratio


def print_row(label: str, **figures: float) -> None:
    print(f"  {label:<26}" + "  ".join(f"{k}={v:,.3f}" for k, v in figures.items()), flush=True)


def run_tool(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> list[str]:
    """Run a benchmark tool to completion and return its stdout lines; a non-zero exit raises with the
    tail of its output."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                          env=env, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return proc.stdout.splitlines()
