"""Control requests (LeaderAndIsr, StopReplica, UpdateMetadata) and the per-event batch that collects them."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Iterable

from gregor.controller.state import NO_LEADER, ControllerContext, LeaderAndIsr, TopicPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionStateInfo:
    """What a broker is told about one partition: its leadership and replica assignment."""

    topic_partition: TopicPartition
    leader_and_isr: LeaderAndIsr
    replicas: tuple[int, ...]
    is_new: bool = False
    # UpdateMetadata: replicas of live brokers in an offline log dir (ctx.replicas_on_offline_dirs).
    offline_replicas: tuple[int, ...] = ()


@dataclass(frozen=True)
class LeaderAndIsrRequest:
    """Makes the receiving broker leader or follower for each listed partition.

    Every control request carries the controller's id and epoch, and the epoch
    of the broker it is addressed to, so brokers can drop requests from an
    older controller or meant for an earlier incarnation of themselves.
    """

    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: tuple[PartitionStateInfo, ...]
    live_leaders: tuple[int, ...]


@dataclass(frozen=True)
class StopReplicaRequest:
    """Stops the listed replicas on the receiving broker; `delete_partition` also removes their logs."""

    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partitions: tuple[tuple[TopicPartition, bool], ...]


@dataclass(frozen=True)
class UpdateMetadataRequest:
    """Refreshes the receiving broker's metadata cache: live brokers and partition states."""

    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: tuple[PartitionStateInfo, ...]
    live_brokers: tuple[int, ...]


ControlRequest = LeaderAndIsrRequest | StopReplicaRequest | UpdateMetadataRequest


# Re-runs a transition against a partition state read back from etcd: the new state to
# store, the argument itself when nothing needs to change any more, or None when the
# transition no longer applies (e.g. no leader can be elected from the new ISR).
Recompute = Callable[[LeaderAndIsr], "LeaderAndIsr | None"]

# One write plus this many re-runs after failed compares (Kafka loops; we bound it).
MAX_PARTITION_STATE_WRITE_ATTEMPTS = 5
# Partitions whose state an event writes at once (perform_partition_state_writes; etcd commits them together).
PARTITION_STATE_WRITE_CONCURRENCY = 64
# Partitions per etcd transaction when an event writes each partition once (a creation, a broker's failover):
# with the controller's epoch guard that is 101 compares, 100 puts and, to say which compare failed, 101 reads,
# under etcd's default --max-txn-ops of 128.
PARTITION_STATE_WRITE_BATCH = 100


@dataclass(frozen=True)
class PartitionStateWrite:
    """A conditional write of a partition's state to etcd.

    `expected_partition_epoch` is None for a create (the key must not exist);
    otherwise the stored state must still carry that partition epoch. The new
    state carries `expected + 1` (or the initial epoch for a create).
    `recompute` re-runs the transition that produced `new_state` against a fresher
    state (Kafka's updateLeaderAndIsr retry after a zkVersion mismatch); None: no retry.
    """

    topic_partition: TopicPartition
    expected_partition_epoch: int | None
    new_state: LeaderAndIsr
    recompute: Recompute | None = field(default=None, compare=False, repr=False)

    def rerun(self, current: LeaderAndIsr, controller_epoch: int) -> tuple["PartitionStateWrite | None", LeaderAndIsr | None]:
        """The same transition against `current` (the state etcd holds now).

        Returns (write, state): (a new conditional write, the state it stores), or
        (None, current) when current already is what the transition wanted, or
        (None, None) when it cannot be re-run: a create, no recompute, a state
        written by a newer controller, or a transition that no longer applies.
        """
        if self.recompute is None or self.expected_partition_epoch is None:
            return None, None
        if current.controller_epoch > controller_epoch:
            return None, None  # a newer controller owns this partition (ControllerMovedException)
        wanted = self.recompute(current)
        if wanted is None:
            return None, None
        if wanted is current or (wanted.leader, wanted.leader_epoch, wanted.isr) == (
                current.leader, current.leader_epoch, current.isr):
            return None, current
        stored = wanted.with_controller_epoch(controller_epoch).with_partition_epoch(current.partition_epoch + 1)
        return PartitionStateWrite(self.topic_partition, current.partition_epoch, stored, self.recompute), stored


class PartitionStateConflict(Exception):
    """A conditional partition-state write lost its compare: someone else wrote the state first."""


@dataclass
class WritesOutcome:
    """What `perform_partition_state_writes` did.

    `changed`: partitions whose stored state differs from what the event planned
    (their transition was re-run), with that state. `failed`: partitions whose
    transition could not be completed, with the state etcd holds (None if gone).
    `retries`: re-runs performed.
    """

    changed: dict[TopicPartition, LeaderAndIsr] = field(default_factory=dict)
    failed: dict[TopicPartition, LeaderAndIsr | None] = field(default_factory=dict)
    retries: int = 0
    # Batches (write_many) that lost a compare and were written partition by partition instead.
    batch_fallbacks: int = 0


