"""Event-loop owned, no locks: requests, the tick timer and the topic watch run on one asyncio loop; ownership and loading run as its tasks.

The group coordinator serving groups (Kafka's GroupCoordinator + GroupMetadataManager, seed 003):
groups are sharded by the __consumer_offsets partition their id hashes to; this instance
serves the partitions that `ShardOwnership` (ownership.py) has claimed and loaded
(`OffsetsLoader`, loading.py), answers COORDINATOR_LOAD_IN_PROGRESS while one loads and
NOT_COORDINATOR for the others. Offsets and group metadata are written to the log with
acks=all, fenced by the ownership lease (`LeaseFence`, docs/groups.md "Fencing"), before
they are acknowledged or served. This module holds the serving side: routing, ListGroups
fan-out, durable writes, the tick timer (sessions, rebalances, offsets retention) and the
topic watch that rebalances subscribed groups.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import Counter, Gauge

from gregor.client.consumer import Consumer
from gregor.client.producer import Producer
from gregor.common import errors
from gregor.common.clock import monotonic_ms, now_ms
from gregor.common.etcd import EtcdClient, WatchCompacted
from gregor.common.etcd_layout import CoordinatorsZNode, TopicZNode
from gregor.common.metrics_reporter import etcd_bootstrap
from gregor.common.quotas import RELAYED_METADATA
from gregor.coordinator import offsets_log as ol
from gregor.coordinator.coordinator_metrics import COMMITTED_OFFSETS, RebalanceTimer
from gregor.coordinator.group import Group, GroupState
from gregor.coordinator.group_manager import GroupConfig, GroupManager
from gregor.coordinator.loading import OffsetsLoader, OffsetsTopic, replay_partition
from gregor.coordinator.ownership import LeaseFence, ShardOwnership, reconcile_forever

__all__ = ["CoordinatorConfig", "GroupCoordinator", "reconcile_forever", "replay_partition"]

log = logging.getLogger(__name__)
Code = errors.Code

GROUPS = Gauge("gregor_coordinator_groups", "Groups owned by this coordinator, by state", ["state"])
MEMBERS = Gauge("gregor_coordinator_members", "Members of the groups owned by this coordinator")
REBALANCES = Counter("gregor_coordinator_rebalances_total", "Rebalances started (PreparingRebalance entered)")
OFFSET_COMMITS = Counter("gregor_coordinator_offset_commits_total", "Offsets committed (one per partition)")
PARTITIONS_OWNED = Gauge("gregor_coordinator_partitions_owned", "__consumer_offsets partitions served")
PARTITIONS_LOADING = Gauge("gregor_coordinator_partitions_loading", "__consumer_offsets partitions being loaded")
@dataclass(frozen=True)
class CoordinatorConfig:
    """Coordinator settings, Kafka's names and defaults."""

    offsets_topic_num_partitions: int = 50  # offsets.topic.num.partitions
    offsets_topic_replication_factor: int = 3  # offsets.topic.replication.factor (capped at live brokers)
    # offsets.topic.segment.bytes: small segments so the log cleaner compacts (and loads replay) quickly.
    offsets_topic_segment_bytes: int = 104857600
    offsets_retention_ms: int = 10080 * 60000  # offsets.retention.minutes (7 days)
    offsets_retention_check_interval_ms: int = 600000  # offsets.retention.check.interval.ms
    offsets_commit_timeout_ms: int = 5000  # offsets.commit.timeout.ms (capped at 2/5 of the lease TTL)
    lease_ttl_ms: int = 10000  # a dead coordinator's partitions move within this
    tick_interval_ms: int = 100  # session and rebalance deadlines are checked this often
    group: GroupConfig = GroupConfig()


