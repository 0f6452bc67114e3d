"""The user-space netem (netem_user.py) that the network-degrade fault uses on kernels without sch_netem:
its per-packet model, and the program between two real network namespaces, observed by a receiver that
counts what netem would cause (loss, duplicates, reordering, delay)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.chaos.netem_user import MARK, NetemModel
from tests.e2e.chaos.netns import Network, netns_exec, ns_name, require_capabilities

REPO = Path(__file__).resolve().parents[3]


def test_the_model_draws_each_fault_at_its_rate() -> None:
    m = NetemModel(delay_ms=80, jitter_ms=40, loss=0.05, duplicate=0.05, reorder=0.2, seed=3)
    ds = [m.decide() for _ in range(20000)]
    lost = sum(d.drop for d in ds) / len(ds)
    kept = [d for d in ds if not d.drop]
    dup = sum(d.duplicate for d in kept) / len(kept)
    at_once = sum(d.delay_s == 0 for d in kept) / len(kept)
    assert 0.04 < lost < 0.06 and 0.04 < dup < 0.06 and 0.18 < at_once < 0.22
    delayed = [d.delay_s for d in kept if d.delay_s > 0]
    assert 0.040 <= min(delayed) < 0.045 and 0.115 < max(delayed) <= 0.120
    again = NetemModel(delay_ms=80, jitter_ms=40, loss=0.05, duplicate=0.05, reorder=0.2, seed=3)
    assert [again.decide() for _ in range(20000)] == ds  # seeded: the same packets meet the same fate


@pytest.mark.parametrize("kw", [{"loss": 1.5}, {"duplicate": -0.1}, {"jitter_ms": 90}])
def test_the_model_refuses_bad_parameters(kw: dict[str, float]) -> None:
    args = {"delay_ms": 80, "jitter_ms": 40, "loss": 0.0, "duplicate": 0.0, "reorder": 0.0, **kw}
    with pytest.raises(ValueError):
        NetemModel(**args)  # type: ignore[arg-type]


RECEIVER = """
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 7799)); s.settimeout(3)
print("READY", flush=True)
seen, late = [], []
while True:
    try:
        data = s.recv(64)
    except socket.timeout:
        break
    n, sent = data.decode().split()
    seen.append(int(n)); late.append(time.time() - float(sent))
print(json.dumps({"seen": seen, "late": late}), flush=True)
"""

SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for n in range(2000):
    s.sendto(f"{n} {time.time()}".encode(), (sys.argv[1], 7799)); time.sleep(0.001)
"""


def test_between_two_namespaces_packets_are_delayed_lost_duplicated_and_reordered() -> None:
    assert require_capabilities() is not None  # root, ip, iptables, and netem or NFQUEUE (+ the binding)
    net = Network(subnet="10.78.0")
    try:
        net.up()
        a, b = net.add("nt-a"), net.add("nt-b")
        recv = subprocess.Popen(["ip", "netns", "exec", ns_name("nt-b"), sys.executable, "-c", RECEIVER],
                                stdout=subprocess.PIPE, text=True)
        assert recv.stdout is not None and recv.stdout.readline().strip() == "READY"
        netem = subprocess.Popen(["ip", "netns", "exec", ns_name("nt-a"), sys.executable, "-m",
                                  "tests.e2e.chaos.netem_user", "--queue", "7", "--seed", "5"],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert netem.stdout is not None and "NETEM READY" in netem.stdout.readline()
        net.queue_egress("nt-a", 7, MARK)
        netns_exec("nt-a", sys.executable, "-c", SENDER, b.ip)
        got = json.loads(recv.communicate(timeout=60)[0].strip().splitlines()[-1])
        net.heal_filters("nt-a")
        netem.terminate()
        counts = json.loads(netem.communicate(timeout=30)[0].strip().splitlines()[-1])
    finally:
        net.down()
    seen, late = got["seen"], sorted(got["late"])
    distinct = set(seen)
    assert counts["packets"] == 2000 and counts["lost"] > 0 and counts["duplicated"] > 0
    assert 2000 - len(distinct) == counts["lost"]                 # what netem dropped never arrived
    assert len(seen) - len(distinct) == counts["duplicated"]      # each duplicate arrived once more
    inversions = sum(1 for x, y in zip(seen, seen[1:]) if y < x)
    assert inversions > 100                                       # reordered (20 % overtake, plus jitter)
    assert late[len(late) // 2] > 0.030                           # most packets waited ~40-120 ms
    assert late[len(late) // 10] < 0.020                          # the ones sent at once did not