async def perform_partition_state_writes(
    writes: Iterable[PartitionStateWrite],
    controller_epoch: int,
    write: Callable[[PartitionStateWrite], Awaitable[None]],
    load: Callable[[TopicPartition], Awaitable[LeaderAndIsr | None]],
    max_attempts: int = MAX_PARTITION_STATE_WRITE_ATTEMPTS,
    concurrency: int = 1,
    write_many: Callable[[list[PartitionStateWrite]], Awaitable[None]] | None = None,
    batch: int = PARTITION_STATE_WRITE_BATCH,
) -> WritesOutcome:
    """Perform an event's writes, each partition's in order; a lost compare re-reads the state and re-runs
    the transition.

    Kafka's updateLeaderAndIsr: a partition leader may shrink or expand its ISR
    between the controller's decision and its write (seed 000's compare-and-swap on
    the state's version). Then the controller reads the state again and applies the
    same transition to it, up to `max_attempts` writes per partition. Later writes
    of a re-run partition in the same event are re-run on its new state.
    `write` raises PartitionStateConflict on a lost compare (anything else propagates).

    With `concurrency` > 1 up to that many partitions are written at once (each partition's writes still
    one after the other): every write is its own guarded transaction, and one after the other each waited
    for etcd's commit, ~1 ms, so bringing a 1,000-partition batch of a creation online took over a second of
    round trips (issue 24). etcd commits concurrent transactions together. 1 keeps the event's order
    across partitions too, and never suspends beyond `write` and `load` (the simulation drives it without
    an event loop). The first exception (a fenced write) cancels the writes still in flight and propagates.

    With `write_many` as well, partitions the event writes exactly once go `batch` to a transaction (one
    guarded etcd transaction of every write's compare and put, all applied or none): a 5,000-partition
    creation was 5,000 transactions, each a gRPC call and a Python round on the controller and a commit on
    etcd (issue 24). A batch that loses a compare (a leader changed one ISR meanwhile) applied nothing; its
    partitions are then written one by one as before, each with its own re-reads. Partitions written more than
    once in the event keep the per-partition path (a transaction cannot put one key twice).
    """
    out = WritesOutcome()

    async def perform(planned: PartitionStateWrite) -> None:
        tp = planned.topic_partition
        if tp in out.failed:
            return
        attempt: PartitionStateWrite | None = planned
        if tp in out.changed:
            attempt, state = planned.rerun(out.changed[tp], controller_epoch)
            if state is None:
                out.failed[tp] = out.changed.pop(tp)
                return
            if attempt is None:
                return
        for n in range(max_attempts):
            assert attempt is not None
            try:
                await write(attempt)
            except PartitionStateConflict:
                current = await load(tp)
                if current is None or n + 1 == max_attempts:
                    out.failed[tp] = current
                    out.changed.pop(tp, None)
                    return
                out.retries += 1
                attempt, state = planned.rerun(current, controller_epoch)
                if state is None:
                    out.failed[tp] = current
                    out.changed.pop(tp, None)
                    return
                if attempt is None:
                    out.changed[tp] = state
                    return
                continue
            if attempt is not planned:
                out.changed[tp] = attempt.new_state
            return

    if concurrency <= 1:
        for planned in writes:
            await perform(planned)
        return out
    per_partition: dict[TopicPartition, list[PartitionStateWrite]] = {}
    for planned in writes:
        per_partition.setdefault(planned.topic_partition, []).append(planned)
    queue: collections.deque[list[PartitionStateWrite]] = collections.deque()
    if write_many is not None and batch > 1:
        once = [ws[0] for ws in per_partition.values() if len(ws) == 1]
        batches = [once[i:i + batch] for i in range(0, len(once), batch)]
        queue.extend(ws for ws in per_partition.values() if len(ws) > 1)
    else:
        batches = []
        queue.extend(per_partition.values())
    batch_queue = collections.deque(batches)

    async def perform_batch(planned: list[PartitionStateWrite]) -> None:
        assert write_many is not None
        if len(planned) > 1:
            try:
                await write_many(planned)
                return
            except PartitionStateConflict:
                out.batch_fallbacks += 1
        # Nothing of the batch applied: each partition on its own with its re-reads, spread over the workers
        # (a broker's failure can lose many batches at once to its leaders shrinking their ISRs).
        queue.extend([w] for w in planned)

    async def worker() -> None:
        while batch_queue or queue:
            if batch_queue:
                await perform_batch(batch_queue.popleft())
                continue
            for planned in queue.popleft():
                await perform(planned)

    workers = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(queue) + len(batch_queue)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return out