class GroupCoordinator:
    """One coordinator instance. Concurrency: event-loop owned; background tasks for the etcd
    watches, ownership reconciliation, partition loading and the tick timer; `stopped` resolves
    (with an exception) if any of them dies or the lease is lost, so the process exits."""

    def __init__(self, coordinator_id: int, etcd: EtcdClient, host: str, port: int,
                 config: CoordinatorConfig | None = None, bootstrap: str = "") -> None:
        self.id = coordinator_id
        self.etcd = etcd
        self.host, self.port = host, port
        self.config = config or CoordinatorConfig()
        self.bootstrap = bootstrap
        self.rebalance_timer = RebalanceTimer()
        self.manager = GroupManager(self.config.group, on_rebalance=self._on_rebalance)
        COMMITTED_OFFSETS.managers[id(self)] = self.manager
        self.num_partitions = self.config.offsets_topic_num_partitions
        self.topic_partitions: dict[str, int] = {}
        self._topic_cleanups: set[asyncio.Task[None]] = set()  # offsets of deleted topics being tombstoned
        self.stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tasks: list[asyncio.Task[Any]] = []
        self.stopping = False  # stop() began (the transaction coordinator's stop sets it first)
        self._producer: Producer | None = None
        self._last_expiry_check_ms = monotonic_ms()
        # W leaves room for the keepalive cadence (TTL/4) and round trip: W + margin = half the TTL.
        write_timeout_ms = max(1, min(self.config.offsets_commit_timeout_ms, self.config.lease_ttl_ms * 2 // 5))
        self.fence = LeaseFence(etcd, self.config.lease_ttl_ms, write_timeout_ms,
                                max(50, self.config.lease_ttl_ms // 10))
        self.loader = OffsetsLoader(self.manager)
        self.offsets = ShardOwnership(etcd, coordinator_id, CoordinatorsZNode.OFFSETS_CLAIMS, ol.OFFSETS_TOPIC,
                                      self.fence, self.loader.load, self._unload, self.on_task_done,
                                      on_change=self._update_partition_gauges)
        self.offsets.num_partitions = self.num_partitions

    # The ownership view, as the servicer and the transaction coordinator read it.
    @property
    def owned(self) -> set[int]:
        return self.offsets.owned

    @property
    def loading(self) -> set[int]:
        return self.offsets.loading

    @property
    def claims(self) -> dict[int, int]:
        return self.offsets.claims

    @property
    def live(self) -> dict[int, dict[str, Any]]:
        return self.offsets.live

    @property
    def write_timeout_ms(self) -> int:
        return self.fence.write_timeout_ms

    @property
    def fence_margin_ms(self) -> int:
        return self.fence.fence_margin_ms

    @property
    def lease_id(self) -> int:
        """Our etcd lease (the transaction coordinator binds its partition claims to it too)."""
        return self.fence.lease_id

    def lease_remaining_ms(self) -> int:
        """How long our ownership lease is certainly still alive (negative once it may have expired)."""
        return self.fence.remaining_ms()

    def check_fence(self, p: int) -> None:
        self.offsets.check_fence(p)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Ensure __consumer_offsets, register in etcd, start watching and claiming partitions."""
        if not self.bootstrap:
            self.bootstrap = await etcd_bootstrap(self.etcd)  # brokers from etcd brokers/ids/*
        topic = OffsetsTopic(self.etcd, self.bootstrap, self.config.offsets_topic_num_partitions,
                             self.config.offsets_topic_replication_factor, self.config.offsets_topic_segment_bytes)
        self.num_partitions = await topic.ensure()
        # Fencing relies on these bounds: send() creates a write's batch within max.block.ms of the
        # admission check (metadata is warmed up below, so it normally does not block at all), and
        # the batch is acknowledged or abandoned within delivery.timeout.ms of its creation.
        self._producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0,
                                   "request.timeout.ms": self.write_timeout_ms,
                                   "delivery.timeout.ms": self.write_timeout_ms,
                                   "max.block.ms": self.fence_margin_ms,
                                   "client.id": f"coordinator-{self.id}"})
        await self._producer.start()
        await self._producer.metadata.wait_for_topic(ol.OFFSETS_TOPIC, 30000)
        self.loader.consumer = Consumer({"bootstrap.servers": self.bootstrap, "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest",
                                         "client.id": f"coordinator-{self.id}-loader"})
        await self.fence.grant(self._register)  # a lost lease is replaced and registered again (LeaseFence)
        self.offsets.set_num_partitions(self.num_partitions)
        for coro, name in (*self.offsets.tasks(), (self._watch_topics(), "watch-topics"),
                           (self._tick_loop(), "tick"), (self.fence.clock_loop(), "lease-clock")):
            self.spawn(coro, f"coordinator-{name}")

    async def _register(self, lease_id: int) -> None:
        await self.etcd.put(CoordinatorsZNode.id_key(self.etcd, self.id),
                            CoordinatorsZNode.encode_info(self.id, self.host, self.port), lease=lease_id)

    def spawn(self, coro: Any, name: str) -> None:
        """Run a background task whose death stops the process."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(self.on_task_done)
        self._tasks.append(task)

    async def stop(self) -> None:
        """Stop writing, let in-flight writes finish, then revoke the lease (claims vanish, survivors
        take over at once, finding every acknowledged write in the log), then close the clients."""
        COMMITTED_OFFSETS.managers.pop(id(self), None)
        self.stopping = True
        self.offsets.closing = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.offsets.release_all()  # unloads every group (NOT_COORDINATOR) and drains their writes
        await self.fence.revoke()
        for client in (self._producer, self.loader.consumer):
            if client is not None:
                try:
                    await client.close()
                except Exception as exc:  # closing must not hide the shutdown
                    log.warning("closing client: %s", exc)

    def _fail(self, exc: BaseException) -> None:
        if not self.stopped.done():
            self.stopped.set_exception(exc)

    def on_task_done(self, task: asyncio.Task[Any]) -> None:
        """Done-callback of every background task of the process (the transaction coordinator's too):
        a task that died stops the process, as does one cancelled other than by stop() (the lease clock once
        ended so, silently, and the process served on fenced for good)."""
        if task.cancelled():
            if not self.stopping:
                log.error("coordinator task %s was cancelled while the coordinator runs", task.get_name())
                self._fail(RuntimeError(f"coordinator task {task.get_name()} was cancelled"))
            return
        exc = task.exception()
        if exc is not None:
            log.error("coordinator task %s died: %r", task.get_name(), exc)
            self._fail(exc)

    def _unload(self, p: int) -> None:
        """Forget the groups of partition p; their parked requests get NOT_COORDINATOR."""
        gone = [g for g in self.manager.groups if ol.partition_for(g, self.num_partitions) == p]
        self.manager.drop_all(gone, errors.error_for(Code.NOT_COORDINATOR, f"offsets partition {p} moved away"))
        log.info("unloaded offsets partition %d (%d groups)", p, len(gone))
        self._update_partition_gauges()

    def _update_partition_gauges(self) -> None:
        PARTITIONS_OWNED.set(len(self.owned))
        PARTITIONS_LOADING.set(len(self.loading))

    # ------------------------------------------------------------------ routing
    def partition_of(self, group_id: str) -> int:
        return ol.partition_for(group_id, self.num_partitions)

    def check_owner(self, group_id: str) -> int:
        """The offsets partition of group_id if this instance serves it, else NOT_COORDINATOR / LOAD_IN_PROGRESS."""
        if not group_id:
            raise errors.error_for(Code.INVALID_GROUP_ID, "group id must not be empty")
        p = self.partition_of(group_id)
        if self.lease_remaining_ms() <= 0:
            # Paused or cut off from etcd past our lease: a successor may own p by now.
            raise errors.error_for(Code.NOT_COORDINATOR,
                                   f"coordinator {self.id} cannot be sure it still owns offsets partition {p} "
                                   f"(its lease may have expired): FindCoordinator again")
        if p in self.loading:
            raise errors.error_for(Code.COORDINATOR_LOAD_IN_PROGRESS,
                                   f"coordinator {self.id} is loading offsets partition {p} for group {group_id}")
        if p not in self.owned:
            raise errors.error_for(Code.NOT_COORDINATOR,
                                   f"coordinator {self.id} does not own group {group_id} (offsets partition {p}, "
                                   f"owner {self.claims.get(p, 'none')}): FindCoordinator again")
        return p

    def find_coordinator(self, group_id: str) -> tuple[int, str, int, int]:
        """(coordinator id, host, port, partition) of the instance serving group_id."""
        if not group_id:
            raise errors.error_for(Code.INVALID_GROUP_ID, "group id must not be empty")
        p = self.partition_of(group_id)
        owner = self.claims.get(p)
        info = self.live.get(owner) if owner is not None else None
        if info is None:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                   f"no coordinator owns offsets partition {p} of group {group_id} yet")
        return int(info["coordinator_id"]), str(info["host"]), int(info["port"]), p

    # ------------------------------------------------------------------ ListGroups
    def list_local_groups(self) -> list[Any]:
        """Groups of the offsets partitions this instance serves; LOAD_IN_PROGRESS while any of
        its partitions is loading (as Kafka's ListGroups), so no group is silently missing."""
        from gregor.rpc.v1 import coordinator_pb2 as pb

        if self.lease_remaining_ms() <= 0:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                   f"coordinator {self.id} cannot be sure it still owns its offsets partitions")
        if self.loading:
            raise errors.error_for(Code.COORDINATOR_LOAD_IN_PROGRESS,
                                   f"coordinator {self.id} is loading offsets partitions {sorted(self.loading)}")
        return [pb.GroupListing(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state.value)
                for g in sorted(self.manager.groups.values(), key=lambda g: g.group_id)
                if self.partition_of(g.group_id) in self.owned and not g.is_(GroupState.DEAD)]

    async def list_all_groups(self, timeout_s: float = 10.0) -> list[Any]:
        """Fan ListGroups out to every live instance registered in etcd (one call lists the cluster).

        Every offsets partition must be claimed by a live instance and every instance must answer,
        else a retriable COORDINATOR_NOT_AVAILABLE / LOAD_IN_PROGRESS: a partial list is never
        passed off as the whole."""
        from gregor.common.rpc import channel
        from gregor.rpc.v1 import coordinator_pb2 as pb, coordinator_pb2_grpc

        unclaimed = [p for p in range(self.num_partitions) if self.live.get(self.claims.get(p, -1)) is None]
        if unclaimed:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                   f"offsets partitions {unclaimed[:10]}{'...' if len(unclaimed) > 10 else ''} "
                                   f"have no live coordinator yet: their groups cannot be listed")

        async def remote(cid: int, info: dict[str, Any]) -> list[Any]:
            async with channel(f"{info['host']}:{info['port']}") as ch:
                stub = coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch)
                try:
                    resp = await stub.ListGroups(pb.ListGroupsRequest(), timeout=timeout_s,
                                                 metadata=(("gregor-list-scope", "local"), RELAYED_METADATA))
                except grpc.RpcError as exc:
                    err = errors.from_rpc_error(exc)
                    code = err.code if err.code == Code.COORDINATOR_LOAD_IN_PROGRESS else Code.COORDINATOR_NOT_AVAILABLE
                    raise errors.error_for(code, f"coordinator {cid} did not list its groups: {err.name}: "
                                                 f"{err.message}") from None
                return list(resp.groups)

        others = [remote(cid, info) for cid, info in sorted(self.live.items()) if cid != self.id]
        out = self.list_local_groups()
        for part in await asyncio.gather(*others):
            out.extend(part)
        return sorted(out, key=lambda g: g.group_id)

    # ------------------------------------------------------------------ durable writes
    async def append(self, p: int, records: list[tuple[bytes, bytes | None]]) -> None:
        """Write records to offsets partition p with acks=all; any failure is COORDINATOR_NOT_AVAILABLE
        (NOT_COORDINATOR if p moved away meanwhile), as Kafka maps produce errors for commits."""
        assert self._producer is not None
        async with self.offsets.writing(p):  # fenced, and drained before p is released
            try:
                handles = [await self._producer.send(ol.OFFSETS_TOPIC, value, key, partition=p)
                           for key, value in records]
                for h in handles:
                    await h
            except errors.GregorError as exc:
                raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                       f"writing to {ol.OFFSETS_TOPIC}-{p} failed: {exc.name}: {exc.message}") from exc

    def group_record(self, group: Group) -> tuple[bytes, bytes | None]:
        value = ol.GroupValue(group.protocol_type, group.generation_id, group.protocol_name, group.leader_id,
                              now_ms(), [ol.MemberValue(m.member_id, m.group_instance_id, m.client_id,
                                                        m.client_host, m.rebalance_timeout_ms, m.session_timeout_ms,
                                                        m.metadata_for(group.protocol_name), m.assignment)
                                         for m in group.members.values()])
        return ol.encode_group_key(ol.GroupKey(group.group_id)), ol.encode_group_value(value)

    async def store_group(self, group: Group) -> None:
        """Write one group's metadata now (raises COORDINATOR_NOT_AVAILABLE / NOT_COORDINATOR on failure)."""
        p = self.partition_of(group.group_id)
        if p not in self.owned:
            raise errors.error_for(Code.NOT_COORDINATOR, f"offsets partition {p} of group {group.group_id} moved away")
        await self.append(p, [self.group_record(group)])

    async def persist_dirty(self) -> None:
        """Write the metadata of groups whose generation or assignment changed (GroupMetadataManager.storeGroup)."""
        dirty, self.manager.dirty = self.manager.dirty, set()
        for gid in dirty:
            group = self.manager.groups.get(gid)
            if group is None or group.is_(GroupState.DEAD):
                continue
            p = self.partition_of(gid)
            if p not in self.owned:
                continue
            try:
                await self.append(p, [self.group_record(group)])
            except errors.GregorError as exc:
                log.warning("storing metadata of group %s failed: %s", gid, exc)

    async def commit_offsets(self, group: Group, p: int,
                             commits: list[tuple[str, int, int, int, str]]) -> None:
        """Write (topic, partition, offset, leader_epoch, metadata) commits durably, then cache them."""
        ts = now_ms()
        records: list[tuple[bytes, bytes | None]] = [
            (ol.encode_offset_key(ol.OffsetKey(group.group_id, t, part)),
             ol.encode_offset_value(ol.OffsetValue(off, epoch, meta, ts)))
            for t, part, off, epoch, meta in commits]
        await self.append(p, records)
        for t, part, off, epoch, meta in commits:
            group.offsets[(t, part)] = (off, epoch, meta, ts)
        OFFSET_COMMITS.inc(len(commits))

    async def delete_offsets_of_topic(self, topic: str) -> None:
        """Tombstone every committed offset of `topic` in the groups whose shard this coordinator owns."""
        for group in list(self.manager.groups.values()):
            tps = [tp for tp in group.offsets if tp[0] == topic]
            p = self.partition_of(group.group_id)
            if not tps or p not in self.owned or group.is_(GroupState.DEAD):
                continue
            try:
                await self.append(p, [(ol.encode_offset_key(ol.OffsetKey(group.group_id, t, part)), None)
                                      for t, part in tps])
            except errors.GregorError as exc:
                log.warning("deleting group %s's offsets of deleted topic %s failed: %s", group.group_id, topic, exc)
                continue
            for tp in tps:
                group.offsets.pop(tp, None)
            log.info("group %s: offsets of deleted topic %s removed", group.group_id, topic)

    async def delete_offsets(self, group: Group, p: int, partitions: list[tuple[str, int]]) -> None:
        """Tombstone the group's committed offsets of `partitions` (Kafka's OffsetDelete), then forget them."""
        tps = [tp for tp in partitions if tp in group.offsets]
        if tps:
            await self.append(p, [(ol.encode_offset_key(ol.OffsetKey(group.group_id, t, part)), None) for t, part in tps])
        for tp in tps:
            group.offsets.pop(tp, None)

    async def delete_group(self, group: Group, p: int) -> None:
        """Tombstone every offset and the group metadata, then drop the group (Dead)."""
        records: list[tuple[bytes, bytes | None]] = [
            (ol.encode_offset_key(ol.OffsetKey(group.group_id, t, part)), None) for t, part in group.offsets]
        records.append((ol.encode_group_key(ol.GroupKey(group.group_id)), None))
        await self.append(p, records)
        self.manager.mark_dead(group.group_id, monotonic_ms())

    # ------------------------------------------------------------------ timers and topic changes
    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_interval_ms / 1000)
            now = monotonic_ms()
            self.manager.tick(now)
            await self.persist_dirty()
            if now - self._last_expiry_check_ms >= self.config.offsets_retention_check_interval_ms:
                self._last_expiry_check_ms = now
                await self._expire_groups(now)
            self._update_group_gauges()

    async def _expire_groups(self, now: int) -> None:
        """offsets.retention.minutes: an Empty group's offsets and metadata go once it has been empty that long."""
        for group in self.manager.expired_groups(now, self.config.offsets_retention_ms):
            p = self.partition_of(group.group_id)
            if p not in self.owned:
                continue
            try:
                await self.delete_group(group, p)
                log.info("group %s expired after offsets.retention.minutes", group.group_id)
            except errors.GregorError as exc:
                log.warning("expiring group %s failed: %s", group.group_id, exc)

    def _on_rebalance(self, group: Group) -> None:
        REBALANCES.inc()
        self.rebalance_timer.started(group.group_id, monotonic_ms())

    def _update_group_gauges(self) -> None:
        counts = {s: 0 for s in GroupState}
        members = 0
        for g in self.manager.groups.values():
            counts[g.state] += 1
            members += len(g.members)
        self.rebalance_timer.observe_done(
            {g.group_id: g.state is GroupState.STABLE for g in self.manager.groups.values()}, monotonic_ms())
        for s, n in counts.items():
            GROUPS.labels(state=s.value).set(n)
        MEMBERS.set(members)

    async def _watch_topics(self) -> None:
        """Changes of topics (etcd brokers/topics/<t>) trigger rebalances of the groups subscribed to them:
        a partition-count change, a deletion, or the creation of a subscribed topic (seed 003)."""
        prefix = TopicZNode.prefix(self.etcd)
        initial = True
        while True:
            res = await self.etcd.get_prefix(prefix)
            listed: set[str] = set()
            for kv in res.kvs:
                topic = self._apply_topic(TopicZNode.topic(self.etcd, kv.key), kv.value, initial=initial)
                if topic is not None:
                    listed.add(topic)
            if not initial:
                # Re-listed after a compacted watch: topics deleted meanwhile sent no event.
                for topic in sorted(set(self.topic_partitions) - listed):
                    self._apply_topic(topic, None)
            initial = False
            try:
                async for ev in self.etcd.watch_prefix(prefix, res.revision + 1):
                    self._apply_topic(TopicZNode.topic(self.etcd, ev.key), ev.value if ev.type == "put" else None)
            except WatchCompacted:
                continue

    def _apply_topic(self, topic: str | None, value: bytes | None, initial: bool = False) -> str | None:
        """Track a topic's partition count; rebalance the subscribed groups when it changes (0 = deleted).
        topic is None for keys that are not a topic's assignment (partition states). Returns the topic."""
        if topic is None:
            return None
        if value is None:
            count = 0
        else:
            try:
                count = TopicZNode.partition_count(value)
            except (ValueError, KeyError, TypeError):
                return None
        before = self.topic_partitions.pop(topic, 0)
        if count:
            self.topic_partitions[topic] = count
        if initial or before == count:
            return topic
        if not count:
            # Kafka's handleDeletedPartitions: a deleted topic's committed offsets go with it, so a group that
            # later gets a re-created topic of that name starts from auto.offset.reset, not from the old
            # topic's offsets (KIP-516's "a different topic").
            task = asyncio.ensure_future(self.delete_offsets_of_topic(topic))
            self._topic_cleanups.add(task)
            task.add_done_callback(self._topic_cleanups.discard)
        change = ("deleted" if not count else "created" if not before
                  else f"now has {count} partitions (was {before})")
        hit = self.manager.on_topic_partitions_changed(topic, monotonic_ms(), change)
        if hit:
            log.info("topic %s %s: rebalancing %s", topic, change, hit)
        return topic
