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
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from gregor.client import AdminClient, Consumer, Producer
from gregor.client.admin import NewTopic
from gregor.client.config import ConfigError
from gregor.client.transaction_manager import TransactionAbortableError
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from gregor.common.rpc import channel
from tests.helpers.cluster import LocalCluster, tear_down
from tests.integration.test_cli import failed, gregor, ok
from tests.helpers.wait import until

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
        await until(lso_moved, 15, "lso_moved")
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
    await until(at_nine, 15, "at_nine")


# ---------------------------------------------------------------- real worker processes (seed 003's advanced case)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_worker(c: LocalCluster, tid: str, inp: str, out: str, group: str, log_path: str,
                 *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.helpers.txn_worker", "--bootstrap", broker_of(c), "--transactional-id", tid,
           "--input", inp, "--output", out, "--group", group, "--partitions", "2", *extra]
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)


async def produce_input(address: str, topic: str, n: int) -> dict[int, list[bytes]]:
    sent: dict[int, list[bytes]] = {0: [], 1: []}
    async with Producer({"bootstrap.servers": address, "linger.ms": 5}) as p:
        for i in range(n):
            v = f"r{i:04d}".encode()
            await p.send(topic, v, partition=i % 2)
            sent[i % 2].append(v)
        await p.flush()
    return sent


async def output_by_partition(address: str, topic: str, want: int) -> dict[int, list[bytes]]:
    got: dict[int, list[bytes]] = {0: [], 1: []}
    async with Consumer({"bootstrap.servers": address, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100}) as c:
        c.assign([(topic, 0), (topic, 1)])
        deadline = time.monotonic() + 20
        while sum(map(len, got.values())) < want and time.monotonic() < deadline:
            for r in await c.poll(200):
                got[r.partition].append(r.value)
        for r in await c.poll(1000):  # nothing more may come: a duplicate would show up here
            got[r.partition].append(r.value)
    return got


async def group_offsets(address: str, group: str, topic: str) -> dict[int, int | None]:
    async with Consumer({"bootstrap.servers": address, "group.id": group, "enable.auto.commit": False}) as c:
        got = await c.committed([(topic, 0), (topic, 1)])
    return {p: got.get((topic, p)) for p in (0, 1)}


