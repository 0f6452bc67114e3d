"""Event-loop owned, one asyncio.Lock per transactional id: Kafka's TransactionCoordinator (seed 003 §6.8, KIP-98), in the group-coordinator process.

Why here: the group coordinator already owns shards of a compacted internal
topic through etcd leases, runs one process per instance with a fenced,
acks=all writer, and is where TxnOffsetCommit's offsets end up; Kafka puts the
two coordinators side by side in every broker for the same reasons. A broker
would have to grow a second ownership scheme and a client of its own.

Transactional ids are sharded by `partition_for(id)` over `__transaction_state`
(compacted, RF 3, 50 partitions as Kafka's `transaction.state.log.*`). This
instance claims partition p with `coordinators/txn-partitions/<p>` (bound to the
group coordinator's lease, so a dead instance's claims vanish with it) when the
same `desired_owner` rule as the offsets partitions names it, through the same
`ShardOwnership` (ownership.py: claim, load, drained release, fence), loads p's
state by replaying it, and then finishes every transaction found in PrepareCommit
or PrepareAbort (its decision is durable, its markers may not be). Each state change
is written with acks=all before it is acted on or answered (the same lease-based
write fence as the group coordinator's), then markers go to the partition leaders
(WriteTxnMarkers, retried until each lands, on a new leader if it moved), then
CompleteCommit / CompleteAbort is written. Ongoing transactions older than their
timeout are aborted with the epoch bumped every
`transaction.abort.timed.out.transaction.cleanup.interval.ms`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import grpc
from prometheus_client import Counter, Gauge, Histogram

from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer
from gregor.client.producer import Producer
from gregor.common import errors
from gregor.common.aio import wait_for
from gregor.common.clock import now_ms
from gregor.common.coordinator_ownership import partition_for
from gregor.common.etcd import EtcdError
from gregor.common.etcd_layout import BrokerIdsZNode, CoordinatorsZNode, TopicZNode
from gregor.common.quotas import RELAYED_METADATA
from gregor.common.rpc import channel
from gregor.coordinator import txn_metadata as tm
from gregor.coordinator.loading import partition_bounds, replay_partition
from gregor.coordinator.ownership import ShardOwnership
from gregor.coordinator.txn_metadata import TxnMetadata, TxnState
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2, coordinator_pb2, coordinator_pb2_grpc

if TYPE_CHECKING:
    from gregor.coordinator.coordinator import GroupCoordinator

log = logging.getLogger(__name__)
Code = errors.Code
TXN_TOPIC = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"
CLAIMS = CoordinatorsZNode.TXN_CLAIMS  # etcd: coordinators/txn-partitions/<p> -> holder id
MARKER_RETRY_S = 0.2  # pause before resending markers that failed retriably (a leader moved)

OPEN_TXNS = Gauge("gregor_coordinator_transactions_open", "Transactions in Ongoing or Prepare* on this instance")
TXN_ENDS = Counter("gregor_coordinator_transactions_total", "Transactions decided", ["result"])
MARKER_LATENCY = Histogram("gregor_coordinator_txn_marker_seconds",
                           "From the Prepare* write to the last marker acknowledged")
TXN_PARTITIONS_OWNED = Gauge("gregor_coordinator_txn_partitions_owned", "__transaction_state partitions served")


@dataclass(frozen=True)
class TxnConfig:
    """Kafka's transaction coordinator settings (names and defaults)."""

    num_partitions: int = 50  # transaction.state.log.num.partitions
    replication_factor: int = 3  # transaction.state.log.replication.factor (capped at live brokers)
    min_isr: int = 2  # transaction.state.log.min.isr (capped at the replication factor)
    segment_bytes: int = 104857600  # transaction.state.log.segment.bytes
    max_timeout_ms: int = 900000  # transaction.max.timeout.ms: bounds every producer's transaction.timeout.ms
    abort_timed_out_interval_ms: int = 10000  # transaction.abort.timed.out.transaction.cleanup.interval.ms


