"""Coordinator fencing, cluster-wide ListGroups and offsets expiry, as real processes (etcd, controller,
broker, coordinators over raw gRPC); see docs/groups.md "Fencing"."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any, Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster
from gregor.client.consumer import Consumer
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.coordinator import offsets_log as ol
from gregor.rpc.v1 import coordinator_pb2 as pb, coordinator_pb2_grpc
from tests.helpers.cluster import tear_down
from tests.integration.coordinator_client import Member, call, join_and_sync, stub
from tests.integration.test_group_coordinator import fetch_offsets, retrying

LEASE_TTL_MS = 2000
PARTITIONS = 4
BASE = {"offsets.topic.num.partitions": str(PARTITIONS), "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "500"}


def up(path: str, coordinators: int, **extra: str) -> LocalCluster:
    return LocalCluster.up(path, brokers=1, controllers=1, coordinators=coordinators, lease_ttl_ms=LEASE_TTL_MS,
                           coordinator_overrides={**BASE, **extra})


async def read_log(bootstrap: str, p: int) -> list[tuple[ol.OffsetKey | ol.GroupKey, bytes | None]]:
    """Every keyed record of __consumer_offsets partition p, decoded key first, up to the high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "client.id": "fencing-test-reader"})
    tp = (ol.OFFSETS_TOPIC, p)
    try:
        end, begin = await consumer.list_offset(tp, -1), await consumer.list_offset(tp, -2)
        out: list[tuple[ol.OffsetKey | ol.GroupKey, bytes | None]] = []
        if end > begin:
            consumer.assign([tp])
            consumer.seek(tp, begin)
            position, deadline = begin, time.monotonic() + 30
            while position < end and time.monotonic() < deadline:
                for rec in await consumer.poll(timeout_ms=500):
                    position = rec.offset + 1
                    if rec.offset < end and rec.key is not None:
                        out.append((ol.decode_key(rec.key), rec.value))
            assert position >= end, f"could not read {ol.OFFSETS_TOPIC}-{p} up to {end}"
        return out
    finally:
        await consumer.close()


def committed_values(records: list[tuple[Any, bytes | None]], group: str) -> list[int | None]:
    """The offsets committed for `group` in log order (None for a tombstone)."""
    return [ol.decode_offset_value(v).offset if v is not None else None
            for k, v in records if isinstance(k, ol.OffsetKey) and k.group == group]


async def group_owned_by(s: Any, owner: int, prefix: str) -> str:
    for i in range(200):
        g = f"{prefix}-{i}"
        r = await retrying(lambda: call(s.FindCoordinator(pb.FindCoordinatorRequest(group_id=g), timeout=10)))
        if r.coordinator_id == owner:
            return g
    raise AssertionError(f"no group owned by coordinator {owner}")