async def test_consume_transform_produce_exactly_once_through_sigkills(cluster: LocalCluster, tmp_path: str) -> None:
    # Enough input that no round can finish it before its kill: a worker commits ~1,000 records/s on a
    # quiet machine, and a round with nothing left to read would wait for a commit that never comes.
    b, n = broker_of(cluster), 1500
    await create(b, "ctp-in")
    await create(b, "ctp-out")
    sent = await produce_input(b, "ctp-in", n)
    rng = random.Random(11)
    log_path = os.path.join(str(tmp_path), "worker.log")
    small = ("--max-poll-records", "7")  # many small transactions: the kills land inside one
    for round_ in range(3):  # killed at a random point after a commit: mid-transaction, mid-commit, between
        round_log = f"{log_path}.{round_}"
        w = start_worker(cluster, "ctp", "ctp-in", "ctp-out", "ctp-group", round_log, *small)

        async def committed_once() -> bool:
            return os.path.exists(round_log) and "COMMITTED" in open(round_log).read()
        try:
            await until(committed_once, 30, "committed_once")
        except AssertionError:
            w.kill()
            raise AssertionError(f"round {round_}: no commit in 30 s; worker log: {open(round_log).read()[-1500:]!r}")
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        w.send_signal(signal.SIGKILL)
        w.wait()
        with open(round_log) as f, open(log_path, "a") as out:
            out.write(f.read())
    left = await group_offsets(b, "ctp-group", "ctp-in")
    assert sum(v or 0 for v in left.values()) < n, "every round was killed with input still to process"
    w = start_worker(cluster, "ctp", "ctp-in", "ctp-out", "ctp-group", log_path, *small)
    try:
        async def all_committed() -> bool:
            return await group_offsets(b, "ctp-group", "ctp-in") == {0: n // 2, 1: n // 2}
        await until(all_committed, 60, "all_committed")
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait()
    with open(log_path) as f:
        log_text = f.read()
    assert log_text.count("COMMITTED") >= 4 and "FAILED" not in log_text, log_text[-2000:]
    got = await output_by_partition(b, "ctp-out", n)
    for p in (0, 1):
        assert got[p] == [v.upper() for v in sent[p]], f"partition {p}: not exactly once / out of order"


async def test_zombie_frozen_with_sigstop_is_fenced(cluster: LocalCluster, tmp_path: str) -> None:
    b = broker_of(cluster)
    await create(b, "zb-in")
    await create(b, "zb-out")
    sent = await produce_input(b, "zb-in", 40)
    hold = os.path.join(str(tmp_path), "go")
    zlog, slog = os.path.join(str(tmp_path), "zombie.log"), os.path.join(str(tmp_path), "successor.log")
    zombie = start_worker(cluster, "zb", "zb-in", "zb-out", "zb-group", zlog, "--hold-file", hold)
    try:
        async def holding() -> bool:
            return os.path.exists(zlog) and "HOLDING" in open(zlog).read()
        await until(holding, 30, "holding")
        zombie.send_signal(signal.SIGSTOP)  # frozen with its transaction's records on the brokers
        successor = start_worker(cluster, "zb", "zb-in", "zb-out", "zb-group", slog, "--stop-after", "40")
        assert successor.wait(timeout=60) == 0, open(slog).read()
        with open(hold, "w"):
            pass
        zombie.send_signal(signal.SIGCONT)
        assert zombie.wait(timeout=30) == 3
    finally:
        if zombie.poll() is None:
            zombie.send_signal(signal.SIGCONT)
            zombie.kill()
    assert "FAILED PRODUCER_FENCED" in open(zlog).read()
    got = await output_by_partition(b, "zb-out", 40)
    for p in (0, 1):
        assert got[p] == [v.upper() for v in sent[p]], f"partition {p}: the zombie's records became visible"


async def test_cli_list_describe_find_hanging_abort_and_consume(cluster: LocalCluster) -> None:
    b = broker_of(cluster)
    await create(b, "tx-cli", 1)
    # A "hanging" transaction: a raw transactional batch whose coordinator never heard of it (no
    # AddPartitionsToTxn), exactly what find-hanging and abort are for.
    from tests.integration.test_idempotence import init_producer_id, raw_produce
    from tests.integration.test_txn_broker import txn_batch
    pid, _ = await init_producer_id(b)
    await raw_produce(b, "tx-cli", txn_batch([b"hang"], pid, 0, 0))
    async with txn_producer(b, "tx-cli-id") as p:
        await p.init_transactions()
        await p.begin_transaction()
        await p.send("tx-cli", b"open")
        await p.flush()
        listed = ok(await asyncio.to_thread(gregor, "transactions", "list", bootstrap=b))
        assert "TransactionalId" in listed and any(
            line.split()[:1] == ["tx-cli-id"] and line.split()[-1] == "Ongoing" for line in listed.splitlines())
        described = ok(await asyncio.to_thread(gregor, "transactions", "describe", "--transactional-id", "tx-cli-id",
                                               bootstrap=b))
        assert "TransactionDurationMs" in described and "tx-cli-0" in described and "Ongoing" in described
        await p.abort_transaction()
    failed(await asyncio.to_thread(gregor, "transactions", "describe", "--transactional-id", "nobody", bootstrap=b),
           "TRANSACTIONAL_ID_NOT_FOUND")
    hanging = ok(await asyncio.to_thread(gregor, "transactions", "find-hanging", "--topic", "tx-cli",
                                         "--max-transaction-timeout", "0", bootstrap=b))
    rows = [line.split() for line in hanging.splitlines()[1:]]
    assert [(r[0], r[2], r[5]) for r in rows] == [("tx-cli", str(pid), "0")], hanging
    failed(await asyncio.to_thread(gregor, "transactions", "abort", "--topic", "tx-cli", "--partition", "0",
                                   "--start-offset", "5", bootstrap=b), "no open transaction starts at offset 5")
    assert await latest(b, "tx-cli", 0, common_pb2.READ_COMMITTED) == 0, "the hanging transaction pins the LSO"
    ok(await asyncio.to_thread(gregor, "transactions", "abort", "--topic", "tx-cli", "--partition", "0",
                               "--start-offset", "0", bootstrap=b))
    hw = await latest(b, "tx-cli", 0, common_pb2.READ_UNCOMMITTED)
    assert await latest(b, "tx-cli", 0, common_pb2.READ_COMMITTED) == hw, "the LSO moved on"
    out = ok(await asyncio.to_thread(gregor, "consume", "tx-cli", "--from-beginning", "--isolation-level",
                                     "read_committed", "--timeout-ms", "2000", bootstrap=b))
    assert out.split() == [], "hang and open were both aborted"
    out = ok(await asyncio.to_thread(gregor, "consume", "tx-cli", "--from-beginning", "--max-messages", "2",
                                     bootstrap=b))
    assert out.split() == ["hang", "open"], "read_uncommitted shows both, and no control record"


async def test_gateway_stream_carries_a_transaction(cluster: LocalCluster, tmp_path: str) -> None:
    from gregor.cli.local_cluster import start_gateway, stop_process
    from gregor.rpc.v1 import gateway_pb2, gateway_pb2_grpc

    b = broker_of(cluster)
    await create(b, "tx-gw", 1)
    gw = start_gateway(str(tmp_path), 0, b)
    try:
        def rec(cid: int, value: bytes) -> gateway_pb2.GatewayTxnRequest:
            return gateway_pb2.GatewayTxnRequest(record=gateway_pb2.GatewayRecord(
                topic="tx-gw", partition=0, correlation_id=cid, record=common_pb2.Record(value=value)))

        ctl = gateway_pb2.GatewayTxnControl
        msgs = [gateway_pb2.GatewayTxnRequest(init=gateway_pb2.GatewayTxnInit(transactional_id="tx-gw-id",
                                                                            correlation_id=0)),
                rec(1, b"outside"),  # before begin: INVALID_TXN_STATE, nothing written
                gateway_pb2.GatewayTxnRequest(begin=ctl(correlation_id=2)), rec(3, b"c1"), rec(4, b"c2"),
                gateway_pb2.GatewayTxnRequest(commit=ctl(correlation_id=5)),
                gateway_pb2.GatewayTxnRequest(begin=ctl(correlation_id=6)), rec(7, b"a1"),
                gateway_pb2.GatewayTxnRequest(abort=ctl(correlation_id=8)),
                gateway_pb2.GatewayTxnRequest(commit=ctl(correlation_id=9))]  # nothing to commit: INVALID_TXN_STATE

        async def requests():  # type: ignore[no-untyped-def]
            for m in msgs:
                yield m

        async with channel(gw.grpc) as ch:
            results = [r async for r in gateway_pb2_grpc.ProducerGatewayServiceStub(ch).TransactionalProduceStream(
                requests(), timeout=60)]
    finally:
        stop_process(gw)
    by_id = {r.correlation_id: r for r in results}
    assert sorted(by_id) == list(range(10))
    failed_ids = {cid for cid, r in by_id.items() if r.error.code}
    assert failed_ids == {1, 9}, results
    assert by_id[1].error.code == errors.Code.INVALID_TXN_STATE and by_id[9].error.code == errors.Code.INVALID_TXN_STATE
    assert (by_id[3].offset, by_id[4].offset) == (0, 1)
    assert [r.correlation_id for r in results].index(4) < [r.correlation_id for r in results].index(5), \
        "a record's result comes before its transaction's commit"
    assert await values(b, "tx-gw", "read_committed", partitions=1, want=2) == [b"c1", b"c2"]


async def test_a_commit_that_timed_out_is_retried_and_lands(cluster: LocalCluster) -> None:
    """Kafka's commitTransaction: when EndTxn does not answer within max.block.ms the call raises, and the
    same call may be retried (an abort in between is refused); the retry commits the transaction."""
    b = broker_of(cluster)
    await create(b, "tx-retry")
    coordinator = cluster.by_role("coordinator")[0]
    async with txn_producer(b, "tx-retry", **{"max.block.ms": 2000, "request.timeout.ms": 1000}) as p:
        await p.init_transactions()
        await p.begin_transaction()
        for i in range(4):
            await p.send("tx-retry", b"r%d" % i)
        await p.flush()
        os.kill(coordinator.pid, signal.SIGSTOP)
        try:
            with pytest.raises(errors.GregorError) as info:
                await p.commit_transaction()
            assert info.value.retriable
            with pytest.raises(errors.InvalidTxnStateError, match="commit_transaction"):  # type: ignore[attr-defined]
                await p.abort_transaction()
        finally:
            os.kill(coordinator.pid, signal.SIGCONT)
        await p.commit_transaction()
    assert sorted(await values(b, "tx-retry", "read_committed", want=4)) == [b"r%d" % i for i in range(4)]


# ---------------------------------------------------------------- KIP-447: zombie consumers are fenced
async def test_a_consumer_that_lost_its_partitions_cannot_commit_offsets_in_a_transaction(cluster: LocalCluster) -> None:
    """KIP-447: send_offsets_to_transaction carries the consumer's generation, member id and group.instance.id,
    and the group's coordinator refuses a member that is no longer current; its transaction can only abort
    and none of its offsets become the group's. The current member's transactional commit goes through."""
    b = broker_of(cluster)
    inp, out, group = "kip447-in", "kip447-out", "kip447"
    await create(b, inp, 2)
    await create(b, out, 1)
    cfg = {"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
           "heartbeat.interval.ms": 300, "session.timeout.ms": 6000, "fetch.max.wait.ms": 100}
    a, c2 = Consumer(cfg), Consumer(cfg)
    try:
        a.subscribe([inp])

        async def a_has_both() -> bool:
            await a.poll(100)
            return len(a.assignment()) == 2
        await until(a_has_both, 60, "the first member is assigned both partitions")
        stale = a.group_metadata()  # what a zombie of `a` holds: both partitions, this generation
        c2.subscribe([inp])

        async def one_each() -> bool:
            await asyncio.gather(a.poll(100), c2.poll(100))
            return len(a.assignment()) == 1 and len(c2.assignment()) == 1
        await until(one_each, 60, "a second member took one of the partitions")
        current = a.group_metadata()
        assert current.generation_id > stale.generation_id and current.member_id == stale.member_id
        mine = a.assignment()[0]
        async with txn_producer(b, "kip447-p") as p:
            await p.init_transactions()
            # The old generation: refused, abortable (commit raises), nothing of it is committed.
            await p.begin_transaction()
            await p.send(out, b"zombie")
            with pytest.raises(errors.IllegalGenerationError):  # type: ignore[attr-defined]
                await p.send_offsets_to_transaction({(inp, 0): 5, (inp, 1): 5}, stale)
            with pytest.raises(TransactionAbortableError):
                await p.commit_transaction()
            await p.abort_transaction()
            # The member as it is now: committed with the transaction.
            await p.begin_transaction()
            await p.send(out, b"current")
            await p.send_offsets_to_transaction({mine: 3}, a.group_metadata())
            await p.commit_transaction()
            # A member that left the group (its id is gone): UNKNOWN_MEMBER_ID.
            gone = c2.group_metadata()
            await c2.close()
            await p.begin_transaction()
            with pytest.raises(errors.UnknownMemberIdError):  # type: ignore[attr-defined]
                await p.send_offsets_to_transaction({(inp, 0): 9, (inp, 1): 9}, gone)
            await p.abort_transaction()
    finally:
        await c2.close()
        await a.close()

    async def offsets() -> dict[int, int | None]:
        async with Consumer({"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False}) as c:
            got = await c.committed([(inp, 0), (inp, 1)])
            return {tp[1]: o for tp, o in got.items()}
    want = {mine[1]: 3, 1 - mine[1]: None}
    await until(_equals(offsets, want), 15, f"committed offsets {want}")
    assert await values(b, out, "read_committed", 1, want=1) == [b"current"]


def _equals(probe: Any, want: Any) -> Any:
    async def check() -> bool:
        return await probe() == want
    return check


async def test_a_replaced_static_member_cannot_commit_offsets_in_a_transaction(cluster: LocalCluster) -> None:
    """KIP-447 with static membership: once another consumer joins with the same group.instance.id, the old
    member id is fenced (FENCED_INSTANCE_ID) even with the current generation."""
    b = broker_of(cluster)
    inp, group = "kip447-static-in", "kip447-static"
    await create(b, inp, 1)
    cfg = {"bootstrap.servers": b, "group.id": group, "group.instance.id": "worker-1", "enable.auto.commit": False,
           "heartbeat.interval.ms": 300, "session.timeout.ms": 6000, "fetch.max.wait.ms": 100}
    old = Consumer(cfg)
    new = Consumer(cfg)
    try:
        old.subscribe([inp])

        async def assigned(c: Consumer) -> bool:
            await c.poll(100)
            return bool(c.assignment())
        await until(lambda: assigned(old), 60, "the first instance is assigned")
        zombie = old.group_metadata()
        new.subscribe([inp])
        await until(lambda: assigned(new), 60, "the replacement instance is assigned")
        assert new.group_metadata().member_id != zombie.member_id
        async with txn_producer(b, "kip447-static-p") as p:
            await p.init_transactions()
            await p.begin_transaction()
            with pytest.raises(errors.FencedInstanceIdError):  # type: ignore[attr-defined]
                await p.send_offsets_to_transaction({(inp, 0): 1}, zombie)
            await p.abort_transaction()
            await p.begin_transaction()
            await p.send_offsets_to_transaction({(inp, 0): 1}, new.group_metadata())
            await p.commit_transaction()
    finally:
        await new.close()
        try:
            await old.close()
        except errors.GregorError:
            pass  # the fenced instance's leave is refused: it is a zombie
