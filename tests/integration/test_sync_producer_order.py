"""The blocking SyncProducer keeps the order of calls (issue 19's three scripts, on a 3-broker cluster).

Kafka's contract: send() has appended the record (or raised) when it returns, and the flush(),
commit_transaction(), abort_transaction() or close() called after it covers it. Each test is one
of the scripts that lost or misreported records when SyncProducer.send() only scheduled the
append on its loop thread and returned.
"""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import pytest

from gregor.client import AdminClient, Consumer, SyncProducer
from gregor.client.admin import NewTopic
from gregor.common import errors
from tests.helpers.cluster import LocalCluster, tear_down
from tests.integration.test_transactions import TXN_OVERRIDES

TOPIC_PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("syncorder")), brokers=3, controllers=1, coordinators=1,
                        lease_ttl_ms=3000, coordinator_overrides=TXN_OVERRIDES)
    try:
        yield c
    finally:
        tear_down(c)


def create(c: LocalCluster, topic: str) -> None:
    async def run() -> None:
        async with AdminClient({"bootstrap.servers": c.bootstrap}) as admin:
            await admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 3)])
    asyncio.run(run())


def read_all(c: LocalCluster, topic: str, isolation: str, settle_s: float = 2.0) -> list[bytes]:
    """Every value a consumer with this isolation level reads, until nothing new came for settle_s."""
    async def run() -> list[bytes]:
        out: list[bytes] = []
        async with Consumer({"bootstrap.servers": c.bootstrap, "auto.offset.reset": "earliest",
                             "isolation.level": isolation}) as consumer:
            consumer.assign([(topic, p) for p in range(TOPIC_PARTITIONS)])
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < settle_s:
                got = await consumer.poll(timeout_ms=300)
                if got:
                    out += [r.value for r in got]
                    quiet_since = time.monotonic()
        return out
    return asyncio.run(run())


def lso_reached_end(c: LocalCluster, topic: str) -> bool:
    """True when read_committed's end offsets (the LSO) equal read_uncommitted's (the HW): no open transaction."""
    async def run() -> bool:
        ends = {}
        for iso in ("read_committed", "read_uncommitted"):
            async with Consumer({"bootstrap.servers": c.bootstrap, "isolation.level": iso}) as consumer:
                ends[iso] = await consumer.end_offsets([(topic, p) for p in range(TOPIC_PARTITIONS)])
        return ends["read_committed"] == ends["read_uncommitted"]
    return asyncio.run(run())


def test_commit_covers_every_send_that_returned(cluster: LocalCluster) -> None:
    create(cluster, "t-commit")
    p = SyncProducer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "sync-order-commit"})
    try:
        p.init_transactions()
        p.begin_transaction()
        futs = [p.send("t-commit", f"c-{i}".encode(), key=str(i).encode()) for i in range(5)]
        p.commit_transaction()
        # commit_transaction flushed them: every future is resolved when it returns.
        assert [f.done() for f in futs] == [True] * 5
        assert all(f.exception() is None for f in futs)
    finally:
        p.close()
    # No transaction is left open (the records landed before the commit): once the coordinator has written
    # the markers, which it does after EndTxn answers, the LSO is the HW. Had a record landed after the
    # commit, the LSO would stay behind it until transaction.timeout.ms aborted it.
    deadline = time.monotonic() + 15
    while not lso_reached_end(cluster, "t-commit"):
        assert time.monotonic() < deadline, "a transaction stays open after commit_transaction() returned"
        time.sleep(0.2)
    assert sorted(read_all(cluster, "t-commit", "read_committed")) == [f"c-{i}".encode() for i in range(5)]


def test_close_right_after_commit_loses_nothing(cluster: LocalCluster) -> None:
    create(cluster, "t-close")
    p = SyncProducer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "sync-order-close"})
    p.init_transactions()
    p.begin_transaction()
    futs = [p.send("t-close", f"c-{i}".encode(), key=str(i).encode()) for i in range(5)]
    p.commit_transaction()
    p.close()
    assert all(f.done() and f.exception() is None for f in futs)
    assert sorted(read_all(cluster, "t-close", "read_uncommitted")) == [f"c-{i}".encode() for i in range(5)]
    assert sorted(read_all(cluster, "t-close", "read_committed")) == [f"c-{i}".encode() for i in range(5)]


def test_aborted_records_stay_invisible_to_read_committed(cluster: LocalCluster) -> None:
    create(cluster, "t-abort")
    p = SyncProducer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "sync-order-abort"})
    try:
        p.init_transactions()
        p.begin_transaction()
        aborted = [p.send("t-abort", f"aborted-{i}".encode()) for i in range(30)]
        p.flush()
        assert all(f.done() for f in aborted), "flush() covers every send that returned"
        p.abort_transaction()
        p.begin_transaction()
        committed = [p.send("t-abort", f"committed-{i}".encode()) for i in range(30)]
        p.commit_transaction()
        assert all(f.done() and f.exception() is None for f in committed)
    finally:
        p.close()
    seen = read_all(cluster, "t-abort", "read_committed")
    assert sorted(seen) == sorted(f"committed-{i}".encode() for i in range(30))
    assert len(read_all(cluster, "t-abort", "read_uncommitted")) == 60


def test_send_raises_what_kafkas_send_raises(cluster: LocalCluster) -> None:
    create(cluster, "t-raise")
    p = SyncProducer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "sync-order-raise",
                      "max.request.size": 10_000})
    try:
        p.init_transactions()
        with pytest.raises(errors.InvalidTxnStateError):  # type: ignore[attr-defined]
            p.send("t-raise", b"outside a transaction")
        p.begin_transaction()
        with pytest.raises(TypeError):
            p.send("t-raise", "not bytes")  # type: ignore[arg-type]
        with pytest.raises(errors.MessageTooLargeError):  # type: ignore[attr-defined]
            p.send("t-raise", b"x" * 20_000)
        ok = p.send("t-raise", b"fine")
        p.commit_transaction()
        assert ok.result(timeout=5).offset >= 0
    finally:
        p.close()
    with pytest.raises(errors.GregorError, match="closed"):
        p.send("t-raise", b"after close")
