"""Model-based tests of the transactional producer against a real cluster (issue 19 item 3).

Hypothesis generates programs of begin / send / flush / commit / abort / send_offsets_to_transaction /
close-and-reopen / a fencing second instance / a broker or coordinator bounce (SIGKILL + restart, one
per program), run through the async Producer or the blocking SyncProducer. A small model predicts which
calls raise, which futures succeed and, at the end of each program, exactly what read_committed and
read_uncommitted consumers see. Where a fault makes an outcome uncertain (a send in flight during a broker
bounce, a commit that failed after a fault) the model allows both outcomes, as Jepsen's `unknown`. A
failure prints the shrunk program as calls of the rules below (their names say what each step does),
replayable as it stands.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gregor.common import errors
from tests.helpers.cluster import LocalCluster, bounce_coordinator, restart_broker, stop_process
from tests.integration.test_transactions import TXN_OVERRIDES
from tests.model.conftest import MODEL_SETTINGS
from tests.model.facades import FACADES, Facade, Offset
from tests.model.reads import (PARTITIONS, create_topic, end_open_transaction, fresh, group_offsets, read,
                               wait_no_open_transaction)

FENCED = (errors.ProducerFencedError, errors.InvalidProducerEpochError)  # type: ignore[attr-defined]
INVALID_STATE = errors.InvalidTxnStateError  # type: ignore[attr-defined]
MAX_BOUNCES = 1  # per program, broker or coordinator: a bounce costs seconds (kill, restart, election/lease)
CLUSTER: Optional[LocalCluster] = None


@dataclass
class Txn:
    """One transaction of the model: its records (value, partition, future) and offsets."""
    records: list[tuple[bytes, int, "Any"]] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    uncertain: bool = False  # a fault happened during it: sends may fail, the end may be unknown


class TransactionalProducerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert CLUSTER is not None
        self.c = CLUSTER
        self.topic = fresh("model-txn")
        self.tid = fresh("model-tid")
        self.group = fresh("model-group")
        self.kind = "sync"
        self.p: Optional[Facade] = None
        self.state = "closed"  # ready | in_txn | abortable | closed
        self.txn: Optional[Txn] = None
        self.n = 0
        self.bounces = 0
        self.committed: list[Txn] = []
        self.maybe_committed: list[Txn] = []  # the commit's outcome is unknown: whole or nothing
        self.aborted: list[Txn] = []
        self.expected_offsets: dict[tuple[str, int], int] = {}
        self.maybe_offsets: list[dict[tuple[str, int], int]] = []

    def _open(self) -> None:
        self.p = FACADES[self.kind]({"bootstrap.servers": self.c.bootstrap, "transactional.id": self.tid,
                                     "linger.ms": 5, "delivery.timeout.ms": 60000})
        self.p.init()
        self.state = "ready"

    @initialize(kind=st.sampled_from(["async", "sync"]))
    def open_producer(self, kind: str) -> None:
        self.kind = kind
        create_topic(self.c, self.topic)
        self._open()

    # ------------------------------------------------------------------ rules
    @rule()
    def begin(self) -> None:
        assert self.p is not None
        if self.state == "ready":
            self.p.begin()
            self.state, self.txn = "in_txn", Txn()
        else:
            with pytest.raises(INVALID_STATE):
                self.p.begin()

    @rule(partition=st.integers(0, PARTITIONS - 1))
    def send(self, partition: int) -> None:
        assert self.p is not None
        self.n += 1
        value = f"{self.tid}:{self.n}".encode()
        if self.state == "in_txn":
            assert self.txn is not None
            try:
                fut = self.p.send(self.topic, value, partition=partition)
            except INVALID_STATE:  # abortable: a send of this transaction failed (only after a fault)
                assert self.txn.uncertain, "send raised in a healthy transaction"
                self.state = "abortable"
                return
            self.txn.records.append((value, partition, fut))
        else:
            with pytest.raises(INVALID_STATE):
                self.p.send(self.topic, value, partition=partition)

    @rule()
    def flush(self) -> None:
        assert self.p is not None
        self.p.flush()
        if self.txn is not None:
            self._all_done(self.txn)

    def _all_done(self, txn: Txn) -> None:
        for value, _, fut in txn.records:
            assert fut.done(), f"{value!r}: a send that returned before flush/commit/abort/close is not done"
            if not txn.uncertain:
                assert fut.exception() is None, f"{value!r} failed without a fault: {fut.exception()!r}"

    @rule(offset=st.integers(0, 100))
    def send_offsets_to_transaction(self, offset: int) -> None:
        assert self.p is not None
        tp = (self.topic, 0)
        if self.state == "in_txn":
            assert self.txn is not None
            self.p.send_offsets({tp: offset}, self.group)
            self.txn.offsets = {tp: offset}
        else:
            with pytest.raises(INVALID_STATE):
                self.p.send_offsets({tp: offset}, self.group)

    @rule()
    def commit(self) -> None:
        assert self.p is not None
        if self.state != "in_txn":
            with pytest.raises(INVALID_STATE):
                self.p.commit()
            return
        txn = self.txn
        assert txn is not None
        try:
            self.p.commit()
        except errors.GregorError:
            assert txn.uncertain, "commit failed without a fault"
            self._all_done(txn)
            self.state = "abortable"  # a failed commit can only be aborted now
            return
        self._all_done(txn)
        assert all(f.exception() is None for _, _, f in txn.records), "commit succeeded over a failed send"
        self.committed.append(txn)
        self.expected_offsets.update(txn.offsets)
        self.state, self.txn = "ready", None

    @rule()
    def abort(self) -> None:
        assert self.p is not None
        if self.state not in ("in_txn", "abortable"):
            with pytest.raises(INVALID_STATE):
                self.p.abort()
            return
        txn = self.txn
        assert txn is not None
        self.p.abort()
        self._all_done(txn)
        self.aborted.append(txn)
        self.state, self.txn = "ready", None

    @rule()
    def close_and_reopen(self) -> None:
        """close() completes or fails every send; the new instance's init_transactions aborts an open one."""
        assert self.p is not None
        self.p.close()
        if self.txn is not None:
            for _, _, fut in self.txn.records:
                assert fut.done(), "close() left a send neither completed nor failed"
            self.aborted.append(self.txn)
            self.txn = None
        self._open()

    @rule()
    def fence_with_second_instance(self) -> None:
        """A second instance with the same transactional.id: the first's commit raises fenced, its open
        transaction is aborted, and the second carries on."""
        old = self.p
        assert old is not None
        if self.state == "ready":
            old.begin()
            self.state, self.txn = "in_txn", Txn()
        txn = self.txn
        assert txn is not None
        self._open()
        self.n += 1
        try:
            late = old.send(self.topic, f"{self.tid}:{self.n}".encode(), partition=self.n % PARTITIONS)
            txn.records.append((f"{self.tid}:{self.n}".encode(), self.n % PARTITIONS, late))
        except (FENCED, INVALID_STATE):  # type: ignore[misc]
            pass
        with pytest.raises((FENCED[0], FENCED[1], INVALID_STATE)) as raised:
            old.commit()
        if not isinstance(raised.value, FENCED):  # abortable only because a send failed fenced
            assert any(isinstance(f.exception(), FENCED) for _, _, f in txn.records if f.done()), raised.value
        old.close()
        txn.uncertain = True  # its futures may have failed fenced; none of it is ever committed
        self.aborted.append(txn)
        self.txn = None

    @precondition(lambda self: self.bounces < MAX_BOUNCES)
    @rule(broker=st.integers(0, 2))
    def bounce_broker(self, broker: int) -> None:
        """SIGKILL one broker and start it again: sends in flight may fail, the transaction's end is unknown."""
        self.bounces += 1
        victim = sorted(self.c.by_role("broker"), key=lambda p: p.id)[broker]
        stop_process(victim, signal.SIGKILL)
        restart_broker(self.c, victim, overrides={"replica.lag.time.max.ms": "3000"})
        if self.txn is not None:
            self.txn.uncertain = True

    @precondition(lambda self: self.bounces < MAX_BOUNCES)
    @rule()
    def bounce_coordinator(self) -> None:
        """SIGKILL the group/transaction coordinator and start it again (same id and port). Its state is in
        __transaction_state and __consumer_offsets (acks=all): the restarted instance reloads it once the dead
        one's lease expires, and the producer's coordinator calls retry meanwhile (max.block.ms). Nothing
        becomes uncertain: an open transaction carries on, and its commit or abort must land whole."""
        self.bounces += 1
        bounce_coordinator(self.c, lease_ttl_ms=3000, overrides=TXN_OVERRIDES)  # tests/model/conftest.py's cluster

    # ------------------------------------------------------------------ the end of a program
    def teardown(self) -> None:
        if self.p is None:
            return
        self.p.close()
        if self.txn is not None:
            self.aborted.append(self.txn)
        end_open_transaction(self.c, self.tid)
        wait_no_open_transaction(self.c, self.topic)
        committed = read(self.c, self.topic, "read_committed")
        uncommitted = read(self.c, self.topic, "read_uncommitted")
        check(self, committed, uncommitted)


