"""Seed 002's A/B example with real processes, the seed's own numbers, both cases.

The seed (Kafka processing OffsetForLeaderEpochRequest, "Examples"):

    A(leader, epoch=1): 1, 2, 3, 4, 5, 6      A cache: leaderEpoch = 1, startOffset = 1
    B(follower):        1, 2, 3, 4            B cache: leaderEpoch = 1, startOffset = 1

A goes offline and B becomes the leader at epoch 2. Then, before A returns,

(a) B appends nothing: B's cache gets no new entry; A comes back, truncates its 5
    and 6 and ends with 1..4 like B;
(b) B appends 5, 6, 7: B's cache gains (epoch 2, startOffset 5); A asks with
    epoch 1, B answers the start offset of epoch 2, 5; A truncates its 5 and 6,
    fetches B's 5, 6, 7 (epoch 2) and adds (2, 5) to its own cache.

Here a record's label is its offset, as in the seed: record "1" sits at offset 1.
Kafka's offsets start at 0 and a new partition's first leader epoch is 0, so the
test first writes one record at offset 0 under epoch 0, moves the partition to
epoch 1 with A still leading (B's controlled shutdown: the controller takes B out
of the ISR, which bumps the leader epoch, as Kafka's ZooKeeper controller does),
and lets retention delete that first segment (its record is timestamped two hours
back; `segment.bytes` at its minimum puts every batch in its own segment). The log
then starts at offset 1 and the cache reads exactly the seed's `1 1`. Both
replicas are read from disk at each step of the seed: batch offsets, the leader
epoch in each batch, the log end offset and `leader-epoch-checkpoint`.

One difference in mechanism, not in outcome: for case (a) the seed describes the
pre-KIP-101 path (A's fetch hits offsetOutOfRange and A truncates to B's latest
offset). Gregor, like Kafka since 0.11, truncates before fetching: A asks
OffsetForLeaderEpoch(1) and B, whose latest epoch is still 1, answers its LEO, 5.
The test checks that answer and A's "truncating to 5 by leader epoch" log line.
(The seed's "latestOffset 4" is the offset of B's last record; Kafka's end offset
is the next one, 5.)
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gregor.broker.replica_fetcher import REPLICA_FETCH_WAIT_MAX_MS
from gregor.cli.local_cluster import LocalCluster, Process, stop_process
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch, split_batches, record_values
from tests.helpers.cluster import restart_broker, running_cluster
from tests.integration.test_cluster_control import metadata, partitions
from tests.helpers.wait import until

LEASE_TTL_MS = 2000  # the controller's lease
# B is SIGSTOPped for about a second while A takes the records B must not get; its
# registration (keepalive every third of this) must outlive that pause.
BROKER_SESSION_TIMEOUT_MS = 6000
RETENTION_CHECK_INTERVAL_MS = 200  # log.retention.check.interval.ms: the epoch-0 segment goes quickly
OVERRIDES = {"broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS),
             "log.retention.check.interval.ms": str(RETENTION_CHECK_INTERVAL_MS)}
TOPIC_CONFIGS = {"segment.bytes": "14",  # Kafka's minimum: every batch rolls a segment
                 "retention.ms": str(3600_000),  # only the record stamped two hours back expires
                 "min.insync.replicas": "1"}
# A dead broker's registration expires, the controller elects, LeaderAndIsr and UpdateMetadata follow.
FAILOVER_WITHIN_S = BROKER_SESSION_TIMEOUT_MS / 1000 + 8
# An ISR change reaches the controller's metadata: 5 s of quiet + the 2.5 s check + UpdateMetadata.
ISR_PROPAGATION_WITHIN_S = 5 + 2.5 + 6
# A restarted broker registers, gets LeaderAndIsr, truncates and catches up.
REJOIN_WITHIN_S = 30
# B's long poll parked at A when B is stopped is answered (empty) after replica.fetch.wait.max.ms;
# only then may A append what B must not see.
PARKED_FETCH_DRAINED_S = REPLICA_FETCH_WAIT_MAX_MS / 1000 + 0.3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("seed002")), brokers=2, controllers=1,
                         lease_ttl_ms=LEASE_TTL_MS, broker_overrides=OVERRIDES) as c:
        yield c


@dataclass(frozen=True)
class DiskLog:
    """One replica's log as its files say: (offset, leader epoch, value) per batch, LEO, the epoch checkpoint."""

    batches: tuple[tuple[int, int, bytes], ...]
    log_end_offset: int
    checkpoint: str

    @property
    def epochs(self) -> list[tuple[int, int]]:
        """leader-epoch-checkpoint as (epoch, start offset) pairs."""
        lines = self.checkpoint.splitlines()
        assert lines[0] == "0" and int(lines[1]) == len(lines) - 2, self.checkpoint
        return [(int(e), int(s)) for e, s in (line.split() for line in lines[2:])]


