"""`__consumer_offsets` as real processes (etcd, a controller, 3 brokers, a coordinator; seed 003, docs/groups.md).

The coordinator creates the topic with RF 3 and cleanup.policy=compact (offsets.topic.segment.bytes
as its segment.bytes); many commits of the same keys roll segments and the brokers' log cleaner
compacts them, and a restarted coordinator loads the latest committed offsets from the compacted
log. A config the controller refuses (INVALID_CONFIG) stops the coordinator instead of creating an
uncompacted topic.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any, Iterator

import pytest

from gregor.cli.local_cluster import ClusterError, LocalCluster, start_coordinator, stop_process
from gregor.client import AdminClient, Consumer
from gregor.common import errors
from gregor.coordinator import offsets_log as ol
from tests.helpers.cluster import etcd_endpoints, replica_log_bytes, tear_down

LEASE_TTL_MS = 3000
NUM_PARTITIONS = 3
SEGMENT_BYTES = 4096  # a commit is ~150-250 bytes: a segment rolls every ~20 commits
OVERRIDES = {"offsets.topic.num.partitions": str(NUM_PARTITIONS), "offsets.topic.segment.bytes": str(SEGMENT_BYTES),
             "group.initial.rebalance.delay.ms": "0"}
# Kafka's log.cleaner.backoff.ms is 15 s; a shorter one lets the test see the cleaner at work.
BROKER_OVERRIDES = {"log.cleaner.backoff.ms": "200"}
OFFSETS = ol.OFFSETS_TOPIC


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("offsets")), brokers=3, controllers=1, coordinators=1,
                        lease_ttl_ms=LEASE_TTL_MS, broker_overrides=BROKER_OVERRIDES,
                        coordinator_overrides=OVERRIDES)
    try:
        yield c
    finally:
        tear_down(c)


async def read_partition(bootstrap: str, partition: int) -> list[tuple[int, Any, Any]]:
    """Every record of __consumer_offsets-<partition> below the HW: (offset, decoded key, decoded value|None)."""
    tp = (OFFSETS, partition)
    out: list[tuple[int, Any, Any]] = []
    async with Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                         "fetch.max.wait.ms": 100}) as c:
        c.assign([tp])
        c.seek_to_beginning(tp)
        end = (await c.end_offsets([tp]))[tp]
        deadline = time.monotonic() + 30
        while await c.position(tp) < end:
            assert time.monotonic() < deadline, f"read {len(out)} records, position {await c.position(tp)} < {end}"
            for rec in await c.poll(500):
                assert rec.key is not None
                key = ol.decode_key(rec.key)
                if rec.value is None:
                    value = None
                elif isinstance(key, ol.OffsetKey):
                    value = ol.decode_offset_value(rec.value)
                else:
                    value = ol.decode_group_value(rec.value)
                out.append((rec.offset, key, value))
    return out


async def test_offsets_topic_is_created_compacted_with_rf_3(cluster: LocalCluster) -> None:
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        info = (await admin.describe_topics([OFFSETS]))[OFFSETS]
        configs = {e.name: e for e in (await admin.describe_configs([OFFSETS]))[OFFSETS]}
    assert info.is_internal
    assert len(info.partitions) == NUM_PARTITIONS
    assert all(len(p.replicas) == 3 and len(set(p.replicas)) == 3 for p in info.partitions), info.partitions
    assert (configs["cleanup.policy"].value, configs["cleanup.policy"].is_default) == ("compact", False)
    assert (configs["segment.bytes"].value, configs["segment.bytes"].is_default) == (str(SEGMENT_BYTES), False)


async def test_repeated_commits_are_compacted_and_survive_a_coordinator_restart(cluster: LocalCluster) -> None:
    group, commits = "compact-g", 200
    tps = [("t", 0), ("t", 1)]
    partition = ol.partition_for(group, NUM_PARTITIONS)
    cfg = {"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False}
    async with Consumer(cfg) as c:
        for i in range(commits):  # standalone commits (no subscription): the same two keys over and over
            await c.commit_sync({tps[0]: i, tps[1]: 1000 + i})
        last = {tps[0]: commits - 1, tps[1]: 1000 + commits - 1}
        assert await c.committed(tps) == last

    # Every record of the group is in the log once written; segments rolled at segment.bytes.
    leader = (await _describe_offsets_partition(cluster, partition)).leader
    broker = next(b for b in cluster.by_role("broker") if b.id == leader)
    assert len(replica_log_bytes(broker, OFFSETS, partition)) >= 3, "segments rolled at segment.bytes"
    written = 2 * commits

    # The log cleaner compacts the sealed segments: only the latest value per key stays there,
    # plus what is in the active segment (never cleaned).
    deadline = time.monotonic() + 60
    while True:
        records = [r for r in await read_partition(cluster.bootstrap, partition)
                   if isinstance(r[1], ol.OffsetKey) and r[1].group == group]
        if len(records) < written // 4 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert len(records) < written // 4, f"{len(records)} of {written} records left: not compacted"
    print(f"{len(records)} of {written} offset records left after compaction (first offset {records[0][0]})")
    assert records[0][0] > 0, "the first commits were cleaned away"
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(set(offsets))
    latest: dict[tuple[str, int], int] = {}
    for _, key, value in records:
        latest[(key.topic, key.partition)] = value.offset
    assert latest == last

    # A new coordinator instance loads the compacted partition: the latest commits are all there.
    old = cluster.by_role("coordinator")[0]
    stop_process(old, signal.SIGTERM)
    cluster.processes.remove(old)
    cluster.processes.append(start_coordinator(cluster.data_dir, 0, etcd_endpoints(cluster),
                                               lease_ttl_ms=LEASE_TTL_MS, overrides=OVERRIDES))
    async with Consumer(cfg) as c:
        assert await c.committed(tps) == last
        await c.commit_sync({tps[0]: commits})  # and the restarted coordinator takes new commits
        assert (await c.committed(tps))[tps[0]] == commits


async def _describe_offsets_partition(cluster: LocalCluster, partition: int) -> Any:
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        return (await admin.describe_topics([OFFSETS]))[OFFSETS].partitions[partition]


async def test_refused_offsets_topic_config_stops_the_coordinator(tmp_path: Any) -> None:
    """INVALID_CONFIG from the controller is fatal: no silent fallback to an uncompacted topic."""
    c = LocalCluster.up(str(tmp_path / "bad"), brokers=1, controllers=1, lease_ttl_ms=LEASE_TTL_MS)
    try:
        with pytest.raises(ClusterError) as ei:
            # segment.bytes must be at least 14 (Kafka's LegacyRecord overhead): the controller refuses it.
            start_coordinator(c.data_dir, 0, etcd_endpoints(c), lease_ttl_ms=LEASE_TTL_MS,
                              overrides={"offsets.topic.segment.bytes": "13"})
        message = str(ei.value)
        assert "exited with 1" in message and "INVALID_CONFIG" in message and "segment.bytes" in message, message
        async with AdminClient({"bootstrap.servers": c.bootstrap}) as admin:
            with pytest.raises(errors.UnknownTopicOrPartitionError):  # type: ignore[attr-defined]
                await admin.describe_topics([OFFSETS])
    finally:
        tear_down(c)
