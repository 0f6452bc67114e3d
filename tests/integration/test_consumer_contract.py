"""Kafka's consumer contract, one suite over every facade: the asyncio Consumer and the blocking SyncConsumer
(issue 19). Real processes: etcd, a controller, 3 brokers and a group coordinator.

- a rebalance listener may commit inside on_partitions_revoked (the partitions are still assigned:
  position() and commit_sync() with no arguments cover them), and the SyncConsumer runs it on the
  thread that called poll()/close();
- commit_async then commit_sync: the async commit lands first (committed offsets never go backwards)
  and its callback has run, on the caller's thread, before commit_sync returns;
- close() waits for pending async commits (their callbacks run) and, with enable.auto.commit, commits.

The async Consumer is driven from the test's thread through a LoopThread of the test's own (its
listener is a coroutine awaiting the Consumer's methods on the loop, as an asyncio application's).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from gregor.client.consumer import Consumer, ConsumerRecord, SyncConsumer
from gregor.common import errors
from tests.helpers.loop_consumer import LoopConsumer
from tests.helpers.wait import until, wait_for
from tests.helpers.cluster import LocalCluster, tear_down
from tests.integration.test_consumer_groups import config, create_topic, produce

TP = tuple[str, int]
FACADES = ["async", "sync"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("contract")), brokers=3, controllers=1, coordinators=1,
                        lease_ttl_ms=3000, coordinator_overrides={"group.initial.rebalance.delay.ms": "0"})
    try:
        yield c
    finally:
        tear_down(c)


class AsyncDriver(LoopConsumer):
    """The asyncio Consumer, called from a blocking test through a loop of the test's own."""

    def __init__(self, cfg: dict[str, Any], factory: Any = Consumer) -> None:
        super().__init__(cfg, "test-async-consumer", factory)

    def subscribe(self, topics: list[str], listener: Any = None) -> None:
        self._sync(lambda: self.c.subscribe(topics, listener=listener))

    def assign(self, tps: list[TP]) -> None:
        self._sync(self.c.assign, tps)

    def assignment(self) -> list[TP]:
        return self._sync(self.c.assignment)  # type: ignore[no-any-return]

    def poll(self, timeout_ms: int) -> list[ConsumerRecord]:
        return self.lt.run(self.c.poll(timeout_ms))

    def commit_sync(self, offsets: Optional[dict[TP, int]] = None) -> None:
        self.lt.run(self.c.commit_sync(offsets))

    def commit_async(self, offsets: Optional[dict[TP, int]] = None, callback: Any = None) -> None:
        self._sync(self.c.commit_async, offsets, callback)

    def committed(self, tps: list[TP]) -> dict[TP, Optional[int]]:
        return self.lt.run(self.c.committed(tps))

    def position(self, tp: TP) -> int:
        return self.lt.run(self.c.position(tp))

    def close(self) -> None:
        try:
            self.lt.run(self.c.close())
        finally:
            self.lt.stop()


def open_consumer(facade: str, cfg: dict[str, Any]) -> Any:
    return SyncConsumer(cfg) if facade == "sync" else AsyncDriver(cfg)


class SyncCommitOnRevoke:
    """Kafka's canonical listener: commit what was consumed when partitions are revoked."""

    def __init__(self, consumer: SyncConsumer) -> None:
        self.c = consumer
        self.events: list[tuple[Any, ...]] = []
        self.threads: set[int] = set()

    def on_partitions_revoked(self, partitions: list[TP]) -> None:
        self.threads.add(threading.get_ident())
        positions = {tp: self.c.position(tp) for tp in partitions}
        self.c.commit_sync()
        self.events.append(("revoked", partitions, positions, self.c.committed(partitions)))

    def on_partitions_assigned(self, partitions: list[TP]) -> None:
        self.threads.add(threading.get_ident())
        self.events.append(("assigned", partitions))


class AsyncCommitOnRevoke:
    def __init__(self, consumer: Consumer) -> None:
        self.c = consumer
        self.events: list[tuple[Any, ...]] = []
        self.threads: set[int] = set()

    async def on_partitions_revoked(self, partitions: list[TP]) -> None:
        positions = {tp: await self.c.position(tp) for tp in partitions}
        await self.c.commit_sync()
        self.events.append(("revoked", partitions, positions, await self.c.committed(partitions)))

    async def on_partitions_assigned(self, partitions: list[TP]) -> None:
        self.events.append(("assigned", partitions))


def commit_on_revoke(consumer: Any) -> Any:
    return SyncCommitOnRevoke(consumer) if isinstance(consumer, SyncConsumer) else AsyncCommitOnRevoke(consumer.c)


def consume(c: Any, n: int, polls: int = 200) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    for _ in range(polls):
        if len(got) >= n:
            break
        got += c.poll(200)
    return got


def topic_with_records(cluster: LocalCluster, name: str, partitions: int, per_partition: int) -> None:
    async def go() -> None:
        await create_topic(cluster, name, partitions)
        await produce(cluster, name, partitions, per_partition, name)
    asyncio.run(go())


