"""The group coordinator process: etcd membership, offsets-partition ownership, loading and durable offsets.

Kafka's GroupCoordinator + GroupMetadataManager (seed 003) over etcd: groups are
sharded by the __consumer_offsets partition their id hashes to; this instance
serves the partitions it has claimed (see common/coordinator_ownership.py), loads each one's
committed offsets and group metadata from the log when it takes it over
(COORDINATOR_LOAD_IN_PROGRESS meanwhile) and answers NOT_COORDINATOR for the
others. Offsets and group metadata are written to the log with acks=all before
they are acknowledged or served.

Fencing (docs/groups.md "Fencing"): an instance writes to an offsets partition only
while its etcd lease — which the partition's claim key is bound to, and whose
expiry is what lets a successor claim the partition — is certainly still alive:
the lease cannot expire before (send time of the last acknowledged keepalive) +
TTL on our monotonic clock, and a write is admitted only if it is certain to be
acknowledged or abandoned by the producer (delivery.timeout.ms = the write
timeout) a safety margin before that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import grpc
from prometheus_client import Counter, Gauge

from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer
from gregor.client.producer import Producer
from gregor.common import errors
from gregor.common.clock import monotonic_ms, now_ms
from gregor.common.etcd import Delete, EtcdClient, EtcdError, Lease, WatchCompacted, lease_ttl_s, value_is
from gregor.common.etcd_layout import BrokerIdsZNode, CoordinatorKey, CoordinatorsZNode, TopicZNode
from gregor.common.metrics_reporter import etcd_bootstrap
from gregor.coordinator import offsets_log as ol
from gregor.coordinator.coordinator_metrics import COMMITTED_OFFSETS, RebalanceTimer
from gregor.coordinator.group import Group, GroupState, Member
from gregor.coordinator.group_manager import GroupConfig, GroupManager
from gregor.common.coordinator_ownership import apply_coordinator_key, desired_partitions

log = logging.getLogger(__name__)
Code = errors.Code

GROUPS = Gauge("gregor_coordinator_groups", "Groups owned by this coordinator, by state", ["state"])
MEMBERS = Gauge("gregor_coordinator_members", "Members of the groups owned by this coordinator")
REBALANCES = Counter("gregor_coordinator_rebalances_total", "Rebalances started (PreparingRebalance entered)")
OFFSET_COMMITS = Counter("gregor_coordinator_offset_commits_total", "Offsets committed (one per partition)")
PARTITIONS_OWNED = Gauge("gregor_coordinator_partitions_owned", "__consumer_offsets partitions served")
PARTITIONS_LOADING = Gauge("gregor_coordinator_partitions_loading", "__consumer_offsets partitions being loaded")


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


async def reconcile_forever(needed: asyncio.Event, reconcile: Any, what: str) -> None:
    """Run reconcile() whenever `needed` is set (etcd views changed); an etcd failure retries it shortly.
    Shared by the offsets partitions' and the transaction partitions' ownership."""
    while True:
        await needed.wait()
        needed.clear()
        try:
            await reconcile()
        except EtcdError as exc:
            log.warning("%s reconcile failed, retrying: %s", what, exc)
            await asyncio.sleep(0.5)
            needed.set()


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
        self.owned: set[int] = set()  # claimed and loaded
        self.loading: set[int] = set()  # claimed, load in progress
        self.claims: dict[int, int] = {}  # partition -> coordinator id (etcd view)
        self.live: dict[int, dict[str, Any]] = {}  # coordinator id -> registration
        self.topic_partitions: dict[str, int] = {}
        self.stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lease: Lease | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._reconcile_needed = asyncio.Event()
        self._load_lock = asyncio.Lock()
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._last_expiry_check_ms = monotonic_ms()
        # Fencing: the lease is certainly alive until this monotonic instant (see module docstring).
        self._lease_valid_until_ms = 0
        # W leaves room for the keepalive cadence (TTL/4) and round trip: W + margin = half the TTL.
        self.write_timeout_ms = max(1, min(self.config.offsets_commit_timeout_ms, self.config.lease_ttl_ms * 2 // 5))
        self.fence_margin_ms = max(50, self.config.lease_ttl_ms // 10)
        self._inflight: dict[int, int] = {}  # offsets partition -> writes sent and not yet finished
        self._closing = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Ensure __consumer_offsets, register in etcd, start watching and claiming partitions."""
        if not self.bootstrap:
            self.bootstrap = await etcd_bootstrap(self.etcd)  # brokers from etcd brokers/ids/*
        await self._ensure_offsets_topic()
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
        self._consumer = Consumer({"bootstrap.servers": self.bootstrap, "enable.auto.commit": False,
                                   "auto.offset.reset": "earliest", "client.id": f"coordinator-{self.id}-loader"})
        granted_at = monotonic_ms()
        self._lease = await self.etcd.grant_lease(lease_ttl_s(self.config.lease_ttl_ms))
        self._lease_valid_until_ms = granted_at + self._lease.ttl_s * 1000
        self._lease.on_lost(lambda exc: self._fail(exc))
        await self.etcd.put(CoordinatorsZNode.id_key(self.etcd, self.id),
                            CoordinatorsZNode.encode_info(self.id, self.host, self.port),
                            lease=self._lease.id)
        for coro, name in ((self._watch_coordinators(), "watch-coordinators"),
                           (self._watch_topics(), "watch-topics"),
                           (self._reconcile_loop(), "reconcile"), (self._tick_loop(), "tick"),
                           (self._lease_clock_loop(), "lease-clock")):
            task = asyncio.get_running_loop().create_task(coro, name=f"coordinator-{name}")
            task.add_done_callback(self._on_task_done)
            self._tasks.append(task)

    async def stop(self) -> None:
        """Stop writing, let in-flight writes finish, then revoke the lease (claims vanish, survivors
        take over at once, finding every acknowledged write in the log), then close the clients."""
        COMMITTED_OFFSETS.managers.pop(id(self), None)
        self._closing = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.manager.drop_all(list(self.manager.groups), errors.error_for(Code.NOT_COORDINATOR, "shutting down"))
        for p in list(self._inflight):
            await self._drain(p)
        if self._lease is not None:
            await self._lease.revoke()
        for client in (self._producer, self._consumer):
            if client is not None:
                try:
                    await client.close()
                except Exception as exc:  # closing must not hide the shutdown
                    log.warning("closing client: %s", exc)

    def _fail(self, exc: BaseException) -> None:
        if not self.stopped.done():
            self.stopped.set_exception(exc)

    def _on_task_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("coordinator task %s died: %r", task.get_name(), exc)
            self._fail(exc)

    async def _ensure_offsets_topic(self) -> None:
        """Create __consumer_offsets through the controller if missing; learn its real partition count."""
        key = TopicZNode.key(self.etcd, ol.OFFSETS_TOPIC)
        kv = await self.etcd.get(key)
        if kv is None:
            brokers = len((await self.etcd.get_prefix(BrokerIdsZNode.prefix(self.etcd))).kvs)
            rf = min(self.config.offsets_topic_replication_factor, max(brokers, 1))
            if rf < self.config.offsets_topic_replication_factor:
                log.warning("offsets.topic.replication.factor %d capped at %d live brokers",
                            self.config.offsets_topic_replication_factor, rf)
            await self._create_offsets_topic(rf)
            deadline = time.monotonic() + 30
            while kv is None and time.monotonic() < deadline:
                kv = await self.etcd.get(key)
                if kv is None:
                    await asyncio.sleep(0.1)
            if kv is None:
                raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE, f"{ol.OFFSETS_TOPIC} did not appear in etcd")
        else:
            await self._check_offsets_topic_configs()
        self.num_partitions = TopicZNode.partition_count(kv.value)
        if self.num_partitions != self.config.offsets_topic_num_partitions:
            log.warning("%s has %d partitions, not offsets.topic.num.partitions %d: using %d", ol.OFFSETS_TOPIC,
                        self.num_partitions, self.config.offsets_topic_num_partitions, self.num_partitions)

    def offsets_topic_configs(self) -> dict[str, str]:
        """The topic configs __consumer_offsets is created with (Kafka's GroupMetadataManager.offsetsTopicConfigs)."""
        return {"cleanup.policy": "compact", "segment.bytes": str(self.config.offsets_topic_segment_bytes)}

    async def _create_offsets_topic(self, rf: int) -> None:
        """CreateTopics through the controller, retrying retriable errors for a minute.

        A refused config (INVALID_CONFIG) is fatal: without compaction the topic would grow
        without bound and every takeover would replay all of it, so the coordinator does not
        start rather than run on an uncompacted offsets topic."""
        configs = self.offsets_topic_configs()
        deadline = time.monotonic() + 60
        async with AdminClient({"bootstrap.servers": self.bootstrap}) as admin:
            while True:
                try:
                    await admin.create_topic(ol.OFFSETS_TOPIC, self.config.offsets_topic_num_partitions, rf, configs)
                    log.info("created %s (%d partitions, RF %d, %s)", ol.OFFSETS_TOPIC,
                             self.config.offsets_topic_num_partitions, rf, configs)
                    return
                except errors.GregorError as exc:
                    if exc.code == Code.TOPIC_ALREADY_EXISTS:
                        return
                    if not exc.retriable or time.monotonic() > deadline:
                        log.error("cannot create %s with %s: %s: %s", ol.OFFSETS_TOPIC, configs, exc.name, exc.message)
                        raise errors.error_for(exc.code, f"creating {ol.OFFSETS_TOPIC} (RF {rf}, {configs}) failed: "
                                                         f"{exc.name}: {exc.message}") from exc
                    await asyncio.sleep(0.5)

    async def _check_offsets_topic_configs(self) -> None:
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

    # ------------------------------------------------------------------ ownership
    async def _watch_coordinators(self) -> None:
        prefix = CoordinatorsZNode.prefix(self.etcd)
        while True:
            res = await self.etcd.get_prefix(prefix)
            self.live, self.claims = {}, {}
            for kv in res.kvs:
                self._apply_coordinator_kv(CoordinatorsZNode.parse(self.etcd, kv.key), kv.value)
            self._reconcile_needed.set()
            try:
                async for ev in self.etcd.watch_prefix(prefix, res.revision + 1):
                    self._apply_coordinator_kv(CoordinatorsZNode.parse(self.etcd, ev.key),
                                               ev.value if ev.type == "put" else None)
                    self._reconcile_needed.set()
            except WatchCompacted:
                continue

    def _apply_coordinator_kv(self, key: CoordinatorKey | None, value: bytes | None) -> None:
        apply_coordinator_key(self.live, self.claims, key, value)

    async def _reconcile_loop(self) -> None:
        await reconcile_forever(self._reconcile_needed, self._reconcile, "ownership")

    async def _reconcile(self) -> None:
        """Release partitions that moved away, claim (and load) the ones that moved here."""
        assert self._lease is not None
        want = desired_partitions(self.id, list(self.live), self.num_partitions) if self.id in self.live else set()
        mine = self.owned | self.loading
        for p in sorted(mine - want):
            self._unload(p)
            await self._drain(p)  # the successor must find every write we sent in the log
            await self.etcd.txn([value_is(self._claim_key(p), CoordinatorsZNode.encode_claim(self.id))],
                                [Delete(self._claim_key(p))])
        for p in sorted(want - mine):
            holder = self.claims.get(p)
            if holder is not None and holder != self.id:
                continue  # the old owner releases it (or its lease expires); the watch brings us back
            if holder is None:
                res = await self.etcd.create_if_absent(self._claim_key(p), CoordinatorsZNode.encode_claim(self.id),
                                                       self._lease.id)
                if not res:
                    continue
                self.claims[p] = self.id
            self.loading.add(p)
            task = asyncio.get_running_loop().create_task(self._load(p), name=f"load-offsets-{p}")
            task.add_done_callback(self._on_task_done)
        self._update_partition_gauges()

    async def _drain(self, p: int) -> None:
        """Wait for the writes in flight to partition p (each ends within write_timeout_ms)."""
        while self._inflight.get(p):
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------ fencing
    async def _lease_clock_loop(self) -> None:
        """Keep `_lease_valid_until_ms` = send time of the last acknowledged keepalive + granted TTL.

        etcd extends a lease to (time it processes the keepalive) + TTL, which is after we sent it,
        so the lease cannot expire before our bound (one host, one monotonic clock rate). The
        Lease object's own keepalive also refreshes; this loop only measures, every TTL/4."""
        assert self._lease is not None
        interval_s = self._lease.ttl_s / 4
        while True:
            await asyncio.sleep(interval_s)
            sent = monotonic_ms()
            try:
                ttl = await self.etcd.refresh_lease(self._lease.id, timeout_s=interval_s)
            except EtcdError as exc:
                log.info("lease clock: keepalive failed (%s); writes stop %d ms before the lease can expire",
                         exc, self.write_timeout_ms + self.fence_margin_ms)
                continue
            if ttl > 0:
                self._lease_valid_until_ms = max(self._lease_valid_until_ms, sent + ttl * 1000)

    @property
    def lease_id(self) -> int:
        """Our etcd lease (the transaction coordinator binds its partition claims to it too)."""
        assert self._lease is not None
        return self._lease.id

    def lease_remaining_ms(self) -> int:
        """How long our ownership lease is certainly still alive (negative once it may have expired)."""
        return self._lease_valid_until_ms - monotonic_ms()

    def check_fence(self, p: int) -> None:
        """Admit a write to offsets partition p only if it ends (acknowledged or abandoned by the
        producer) a safety margin before our lease — and with it our claim on p — can expire."""
        if self._closing or p not in self.owned:
            raise errors.error_for(Code.NOT_COORDINATOR, f"coordinator {self.id} no longer owns offsets partition {p}")
        remaining = self.lease_remaining_ms()
        if remaining < self.write_timeout_ms + self.fence_margin_ms:
            raise errors.error_for(
                Code.NOT_COORDINATOR,
                f"coordinator {self.id} is fenced from offsets partition {p}: its ownership lease is only certain "
                f"for {remaining} ms, less than the write timeout {self.write_timeout_ms} ms + margin "
                f"{self.fence_margin_ms} ms (a successor may take over): FindCoordinator again")

    def _claim_key(self, p: int) -> bytes:
        return CoordinatorsZNode.claim_key(self.etcd, CoordinatorsZNode.OFFSETS_CLAIMS, p)

    def _unload(self, p: int) -> None:
        """Forget the groups of partition p; their parked requests get NOT_COORDINATOR."""
        self.owned.discard(p)
        self.loading.discard(p)
        gone = [g for g in self.manager.groups if ol.partition_for(g, self.num_partitions) == p]
        self.manager.drop_all(gone, errors.error_for(Code.NOT_COORDINATOR, f"offsets partition {p} moved away"))
        log.info("unloaded offsets partition %d (%d groups)", p, len(gone))
        self._update_partition_gauges()

    def _update_partition_gauges(self) -> None:
        PARTITIONS_OWNED.set(len(self.owned))
        PARTITIONS_LOADING.set(len(self.loading))

    # ------------------------------------------------------------------ loading
    async def _load(self, p: int) -> None:
        """Replay partition p of __consumer_offsets up to its high watermark (GroupMetadataManager.loadGroupsAndOffsets)."""
        assert self._consumer is not None
        start = time.monotonic()
        async with self._load_lock:
            if p not in self.loading:
                return
            tp = (ol.OFFSETS_TOPIC, p)
            while True:
                try:
                    end = await self._consumer.list_offset(tp, -1)
                    begin = await self._consumer.list_offset(tp, -2)
                    break
                except errors.GregorError as exc:
                    log.info("load of offsets partition %d waits: %s", p, exc)
                    await asyncio.sleep(0.5)
                    if p not in self.loading:
                        return
            offsets: dict[str, dict[tuple[str, int], ol.OffsetValue | None]] = {}
            groups: dict[str, ol.GroupValue | None] = {}
            if end > begin:
                async for rec in replay_partition(self._consumer, tp, begin, end, lambda: p in self.loading):
                    self._replay(rec.key, rec.value, offsets, groups)
            if p not in self.loading:
                return
            self._install(p, offsets, groups)
            self.loading.discard(p)
            self.owned.add(p)
            self._update_partition_gauges()
            log.info("loaded offsets partition %d (offsets %d..%d, %d groups) in %.0f ms", p, begin, end,
                     len(set(offsets) | set(groups)), (time.monotonic() - start) * 1000)

    @staticmethod
    def _replay(key: bytes, value: bytes | None, offsets: dict[str, dict[tuple[str, int], ol.OffsetValue | None]],
                groups: dict[str, ol.GroupValue | None]) -> None:
        try:
            k = ol.decode_key(key)
            if isinstance(k, ol.OffsetKey):
                offsets.setdefault(k.group, {})[(k.topic, k.partition)] = (
                    ol.decode_offset_value(value) if value is not None else None)
            else:
                groups[k.group] = ol.decode_group_value(value) if value is not None else None
        except errors.GregorError as exc:
            log.warning("skipping undecodable %s record: %s", ol.OFFSETS_TOPIC, exc)

    def _install(self, p: int, offsets: dict[str, dict[tuple[str, int], ol.OffsetValue | None]],
                 groups: dict[str, ol.GroupValue | None]) -> None:
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
                                                 metadata=(("gregor-list-scope", "local"),))
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
        self.check_fence(p)
        self._inflight[p] = self._inflight.get(p, 0) + 1
        try:
            handles = [await self._producer.send(ol.OFFSETS_TOPIC, value, key, partition=p) for key, value in records]
            for h in handles:
                await h
        except errors.GregorError as exc:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                   f"writing to {ol.OFFSETS_TOPIC}-{p} failed: {exc.name}: {exc.message}") from exc
        finally:
            self._inflight[p] -= 1
            if not self._inflight[p]:
                del self._inflight[p]
        if p not in self.owned:
            raise errors.error_for(Code.NOT_COORDINATOR, f"offsets partition {p} moved away during the write")

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
        change = ("deleted" if not count else "created" if not before
                  else f"now has {count} partitions (was {before})")
        hit = self.manager.on_topic_partitions_changed(topic, monotonic_ms(), change)
        if hit:
            log.info("topic %s %s: rebalancing %s", topic, change, hit)
        return topic
