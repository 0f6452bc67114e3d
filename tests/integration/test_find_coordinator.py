"""Group discovery as in Kafka: a client with only bootstrap.servers (brokers) finds its group coordinator.

Real processes: etcd, a controller, a broker, two group coordinators. The broker answers
BrokerService.FindCoordinator from the coordinators' lease-bound registrations in etcd
(broker/coordinator_lookup.py); after the owning coordinator is SIGKILLed the answer moves
to the survivor within the lease TTL; with no coordinator left, and on a standalone
broker, the answer is a typed, retriable COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest

from gregor.client import AdminClient, Consumer, NewTopic, Producer
from gregor.client.group_admin import GroupAdmin
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from tests.helpers.cluster import LocalCluster, broker_process, stop_process, tear_down

LEASE_TTL_MS = 2000
SERVICES = os.path.join(os.path.dirname(__file__), "..", "..", "services")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("findcoord")), brokers=1, controllers=1, coordinators=2,
                        lease_ttl_ms=LEASE_TTL_MS,
                        coordinator_overrides={"group.initial.rebalance.delay.ms": "0",
                                               "offsets.topic.replication.factor": "1",
                                               "offsets.topic.num.partitions": "4"})
    try:
        yield c
    finally:
        tear_down(c)


async def broker_find(address: str, group_id: str, key_type: int = 0) -> coordinator_pb2.FindCoordinatorResponse:
    async with channel(address) as ch:
        try:
            return await broker_pb2_grpc.BrokerServiceStub(ch).FindCoordinator(
                coordinator_pb2.FindCoordinatorRequest(group_id=group_id, key_type=key_type), timeout=10)
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None


async def broker_find_until(address: str, group_id: str, ok: object, timeout_s: float = 30.0) -> object:
    """Ask until ok(answer-or-error) holds; returns that answer (or error)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = await broker_find(address, group_id)
        except errors.GregorError as err:
            last = err
        if ok(last):  # type: ignore[operator]
            return last
        await _sleep(0.05)
    raise AssertionError(f"FindCoordinator({group_id}) on {address} never satisfied the check; last: {last}")


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


def cli_env(tmp: str) -> dict[str, str]:
    """No cluster.json, no coordinator list: the CLI has nothing but --bootstrap."""
    e = {**os.environ, "PYTHONPATH": os.path.abspath(SERVICES), "GREGOR_DATA_DIR": tmp}
    for k in ("GREGOR_BOOTSTRAP", "GREGOR_COORDINATORS"):
        e.pop(k, None)
    return e


async def test_broker_answers_like_the_coordinators(cluster: LocalCluster) -> None:
    broker = cluster.by_role("broker")[0].grpc
    coords = {p.grpc for p in cluster.by_role("coordinator")}
    for gid in ("g-a", "g-b", "g-c", "g-d", "other"):
        # Right after start-up ownership may still be moving (the second instance takes its share):
        # wait until the broker's answer and the coordinators' own (from their claims) agree.
        deadline = time.monotonic() + 30
        own: object = None
        while True:
            resp = await broker_find_until(broker, gid, lambda r: not isinstance(r, errors.GregorError))
            assert isinstance(resp, coordinator_pb2.FindCoordinatorResponse)
            assert f"{resp.host}:{resp.port}" in coords and 0 <= resp.partition < 4
            async with channel(sorted(coords)[0]) as ch:
                try:
                    own = await coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch).FindCoordinator(
                        coordinator_pb2.FindCoordinatorRequest(group_id=gid), timeout=10)
                    agree = (own.coordinator_id, own.host, own.port, own.partition) == \
                        (resp.coordinator_id, resp.host, resp.port, resp.partition)
                except grpc.RpcError:
                    agree = False
            if agree:
                break
            assert time.monotonic() < deadline, f"broker and coordinators disagree on {gid}: {resp} vs {own}"
            await _sleep(0.1)


async def test_bad_requests_are_typed(cluster: LocalCluster) -> None:
    broker = cluster.by_role("broker")[0].grpc
    with pytest.raises(errors.GregorError) as e:
        await broker_find(broker, "")
    assert e.value.code == errors.Code.INVALID_GROUP_ID
    with pytest.raises(errors.GregorError) as e:
        await broker_find(broker, "g", key_type=2)  # 0 GROUP and 1 TRANSACTION are Kafka's only key types
    assert e.value.code == errors.Code.INVALID_REQUEST
    with pytest.raises(errors.GregorError) as e:
        await broker_find(broker, "", key_type=1)
    assert e.value.code == errors.Code.INVALID_REQUEST


