"""A `__transaction_state` shard handed over mid-transaction loses no state write (real processes).

Two brokers, `__transaction_state` at RF 2 (acks=all waits for both), one coordinator A
owning every shard. The follower broker F of the transactional id's shard p is frozen
(SIGSTOP), so A's PrepareCommit write for the producer's commit_transaction() is
appended on the leader but cannot be acknowledged: the write is in flight. A second
coordinator C then starts; etcd's live set now names C the owner of p, so A releases p.

Released correctly (ownership.py), A keeps its claim until the in-flight write has
ended, so C cannot load p before the write is in the log and C's first view of the id
is PrepareCommit. Released without the drain (the transaction coordinator before this
change), A deletes its claim at once, C replays p up to the high watermark — which the
frozen follower holds below the PrepareCommit — and serves `Ongoing`, a state the log
has already moved past. Then F resumes; the producer's commit must complete (the
records visible read_committed, exactly once) and C's final state must equal the last
record of the id in the log.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Awaitable, Iterator

import grpc
import pytest

from gregor.cli.local_cluster import _process_dir, _spawn, _wait_ready
from gregor.client import AdminClient, Consumer, Producer
from gregor.client.admin import NewTopic
from gregor.common.coordinator_ownership import desired_owner, partition_for
from gregor.common.rpc import channel
from gregor.coordinator import txn_metadata as tm
from gregor.rpc.v1 import transaction_pb2, transaction_pb2_grpc
from tests.helpers.cluster import LocalCluster, Process, etcd_endpoints, replica_values, tear_down
from tests.helpers.wait import until

TXN_TOPIC = "__transaction_state"
TXN_PARTITIONS = 2
LEASE_TTL_MS = 40000  # write timeout = offsets.commit.timeout.ms below: room for C to start while A's write waits
COORDINATOR_OVERRIDES = {"offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "2",
                         "offsets.commit.timeout.ms": "15000",
                         "transaction.state.log.replication.factor": "2", "transaction.state.log.min.isr": "2",
                         "transaction.state.log.num.partitions": str(TXN_PARTITIONS)}
# How long the test gives a successor to serve the shard while the old owner's write is held up. Under the
# drain it never does (the old owner holds the claim until its write ends), so this only bounds how long a
# broken release gets to show itself; the outcome on correct code does not depend on it.
SUCCESSOR_WINDOW_S = 4.0


@pytest.fixture
def cluster(tmp_path: str) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path), brokers=2, controllers=1, coordinators=1, lease_ttl_ms=LEASE_TTL_MS,
                        # F stays in the ISR and registered while frozen.
                        broker_overrides={"replica.lag.time.max.ms": "60000"},
                        coordinator_overrides=COORDINATOR_OVERRIDES)
    try:
        yield c
    finally:
        tear_down(c)


async def describe(address: str, tid: str) -> transaction_pb2.TransactionDescription | None:
    """The coordinator's view of tid, None while it does not serve it (NOT_COORDINATOR, loading)."""
    async with channel(address) as ch:
        try:
            resp = await transaction_pb2_grpc.TransactionCoordinatorServiceStub(ch).DescribeTransactions(
                transaction_pb2.DescribeTransactionsRequest(transactional_ids=[tid]), timeout=5)
        except grpc.RpcError:
            return None
    d = resp.transactions[0]
    return None if d.error.code else d


def start_coordinator_with(cluster: LocalCluster, coordinator_id: int, bootstrap: str) -> Process:
    """A coordinator process as `cluster up` starts one, with an explicit --bootstrap."""
    data_dir = cluster.data_dir
    coordinator_dir, ready = _process_dir(data_dir, f"coordinator-{coordinator_id}")
    log_path = os.path.join(data_dir, "logs", f"coordinator-{coordinator_id}.log")
    etcd = ",".join(f"http://{e}" for e in etcd_endpoints(cluster).split(","))
    cmd = [sys.executable, "-m", "gregor.coordinator", "--coordinator-id", str(coordinator_id), "--etcd", etcd,
           "--bootstrap", bootstrap, "--port", "0", "--metrics-port", "-1", "--ready-file", ready,
           "--lease-ttl-ms", str(LEASE_TTL_MS)]
    for k, v in COORDINATOR_OVERRIDES.items():
        cmd += ["--override", f"{k}={v}"]
    info = _wait_ready(_spawn(cmd, log_path), ready, log_path)
    return Process("coordinator", coordinator_id, info["pid"], info["grpc"], info["metrics"], log_path,
                   coordinator_dir)


def logged_states(leader: Process, tid: str, p: int) -> list[tm.TxnMetadata]:
    return [tm.decode_value(tid, v) for v in replica_values(leader, TXN_TOPIC, p)]