async def test_coordinator_paused_past_its_lease_cannot_commit(tmp_path: Any) -> None:
    """SIGSTOP the owner past its lease: the survivor takes over; the resumed owner's OffsetCommit
    fails with NOT_COORDINATOR and __consumer_offsets holds no write from it after the takeover; the
    resumed owner then comes back on a new lease and serves the group with the successor's commit."""
    c = up(str(tmp_path / "fence"), coordinators=2)
    try:
        addrs = {p.id: p.grpc for p in c.by_role("coordinator")}
        (ch0, s0), (ch1, s1) = stub(addrs[0]), stub(addrs[1])
        async with ch0, ch1:
            group = await group_owned_by(s1, 0, "g-fence")
            p = ol.partition_for(group, PARTITIONS)
            m = Member(s0, group, ["t"], session_timeout_ms=60000)
            await retrying(lambda: join_and_sync([m], {"t": 1}))
            await m.commit({("t", 0): 10})
            victim = next(x for x in c.by_role("coordinator") if x.id == 0)
            os.kill(victim.pid, signal.SIGSTOP)
            try:
                paused = time.monotonic()
                while (await retrying(lambda: call(s1.FindCoordinator(
                        pb.FindCoordinatorRequest(group_id=group), timeout=10)))).coordinator_id != 1:
                    await asyncio.sleep(0.1)
                assert await retrying(lambda: fetch_offsets(s1, group), timeout_s=30) == {("t", 0): 10}
                print(f"successor serves the paused owner's group {time.monotonic() - paused:.2f} s after SIGSTOP")
                m.stub = s1
                await m.commit({("t", 0): 20})  # the loaded member commits through the successor
                # The stale owner gets a commit while still paused (queued in its socket), then resumes.
                stale = asyncio.ensure_future(call(s0.OffsetCommit(pb.OffsetCommitRequest(
                    group_id=group, generation_id=m.generation, member_id=m.member_id,
                    partitions=[pb.OffsetCommitPartition(topic="t", partition=0, offset=666)]), timeout=20)))
                await asyncio.sleep(0.3)
            finally:
                os.kill(victim.pid, signal.SIGCONT)
            with pytest.raises(errors.GregorError) as ei:
                await stale
            assert ei.value.code == errors.Code.NOT_COORDINATOR, ei.value
            await asyncio.sleep(1.0)  # give any stray write from the stale owner time to land
            assert committed_values(await read_log(c.bootstrap, p), group) == [10, 20]
            # The resumed owner replaced its lost lease, registered again and, as the group's desired owner,
            # claimed its partition back once the successor released it (ownership.py LeaseFence): whoever
            # serves the group now loaded it from the log, successor's commit included.
            stubs = {0: s0, 1: s1}

            async def served_offsets() -> dict[tuple[str, int], int]:
                owner = await call(s1.FindCoordinator(pb.FindCoordinatorRequest(group_id=group), timeout=10))
                return await fetch_offsets(stubs[owner.coordinator_id], group)

            assert await retrying(served_offsets, timeout_s=30) == {("t", 0): 20}
            assert committed_values(await read_log(c.bootstrap, p), group) == [10, 20]
    finally:
        tear_down(c)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two coordinators with a 3 s offsets retention checked every 300 ms (test-only knob)."""
    c = up(str(tmp_path_factory.mktemp("pair")), coordinators=2,
           **{"offsets.retention.ms": "3000", "offsets.retention.check.interval.ms": "300"})
    try:
        yield c
    finally:
        tear_down(c)


async def test_list_groups_on_any_instance_lists_the_whole_cluster(pair: LocalCluster) -> None:
    addrs = {p.id: p.grpc for p in pair.by_role("coordinator")}
    (ch0, s0), (ch1, s1) = stub(addrs[0]), stub(addrs[1])
    async with ch0, ch1:
        stubs = {0: s0, 1: s1}
        groups = {cid: await group_owned_by(s0, cid, "g-list") for cid in (0, 1)}
        for cid, g in groups.items():
            await retrying(lambda: join_and_sync([Member(stubs[cid], g, ["t"], session_timeout_ms=60000)], {"t": 1}))
        for s in (s0, s1):
            listing = await retrying(lambda: call(s.ListGroups(pb.ListGroupsRequest(), timeout=10)))
            got = {(g.group_id, g.state, g.protocol_type) for g in listing.groups}
            assert {(g, "Stable", "consumer") for g in groups.values()} <= got
        # The fan-out's sub-request: one instance's own groups only.
        for cid, s in stubs.items():
            local = await call(s.ListGroups(pb.ListGroupsRequest(), timeout=10,
                                            metadata=(("gregor-list-scope", "local"),)))
            names = {g.group_id for g in local.groups}
            assert groups[cid] in names and groups[1 - cid] not in names


async def test_empty_group_offsets_expire_with_tombstones(pair: LocalCluster) -> None:
    addrs = {p.id: p.grpc for p in pair.by_role("coordinator")}
    async with channel(addrs[0]) as ch0:
        s0 = coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch0)
        group = await group_owned_by(s0, 0, "g-expire")
        live = await group_owned_by(s0, 0, "g-kept")
        member = Member(s0, live, ["t"], session_timeout_ms=60000)
        await retrying(lambda: join_and_sync([member], {"t": 1}))
        await member.commit({("t", 0): 7})
        simple = Member(s0, group, ["t"])
        await retrying(lambda: simple.commit({("t", 0): 5, ("t", 1): 6}, generation=-1))  # Empty group
        assert await fetch_offsets(s0, group) == {("t", 0): 5, ("t", 1): 6}
        start = time.monotonic()
        while await fetch_offsets(s0, group):
            assert time.monotonic() - start < 15, "an Empty group's offsets did not expire"
            await asyncio.sleep(0.2)
        took = time.monotonic() - start
        print(f"Empty group expired {took:.2f} s after its commit (offsets.retention.ms 3000, check every 300 ms)")
        assert took >= 2.5
        listing = await call(s0.ListGroups(pb.ListGroupsRequest(), timeout=10))
        names = {g.group_id for g in listing.groups}
        assert group not in names and live in names
        assert await fetch_offsets(s0, live) == {("t", 0): 7}  # a Stable group's offsets stay
        records = await read_log(pair.bootstrap, ol.partition_for(group, PARTITIONS))
        mine = [(k, v) for k, v in records if k.group == group]
        tombstoned = {(k.topic, k.partition) for k, v in mine if isinstance(k, ol.OffsetKey) and v is None}
        assert tombstoned == {("t", 0), ("t", 1)}
        assert any(isinstance(k, ol.GroupKey) and v is None for k, v in mine), "no group metadata tombstone"
        assert committed_values(records, group)[-2:] == [None, None]
