"""Model-based test of the idempotent producer against a real cluster (issue 19 item 3): random programs of
send / flush / close-and-reopen / a broker bounce, through the async Producer or the SyncProducer. At the end
of each program: no record is in the log twice, each partition holds its records in send order, and every
acknowledged record is present (a send in flight during a bounce may fail; if it failed it may or may not
be in the log, Jepsen's `unknown`). A failure prints the shrunk program as calls of the rules below.
"""

from __future__ import annotations

import signal
from typing import Any, Optional

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from tests.helpers.cluster import LocalCluster, restart_broker, stop_process
from tests.model.conftest import MODEL_SETTINGS
from tests.model.facades import FACADES, Facade
from tests.model.reads import PARTITIONS, create_topic, fresh, read

MAX_BOUNCES = 1
CLUSTER: Optional[LocalCluster] = None


class IdempotentProducerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert CLUSTER is not None
        self.c = CLUSTER
        self.topic = fresh("model-idem")
        self.kind = "sync"
        self.p: Optional[Facade] = None
        self.sent: list[tuple[bytes, int, Any]] = []
        self.faulted: set[bytes] = set()  # sends in flight during a fault: failure allowed
        self.n = 0
        self.bounces = 0

    def _open(self) -> None:
        self.p = FACADES[self.kind]({"bootstrap.servers": self.c.bootstrap, "enable.idempotence": True,
                                     "acks": "all", "linger.ms": 5, "delivery.timeout.ms": 60000})

    @initialize(kind=st.sampled_from(["async", "sync"]))
    def open_producer(self, kind: str) -> None:
        self.kind = kind
        create_topic(self.c, self.topic)
        self._open()

    @rule(partition=st.integers(0, PARTITIONS - 1), count=st.integers(1, 5))
    def send(self, partition: int, count: int) -> None:
        assert self.p is not None
        for _ in range(count):
            self.n += 1
            value = f"idem:{self.n}".encode()
            self.sent.append((value, partition, self.p.send(self.topic, value, partition=partition)))

    @rule()
    def flush(self) -> None:
        assert self.p is not None
        self.p.flush()
        self._all_done()

    def _all_done(self) -> None:
        for value, _, fut in self.sent:
            assert fut.done(), f"{value!r}: a send that returned before flush/close is not done"
            if value not in self.faulted:
                assert fut.exception() is None, f"{value!r} failed without a fault: {fut.exception()!r}"

    @rule()
    def close_and_reopen(self) -> None:
        assert self.p is not None
        self.p.close()
        self._all_done()
        self._open()

    @precondition(lambda self: self.bounces < MAX_BOUNCES)
    @rule(broker=st.integers(0, 2))
    def bounce_broker(self, broker: int) -> None:
        """SIGKILL one broker and start it again; the producer retries what was in flight."""
        self.bounces += 1
        self.faulted |= {v for v, _, f in self.sent if not f.done()}
        victim = sorted(self.c.by_role("broker"), key=lambda p: p.id)[broker]
        stop_process(victim, signal.SIGKILL)
        restart_broker(self.c, victim, overrides={"replica.lag.time.max.ms": "3000"})

    def teardown(self) -> None:
        if self.p is None:
            return
        self.p.close()
        self._all_done()
        log = read(self.c, self.topic, "read_uncommitted")
        values = [v for vs in log.values() for v in vs]
        assert len(values) == len(set(values)), "a record is in the log twice"
        where = {v: p for v, p, _ in self.sent}
        for p, vs in log.items():
            assert all(where.get(v) == p for v in vs), f"partition {p} holds records sent elsewhere or never"
            ns = [int(v.rsplit(b":", 1)[1]) for v in vs]
            assert ns == sorted(ns), f"partition {p}: the log's order is not the send order: {ns}"
        acked = {v for v, _, f in self.sent if f.exception() is None}
        assert acked <= set(values), f"acknowledged records missing: {acked - set(values)}"


TestIdempotentProducer = IdempotentProducerModel.TestCase
TestIdempotentProducer.settings = MODEL_SETTINGS


@pytest.fixture(autouse=True)
def _cluster(cluster: LocalCluster) -> None:
    global CLUSTER
    CLUSTER = cluster