async def test_shard_handed_over_mid_commit_loses_no_state_write(cluster: LocalCluster) -> None:
    brokers = {b.id: b for b in cluster.by_role("broker")}
    boot = cluster.bootstrap
    a = cluster.by_role("coordinator")[0]
    # The shard that moves to the second coordinator (id 1) once it is live, and an id that lives there.
    p = next(q for q in range(TXN_PARTITIONS) if desired_owner(q, [a.id, 1]) == 1)
    tid = next(t for t in (f"ho-{i}" for i in range(1000)) if partition_for(t, TXN_PARTITIONS) == p)

    async with AdminClient({"bootstrap.servers": boot}) as admin:
        await admin.create_topics([NewTopic("ho-out", 2, 1)])
    producer = Producer({"bootstrap.servers": boot, "transactional.id": tid, "linger.ms": 0})
    watcher: asyncio.Task[None] | None = None
    try:
        await producer.init_transactions()  # creates __transaction_state; A loads p
        await producer.metadata.wait_for_topic(TXN_TOPIC, 10000)
        await producer.metadata.wait_for_topic("ho-out", 10000)
        leader_id = producer.metadata.leader_for(TXN_TOPIC, p)
        leader, follower = brokers[leader_id], next(b for i, b in brokers.items() if i != leader_id)
        out = next(q for q in range(2) if producer.metadata.leader_for("ho-out", q) == leader_id)
        await producer.begin_transaction()
        for i in range(3):
            await (await producer.send("ho-out", f"v{i}".encode(), partition=out))
        before = len(replica_values(leader, TXN_TOPIC, p))

        os.kill(follower.pid, signal.SIGSTOP)  # A's next write to p is appended on the leader, unacknowledged
        try:
            commit = asyncio.create_task(producer.commit_transaction())
            await until(lambda: len(replica_values(leader, TXN_TOPIC, p)) > before, 30,
                        "A's PrepareCommit is appended on the leader")
            assert logged_states(leader, tid, p)[-1].state is tm.TxnState.PREPARE_COMMIT
            # C bootstraps from the leader only: the frozen follower would hold up its start-up calls.
            c = await asyncio.to_thread(start_coordinator_with, cluster, 1, leader.grpc)
            cluster.processes.append(c)
            cluster.save()
            # A gives p up (it answers NOT_COORDINATOR for the id once it has unloaded it) ...
            await until(lambda: _none(describe(a.grpc, tid)), 30, "A releases p")
            # ... and C must not serve p before A's write has ended: record every state C serves, from now on.
            served: list[str] = []

            async def watch_c() -> None:
                while not served or served[-1] != "CompleteCommit":
                    d = await describe(c.grpc, tid)
                    if d is not None and (not served or served[-1] != d.state):
                        served.append(d.state)
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch_c())
            try:
                await until(lambda: served, SUCCESSOR_WINDOW_S, "C serves p")
            except AssertionError:
                pass  # expected under the drain: C waits for A's claim, which A holds until its write ends
            assert not commit.done()
        finally:
            os.kill(follower.pid, signal.SIGCONT)
        await asyncio.wait_for(commit, 60)  # acknowledged: the transaction is committed
        await asyncio.wait_for(watcher, 60)  # C reaches CompleteCommit
    finally:
        if watcher is not None:
            watcher.cancel()
        await producer.close()

    # The first state C served already includes A's PrepareCommit (the last write A made before the handover):
    # it never served a state the log had moved past, and never went back.
    assert served[0] in ("PrepareCommit", "CompleteCommit"), (
        f"the new owner served {served} while the old owner's PrepareCommit was in flight: "
        f"a __transaction_state write was lost to it")
    assert "Ongoing" not in served, served
    assert await committed_values(boot, "ho-out", out) == [b"v0", b"v1", b"v2"]
    final: list[transaction_pb2.TransactionDescription] = []

    async def completed() -> bool:
        d = await describe(c.grpc, tid)
        if d is not None and d.state == "CompleteCommit":
            final.append(d)
            return True
        return False

    await until(completed, 30, "the new owner completes the commit")
    assert final[0].coordinator_id == c.id
    last = logged_states(leader, tid, p)[-1]
    assert (last.state.value, last.producer_id, last.producer_epoch) == (
        final[0].state, final[0].producer_id, final[0].producer_epoch)


async def _none(aw: Awaitable[object]) -> bool:
    return await aw is None


async def committed_values(boot: str, topic: str, partition: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    async with Consumer({"bootstrap.servers": boot, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100}) as cons:
        cons.assign([(topic, partition)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(out) < 3:
            out += [r.value for r in await cons.poll(200)]
        out += [r.value for r in await cons.poll(500)]  # nothing beyond the three
    return out