def acked(txn: Txn) -> list[bytes]:
    return [v for v, _, f in txn.records if f.done() and f.exception() is None]


def check(m: TransactionalProducerModel, committed: dict[int, list[bytes]], uncommitted: dict[int, list[bytes]]) -> None:
    all_committed = [v for vs in committed.values() for v in vs]
    all_log = [v for vs in uncommitted.values() for v in vs]
    assert len(all_log) == len(set(all_log)), "a record is in the log twice (idempotence)"
    sent = {v for t in m.committed + m.aborted + m.maybe_committed for v, _, _ in t.records}
    assert set(all_log) <= sent, f"records nobody sent: {set(all_log) - sent}"
    for t in m.committed + m.aborted:
        missing = set(acked(t)) - set(all_log)
        assert not missing, f"acknowledged records missing from the log: {missing}"
    # read_committed: every committed transaction whole, never an aborted record
    must = {v for t in m.committed for v, _, _ in t.records}
    never = {v for t in m.aborted for v, _, _ in t.records}
    seen = set(all_committed)
    assert must <= seen, f"committed records read_committed does not see: {must - seen}"
    assert not (seen & never), f"aborted records visible to read_committed: {seen & never}"
    assert seen <= must, f"read_committed sees records of no committed transaction: {seen - must}"
    # per partition, offset order is send order (values carry the send counter)
    for p, vs in uncommitted.items():
        ns = [int(v.rsplit(b":", 1)[1]) for v in vs]
        assert ns == sorted(ns), f"partition {p}: the log's order is not the send order: {ns}"
    if m.expected_offsets:
        assert group_offsets(m.c, m.group, want=m.expected_offsets) == m.expected_offsets


TestTransactionalProducer = TransactionalProducerModel.TestCase
TestTransactionalProducer.settings = MODEL_SETTINGS


@pytest.fixture(autouse=True)
def _cluster(cluster: LocalCluster) -> None:
    global CLUSTER
    CLUSTER = cluster