@pytest.mark.parametrize("facade", FACADES)
def test_listener_commits_in_on_partitions_revoked_at_close(cluster: LocalCluster, facade: str) -> None:
    topic = f"revoke-close-{facade}"
    topic_with_records(cluster, topic, 2, 10)
    c = open_consumer(facade, config(cluster, f"{topic}-g", enable_auto_commit=False))
    listener = commit_on_revoke(c)
    c.subscribe([topic], listener=listener)
    assert len(consume(c, 20)) == 20
    tps = [(topic, 0), (topic, 1)]
    c.close()
    revoked = [e for e in listener.events if e[0] == "revoked"]
    # The listener saw the partitions still assigned (position() worked) and its commit_sync() covered them.
    assert revoked and revoked[-1][1] == tps and revoked[-1][2] == {tps[0]: 10, tps[1]: 10}, listener.events
    assert revoked[-1][3] == {tps[0]: 10, tps[1]: 10}
    if facade == "sync":
        assert listener.threads == {threading.get_ident()}  # Kafka: listeners run on the caller's thread


@pytest.mark.parametrize("facade", FACADES)
def test_listener_commits_in_on_partitions_revoked_on_rebalance(cluster: LocalCluster, facade: str) -> None:
    """A second member joins; the first one's revocation commits what it consumed, so the newcomer
    starts where the first member stopped: no record is delivered twice."""
    topic = f"revoke-rebalance-{facade}"
    topic_with_records(cluster, topic, 2, 10)
    cfg = config(cluster, f"{topic}-g", enable_auto_commit=False)
    a = open_consumer(facade, cfg)
    listener = commit_on_revoke(a)
    a.subscribe([topic], listener=listener)
    got_a = consume(a, 20)
    assert len(got_a) == 20
    b = open_consumer(facade, cfg)
    got_b: list[ConsumerRecord] = []
    stop = threading.Event()
    b_error: list[BaseException] = []

    def poll_b() -> None:
        try:
            b.subscribe([topic])
            while not stop.is_set():
                got_b.extend(b.poll(200))
        except BaseException as exc:  # reported by the test
            b_error.append(exc)
    t = threading.Thread(target=poll_b)
    t.start()
    try:
        for _ in range(300):
            got_a += a.poll(200)
            if any(e[0] == "revoked" for e in listener.events) and len(a.assignment()) == 1:
                break
        revoked = [e for e in listener.events if e[0] == "revoked"]
        assert revoked, listener.events
        _, parts, positions, committed = revoked[0]
        assert parts == [(topic, 0), (topic, 1)] and positions == {(topic, 0): 10, (topic, 1): 10}
        assert committed == positions
        if facade == "sync":
            assert listener.threads == {threading.get_ident()}
        for _ in range(150):  # b settles on its partition; it must fetch nothing (all committed)
            if len(b.assignment()) == 1:
                break
            a.poll(100)
        assert len(b.assignment()) == 1
        for _ in range(5):
            a.poll(100)
    finally:
        stop.set()
        t.join(60)
        b.close()
        a.close()
    assert not b_error, b_error
    assert got_b == []  # everything was committed by a's listener before b was assigned
    assert len(got_a) == 20


@pytest.mark.parametrize("facade", FACADES)
def test_commit_async_then_commit_sync_keeps_order(cluster: LocalCluster, facade: str) -> None:
    topic = f"commit-order-{facade}"
    topic_with_records(cluster, topic, 1, 1)
    tp = (topic, 0)
    c = open_consumer(facade, config(cluster, f"{topic}-g", enable_auto_commit=False))
    try:
        c.assign([tp])
        caller = threading.get_ident()
        for round_ in range(5):
            done: list[tuple[int, Optional[BaseException], int]] = []
            base = round_ * 100
            for i in range(1, 6):
                c.commit_async({tp: base + i},
                               lambda offsets, exc: done.append((offsets[tp], exc, threading.get_ident())))
            c.commit_sync({tp: base + 10})
            # Kafka: earlier async commits completed, callbacks ran in call order, before commitSync returned.
            assert [(o, e) for o, e, _ in done] == [(base + i, None) for i in range(1, 6)]
            if facade == "sync":
                assert {th for _, _, th in done} == {caller}
            assert c.committed([tp]) == {tp: base + 10}  # the older async commits never landed after it
    finally:
        c.close()


