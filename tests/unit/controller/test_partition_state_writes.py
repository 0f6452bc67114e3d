"""A controller write that loses its compare to a leader's ISR change is re-run on the fresh state (updateLeaderAndIsr)."""

from __future__ import annotations

from gregor.controller import replica_state_machine as rsm
from gregor.controller.election import PreferredElection
from gregor.controller.leader_balance import do_controlled_shutdown
from gregor.controller.membership import on_controller_failover
from gregor.controller import partition_state_machine as psm
from gregor.controller.requests import (ControllerActions, LeaderAndIsrRequest, PartitionStateConflict,
                                        PartitionStateWrite, WritesOutcome, perform_partition_state_writes)
from gregor.controller.state import ControllerContext, LeaderAndIsr, PartitionReplica, PartitionState, ReplicaState, TopicPartition

TP = TopicPartition("t", 0)


class Store:
    """Partition states with zkVersion semantics: a write applies only if the stored epoch is the expected one.

    `interleave` runs before each write attempt: a partition leader writing the ISR concurrently.
    """

    def __init__(self, states: dict[TopicPartition, LeaderAndIsr]) -> None:
        self.states = dict(states)
        self.interleave: list[LeaderAndIsr] = []
        self.attempts = 0

    async def write(self, w: PartitionStateWrite) -> None:
        self.attempts += 1
        if self.interleave:
            self.states[w.topic_partition] = self.interleave.pop(0)
        current = self.states.get(w.topic_partition)
        if w.expected_partition_epoch is None:
            if current is not None:
                raise PartitionStateConflict("exists")
        elif current is None or current.partition_epoch != w.expected_partition_epoch:
            raise PartitionStateConflict("version")
        assert w.expected_partition_epoch is None or w.new_state.partition_epoch == w.expected_partition_epoch + 1
        self.states[w.topic_partition] = w.new_state

    async def load(self, tp: TopicPartition) -> LeaderAndIsr | None:
        return self.states.get(tp)


def context(lai: LeaderAndIsr, replicas: tuple[int, ...] = (1, 2, 3)) -> ControllerContext:
    ctx = ControllerContext(live_broker_epochs={1: 11, 2: 12, 3: 13}, epoch=4)
    ctx.all_topics.add("t")
    ctx.update_partition_replica_assignment(TP, replicas)
    ctx.put_partition_leadership_info(TP, lai)
    on_controller_failover(ctx, ControllerActions())
    return ctx


async def test_offline_replica_rerun_after_leader_shrank_the_isr() -> None:
    """The controller takes 3 out of the ISR while leader 1 just removed 2: the result drops both."""
    stored = LeaderAndIsr(1, 5, (1, 2, 3), controller_epoch=4, partition_epoch=7)
    ctx = context(stored)
    actions = ControllerActions()
    rsm.handle_state_changes(ctx, [PartitionReplica(TP, 3)], ReplicaState.OFFLINE, actions)
    assert ctx.partition_leadership_info[TP].isr == (1, 2)
    store = Store({TP: stored})
    store.interleave = [stored.with_isr((1, 3)).with_partition_epoch(8)]  # the leader's CAS lands first
    out = await perform_partition_state_writes(actions.writes, ctx.epoch, store.write, store.load)
    assert out.retries == 1 and not out.failed
    assert store.states[TP] == LeaderAndIsr(1, 6, (1,), controller_epoch=4, partition_epoch=9,
                                           leader_broker_epoch=11)
    assert out.changed == {TP: store.states[TP]}
    # The batched LeaderAndIsr carries what was stored, not what was planned.
    actions.batch.replace_leader_and_isr(TP, out.changed[TP])
    ctx.put_partition_leadership_info(TP, out.changed[TP])
    lair = next(r for r in actions.batch.build(ctx, 0)[1] if isinstance(r, LeaderAndIsrRequest))
    assert lair.partition_states[0].leader_and_isr == store.states[TP]


async def test_rerun_that_finds_nothing_left_to_do_writes_nothing() -> None:
    stored = LeaderAndIsr(1, 5, (1, 2, 3), controller_epoch=4, partition_epoch=7)
    ctx = context(stored)
    actions = ControllerActions()
    rsm.handle_state_changes(ctx, [PartitionReplica(TP, 3)], ReplicaState.OFFLINE, actions)
    already = stored.with_isr((1, 2)).with_partition_epoch(8)  # the leader removed 3 itself
    store = Store({TP: stored})
    store.interleave = [already]
    out = await perform_partition_state_writes(actions.writes, ctx.epoch, store.write, store.load)
    assert out.changed == {TP: already} and store.states[TP] == already and store.attempts == 1