def disk_log(b: Process, topic: str) -> DiskLog:
    """Read a partition replica straight from its segment files and leader-epoch-checkpoint."""
    pdir = os.path.join(b.data_dir, f"{topic}-0")
    batches: list[tuple[int, int, bytes]] = []
    first_base = None
    for path in sorted(glob.glob(os.path.join(pdir, "*.log"))):
        first_base = int(os.path.basename(path)[:-4]) if first_base is None else first_base
        with open(path, "rb") as f:
            for h, raw in split_batches(f.read()):
                (value,) = record_values(raw)  # one record per batch, as produced below
                batches.append((h.base_offset, h.partition_leader_epoch, value))
    leo = batches[-1][0] + 1 if batches else (first_base or 0)
    with open(os.path.join(pdir, "leader-epoch-checkpoint")) as f:
        return DiskLog(tuple(batches), leo, f.read())


def record(offset: int, epoch: int) -> tuple[int, int, bytes]:
    """The seed's record `offset` as appended under `epoch`: value "<offset>@e<epoch>"."""
    return offset, epoch, f"{offset}@e{epoch}".encode()


async def produce(p: Process, topic: str, value: bytes, acks: int, timestamp_ms: int | None = None) -> int:
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=topic, partition=0, records=make_batch([value], timestamp_ms=timestamp_ms), acks=acks,
            timeout_ms=10000), timeout=15)
    return resp.base_offset


async def offset_for_leader_epoch(p: Process, topic: str, epoch: int) -> tuple[int, int]:
    """What a follower asking with `epoch` gets from p: (epoch, end offset)."""
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).OffsetForLeaderEpoch(
            broker_pb2.OffsetForLeaderEpochRequest(topic=topic, partition=0, leader_epoch=epoch), timeout=5)
    return resp.leader_epoch, resp.end_offset


async def latest_offset(p: Process, topic: str) -> int:
    """ListOffsets(latest) on the leader: the high watermark."""
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).ListOffsets(
            broker_pb2.ListOffsetsRequest(topic=topic, partition=0, timestamp_ms=-1), timeout=5)
    return resp.offset


async def state(p: Process, topic: str) -> tuple[int, int, tuple[int, ...]]:
    """(leader, leader epoch, isr) of partition 0 in p's metadata; (-1, -1, ()) while unknown."""
    try:
        v = partitions(await metadata(p, topic))
    except Exception:  # noqa: BLE001 - a broker still starting answers nothing useful yet
        return -1, -1, ()
    if 0 not in v:
        return -1, -1, ()
    leader, epoch, _, isr = v[0]
    return leader, epoch, tuple(sorted(isr))


async def wait_state(p: Process, topic: str, want: tuple[int, int, tuple[int, ...]], within_s: float,
                     what: str) -> None:
    async def reached() -> bool:
        return await state(p, topic) == want
    await until(reached, within_s, f"{what}: (leader, epoch, isr) == {want}, last {await state(p, topic)}")


async def wait_disk(b: Process, topic: str, want: DiskLog, within_s: float, what: str) -> None:
    async def reached() -> bool:
        try:
            return disk_log(b, topic) == want
        except (OSError, ValueError, AssertionError):
            return False  # a file between writes
    try:
        await until(reached, within_s, what)
    except AssertionError:
        assert disk_log(b, topic) == want, what  # show the difference


def expected(records: list[tuple[int, int, bytes]], epochs: list[tuple[int, int]]) -> DiskLog:
    text = "0\n" + f"{len(epochs)}\n" + "".join(f"{e} {s}\n" for e, s in epochs)
    return DiskLog(tuple(records), records[-1][0] + 1, text)