@pytest.mark.parametrize("facade", FACADES)
def test_close_waits_for_async_commits_and_auto_commits(cluster: LocalCluster, facade: str) -> None:
    topic = f"close-commit-{facade}"
    topic_with_records(cluster, topic, 2, 5)
    tps = [(topic, 0), (topic, 1)]
    # enable.auto.commit with a long interval: only close() commits.
    c = open_consumer(facade, config(cluster, f"{topic}-auto", auto_commit_interval_ms=600000))
    c.subscribe([topic])
    assert len(consume(c, 10)) == 10
    c.close()
    probe = open_consumer(facade, config(cluster, f"{topic}-auto", enable_auto_commit=False))
    try:
        assert probe.committed(tps) == {tps[0]: 5, tps[1]: 5}
    finally:
        probe.close()
    # commit_async then close(): the commit lands and its callback runs (on the caller's thread) before close returns.
    c = open_consumer(facade, config(cluster, f"{topic}-async", enable_auto_commit=False))
    c.assign(tps)
    assert len(consume(c, 10)) == 10
    done: list[tuple[dict[TP, int], Optional[BaseException], int]] = []
    c.commit_async(None, lambda offsets, exc: done.append((dict(offsets), exc, threading.get_ident())))
    c.close()
    assert [(o, e) for o, e, _ in done] == [({tps[0]: 5, tps[1]: 5}, None)]
    if facade == "sync":
        assert done[0][2] == threading.get_ident()
    probe = open_consumer(facade, config(cluster, f"{topic}-async", enable_auto_commit=False))
    try:
        assert probe.committed(tps) == {tps[0]: 5, tps[1]: 5}
    finally:
        probe.close()


def test_sync_consumer_refuses_poll_and_close_from_a_listener(cluster: LocalCluster) -> None:
    """poll()/close() inside a listener would re-enter the rebalance it runs in: a typed error, not a hang."""
    topic = "reentrant"
    topic_with_records(cluster, topic, 1, 1)
    c = SyncConsumer(config(cluster, "reentrant-g", enable_auto_commit=False))
    seen: list[BaseException] = []

    class Reenter:
        def on_partitions_assigned(self, partitions: list[TP]) -> None:
            for call in (lambda: c.poll(0), c.close, c.unsubscribe):
                try:
                    call()
                except errors.GregorError as exc:
                    seen.append(exc)

        def on_partitions_revoked(self, partitions: list[TP]) -> None:
            pass
    c.subscribe([topic], listener=Reenter())  # type: ignore[arg-type]
    try:
        assert len(consume(c, 1)) == 1
    finally:
        c.close()
    assert len(seen) == 3 and all(isinstance(e, errors.InvalidRequestError) for e in seen)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- position() and the partition's one reset
_IN_POSITION: contextvars.ContextVar[bool] = contextvars.ContextVar("in_position", default=False)


class SlowPositionConsumer(Consumer):
    """A Consumer whose ListOffsets answers arrive in the order that exposes a second reset.

    Only latency is added, around real ListOffsets calls to the real leader: the fetch task's reset is
    held until position() has been called, and a ListOffsets that position() itself issues is held
    until the partition has fetched records (as a slow answer on a loaded network would be). A
    consumer with one reset per partition issues no ListOffsets from position() at all."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.list_offsets_calls: list[tuple[TP, bool]] = []  # (partition, issued by position())
        self.position_called = asyncio.Event()

    async def position(self, tp: TP) -> int:
        self.position_called.set()
        token = _IN_POSITION.set(True)
        try:
            return await super().position(tp)
        finally:
            _IN_POSITION.reset(token)

    async def _list_offsets(self, tp: TP, timestamp_ms: int) -> tuple[int, int]:
        from_position = _IN_POSITION.get()
        self.list_offsets_calls.append((tp, from_position))
        state = self.subscriptions.states.get(tp)
        if not from_position:
            await asyncio.wait_for(self.position_called.wait(), 30)
        elif state is not None:
            await until(lambda: state.buffer or state.position not in (None, 0), 30,
                        "the fetch task fetched records")
        return await super()._list_offsets(tp, timestamp_ms)


class SlowPositionSync(SyncConsumer):
    @staticmethod
    async def _make(config: Any, kwargs: dict[str, Any]) -> Consumer:
        return SlowPositionConsumer(dict(config))


@pytest.mark.parametrize("facade", FACADES)
def test_position_during_the_fetch_tasks_reset_does_not_reset_again(cluster: LocalCluster, facade: str) -> None:
    """position() on an assigned partition whose fetch task is resetting it (auto.offset.reset) waits for that
    reset instead of starting a second one: one ListOffsets, and every record is returned exactly once.
    Before the fix, position()'s own reset landed after the fetch had advanced and rewound it (records twice)."""
    topic = f"position-reset-{facade}"
    topic_with_records(cluster, topic, 1, 10)
    tp = (topic, 0)
    cfg = {"bootstrap.servers": cluster.bootstrap, "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100}
    c: Any
    if facade == "sync":
        c = SlowPositionSync(cfg)
        inner: SlowPositionConsumer = c._consumer
    else:
        c = AsyncDriver(cfg, SlowPositionConsumer)
        inner = c.c
    try:
        c.assign([tp])
        wait_for(lambda: inner.list_offsets_calls, 30, "the fetch task's reset is in flight")
        assert c.position(tp) == 0
        got: list[ConsumerRecord] = []
        for _ in range(100):
            got += c.poll(100)
            if c.position(tp) >= 10 and len(got) >= 10:
                break
        for _ in range(3):  # a rewound fetch would still be delivering
            got += c.poll(100)
        assert [r.offset for r in got] == list(range(10)), [r.offset for r in got]
        assert inner.list_offsets_calls == [(tp, False)]  # one reset, the fetch task's; position() waited for it
    finally:
        c.close()