async def test_election_rerun_uses_the_fresh_isr_and_fails_when_no_candidate_is_left() -> None:
    """Controlled shutdown of leader 1 picks 2; meanwhile 1 shrank the ISR to (1, 3): 3 must be elected."""
    stored = LeaderAndIsr(1, 5, (1, 2, 3), controller_epoch=4, partition_epoch=7)
    ctx = context(stored)
    actions = ControllerActions()
    do_controlled_shutdown(ctx, 1, 11, actions)
    assert ctx.partition_leadership_info[TP].leader == 2
    store = Store({TP: stored})
    store.interleave = [stored.with_isr((1, 3)).with_partition_epoch(8)]
    out = await perform_partition_state_writes(actions.writes, ctx.epoch, store.write, store.load)
    assert store.states[TP] == LeaderAndIsr(3, 6, (3,), controller_epoch=4, partition_epoch=9,
                                           leader_broker_epoch=13)
    assert out.changed[TP] == store.states[TP]

    ctx = context(stored)
    actions = ControllerActions()
    do_controlled_shutdown(ctx, 1, 11, actions)
    store = Store({TP: stored})
    alone = stored.with_isr((1,)).with_partition_epoch(8)
    store.interleave = [alone]
    out = await perform_partition_state_writes(actions.writes, ctx.epoch, store.write, store.load)
    assert out.failed == {TP: alone} and store.states[TP] == alone and not out.changed


async def test_retries_are_bounded() -> None:
    stored = LeaderAndIsr(2, 5, (1, 2, 3), controller_epoch=4, partition_epoch=7)
    ctx = context(stored)
    actions = ControllerActions()
    psm.handle_state_changes(ctx, [TP], PartitionState.ONLINE, actions, PreferredElection())
    store = Store({TP: stored})
    # The leader wins every race (a new ISR write before each attempt).
    store.interleave = [stored.with_isr((1, 2, 3) if i % 2 else (1, 2)).with_partition_epoch(8 + i) for i in range(10)]
    out = await perform_partition_state_writes(actions.writes, ctx.epoch, store.write, store.load, max_attempts=3)
    assert store.attempts == 3 and out.retries == 2 and TP in out.failed and store.states[TP].leader == 2


async def test_state_written_by_a_newer_controller_is_not_overwritten() -> None:
    stored = LeaderAndIsr(1, 5, (1, 2, 3), controller_epoch=4, partition_epoch=7)
    ctx = context(stored)
    actions = ControllerActions()
    rsm.handle_state_changes(ctx, [PartitionReplica(TP, 3)], ReplicaState.OFFLINE, actions)
    newer = LeaderAndIsr(2, 9, (2, 3), controller_epoch=5, partition_epoch=8)
    store = Store({TP: stored})
    store.interleave = [newer]
    out = await perform_partition_state_writes(actions.writes, ctx.epoch, store.write, store.load)
    assert out.failed == {TP: newer} and store.states[TP] == newer


async def test_later_writes_of_a_rerun_partition_build_on_its_new_state() -> None:
    """Two writes for one partition in one event (replicas 3, then 2, go offline): the second is re-based."""
    stored = LeaderAndIsr(1, 5, (1, 2, 3), controller_epoch=4, partition_epoch=7)
    ctx = context(stored)
    actions = ControllerActions()
    rsm.handle_state_changes(ctx, [PartitionReplica(TP, 3)], ReplicaState.OFFLINE, actions)
    rsm.handle_state_changes(ctx, [PartitionReplica(TP, 2)], ReplicaState.OFFLINE, actions)
    assert [w.expected_partition_epoch for w in actions.writes] == [7, 8]
    store = Store({TP: stored})
    store.interleave = [stored.with_isr((1, 2, 3)).with_partition_epoch(8)]  # a no-op ISR rewrite by the leader
    out = await perform_partition_state_writes(actions.writes, ctx.epoch, store.write, store.load)
    assert not out.failed
    assert store.states[TP].isr == (1,) and store.states[TP].partition_epoch == 10
    assert out.changed[TP] == store.states[TP]


async def test_a_create_that_finds_the_key_is_not_rerun() -> None:
    existing = LeaderAndIsr(2, 0, (2,), controller_epoch=4, partition_epoch=0)
    store = Store({TP: existing})
    out = await perform_partition_state_writes([PartitionStateWrite(TP, None, LeaderAndIsr(1, 0, (1, 2)))], 4,
                                               store.write, store.load)
    assert out.failed == {TP: existing} and out.retries == 1