class TransactionCoordinator:
    """The transactional ids of the `__transaction_state` partitions this instance owns."""

    def __init__(self, gc: "GroupCoordinator", config: TxnConfig | None = None) -> None:
        self.gc = gc
        self.config = config or TxnConfig()
        self.num_partitions = 0  # of __transaction_state; 0 until it exists
        self.txns: dict[str, TxnMetadata] = {}
        # Claims, loads, releases (draining in-flight writes first) and fences: ownership.py, as for groups.
        self.shards = ShardOwnership(gc.etcd, gc.id, CLAIMS, TXN_TOPIC, gc.fence, self._load, self._unload,
                                     gc.on_task_done, on_change=self._update_partition_gauge)
        self._load_lock = asyncio.Lock()
        self._creating: asyncio.Task[None] | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._completing: dict[str, asyncio.Task[None]] = {}
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Clients and watches now; __transaction_state is created on the first transactional call (as Kafka
        creates it on the first FindCoordinator for a transaction), so clusters without transactions never
        carry its 50 partitions."""
        gc = self.gc
        for coro, name in (*self.shards.tasks(), (self._abort_timed_out_loop(), "timeouts"),
                           (self._wait_for_topic(), "topic")):
            task = asyncio.get_running_loop().create_task(coro, name=f"txn-coordinator-{name}")
            task.add_done_callback(gc.on_task_done)
            self._tasks.append(task)

    async def stop(self) -> None:
        """Stop admitting writes, cancel the background work, drain the writes in flight to every
        shard (the group coordinator's stop revokes the lease next: the claims go with it)."""
        self.gc.stopping = True  # the cancellations below are no task's death
        self.shards.closing = True
        for t in [*self._tasks, *self._completing.values()]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._completing.values(), return_exceptions=True)
        await self.shards.release_all()
        for client in (self._producer, self._consumer):
            if client is not None:
                try:
                    await client.close()
                except Exception as exc:
                    log.warning("closing client: %s", exc)

    async def _wait_for_topic(self) -> None:
        """Learn the partition count of __transaction_state once it exists in etcd; ownership starts then."""
        etcd, key = self.gc.etcd, TopicZNode.key(self.gc.etcd, TXN_TOPIC)
        while (kv := await etcd.get(key)) is None:
            await asyncio.sleep(0.2)
        gc = self.gc  # the writer and the loader only now: a cluster without transactions never starts them
        self._producer = Producer({"bootstrap.servers": gc.bootstrap, "acks": "all", "linger.ms": 0,
                                   "request.timeout.ms": gc.write_timeout_ms, "delivery.timeout.ms": gc.write_timeout_ms,
                                   "max.block.ms": max(gc.fence_margin_ms, 1000), "client.id": f"txn-coordinator-{gc.id}"})
        await self._producer.start()
        self._consumer = Consumer({"bootstrap.servers": gc.bootstrap, "enable.auto.commit": False,
                                   "auto.offset.reset": "earliest", "client.id": f"txn-coordinator-{gc.id}-loader"})
        await self._producer.metadata.wait_for_topic(TXN_TOPIC, 30000)
        self.num_partitions = TopicZNode.partition_count(kv.value)
        self.shards.set_num_partitions(self.num_partitions)

    def _maybe_create_topic(self) -> None:
        if self._creating is None or (self._creating.done() and self.num_partitions == 0):
            self._creating = asyncio.get_running_loop().create_task(self._create_topic(), name="create-txn-topic")

    async def _create_topic(self) -> None:
        try:
            await self._ensure_topic()
        except (errors.GregorError, EtcdError) as exc:  # the next transactional call tries again
            log.warning("creating %s failed: %s", TXN_TOPIC, exc)

    async def _ensure_topic(self) -> None:
        """Create __transaction_state (compacted, Kafka's transaction.state.log.* settings) if missing."""
        etcd, key = self.gc.etcd, TopicZNode.key(self.gc.etcd, TXN_TOPIC)
        kv = await etcd.get(key)
        if kv is None:
            brokers = len((await etcd.get_prefix(BrokerIdsZNode.prefix(etcd))).kvs)
            rf = min(self.config.replication_factor, max(brokers, 1))
            configs = {"cleanup.policy": "compact", "segment.bytes": str(self.config.segment_bytes),
                       "min.insync.replicas": str(min(self.config.min_isr, rf))}
            async with AdminClient({"bootstrap.servers": self.gc.bootstrap}) as admin:
                try:
                    await admin.create_topic(TXN_TOPIC, self.config.num_partitions, rf, configs)
                except errors.GregorError as exc:
                    if exc.code != Code.TOPIC_ALREADY_EXISTS:
                        raise
            deadline = time.monotonic() + 30
            while kv is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                kv = await etcd.get(key)
            if kv is None:
                log.warning("%s did not appear in etcd", TXN_TOPIC)

    # ------------------------------------------------------------------ ownership (ownership.py, as the offsets)
    @property
    def owned(self) -> set[int]:
        return self.shards.owned

    @property
    def loading(self) -> set[int]:
        return self.shards.loading

    @property
    def claims(self) -> dict[int, int]:
        return self.shards.claims

    @property
    def epochs(self) -> dict[int, int]:
        """Our coordinator epoch per owned partition: the etcd create revision of our claim, which grows with
        every new claim of the partition, so a stale owner's markers are older than its successor's."""
        return self.shards.epochs

    def _update_partition_gauge(self) -> None:
        TXN_PARTITIONS_OWNED.set(len(self.owned))

    def _unload(self, p: int) -> None:
        """Forget the transactional ids of partition p and stop completing their transactions (the new
        owner finds Prepare* in the log and completes them)."""
        for tid in [t for t in self.txns if self.partition_of(t) == p]:
            del self.txns[tid]
            task = self._completing.pop(tid, None)
            if task is not None:
                task.cancel()
        self._update_partition_gauge()

    async def _load(self, p: int, loading: Callable[[], bool]) -> bool:
        """Replay partition p to its high watermark, then finish the transactions left in Prepare*."""
        assert self._consumer is not None
        tp = (TXN_TOPIC, p)
        bounds = await partition_bounds(self._consumer, tp, loading)
        if bounds is None:
            return False
        begin, end = bounds
        found: dict[str, TxnMetadata | None] = {}
        if end > begin:
            async with self._load_lock:  # one loader consumer: partitions load one at a time
                async for rec in replay_partition(self._consumer, tp, begin, end, loading):
                    try:
                        tid = tm.decode_key(rec.key)
                        found[tid] = tm.decode_value(tid, rec.value) if rec.value is not None else None
                    except (ValueError, KeyError) as exc:
                        log.warning("skipping undecodable %s record at %d: %s", TXN_TOPIC, rec.offset, exc)
        if not loading():
            return False
        for tid, md in found.items():
            if md is not None:
                self.txns[tid] = md
        left = [md for md in self.txns.values() if self.partition_of(md.transactional_id) == p
                and md.state in tm.PREPARING]
        log.info("loaded %s-%d (%d transactional ids, %d to complete)", TXN_TOPIC, p, len(found), len(left))
        # Served from now on (ShardOwnership marks p owned when this returns, before the loop runs again).
        loop = asyncio.get_running_loop()
        for md in left:
            loop.call_soon(self._complete_in_background, md)
        self._update_gauges()
        return True

    # ------------------------------------------------------------------ routing and writes
    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions) if self.num_partitions else -1

    def check_owner(self, transactional_id: str) -> int:
        if not transactional_id:
            raise errors.error_for(Code.INVALID_REQUEST, "transactional id must not be empty")
        if self.num_partitions == 0:
            self._maybe_create_topic()
            raise errors.error_for(Code.COORDINATOR_LOAD_IN_PROGRESS, f"{TXN_TOPIC} is being created")
        p = self.partition_of(transactional_id)
        if p in self.loading:
            raise errors.error_for(Code.COORDINATOR_LOAD_IN_PROGRESS,
                                   f"coordinator {self.gc.id} is loading {TXN_TOPIC}-{p}")
        if p not in self.owned or self.gc.lease_remaining_ms() <= 0:
            raise errors.error_for(Code.NOT_COORDINATOR,
                                   f"coordinator {self.gc.id} does not own transactional id {transactional_id} "
                                   f"({TXN_TOPIC}-{p}, owner {self.claims.get(p, 'none')}): FindCoordinator again")
        return p

    def find_coordinator(self, transactional_id: str) -> tuple[int, str, int, int]:
        p = self.partition_of(transactional_id)
        owner = self.claims.get(p)
        info = self.gc.live.get(owner) if owner is not None else None
        if info is None:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE, f"no coordinator owns {TXN_TOPIC}-{p} yet")
        return int(info["coordinator_id"]), str(info["host"]), int(info["port"]), p

    def lock(self, transactional_id: str) -> asyncio.Lock:
        return self._locks.setdefault(transactional_id, asyncio.Lock())

    async def write(self, md: TxnMetadata) -> TxnMetadata:
        """Write md to its __transaction_state partition (acks=all, fenced by our lease), then cache it."""
        assert self._producer is not None
        p = self.partition_of(md.transactional_id)
        async with self.shards.writing(p):  # fenced by the lease; a release waits for it
            try:
                await (await self._producer.send(TXN_TOPIC, tm.encode_value(md), tm.encode_key(md.transactional_id),
                                                 partition=p))
            except errors.GregorError as exc:
                raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                       f"writing to {TXN_TOPIC}-{p} failed: {exc.name}: {exc.message}") from exc
        self.txns[md.transactional_id] = md
        self._update_gauges()
        return md

    def _update_gauges(self) -> None:
        OPEN_TXNS.set(sum(1 for md in self.txns.values() if md.state is TxnState.ONGOING or md.state in tm.PREPARING))

    # ------------------------------------------------------------------ markers and completion
    def _complete_in_background(self, md: TxnMetadata) -> None:
        tid = md.transactional_id
        if tid in self._completing and not self._completing[tid].done():
            return
        task = asyncio.get_running_loop().create_task(self._complete(md), name=f"complete-txn-{tid}")
        self._completing[tid] = task

    async def _complete(self, md: TxnMetadata) -> None:
        """Markers to every partition, the pending offsets to their groups, then Complete*; retried until done
        (or until this instance loses the partition: the new owner finds Prepare* and does the same)."""
        start = time.monotonic()
        commit = md.state is TxnState.PREPARE_COMMIT
        while True:
            try:
                await self.write_markers(md, commit)
                if commit:
                    await self._commit_pending_offsets(md)
                async with self.lock(md.transactional_id):
                    current = self.txns.get(md.transactional_id)
                    if current is not None and current.state is md.state and current.producer_epoch == md.producer_epoch:
                        await self.write(tm.complete(current, now_ms()))
                break
            except Exception as exc:  # anything but cancellation: retry, the decision is durable
                if self.partition_of(md.transactional_id) not in self.owned:
                    return
                log.warning("completing transaction %s failed (%r); retrying", md.transactional_id, exc)
                await asyncio.sleep(MARKER_RETRY_S)
        MARKER_LATENCY.observe(time.monotonic() - start)
        TXN_ENDS.labels(result="commit" if commit else "abort").inc()

    async def write_markers(self, md: TxnMetadata, commit: bool) -> None:
        """WriteTxnMarkers to the leader of every partition of md until each one is written."""
        assert self._producer is not None
        metadata = self._producer.metadata
        left = set(md.partitions)
        while left:
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for topic, part in sorted(left):
                try:
                    await metadata.wait_for_topic(topic, 5000)
                except errors.GregorError:
                    left.discard((topic, part))  # the topic is gone: nothing to mark
                    continue
                by_leader.setdefault(metadata.leader_for(topic, part), []).append((topic, part))
            for leader, tps in by_leader.items():
                if leader < 0:
                    metadata.request_update()
                    continue
                req = broker_pb2.WriteTxnMarkersRequest(timeout_ms=self.gc.write_timeout_ms, markers=[
                    broker_pb2.WriteTxnMarker(producer_id=md.producer_id, producer_epoch=md.producer_epoch,
                                              committed=commit, coordinator_epoch=self.coordinator_epoch(md),
                                              partitions=[common_pb2.TopicPartition(topic=t, partition=p)
                                                          for t, p in tps])])
                try:
                    resp = await metadata.broker_stub(leader).WriteTxnMarkers(
                        req, timeout=self.gc.write_timeout_ms / 1000 + 1)
                except grpc.RpcError as exc:
                    log.info("WriteTxnMarkers to broker %d failed: %s", leader, errors.from_rpc_error(exc))
                    metadata.request_update()
                    continue
                for r in resp.results:
                    code = r.error.code
                    if code == Code.NONE or code == Code.UNKNOWN_TOPIC_OR_PARTITION and r.topic not in metadata.topics:
                        left.discard((r.topic, r.partition))
                    elif code in (Code.TRANSACTION_COORDINATOR_FENCED, Code.INVALID_PRODUCER_EPOCH):
                        # A newer coordinator or epoch already wrote here: this transaction's outcome is decided.
                        log.warning("marker for %s on %s-%d refused: %s", md.transactional_id, r.topic, r.partition,
                                    r.error.message)
                        left.discard((r.topic, r.partition))
                    else:
                        metadata.request_update()
            if left:
                await asyncio.sleep(MARKER_RETRY_S)

    def coordinator_epoch(self, md: TxnMetadata) -> int:
        """Kafka's coordinator epoch is the __transaction_state partition's leader epoch; here ownership moves
        through etcd claims, so it is the create revision of our claim on the id's partition."""
        return self.epochs.get(self.partition_of(md.transactional_id), 0)

    async def _commit_pending_offsets(self, md: TxnMetadata) -> None:
        """A committed transaction's consumer offsets become the groups' committed offsets (OffsetCommit
        to each group's coordinator, idempotent, so a retry or a successor may write them again)."""
        for group_id, offsets in md.pending_offsets.items():
            _, host, port, _ = self.gc.find_coordinator(group_id)
            async with channel(f"{host}:{port}") as ch:
                req = coordinator_pb2.OffsetCommitRequest(group_id=group_id, generation_id=-1, member_id="",
                                                          transactional=True)
                for (topic, part), (offset, meta) in sorted(offsets.items()):
                    req.partitions.add(topic=topic, partition=part, offset=offset, metadata=meta)
                try:
                    resp = await coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch).OffsetCommit(
                        req, timeout=self.gc.write_timeout_ms / 1000 + 1, metadata=(RELAYED_METADATA,))
                except grpc.RpcError as exc:
                    raise errors.from_rpc_error(exc) from None
            failed = [r for r in resp.results if r.error.code]
            if failed:
                raise errors.error_for(failed[0].error.code, f"committing transactional offsets of group "
                                                             f"{group_id}: {failed[0].error.message}")

    # ------------------------------------------------------------------ timeouts
    async def _abort_timed_out_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.abort_timed_out_interval_ms / 1000)
            now = now_ms()
            for md in [m for m in self.txns.values() if m.is_expired(now)]:
                tid = md.transactional_id
                try:
                    async with self.lock(tid):
                        current = self.txns.get(tid)
                        if current is None or not current.is_expired(now_ms()):
                            continue
                        log.info("transaction %s timed out after %d ms: aborting", tid, current.timeout_ms)
                        self._complete_in_background(await self.write(tm.fence_and_abort(current, now_ms())))
                except errors.GregorError as exc:
                    log.warning("aborting timed-out transaction %s failed: %s", tid, exc)

    # ------------------------------------------------------------------ requests (txn_server.py translates)
    async def _new_producer_id(self) -> int:
        """A fresh producer id from a broker's block (InitProducerId without a transactional id)."""
        assert self._producer is not None
        md = self._producer.metadata
        try:
            resp = await broker_pb2_grpc.BrokerServiceStub(md.channel(md.any_address())).InitProducerId(
                broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=15)
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None
        return int(resp.producer_id)

    async def init_producer_id(self, tid: str, timeout_ms: int) -> tuple[int, int]:
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            raise errors.error_for(Code.INVALID_TRANSACTION_TIMEOUT,
                                   f"transaction.timeout.ms {timeout_ms} must be in (0, transaction.max.timeout.ms="
                                   f"{self.config.max_timeout_ms}]")
        self.check_owner(tid)
        async with self.lock(tid):
            md = self.txns.get(tid)
            if md is not None and md.state is TxnState.ONGOING:
                md = await self.write(tm.fence_and_abort(md, now_ms()))  # the previous instance's transaction
            if md is not None and md.state in tm.PREPARING:
                self._complete_in_background(md)
                raise errors.error_for(Code.CONCURRENT_TRANSACTIONS,
                                       f"transaction {tid} of the previous instance is being completed: retry")
            fresh = (await self._new_producer_id()
                     if md is None or md.producer_epoch + 1 >= tm.MAX_PRODUCER_EPOCH else tm.NO_PRODUCER_ID)
            new = await self.write(tm.init_producer_id(md, tid, timeout_ms, now_ms(), lambda: fresh))
        return new.producer_id, new.producer_epoch

    def _current(self, tid: str) -> TxnMetadata:
        self.check_owner(tid)
        md = self.txns.get(tid)
        if md is None:
            raise errors.error_for(Code.INVALID_PRODUCER_ID_MAPPING,
                                   f"transactional id {tid} has no producer id: call init_transactions() first")
        return md

    async def _after_completion(self, tid: str) -> None:
        """Wait (bounded) for the previous transaction's markers, so the next transaction's first call is not
        answered CONCURRENT_TRANSACTIONS and retried after a client backoff (the common case right after a
        commit: EndTxn answers once the decision is durable, the markers follow)."""
        task = self._completing.get(tid)
        if task is not None and not task.done():
            try:
                await wait_for(asyncio.shield(task), self.gc.write_timeout_ms / 1000)
            except (asyncio.TimeoutError, Exception):  # still running or failed: the state decides below
                pass

    async def add_partitions(self, tid: str, pid: int, epoch: int, partitions: set[tuple[str, int]]) -> None:
        await self._after_completion(tid)
        async with self.lock(tid):
            new = tm.add_partitions(self._current(tid), pid, epoch, partitions, now_ms())
            if new is not None:
                await self.write(new)

    async def add_offsets(self, tid: str, pid: int, epoch: int, group_id: str) -> None:
        if not group_id:
            raise errors.error_for(Code.INVALID_GROUP_ID, "group id must not be empty")
        await self._after_completion(tid)
        async with self.lock(tid):
            md = self._current(tid)
            new = tm.add_partitions(md, pid, epoch, set(), now_ms()) or md
            if group_id not in new.groups:
                new = new.to(TxnState.ONGOING, now_ms(), groups=new.groups | {group_id})
            if new is not md:
                await self.write(new)

    async def txn_offset_commit(self, tid: str, pid: int, epoch: int, group_id: str,
                                offsets: dict[tuple[str, int], tuple[int, str]], generation_id: int = -1,
                                member_id: str = "", group_instance_id: str = "") -> None:
        """Keep offsets with the transaction, once the group's coordinator has accepted their sender (KIP-447):
        a consumer that lost its partitions in a rebalance (older generation, removed, or replaced by its
        group.instance.id) cannot commit their offsets, so its transaction must abort. Both the gRPC and the
        Kafka-protocol TxnOffsetCommit end here, so both are checked."""
        md = self._current(tid)
        tm.txn_offset_commit(md, pid, epoch, group_id, offsets, now_ms())  # producer and state checks first
        await self._validate_group_member(group_id, generation_id, member_id, group_instance_id)
        async with self.lock(tid):
            await self.write(tm.txn_offset_commit(self._current(tid), pid, epoch, group_id, offsets, now_ms()))

    async def _validate_group_member(self, group_id: str, generation_id: int, member_id: str,
                                     group_instance_id: str) -> None:
        """GroupCoordinatorService.ValidateTxnOffsetCommit on the group's coordinator (maybe this process)."""
        try:
            _, host, port, _ = self.gc.find_coordinator(group_id)
        except errors.GregorError as exc:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                   f"no coordinator of group {group_id} to check the offsets' sender: {exc.message}")
        req = coordinator_pb2.ValidateTxnOffsetCommitRequest(group_id=group_id, generation_id=generation_id,
                                                             member_id=member_id, group_instance_id=group_instance_id)
        async with channel(f"{host}:{port}") as ch:
            try:
                await coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch).ValidateTxnOffsetCommit(
                    req, timeout=self.gc.write_timeout_ms / 1000 + 1)
            except grpc.RpcError as exc:
                err = errors.from_rpc_error(exc)
                if err.code == Code.NOT_COORDINATOR:
                    # The group's shard moved, not the transaction's: NOT_COORDINATOR would tell the producer
                    # that we are not its transaction coordinator. Retriable all the same.
                    raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                           f"group {group_id}'s coordinator moved: {err.message}") from None
                raise err from None

    async def end_txn(self, tid: str, pid: int, epoch: int, commit: bool) -> None:
        async with self.lock(tid):
            md = self._current(tid)
            new = tm.end_txn(md, pid, epoch, commit, now_ms())
            if new is None:
                if md.state in tm.PREPARING:
                    self._complete_in_background(md)
                return
            self._complete_in_background(await self.write(new))

    def describe(self, tid: str) -> TxnMetadata:
        self.check_owner(tid)
        md = self.txns.get(tid)
        if md is None:
            raise errors.error_for(Code.TRANSACTIONAL_ID_NOT_FOUND, f"transactional id {tid} is not known")
        return md
