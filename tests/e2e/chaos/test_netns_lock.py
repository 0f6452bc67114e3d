"""One chaos run at a time owns the `gch-` namespaces: a second run, the netem test or the manual cleanup started
while a run is going stop with a clear message instead of removing that run's namespaces under it (a second run
used to take a 10-minute run down: `Cannot open network namespace "gch-coordinator-1"`). Root, as the suite."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.chaos.netns import Busy, Network, cleanup, our_namespaces, require_capabilities

REPO = Path(__file__).resolve().parents[3]

# A stand-in for a run in progress, in its own process: it brings up one namespace and keeps it.
HOLDER = """
import sys, time
from tests.e2e.chaos.netns import Network
net = Network(subnet="10.79.0")
net.up()
net.add("lock-a")
print("UP", flush=True)
sys.stdin.read()  # until the test closes our stdin
net.down()
"""


def test_a_second_run_leaves_a_running_ones_namespaces_alone() -> None:
    assert require_capabilities() is not None
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "UP"
        with pytest.raises(Busy, match=f"pid {holder.pid}"):
            cleanup()
        with pytest.raises(Busy):
            Network(subnet="10.80.0").up()
        second = subprocess.run([sys.executable, "-m", "tests.e2e.chaos.run", "--duration", "5", "--out",
                                 "/tmp/gregor-chaos-lock-test"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert second.returncode == 4 and "another chaos run" in second.stderr, (second.returncode, second.stderr[-2000:])
        manual = subprocess.run([sys.executable, "-m", "tests.e2e.chaos.netns"], cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert manual.returncode != 0 and "not removed" in manual.stderr, manual
        assert "gch-lock-a" in our_namespaces()  # untouched by all three
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert our_namespaces() == []


def test_a_killed_runs_leftovers_are_still_removed() -> None:
    """The kernel drops a killed holder's lock: its namespaces are leftovers again, and cleanup removes them."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "UP"
    holder.kill()
    holder.wait(timeout=30)
    deadline = time.monotonic() + 10
    while True:
        try:
            removed = cleanup()
            break
        except Busy:
            assert time.monotonic() < deadline, "the killed holder's lock was never dropped"
            time.sleep(0.1)
    assert "gch-lock-a" in removed and our_namespaces() == []