# -- many partitions at once (issue 24: one guarded etcd transaction per partition, one after the other, took
# over a second per 1,000-partition batch of a creation) ---------------------------------------------------------

import asyncio  # noqa: E402
import dataclasses  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402


class ConcurrentStore(Store):
    """Store whose writes suspend (as an etcd round trip does) and whose leader interleavings are per partition;
    counts the writes in flight at once."""

    def __init__(self, states: dict[TopicPartition, LeaderAndIsr], interleave: dict[TopicPartition, list[LeaderAndIsr]],
                 pauses: list[int]) -> None:
        super().__init__(states)
        self.per_partition = {tp: list(v) for tp, v in interleave.items()}
        self.pauses = pauses
        self.in_flight = 0
        self.max_in_flight = 0
        self.order: list[TopicPartition] = []

    transactions = 0

    async def write_many(self, ws: list[PartitionStateWrite]) -> None:
        """One transaction of several partitions: applied whole when every compare holds, else nothing (a
        leader's write about to land on one of them loses it the compare). It takes no leader write itself:
        the partition-by-partition fallback meets them as the one-at-a-time model does."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.transactions += 1
        try:
            for _ in range(self.pauses[self.transactions % len(self.pauses)]):
                await asyncio.sleep(0)
            assert len({w.topic_partition for w in ws}) == len(ws), "a transaction cannot put one key twice"

            def holds(w: PartitionStateWrite) -> bool:
                current = self.states.get(w.topic_partition)
                if w.expected_partition_epoch is None:
                    return current is None
                return current is not None and current.partition_epoch == w.expected_partition_epoch

            if any(self.per_partition.get(w.topic_partition) or not holds(w) for w in ws):
                raise PartitionStateConflict("batch")
            for w in ws:
                self.order.append(w.topic_partition)
                self.states[w.topic_partition] = w.new_state
        finally:
            self.in_flight -= 1

    async def write(self, w: PartitionStateWrite) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for _ in range(self.pauses[self.attempts % len(self.pauses)]):
                await asyncio.sleep(0)
            self.order.append(w.topic_partition)
            if self.per_partition.get(w.topic_partition):
                self.states[w.topic_partition] = self.per_partition[w.topic_partition].pop(0)
            await super().write(w)
        finally:
            self.in_flight -= 1


def _shrink_by_one(current: LeaderAndIsr) -> LeaderAndIsr | None:
    """A transition re-runnable on any state: drop the ISR's last member (nothing to do at one member)."""
    return current.with_isr(current.isr[:-1]) if len(current.isr) > 1 else None


@st.composite
def _plans(draw: st.DrawFn) -> tuple[dict[TopicPartition, LeaderAndIsr], list[PartitionStateWrite],
                                     dict[TopicPartition, list[LeaderAndIsr]], list[int]]:
    n = draw(st.integers(1, 12))
    stored: dict[TopicPartition, LeaderAndIsr] = {}
    writes: list[PartitionStateWrite] = []
    interleave: dict[TopicPartition, list[LeaderAndIsr]] = {}
    for p in range(n):
        tp = TopicPartition("t", p)
        state = LeaderAndIsr(1, 5, (1, 2, 3, 4), controller_epoch=4, partition_epoch=7)
        stored[tp] = state
        # The leader changes the ISR before some of the controller's attempts (a lost compare each).
        interleave[tp] = [state.with_isr((1, 2, 3)).with_partition_epoch(8 + i)
                          for i in range(draw(st.integers(0, 6)))]
        planned = state
        for _ in range(draw(st.integers(1, 3))):
            nxt = _shrink_by_one(planned)
            if nxt is None:
                break
            nxt = nxt.with_partition_epoch(planned.partition_epoch + 1)
            writes.append(PartitionStateWrite(tp, planned.partition_epoch, nxt, _shrink_by_one))
            planned = nxt
    order = draw(st.permutations(range(len(writes))))
    by_tp: dict[TopicPartition, list[PartitionStateWrite]] = {}
    for w in writes:
        by_tp.setdefault(w.topic_partition, []).append(w)
    # Shuffle across partitions, keeping each partition's own writes in order.
    cursor = {tp: 0 for tp in by_tp}
    shuffled: list[PartitionStateWrite] = []
    for i in order:
        tp = writes[i].topic_partition
        shuffled.append(by_tp[tp][cursor[tp]])
        cursor[tp] += 1
    pauses = draw(st.lists(st.integers(0, 3), min_size=1, max_size=8))
    return stored, shuffled, interleave, pauses