async def a_leads_epoch_1_with_1_to_6(cluster: LocalCluster, topic: str) -> tuple[Process, Process]:
    """The seed's starting point: A leads epoch 1 with 1..6, B follows with 1..4; both caches [(1, 1)].

    Returns (A, B); B's process may have been restarted (controlled shutdown for the epoch bump).
    """
    a, b = sorted(cluster.by_role("broker"), key=lambda p: p.id)  # restarts reorder cluster.processes
    async with channel(a.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=topic, num_partitions=-1, replication_factor=-1,
                                                  assignments={0: controller_pb2.ReplicaList(broker_ids=[a.id, b.id])},
                                                  configs=TOPIC_CONFIGS)]), timeout=30)
    assert resp.results[0].error.code == 0, resp
    await wait_state(a, topic, (a.id, 0, tuple(sorted((a.id, b.id)))), 15, "A leads a new partition at epoch 0")

    # Offset 0, epoch 0: the record that retention removes so that the log starts at 1.
    two_hours_ago = int(time.time() * 1000) - 2 * 3600_000
    assert await produce(a, topic, b"0@e0", acks=-1, timestamp_ms=two_hours_ago) == 0
    # Epoch 1 with A still leading: B's controlled shutdown takes it out of the ISR (leader epoch + 1).
    await asyncio.to_thread(stop_process, b, signal.SIGTERM)
    await wait_state(a, topic, (a.id, 1, (a.id,)), 15, "B's controlled shutdown: A leads epoch 1 alone")
    b = await asyncio.to_thread(restart_broker, cluster, b, OVERRIDES)

    # Records 1..4 under epoch 1, acknowledged by both (acks=all once B is back in the ISR).
    await wait_state(a, topic, (a.id, 1, tuple(sorted((a.id, b.id)))), ISR_PROPAGATION_WITHIN_S + REJOIN_WITHIN_S,
                     "B catches up and rejoins the ISR; the controller knows it (B must be electable)")
    for offset in range(1, 5):
        assert await produce(a, topic, record(offset, 1)[2], acks=-1) == offset
    both = expected([record(o, 1) for o in range(1, 5)], [(1, 1)])
    # Retention deletes the epoch-0 segment on each replica; its cache entry (0, 0) goes with it.
    await wait_disk(a, topic, both, 10, "A: the epoch-0 segment deleted, 1..4 under epoch 1, cache [(1, 1)]")
    await wait_disk(b, topic, both, 10, "B: the same, replicated")

    os.kill(b.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(PARKED_FETCH_DRAINED_S)
        for offset in (5, 6):
            assert await produce(a, topic, record(offset, 1)[2], acks=1) == offset
        # "A(leader, epoch=1): 1..6, A cache: (1, 1); B(follower): 1..4, B cache: (1, 1)".
        assert disk_log(a, topic) == expected([record(o, 1) for o in range(1, 7)], [(1, 1)])
        assert disk_log(b, topic) == both
        # "A挂掉后": A dies; B, still in the ISR, is the clean choice.
        await asyncio.to_thread(stop_process, a, signal.SIGKILL)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    await wait_state(b, topic, (b.id, 2, (b.id,)), FAILOVER_WITHIN_S, "B becomes leader at epoch 2")
    return a, b


async def a_returns(cluster: LocalCluster, a: Process, topic: str, final: DiskLog, b: Process) -> Process:
    """Restart A; it truncates by leader epoch (asked 1, B said 5) and ends with `final`, as B has."""
    back = await asyncio.to_thread(restart_broker, cluster, a, OVERRIDES)
    await wait_disk(back, topic, final, REJOIN_WITHIN_S, "A truncated by leader epoch and caught up")
    with open(back.log, errors="replace") as f:
        restarted = f.read().split(f"registered with broker epoch {back.extra['broker_epoch']}")[-1]
    assert f"{topic}-0: truncating to 5 by leader epoch (asked 1, leader said 1@5)" in restarted, restarted[-3000:]
    assert disk_log(b, topic) == final
    assert await latest_offset(b, topic) == final.log_end_offset  # the HW: every record committed
    return back


async def test_seed_002_case_a_new_leader_appended_nothing(cluster: LocalCluster) -> None:
    topic = "seed002-a"
    a, b = await a_leads_epoch_1_with_1_to_6(cluster, topic)
    # "此时还没有新记录追加,leaderEpochCache没有新增条目": becoming leader adds no cache entry.
    only_1_to_4 = expected([record(o, 1) for o in range(1, 5)], [(1, 1)])
    assert disk_log(b, topic) == only_1_to_4
    assert only_1_to_4.log_end_offset == 5
    # A will ask with its latest epoch, 1: B's latest is 1 too, so B answers its LEO.
    assert await offset_for_leader_epoch(b, topic, 1) == (1, 5)
    # A dead: its files still hold 5 and 6 under epoch 1.
    assert disk_log(a, topic) == expected([record(o, 1) for o in range(1, 7)], [(1, 1)])
    await a_returns(cluster, a, topic, only_1_to_4, b)


async def test_seed_002_case_b_new_leader_appended_5_6_7(cluster: LocalCluster) -> None:
    topic = "seed002-b"
    a, b = await a_leads_epoch_1_with_1_to_6(cluster, topic)
    for offset in (5, 6, 7):
        assert await produce(b, topic, record(offset, 2)[2], acks=-1) == offset
    # "B cache: leaderEpoch = 1, startOffset = 1; leaderEpoch = 2, startOffset = 5".
    b_log = expected([record(o, 1) for o in range(1, 5)] + [record(o, 2) for o in (5, 6, 7)], [(1, 1), (2, 5)])
    assert disk_log(b, topic) == b_log
    assert b_log.log_end_offset == 8
    # "请求的epoch为1,B查询到epoch=2(比1大的最小epoch),然后返回对应的startOffset=5".
    assert await offset_for_leader_epoch(b, topic, 1) == (1, 5)
    assert disk_log(a, topic) == expected([record(o, 1) for o in range(1, 7)], [(1, 1)])
    # A truncates its 5 and 6, fetches 5, 6, 7 under epoch 2 and adds (2, 5) to its cache.
    await a_returns(cluster, a, topic, b_log, b)