def apply_writes_outcome(ctx: ControllerContext, actions: ControllerActions, outcome: WritesOutcome) -> None:
    """Bring the context and the event's requests in line with what the writes stored.

    A re-run partition's context and LeaderAndIsr carry the state finally written; a failed one keeps
    the state etcd holds (when there is one) and its requests are dropped. The controller and the
    simulation (tests/sim) both call this after `perform_partition_state_writes`.
    """
    for tp, state in outcome.changed.items():
        log.info("partition state of %s changed under us; the transition was re-run: %s", tp, state)
        ctx.put_partition_leadership_info(tp, state)
        actions.batch.replace_leader_and_isr(tp, state)
    for tp, current in outcome.failed.items():
        log.warning("partition state of %s changed under us and the transition could not be re-run; now %s",
                    tp, current)
        if current is not None:
            ctx.put_partition_leadership_info(tp, current)
        actions.failed.setdefault(tp, f"partition state of {tp} changed concurrently")
    actions.batch.discard_partitions(outcome.failed)


@dataclass
class ControlRequestBatch:
    """Requests accumulated while one controller event runs (Kafka's ControllerBrokerRequestBatch).

    Concurrency: owned by the controller's event task, like the context it reads.
    """

    leader_and_isr: dict[int, dict[TopicPartition, PartitionStateInfo]] = field(default_factory=dict)
    stop_replica: dict[int, dict[TopicPartition, bool]] = field(default_factory=dict)
    update_metadata_brokers: set[int] = field(default_factory=set)
    update_metadata_partitions: set[TopicPartition] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not (
            any(self.leader_and_isr.values()) or any(self.stop_replica.values()) or self.update_metadata_brokers
        )

    def add_leader_and_isr(
        self,
        ctx: ControllerContext,
        broker_ids: Iterable[int],
        tp: TopicPartition,
        leader_and_isr: LeaderAndIsr,
        is_new: bool = False,
    ) -> None:
        """LeaderAndIsr to the given brokers, and UpdateMetadata for tp to every live broker."""
        info = PartitionStateInfo(tp, leader_and_isr, ctx.partition_replica_assignment(tp), is_new)
        for broker_id in broker_ids:
            if broker_id < 0:
                continue
            # A later LeaderAndIsr restarts a replica an earlier plain StopReplica in this batch stopped.
            stops = self.stop_replica.get(broker_id, {})
            if stops.get(tp) is False:
                del stops[tp]
            previous = self.leader_and_isr.setdefault(broker_id, {}).get(tp)
            # A partition that is new for this broker stays new within the batch.
            self.leader_and_isr[broker_id][tp] = PartitionStateInfo(
                tp, leader_and_isr, info.replicas, is_new or bool(previous and previous.is_new)
            )
        self.add_update_metadata(ctx.live_or_shutting_down_broker_ids, [tp])

    def add_stop_replica(self, broker_ids: Iterable[int], tp: TopicPartition, delete_partition: bool) -> None:
        for broker_id in broker_ids:
            # A later StopReplica supersedes an earlier LeaderAndIsr for the same replica.
            self.leader_and_isr.get(broker_id, {}).pop(tp, None)
            per_broker = self.stop_replica.setdefault(broker_id, {})
            # Deletion wins over a plain stop for the same partition.
            per_broker[tp] = per_broker.get(tp, False) or delete_partition

    def add_update_metadata(self, broker_ids: Iterable[int], partitions: Iterable[TopicPartition]) -> None:
        """UpdateMetadata to the given brokers; with no partitions it still carries the live broker list."""
        self.update_metadata_brokers.update(b for b in broker_ids if b >= 0)
        self.update_metadata_partitions.update(partitions)

    def replace_leader_and_isr(self, tp: TopicPartition, leader_and_isr: LeaderAndIsr) -> None:
        """Carry a re-run transition's stored state in the LeaderAndIsr requests already batched for tp."""
        for per_broker in self.leader_and_isr.values():
            info = per_broker.get(tp)
            if info is not None:
                per_broker[tp] = PartitionStateInfo(tp, leader_and_isr, info.replicas, info.is_new)

    def discard_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop everything about partitions whose etcd write failed; the driver retries them."""
        gone = set(partitions)
        for per_broker in self.leader_and_isr.values():
            for tp in gone:
                per_broker.pop(tp, None)
        self.leader_and_isr = {b: p for b, p in self.leader_and_isr.items() if p}
        self.update_metadata_partitions -= gone

    def build(self, ctx: ControllerContext, controller_id: int) -> dict[int, list[ControlRequest]]:
        """The requests to send, per broker, in Kafka's order: LeaderAndIsr, UpdateMetadata, StopReplica."""
        out: dict[int, list[ControlRequest]] = {}
        live_leaders = tuple(sorted(ctx.live_or_shutting_down_broker_ids))
        for broker_id, parts in sorted(self.leader_and_isr.items()):
            if not parts:
                continue
            out.setdefault(broker_id, []).append(
                LeaderAndIsrRequest(
                    controller_id, ctx.epoch, ctx.broker_epoch(broker_id),
                    tuple(parts[tp] for tp in sorted(parts)), live_leaders,
                )
            )
        metadata = tuple(
            PartitionStateInfo(tp, ctx.partition_leadership_info[tp], ctx.partition_replica_assignment(tp),
                               offline_replicas=ctx.offline_dir_replicas(tp))
            for tp in sorted(self.update_metadata_partitions)
            if tp in ctx.partition_leadership_info
        )
        # Brokers in controlled shutdown are left out of UpdateMetadata's live brokers, so leaders do not
        # take them back into an ISR (KIP-841's ISR eligibility; they still get requests and lead until moved).
        live_brokers = tuple(sorted(ctx.live_broker_ids))
        for broker_id in sorted(self.update_metadata_brokers):
            out.setdefault(broker_id, []).append(
                UpdateMetadataRequest(controller_id, ctx.epoch, ctx.broker_epoch(broker_id), metadata, live_brokers)
            )
        for broker_id, stops in sorted(self.stop_replica.items()):
            if not stops:
                continue
            out.setdefault(broker_id, []).append(
                StopReplicaRequest(controller_id, ctx.epoch, ctx.broker_epoch(broker_id), tuple(sorted(stops.items())))
            )
        return out


