"""The producer contract, one suite over every facade (issue 19 item 2): the async Producer, the blocking
SyncProducer and the gateway's TransactionalProduceStream run the same programs and must agree.

Kafka's KafkaProducer contract: send() appends to the accumulator or raises; flush(), commitTransaction(),
abortTransaction() and close() cover every send that returned before them; read_committed consumers see
committed transactions whole and aborted ones never; a transactional call in the wrong state raises
InvalidTxnStateException; a second instance with the same transactional.id fences the first.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from gregor.common import errors
from tests.helpers.cluster import LocalCluster
from tests.model.facades import FACADES, Facade
from tests.model.reads import create_topic, end_open_transaction, fresh, group_offsets, read, wait_no_open_transaction

FENCED = (errors.ProducerFencedError, errors.InvalidProducerEpochError)  # type: ignore[attr-defined]


def open_facade(kind: str, c: LocalCluster, tid: str, **extra: Any) -> Facade:
    cfg: dict[str, Any] = {"bootstrap.servers": c.bootstrap, "transactional.id": tid, "linger.ms": 5, **extra}
    if kind == "gateway":
        cfg = {"gateway": c.by_role("gateway")[0].grpc, "transactional.id": tid}
    return FACADES[kind](cfg)


@pytest.fixture(params=sorted(FACADES))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def topic(cluster: LocalCluster) -> str:
    name = fresh("contract")
    create_topic(cluster, name)
    return name


@pytest.fixture
def producer(kind: str, cluster: LocalCluster, topic: str) -> Iterator[Facade]:
    f = open_facade(kind, cluster, fresh("tid"))
    f.init()
    try:
        yield f
    finally:
        f.close()


def committed_values(c: LocalCluster, topic: str) -> list[bytes]:
    wait_no_open_transaction(c, topic)
    return sorted(v for vs in read(c, topic, "read_committed").values() for v in vs)


def test_commit_covers_every_send_that_returned(cluster: LocalCluster, topic: str, producer: Facade) -> None:
    producer.begin()
    futs = [producer.send(topic, f"c-{i}".encode(), partition=i % 3) for i in range(6)]
    producer.commit()
    assert [f.done() and f.exception() is None for f in futs] == [True] * 6
    assert committed_values(cluster, topic) == sorted(f"c-{i}".encode() for i in range(6))


def test_abort_covers_every_send_and_hides_it(cluster: LocalCluster, topic: str, producer: Facade) -> None:
    producer.begin()
    aborted = [producer.send(topic, f"a-{i}".encode(), partition=i % 3) for i in range(6)]
    producer.abort()
    assert all(f.done() for f in aborted)
    producer.begin()
    committed = [producer.send(topic, f"c-{i}".encode(), partition=i % 3) for i in range(6)]
    producer.commit()
    assert all(f.done() and f.exception() is None for f in committed)
    assert committed_values(cluster, topic) == sorted(f"c-{i}".encode() for i in range(6))
    # every acknowledged aborted record is in the log, only read_uncommitted shows it
    uncommitted = {v for vs in read(cluster, topic, "read_uncommitted").values() for v in vs}
    assert {f"a-{i}".encode() for i, f in enumerate(aborted) if f.exception() is None} <= uncommitted


def offering(call: str) -> list[str]:
    """The facades that offer `call` (the gateway's TransactionalProduceStream has no flush or send_offsets):
    a contract test of that call runs over exactly those."""
    return [k for k in sorted(FACADES) if call in getattr(FACADES[k], "offers")]


@pytest.mark.parametrize("kind", offering("flush"), indirect=True)
def test_flush_covers_every_send_that_returned(topic: str, producer: Facade) -> None:
    producer.begin()
    futs = [producer.send(topic, f"f-{i}".encode()) for i in range(20)]
    producer.flush()
    assert all(f.done() for f in futs)
    producer.commit()


def test_close_completes_or_fails_every_send(cluster: LocalCluster, topic: str, kind: str) -> None:
    tid = fresh("tid")
    f = open_facade(kind, cluster, tid)
    f.init()
    f.begin()
    futs = [f.send(topic, f"x-{i}".encode(), partition=i % 3) for i in range(6)]
    f.close()
    assert [fut.done() for fut in futs] == [True] * 6, "close() left sends neither completed nor failed"
    end_open_transaction(cluster, tid)
    assert committed_values(cluster, topic) == []


def test_send_outside_a_transaction_raises(topic: str, producer: Facade) -> None:
    assert isinstance(producer.send_error(topic, b"outside"), errors.InvalidTxnStateError)  # type: ignore[attr-defined]
    producer.begin()
    producer.commit()
    assert isinstance(producer.send_error(topic, b"after commit"), errors.InvalidTxnStateError)  # type: ignore[attr-defined]


def test_send_raises_for_a_record_too_large(cluster: LocalCluster, topic: str, producer: Facade) -> None:
    producer.begin()
    assert isinstance(producer.send_error(topic, b"x" * 1_100_000), errors.MessageTooLargeError)  # type: ignore[attr-defined]
    ok = producer.send(topic, b"fine")
    producer.commit()
    assert ok.result(timeout=30)[1] >= 0
    assert committed_values(cluster, topic) == [b"fine"]


def test_send_raises_for_a_value_that_is_not_bytes(topic: str, producer: Facade) -> None:
    producer.begin()
    with pytest.raises(TypeError):
        producer.send(topic, "not bytes")
    producer.abort()


def test_transactional_calls_in_the_wrong_state_raise(topic: str, producer: Facade) -> None:
    for call in (producer.commit, producer.abort):
        with pytest.raises(errors.InvalidTxnStateError):  # type: ignore[attr-defined]
            call()
    producer.begin()
    with pytest.raises(errors.InvalidTxnStateError):  # type: ignore[attr-defined]
        producer.begin()
    producer.commit()


def test_a_second_instance_fences_the_first(cluster: LocalCluster, topic: str, kind: str) -> None:
    tid = fresh("tid")
    old = open_facade(kind, cluster, tid)
    old.init()
    old.begin()
    before = old.send(topic, b"zombie-before", partition=0)
    if "flush" in old.offers:
        old.flush()
    new = open_facade(kind, cluster, tid)
    try:
        new.init()
        try:
            late = old.send(topic, b"zombie-after", partition=1)
        except FENCED:
            late = None
        with pytest.raises(FENCED):
            old.commit()
        if late is not None:
            assert isinstance(late.exception(timeout=30), FENCED)
        new.begin()
        new.send(topic, b"new", partition=2)
        new.commit()
    finally:
        old.close()
        new.close()
    assert before.done()
    assert committed_values(cluster, topic) == [b"new"]


@pytest.mark.parametrize("kind", offering("send_offsets"), indirect=True)
def test_offsets_sent_with_a_transaction_commit_with_it(cluster: LocalCluster, topic: str, producer: Facade) -> None:
    group = fresh("group")
    producer.begin()
    producer.send(topic, b"a")
    producer.send_offsets({(topic, 0): 7}, group)
    producer.abort()
    assert group_offsets(cluster, group) == {}
    producer.begin()
    producer.send(topic, b"b")
    producer.send_offsets({(topic, 0): 9}, group)
    producer.commit()
    assert group_offsets(cluster, group, want={(topic, 0): 9}) == {(topic, 0): 9}
