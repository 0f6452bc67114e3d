"""Event-loop owned; one loader consumer per coordinator, so loads run one at a time under an asyncio.Lock.

Loading a coordinator's internal topic: creating `__consumer_offsets` (Kafka's
GroupMetadataManager / offsets topic bootstrap), and rebuilding state by replaying a
partition to its high watermark when ShardOwnership hands it over (Kafka's
GroupMetadataManager.loadGroupsAndOffsets; the transaction coordinator replays
`__transaction_state` through the same `replay_partition`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Callable

from gregor.client.admin import AdminClient
from gregor.common import errors
from gregor.common.clock import monotonic_ms
from gregor.common.etcd import EtcdClient
from gregor.common.etcd_layout import BrokerIdsZNode, TopicZNode
from gregor.coordinator import offsets_log as ol
from gregor.coordinator.group import Group, GroupState, Member
from gregor.coordinator.group_manager import GroupManager

log = logging.getLogger(__name__)
Code = errors.Code

OffsetsView = dict[str, dict[tuple[str, int], ol.OffsetValue | None]]
GroupsView = dict[str, ol.GroupValue | None]


async def replay_partition(consumer: Any, tp: Any, begin: int, end: int,
                           loading: Callable[[], bool]) -> AsyncIterator[Any]:
    """The keyed records of one internal-topic partition in [begin, end), read to rebuild a
    coordinator's state when it takes the partition over; stops early once it is no longer loading."""
    consumer.assign([tp])
    consumer.seek(tp, begin)
    position = begin
    try:
        while position < end and loading():
            for rec in await consumer.poll(timeout_ms=500):
                position = rec.offset + 1
                if rec.offset < end and rec.key is not None:
                    yield rec
    finally:
        consumer.assign([])


async def partition_bounds(consumer: Any, tp: tuple[str, int], loading: Callable[[], bool]) -> tuple[int, int] | None:
    """(log start, high watermark) of tp, retried while the partition has no leader; None once no longer loading."""
    while True:
        try:
            end = await consumer.list_offset(tp, -1)
            begin = await consumer.list_offset(tp, -2)
            return begin, end
        except errors.GregorError as exc:
            log.info("load of %s-%d waits: %s", tp[0], tp[1], exc)
            await asyncio.sleep(0.5)
            if not loading():
                return None


class OffsetsTopic:
    """Creates `__consumer_offsets` if missing and learns its real partition count."""

    def __init__(self, etcd: EtcdClient, bootstrap: str, num_partitions: int, replication_factor: int,
                 segment_bytes: int) -> None:
        self.etcd, self.bootstrap = etcd, bootstrap
        self.num_partitions, self.replication_factor = num_partitions, replication_factor
        self.segment_bytes = segment_bytes

    def configs(self) -> dict[str, str]:
        """The topic configs __consumer_offsets is created with (Kafka's GroupMetadataManager.offsetsTopicConfigs)."""
        return {"cleanup.policy": "compact", "segment.bytes": str(self.segment_bytes)}

    async def ensure(self) -> int:
        """Create __consumer_offsets through the controller if missing; its real partition count."""
        key = TopicZNode.key(self.etcd, ol.OFFSETS_TOPIC)
        kv = await self.etcd.get(key)
        if kv is None:
            brokers = len((await self.etcd.get_prefix(BrokerIdsZNode.prefix(self.etcd))).kvs)
            rf = min(self.replication_factor, max(brokers, 1))
            if rf < self.replication_factor:
                log.warning("offsets.topic.replication.factor %d capped at %d live brokers",
                            self.replication_factor, rf)
            await self._create(rf)
            deadline = time.monotonic() + 30
            while kv is None and time.monotonic() < deadline:
                kv = await self.etcd.get(key)
                if kv is None:
                    await asyncio.sleep(0.1)
            if kv is None:
                raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE, f"{ol.OFFSETS_TOPIC} did not appear in etcd")
        else:
            await self._check_configs()
        n = TopicZNode.partition_count(kv.value)
        if n != self.num_partitions:
            log.warning("%s has %d partitions, not offsets.topic.num.partitions %d: using %d", ol.OFFSETS_TOPIC,
                        n, self.num_partitions, n)
        return n

    async def _create(self, rf: int) -> None:
        """CreateTopics through the controller, retrying retriable errors for a minute.

        A refused config (INVALID_CONFIG) is fatal: without compaction the topic would grow
        without bound and every takeover would replay all of it, so the coordinator does not
        start rather than run on an uncompacted offsets topic."""
        configs = self.configs()
        deadline = time.monotonic() + 60
        async with AdminClient({"bootstrap.servers": self.bootstrap}) as admin:
            while True:
                try:
                    await admin.create_topic(ol.OFFSETS_TOPIC, self.num_partitions, rf, configs)
                    log.info("created %s (%d partitions, RF %d, %s)", ol.OFFSETS_TOPIC, self.num_partitions, rf,
                             configs)
                    return
                except errors.GregorError as exc:
                    if exc.code == Code.TOPIC_ALREADY_EXISTS:
                        return
                    if not exc.retriable or time.monotonic() > deadline:
                        log.error("cannot create %s with %s: %s: %s", ol.OFFSETS_TOPIC, configs, exc.name, exc.message)
                        raise errors.error_for(exc.code, f"creating {ol.OFFSETS_TOPIC} (RF {rf}, {configs}) failed: "
                                                         f"{exc.name}: {exc.message}") from exc
                    await asyncio.sleep(0.5)

    async def _check_configs(self) -> None:
        """Warn when an existing __consumer_offsets is not compacted (e.g. created by hand, or by a
        release that fell back to cleanup.policy=delete): offsets would be lost to retention.ms."""
        try:
            async with AdminClient({"bootstrap.servers": self.bootstrap}) as admin:
                entries = (await admin.describe_configs([ol.OFFSETS_TOPIC])).get(ol.OFFSETS_TOPIC, [])
        except errors.GregorError as exc:
            log.warning("cannot read the configs of %s: %s", ol.OFFSETS_TOPIC, exc)
            return
        policy = next((e.value for e in entries if e.name == "cleanup.policy"), "delete")
        if "compact" not in policy.split(","):
            log.error("%s has cleanup.policy=%s, not compact: committed offsets older than retention.ms will be "
                      "deleted. Fix: gregor topics alter %s --config cleanup.policy=compact",
                      ol.OFFSETS_TOPIC, policy, ol.OFFSETS_TOPIC)