@settings(max_examples=200, deadline=None)
@given(plan=_plans(), concurrency=st.integers(2, 16), batch=st.sampled_from([0, 1, 2, 3, 100]))
def test_concurrent_writes_store_and_report_what_one_at_a_time_does(plan, concurrency: int, batch: int) -> None:
    """The model is the one-at-a-time run: writing up to `concurrency` partitions at once, and (batch > 0)
    the partitions written once `batch` to a transaction, stores the same states and reports the same
    re-runs and failures, keeps each partition's writes in order, and never has more than `concurrency`
    writes in flight."""
    stored, writes, interleave, pauses = plan

    def run(c: int, b: int = 0) -> tuple[ConcurrentStore, WritesOutcome]:
        store = ConcurrentStore(stored, interleave, pauses)
        out = asyncio.run(perform_partition_state_writes(writes, 4, store.write, store.load, concurrency=c,
                                                         write_many=store.write_many if b else None, batch=b))
        return store, out

    model_store, model = run(1)
    store, out = run(concurrency, batch)
    assert store.states == model_store.states
    assert dataclasses.replace(out, batch_fallbacks=0) == model
    once = sum(1 for tp in stored if sum(w.topic_partition == tp for w in writes) == 1)
    expected_transactions = once // batch + (once % batch > 1) if batch > 1 else 0
    assert store.transactions == expected_transactions  # a last batch of one goes the single way
    assert out.batch_fallbacks <= store.transactions
    assert store.max_in_flight <= concurrency
    assert model_store.max_in_flight == 1
    for tp in stored:  # per partition, the same attempts in the same order
        assert [t for t in store.order if t == tp] == [t for t in model_store.order if t == tp]
    if len(stored) > 1 and min(pauses) > 0:  # every write suspends: the second worker starts meanwhile
        assert store.max_in_flight > 1, "writes of different partitions overlap"


async def test_a_fenced_write_cancels_the_writes_in_flight_and_propagates() -> None:
    class Fenced(Exception):
        pass

    started: list[TopicPartition] = []
    cancelled: list[TopicPartition] = []

    async def write(w: PartitionStateWrite) -> None:
        started.append(w.topic_partition)
        if w.topic_partition.partition == 3:
            raise Fenced()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(w.topic_partition)
            raise

    async def load(tp: TopicPartition) -> LeaderAndIsr | None:
        return None

    state = LeaderAndIsr(1, 5, (1, 2), controller_epoch=4, partition_epoch=7)
    writes = [PartitionStateWrite(TopicPartition("t", p), 7, state.with_partition_epoch(8)) for p in range(20)]
    try:
        await asyncio.wait_for(perform_partition_state_writes(writes, 4, write, load, concurrency=8), 5)
    except Fenced:
        pass
    else:
        raise AssertionError("the fenced write's error must propagate")
    assert len(started) == 8 and sorted(cancelled) == sorted(t for t in started if t.partition != 3)


async def test_a_creation_goes_a_hundred_partitions_to_a_transaction_and_a_fenced_one_propagates() -> None:
    """250 new partitions: three transactions (100, 100, 50), every state stored. Then a fenced transaction
    (the controller lost its epoch) propagates and nothing of it is written one by one."""
    class Fenced(Exception):
        pass

    stored: dict[TopicPartition, LeaderAndIsr] = {}
    transactions: list[int] = []
    singles: list[TopicPartition] = []

    async def write_many(ws: list[PartitionStateWrite]) -> None:
        transactions.append(len(ws))
        if fenced:
            raise Fenced()
        stored.update({w.topic_partition: w.new_state for w in ws})

    async def write(w: PartitionStateWrite) -> None:
        singles.append(w.topic_partition)

    async def load(tp: TopicPartition) -> LeaderAndIsr | None:
        return stored.get(tp)

    creates = [PartitionStateWrite(TopicPartition("big", p), None, LeaderAndIsr(p % 3, 0, (0, 1, 2)))
               for p in range(250)]
    fenced = False
    out = await perform_partition_state_writes(creates, 4, write, load, concurrency=64, write_many=write_many)
    assert sorted(transactions) == [50, 100, 100] and not singles and not out.failed and not out.batch_fallbacks
    assert stored == {w.topic_partition: w.new_state for w in creates}
    fenced, transactions[:] = True, []
    again = [PartitionStateWrite(TopicPartition("other", p), None, LeaderAndIsr(0, 0, (0, 1))) for p in range(150)]
    try:
        await perform_partition_state_writes(again, 4, write, load, concurrency=64, write_many=write_many)
    except Fenced:
        pass
    else:
        raise AssertionError("a fenced transaction's error must propagate")
    assert not singles and not any(tp.topic == "other" for tp in stored)