@dataclass
class ControllerActions:
    """Everything one controller event decided: ordered etcd writes, control requests, failures.

    The pure state machines update the context as if every write succeeds; the
    driver performs `writes` in order (`perform_partition_state_writes`); one that
    fails its compare is re-read from etcd and its transition re-run on the fresh
    state (Kafka retries `updateLeaderAndIsr` the same way); a partition whose
    transition cannot complete is reloaded and dropped with `batch.discard_partitions`.

    Concurrency: owned by the controller's event task.
    """

    batch: ControlRequestBatch = field(default_factory=ControlRequestBatch)
    writes: list[PartitionStateWrite] = field(default_factory=list)
    failed: dict[TopicPartition, str] = field(default_factory=dict)
    topics_to_resume_deletion: set[str] = field(default_factory=set)
    unclean_elections: int = 0
    elections: dict[str, int] = field(default_factory=dict)  # leaders elected, by election kind

    def write(self, ctx: ControllerContext, tp: TopicPartition, new_state: LeaderAndIsr, create: bool = False,
              recompute: Recompute | None = None) -> LeaderAndIsr:
        """Record a conditional write of tp's state and apply it to the context; returns the stored state.

        `recompute` re-runs the transition on a fresher state if the write loses its compare.
        A new leader epoch records the leader's broker epoch (`stamp_leader_broker_epoch`).
        """
        if create:
            stored = stamp_leader_broker_epoch(ctx, new_state.with_controller_epoch(ctx.epoch), None)
            self.writes.append(PartitionStateWrite(tp, None, stored))
        else:
            expected = new_state.partition_epoch
            stored = stamp_leader_broker_epoch(
                ctx, new_state.with_controller_epoch(ctx.epoch).with_partition_epoch(expected + 1),
                ctx.partition_leadership_info.get(tp))
            self.writes.append(PartitionStateWrite(tp, expected, stored, _stamped(ctx, recompute)))
        ctx.put_partition_leadership_info(tp, stored)
        self.failed.pop(tp, None)
        return stored


def stamp_leader_broker_epoch(ctx: ControllerContext, new: LeaderAndIsr, previous: LeaderAndIsr | None) -> LeaderAndIsr:
    """Record which registration of the leader a new leader epoch goes to (KIP-903's broker epochs).

    The LeaderAndIsr for that epoch is addressed to `ctx.broker_epoch(leader)`, so
    that is the incarnation that leads. A later controller that finds the leader
    registered under another epoch knows it restarted since (possibly losing an
    unflushed tail appended at this leader epoch) even though it never saw the
    bounce, and elects again (`membership.bounced_leaders`). The same leader
    epoch (an ISR change) keeps what is recorded.
    """
    if new.leader == NO_LEADER or (previous is not None and new.leader_epoch == previous.leader_epoch):
        return new
    return new.with_leader_broker_epoch(ctx.broker_epoch(new.leader))


def _stamped(ctx: ControllerContext, recompute: Recompute | None) -> Recompute | None:
    """`recompute` whose new leader epochs are stamped like the first attempt's."""
    if recompute is None:
        return None

    def rerun(current: LeaderAndIsr) -> LeaderAndIsr | None:
        wanted = recompute(current)
        return wanted if wanted is None or wanted is current else stamp_leader_broker_epoch(ctx, wanted, current)

    return rerun