class OffsetsLoader:
    """Replays a __consumer_offsets partition into the GroupManager (GroupMetadataManager.loadGroupsAndOffsets)."""

    def __init__(self, manager: GroupManager) -> None:
        self.manager = manager
        self.consumer: Any = None  # the loader Consumer, set at start
        self._lock = asyncio.Lock()

    async def load(self, p: int, loading: Callable[[], bool]) -> bool:
        """Replay partition p up to its high watermark and install its groups; False if released meanwhile."""
        assert self.consumer is not None
        start = time.monotonic()
        async with self._lock:
            if not loading():
                return False
            tp = (ol.OFFSETS_TOPIC, p)
            bounds = await partition_bounds(self.consumer, tp, loading)
            if bounds is None:
                return False
            begin, end = bounds
            offsets: OffsetsView = {}
            groups: GroupsView = {}
            if end > begin:
                async for rec in replay_partition(self.consumer, tp, begin, end, loading):
                    self.replay(rec.key, rec.value, offsets, groups)
            if not loading():
                return False
            self.install(offsets, groups)
            log.info("loaded offsets partition %d (offsets %d..%d, %d groups) in %.0f ms", p, begin, end,
                     len(set(offsets) | set(groups)), (time.monotonic() - start) * 1000)
            return True

    @staticmethod
    def replay(key: bytes, value: bytes | None, offsets: OffsetsView, groups: GroupsView) -> None:
        try:
            k = ol.decode_key(key)
            if isinstance(k, ol.OffsetKey):
                offsets.setdefault(k.group, {})[(k.topic, k.partition)] = (
                    ol.decode_offset_value(value) if value is not None else None)
            else:
                groups[k.group] = ol.decode_group_value(value) if value is not None else None
        except errors.GregorError as exc:
            log.warning("skipping undecodable %s record: %s", ol.OFFSETS_TOPIC, exc)

    def install(self, offsets: OffsetsView, groups: GroupsView) -> None:
        now = monotonic_ms()
        for gid in set(offsets) | set(groups):
            live_offsets = {tp: v for tp, v in offsets.get(gid, {}).items() if v is not None}
            gv = groups.get(gid)
            if gv is None and not live_offsets:
                continue  # deleted group (tombstones)
            group = Group(gid, state_timestamp_ms=now)
            group.offsets = {tp: (v.offset, v.leader_epoch, v.metadata, v.commit_timestamp_ms)
                             for tp, v in live_offsets.items()}
            if gv is not None:
                group.generation_id, group.protocol_type = gv.generation_id, gv.protocol_type
                group.protocol_name, group.leader_id = gv.protocol_name, gv.leader_id
                for mv in gv.members:
                    group.add(Member(mv.member_id, mv.group_instance_id, mv.client_id, mv.client_host,
                                     mv.rebalance_timeout_ms, mv.session_timeout_ms, gv.protocol_type,
                                     [(gv.protocol_name, mv.subscription)], assignment=mv.assignment,
                                     heartbeat_deadline_ms=now + mv.session_timeout_ms))
                if gv.leader_id in group.members:
                    group.leader_id = gv.leader_id
                # Kafka loads a group with members as Stable; members that are gone expire by session timeout.
                group.state = GroupState.STABLE if group.members else GroupState.EMPTY
            self.manager.groups[gid] = group
