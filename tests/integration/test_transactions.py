"""Transactions end to end with real processes (seed 003 §6.8): etcd, a controller, a broker, a coordinator.

The transactional producer against the transaction coordinator in the
group-coordinator process: committed records are visible to read_committed
consumers and aborted ones never are; a second instance with the same
transactional.id fences the first (its commit fails, nothing it wrote becomes
visible); a transaction left open past transaction.timeout.ms is aborted and
the LSO moves on; offsets sent with a transaction become the group's committed
offsets only when it commits; bad calls are typed errors that write nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import pytest

from gregor.client import AdminClient, Consumer, Producer
from gregor.client.admin import NewTopic
from gregor.client.config import ConfigError
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from gregor.common.rpc import channel
from tests.helpers.cluster import LocalCluster, tear_down

TXN_OVERRIDES = {"offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "5",
                 "transaction.state.log.replication.factor": "1", "transaction.state.log.num.partitions": "5",
                 "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
                 "transaction.max.timeout.ms": "60000", "group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("txn")), brokers=1, controllers=1, coordinators=1,
                        lease_ttl_ms=3000, coordinator_overrides=TXN_OVERRIDES)
    try:
        yield c
    finally:
        tear_down(c)


def broker_of(c: LocalCluster) -> str:
    return c.by_role("broker")[0].grpc


async def create(address: str, topic: str, partitions: int = 2) -> None:
    async with AdminClient({"bootstrap.servers": address}) as admin:
        await admin.create_topics([NewTopic(topic, partitions, 1)])


def txn_producer(address: str, tid: str, **extra: object) -> Producer:
    return Producer({"bootstrap.servers": address, "transactional.id": tid, "linger.ms": 5, **extra})


async def values(address: str, topic: str, isolation: str, partitions: int = 2, want: int | None = None,
                 timeout_s: float = 10.0) -> list[bytes]:
    """Every value of topic (all partitions, offset order within each) a consumer at `isolation` returns;
    polls until `want` arrived (or, without want, until nothing new came for a second)."""
    out: list[bytes] = []
    async with Consumer({"bootstrap.servers": address, "isolation.level": isolation,
                         "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100}) as c:
        c.assign([(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            got = await c.poll(200)
            out += [r.value for r in sorted(got, key=lambda r: (r.partition, r.offset))]
            if got:
                quiet_since = time.monotonic()
            if want is not None and len(out) >= want:
                break
            if want is None and time.monotonic() - quiet_since > 1.0:
                break
    return out


async def latest(address: str, topic: str, partition: int, isolation: int) -> int:
    async with channel(address) as ch:
        r = await broker_pb2_grpc.BrokerServiceStub(ch).ListOffsets(broker_pb2.ListOffsetsRequest(
            topic=topic, partition=partition, timestamp_ms=-1, isolation_level=isolation), timeout=10)  # type: ignore
    return r.offset


async def until(pred, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def test_committed_visible_aborted_never(cluster: LocalCluster) -> None:
    b = broker_of(cluster)
    await create(b, "tx-out")
    async with txn_producer(b, "tx-basic") as p:
        await p.init_transactions()
        await p.begin_transaction()
        for i in range(4):
            await p.send("tx-out", f"c1-{i}".encode(), partition=i % 2)
        await p.commit_transaction()
        await p.begin_transaction()
        for i in range(3):
            await p.send("tx-out", f"a-{i}".encode(), partition=i % 2)
        await p.flush()  # on the brokers, then aborted
        await p.abort_transaction()
        await p.begin_transaction()
        await p.send("tx-out", b"c2-0", partition=0)
        await p.commit_transaction()
    committed = await values(b, "tx-out", "read_committed", want=5)
    assert sorted(committed) == [b"c1-0", b"c1-1", b"c1-2", b"c1-3", b"c2-0"]
    uncommitted = await values(b, "tx-out", "read_uncommitted", want=8)
    assert sorted(uncommitted) == sorted([b"c1-0", b"c1-1", b"c1-2", b"c1-3", b"a-0", b"a-1", b"a-2", b"c2-0"])


async def test_bad_calls_are_typed_errors_and_write_nothing(cluster: LocalCluster) -> None:
    b = broker_of(cluster)
    await create(b, "tx-bad", 1)
    with pytest.raises(ConfigError):
        Producer({"bootstrap.servers": b, "transactional.id": "x", "enable.idempotence": False})
    async with Producer({"bootstrap.servers": b}) as plain:
        with pytest.raises(errors.InvalidTxnStateError):  # type: ignore[attr-defined]
            await plain.begin_transaction()
    async with txn_producer(b, "tx-bad", **{"transaction.timeout.ms": 120000}) as p:
        with pytest.raises(errors.GregorError) as e:
            await p.init_transactions()
        assert e.value.code == errors.Code.INVALID_TRANSACTION_TIMEOUT
    async with txn_producer(b, "tx-bad") as p:
        with pytest.raises(errors.InvalidTxnStateError):  # type: ignore[attr-defined]
            await p.begin_transaction()  # before init_transactions()
        await p.init_transactions()
        with pytest.raises(errors.InvalidTxnStateError):  # type: ignore[attr-defined]
            await p.commit_transaction()  # without begin_transaction()
        with pytest.raises(errors.InvalidTxnStateError):  # type: ignore[attr-defined]
            await p.send("tx-bad", b"outside")  # send outside a transaction
    assert await latest(b, "tx-bad", 0, common_pb2.READ_UNCOMMITTED) == 0, "nothing was written"


async def test_new_instance_fences_the_old_one(cluster: LocalCluster) -> None:
    b = broker_of(cluster)
    await create(b, "tx-fence")
    old = txn_producer(b, "tx-fence")
    new = txn_producer(b, "tx-fence")
    try:
        await old.init_transactions()
        await old.begin_transaction()
        for i in range(3):
            await (await old.send("tx-fence", f"zombie-{i}".encode(), partition=i % 2))  # acknowledged
        await new.init_transactions()  # aborts the old instance's transaction, bumps the epoch
        with pytest.raises(errors.ProducerFencedError):  # type: ignore[attr-defined]
            await old.commit_transaction()
        with pytest.raises(errors.ProducerFencedError):  # type: ignore[attr-defined]
            await old.send("tx-fence", b"late")
        await new.begin_transaction()
        await new.send("tx-fence", b"successor", partition=1)
        await new.commit_transaction()
    finally:
        await old.close()
        await new.close()
    assert await values(b, "tx-fence", "read_committed", want=1) == [b"successor"]


async def test_timed_out_transaction_is_aborted_and_the_lso_moves_on(cluster: LocalCluster) -> None:
    b = broker_of(cluster)
    await create(b, "tx-timeout", 1)
    async with txn_producer(b, "tx-timeout", **{"transaction.timeout.ms": 1500}) as p:
        await p.init_transactions()
        await p.begin_transaction()
        await (await p.send("tx-timeout", b"doomed"))
        hw = await latest(b, "tx-timeout", 0, common_pb2.READ_UNCOMMITTED)
        assert hw == 1 and await latest(b, "tx-timeout", 0, common_pb2.READ_COMMITTED) == 0
        # A read_committed consumer waits at the LSO while the transaction is open.
        assert await values(b, "tx-timeout", "read_committed", partitions=1, want=1, timeout_s=0.5) == []

        async def lso_moved() -> bool:
            return await latest(b, "tx-timeout", 0, common_pb2.READ_COMMITTED) == 2  # past the abort marker
        await until(lso_moved)
        with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):  # type: ignore[attr-defined]
            await p.commit_transaction()
    assert await values(b, "tx-timeout", "read_committed", partitions=1, timeout_s=1.5) == []


async def test_offsets_commit_only_with_the_transaction(cluster: LocalCluster) -> None:
    b = broker_of(cluster)
    await create(b, "tx-in", 1)
    await create(b, "tx-o", 1)
    group = "tx-group"

    async def committed() -> int | None:
        async with Consumer({"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False}) as c:
            return (await c.committed([("tx-in", 0)])).get(("tx-in", 0))

    async with txn_producer(b, "tx-offsets") as p:
        await p.init_transactions()
        await p.begin_transaction()
        await p.send("tx-o", b"x")
        await p.send_offsets_to_transaction({("tx-in", 0): 7}, group)
        await p.abort_transaction()
        assert await committed() is None, "an aborted transaction commits no offset"
        await p.begin_transaction()
        await p.send("tx-o", b"y")
        await p.send_offsets_to_transaction({("tx-in", 0): 9}, group)
        await p.commit_transaction()

    async def at_nine() -> bool:
        return await committed() == 9
    await until(at_nine)
