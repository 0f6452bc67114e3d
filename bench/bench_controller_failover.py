"""Controller failover at many partitions, the controller side alone (issue 24): SIGKILL the active
controller, time until the standby is registered in etcd and until it answers an admin write.

A real etcd and two real controller processes; the cluster metadata (P partitions at RF 3 on 3
brokers, every partition led by its preferred replica with a full ISR) is written into etcd
directly, and the three brokers are registrations only (their gRPC ports answer nothing, so the
new controller's LeaderAndIsr / UpdateMetadata sends fail and are retried in the background, which
is what a controller does against a broker that is slow to answer). What is measured is what the
controller itself spends: lease expiry, election, loading P partition states and deciding on them.
The new controller's own account of its failover (its log line "failover took ...") is printed too.

    python bench/bench_controller_failover.py --partitions 1000 10000 [--lease-ttl-ms N] [--rounds 3]
        [--standby-wait-s S]   # default 1 s; a warm standby needs a few to have loaded and decided

bench_partitions.py's "failover admin s" cell measures the same thing end to end against real
brokers through a Kafka client (Gregor side alone: --systems gregor).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gregor.cli.local_cluster import start_controller, start_etcd, stop_process  # noqa: E402
from gregor.common import uuid  # noqa: E402
from gregor.common.etcd import EtcdClient, Lease, Put  # noqa: E402
from gregor.common.etcd_layout import BrokerIdsZNode, PartitionState, PartitionStateZNode, TopicZNode  # noqa: E402
from gregor.controller import elector  # noqa: E402
from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc  # noqa: E402

BROKERS = (0, 1, 2)
RF = 3
PARTITIONS_PER_TOPIC = 1000
TXN_OPS = 100  # etcd's --max-txn-ops is 128


async def populate(etcd: EtcdClient, partitions: int) -> list[Lease]:
    """Three broker registrations (lease-bound) and `partitions` led, fully replicated partitions."""
    leases, epochs = [], {}
    for b in BROKERS:
        lease = await etcd.grant_lease(3600)
        leases.append(lease)
        key = BrokerIdsZNode.key(etcd, b)
        value = json.dumps({"host": "127.0.0.1", "grpc_port": 1, "data_port": 0}).encode()
        await etcd.put(key, value, lease.id)
        kv = await etcd.get(key)
        assert kv is not None
        epochs[b] = kv.create_revision
    ops: list[Put] = []
    for t in range((partitions + PARTITIONS_PER_TOPIC - 1) // PARTITIONS_PER_TOPIC):
        topic = f"t{t}"
        count = min(PARTITIONS_PER_TOPIC, partitions - t * PARTITIONS_PER_TOPIC)
        assignment = {p: [BROKERS[(p + i) % len(BROKERS)] for i in range(RF)] for p in range(count)}
        ops.append(Put(TopicZNode.key(etcd, topic), TopicZNode.encode(assignment, uuid.random_topic_id())))
        for p, replicas in assignment.items():
            state = PartitionState(replicas[0], 0, tuple(replicas), 1, 0, epochs[replicas[0]])
            ops.append(Put(PartitionStateZNode.key(etcd, topic, p), PartitionStateZNode.encode(state)))
    for i in range(0, len(ops), TXN_OPS):
        assert await etcd.txn([], ops[i:i + TXN_OPS])
    return leases


async def until(cond, timeout_s: float, what: str, interval_s: float = 0.02) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if await cond():
            return time.monotonic() - start
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


async def create_topic(grpc_address: str, name: str) -> bool:
    import grpc

    try:
        async with grpc.aio.insecure_channel(grpc_address) as ch:
            resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
                topics=[controller_pb2.CreatableTopic(name=name, num_partitions=1, replication_factor=1)]),
                timeout=5)
    except grpc.aio.AioRpcError:
        return False
    return resp.results[0].error.code == 0


def failover_line(log_path: str) -> str:
    with open(log_path, errors="replace") as f:
        lines = [line for line in f if "failover took" in line]
    found = re.search(r"failover took (.*)$", lines[-1]) if lines else None
    return found.group(1) if found else "?"


async def one_round(base: Path, partitions: int, lease_ttl_ms: int | None,
                    standby_wait_s: float = 1.0) -> dict[str, float | str]:
    etcd_proc = start_etcd(str(base))
    procs = [etcd_proc]
    try:
        async with EtcdClient(f"http://{etcd_proc.grpc}") as etcd:
            leases = await populate(etcd, partitions)
            first = start_controller(str(base), 1, etcd_proc.grpc, lease_ttl_ms=lease_ttl_ms)
            procs.append(first)
            await until(lambda: _registered(etcd, 1), 120, "controller 1 active")
            await until(lambda: _async(os.path.exists(first.log) and failover_line(first.log) != "?"), 300,
                        "controller 1 finished its failover")
            second = start_controller(str(base), 2, etcd_proc.grpc, lease_ttl_ms=lease_ttl_ms)
            procs.append(second)
            await asyncio.sleep(standby_wait_s)  # the standby is watching (and, warm, has loaded and decided)
            killed = time.monotonic()
            os.kill(first.pid, signal.SIGKILL)
            await until(lambda: _registered(etcd, 2), 120, "controller 2 registered")
            elected = time.monotonic() - killed
            n = 0

            async def admin() -> bool:
                nonlocal n
                n += 1
                return await create_topic(second.grpc, f"after-failover-{n}")

            await until(admin, 300, "CreateTopics answered by controller 2")
            answered = time.monotonic() - killed
            await asyncio.sleep(1.0)
            again = time.monotonic()
            steady = await until(admin, 300, "a second CreateTopics") if not await admin() else \
                time.monotonic() - again
            for lease in leases:
                await lease.revoke()
            return {"elected s": elected, "admin s": answered, "steady admin s": steady,
                    "failover": failover_line(second.log),
                    "first failover": failover_line(first.log)}
    finally:
        for p in reversed(procs):
            stop_process(p, signal.SIGKILL)


async def _registered(etcd: EtcdClient, controller_id: int) -> bool:
    return await elector.read_controller_id(etcd) == controller_id


async def _async(value: bool) -> bool:
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--lease-ttl-ms", type=int, help="the controllers' --lease-ttl-ms (default: theirs)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--standby-wait-s", type=float, default=1.0,
                    help="seconds between starting the standby and killing the active controller (a standby "
                         "that has run a while has its copy loaded and its failover decided)")
    ap.add_argument("--keep", help="run in this directory (kept, with the processes' logs) instead of a temporary one")
    args = ap.parse_args()
    for p in args.partitions:
        results = []
        for r in range(args.rounds):
            if args.keep:
                base = Path(args.keep) / f"p{p}-r{r}"
                base.mkdir(parents=True, exist_ok=True)
                res = asyncio.run(one_round(base, p, args.lease_ttl_ms, args.standby_wait_s))
            else:
                with tempfile.TemporaryDirectory(prefix="bench-ctl-failover-") as tmp:
                    res = asyncio.run(one_round(Path(tmp), p, args.lease_ttl_ms, args.standby_wait_s))
            results.append(res)
            print(f"{p:>6} partitions, round {r + 1}: elected {res['elected s']:.2f} s, admin write "
                  f"{res['admin s']:.2f} s after SIGKILL (a CreateTopics later: {res['steady admin s']:.3f} s); new controller's failover {res['failover']}; "
                  f"first controller's {res['first failover']} (load {os.getloadavg()[0]:.1f})", flush=True)
        if len(results) > 1:
            print(f"{p:>6} partitions: median elected {statistics.median(float(r['elected s']) for r in results):.2f}"
                  f" s, median admin {statistics.median(float(r['admin s']) for r in results):.2f} s", flush=True)


if __name__ == "__main__":
    main()