async def test_consumer_with_only_bootstrap_servers_joins_and_commits(cluster: LocalCluster, tmp_path: str) -> None:
    broker = cluster.by_role("broker")[0].grpc
    async with AdminClient({"bootstrap.servers": broker}) as admin:
        await admin.create_topics([NewTopic("fc", 2, 1)])
    async with Producer({"bootstrap.servers": broker, "linger.ms": 0}) as p:
        for i in range(10):
            await (await p.send("fc", f"v{i}".encode(), partition=i % 2))
    cfg = {"bootstrap.servers": broker, "group.id": "fc-g", "auto.offset.reset": "earliest",
           "enable.auto.commit": False, "heartbeat.interval.ms": 300, "session.timeout.ms": 10000,
           "fetch.max.wait.ms": 100}
    seen: list[str] = []
    async with Consumer(cfg) as c:
        c.subscribe(["fc"])
        deadline = time.monotonic() + 60
        while len(seen) < 10 and time.monotonic() < deadline:
            seen += [r.value.decode() for r in await c.poll(200) if r.value]
        assert sorted(seen) == sorted(f"v{i}" for i in range(10))
        await c.commit_sync()
        assert c._group is not None and c._group.coordinator in {p.grpc for p in cluster.by_role("coordinator")}
        async with GroupAdmin({"bootstrap.servers": broker}) as admin:
            assert await admin.committed_offsets("fc-g") == {("fc", 0): 5, ("fc", 1): 5}
            desc = await admin.describe_group("fc-g")
            assert desc.state == "Stable" and len(desc.members) == 1
            assert "fc-g" in [g.group_id for g in await admin.list_groups()]
    # The CLI with nothing but --bootstrap (no cluster.json, no GREGOR_COORDINATORS).
    base = [sys.executable, "-m", "gregor.cli.main", "--bootstrap", broker, "-o", "json"]
    out = subprocess.run(base + ["groups", "list"], capture_output=True, text=True, timeout=60,
                         env=cli_env(str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert "fc-g" in [g["group"] for g in json.loads(out.stdout)]
    out = subprocess.run(base + ["groups", "describe", "fc-g"], capture_output=True, text=True, timeout=60,
                         env=cli_env(str(tmp_path)))
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["partitions"]
    assert {(r["topic"], r["partition"], r["current_offset"]) for r in rows} == {("fc", 0, 5), ("fc", 1, 5)}
    out = subprocess.run(base + ["consume", "fc", "--group", "fc-cli", "--from-beginning", "--max-messages", "10",
                                 "--timeout-ms", "30000"], capture_output=True, text=True, timeout=90,
                         env=cli_env(str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert len([line for line in out.stdout.splitlines() if line.strip()]) == 10


async def test_answer_moves_to_the_survivor_then_coordinator_not_available(cluster: LocalCluster) -> None:
    """Last in the module: it kills both coordinators."""
    broker = cluster.by_role("broker")[0].grpc
    coordinators = cluster.by_role("coordinator")
    first = await broker_find_until(broker, "fo-g", lambda r: not isinstance(r, errors.GregorError))
    assert isinstance(first, coordinator_pb2.FindCoordinatorResponse)
    owner = f"{first.host}:{first.port}"
    victim = next(p for p in coordinators if p.grpc == owner)
    survivor = next(p for p in coordinators if p.grpc != owner)
    stop_process(victim, signal.SIGKILL)
    killed = time.monotonic()
    moved = await broker_find_until(broker, "fo-g", lambda r: isinstance(r, coordinator_pb2.FindCoordinatorResponse)
                                    and f"{r.host}:{r.port}" == survivor.grpc)
    took_ms = (time.monotonic() - killed) * 1000
    print(f"FindCoordinator on the broker named the survivor {took_ms:.0f} ms after SIGKILL "
          f"(lease TTL {LEASE_TTL_MS} ms)")
    # The dead instance's registration goes when its lease expires (etcd checks expiry every ~500 ms).
    assert took_ms < LEASE_TTL_MS + 1000
    assert isinstance(moved, coordinator_pb2.FindCoordinatorResponse) and moved.partition == first.partition
    # A member with only bootstrap.servers still reaches the group on the survivor.
    async with GroupAdmin({"bootstrap.servers": broker, "default.api.timeout.ms": 30000}) as admin:
        assert await admin.find_coordinator("fo-g") == survivor.grpc
    stop_process(survivor, signal.SIGKILL)
    err = await broker_find_until(broker, "fo-g", lambda r: isinstance(r, errors.GregorError))
    assert isinstance(err, errors.GregorError)
    assert err.code == errors.Code.COORDINATOR_NOT_AVAILABLE and err.retriable
    # The consumer's discovery gives up with the same typed error after default.api.timeout.ms.
    async with GroupAdmin({"bootstrap.servers": broker, "default.api.timeout.ms": 1000}) as admin:
        with pytest.raises(errors.GregorError) as e:
            await admin.committed_offsets("fo-g")
        assert e.value.code == errors.Code.COORDINATOR_NOT_AVAILABLE


async def test_standalone_broker_has_no_coordinator(tmp_path: str) -> None:
    with broker_process(str(tmp_path)) as b:
        with pytest.raises(errors.GregorError) as e:
            await broker_find(b.grpc, "g")
        assert e.value.code == errors.Code.COORDINATOR_NOT_AVAILABLE and e.value.retriable
        assert "standalone" in e.value.message
