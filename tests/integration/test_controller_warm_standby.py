"""The warm standby controller (issue 24): a standby keeps the topics, partition states, configs and
deletion marks loaded from etcd (snapshot, then watch) and, on winning the election, hands them to the
failover verified key by key against etcd (StandbyMetadata.take). Real etcd throughout; the first test
runs two controller processes, the others a controller in-process so the test can stop its watches
(a watch that died or missed events) or read its copy.

The brokers are registrations only (lease-bound keys, as bench_controller_failover.py writes them): what
is checked is what the new controller decides and writes to etcd.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Mapping

import pytest
from prometheus_client import CollectorRegistry

from gregor.cli.local_cluster import Process, stop_process
from gregor.common import uuid
from gregor.common.etcd import EtcdClient, Lease, Put, version_is
from gregor.common.etcd_layout import (BrokerIdsZNode, DeleteTopicsZNode, PartitionState, PartitionStateZNode,
                                       TopicConfigZNode, TopicZNode)
from gregor.controller import elector, metadata_store
from gregor.controller.controller import Controller, LeaderBalanceConfig
from gregor.controller.standby_metadata import StandbyMetadata
from gregor.controller.state import LeaderAndIsr, TopicPartition
from tests.helpers.cluster import kill_all, start_controller_with
from tests.helpers.wait import until

BROKERS = (0, 1, 2)


async def register_brokers(etcd: EtcdClient) -> tuple[dict[int, Lease], dict[int, int]]:
    """Three broker registrations on their own leases: (leases, broker epochs)."""
    leases, epochs = {}, {}
    for b in BROKERS:
        leases[b] = await etcd.grant_lease(60)
        key = BrokerIdsZNode.key(etcd, b)
        await etcd.put(key, json.dumps({"host": "127.0.0.1", "grpc_port": 1, "data_port": 0}).encode(), leases[b].id)
        kv = await etcd.get(key)
        assert kv is not None
        epochs[b] = kv.create_revision
    return leases, epochs


async def write_topic(etcd: EtcdClient, topic: str, partitions: int, epochs: dict[int, int],
                      states: bool = True) -> None:
    """A topic at RF 3, every partition led by its preferred replica with a full ISR (or, without
    states, a topic key alone, as a creation the controller has not handled yet)."""
    assignment = {p: [BROKERS[(p + i) % len(BROKERS)] for i in range(3)] for p in range(partitions)}
    ops = [Put(TopicZNode.key(etcd, topic), TopicZNode.encode(assignment, uuid.random_topic_id()))]
    if states:
        ops += [Put(PartitionStateZNode.key(etcd, topic, p),
                    PartitionStateZNode.encode(PartitionState(r[0], 0, tuple(r), 1, 0, epochs[r[0]])))
                for p, r in assignment.items()]
    assert await etcd.txn([], ops)


async def shrink_isr(etcd: EtcdClient, topic: str, partition: int, isr: tuple[int, ...]) -> None:
    """The leader's ISR change (AlterPartition): same leader and leader epoch, the ISR alone, guarded."""
    key = PartitionStateZNode.key(etcd, topic, partition)
    kv = await etcd.get(key)
    assert kv is not None
    state = PartitionStateZNode.decode(kv.value, kv.version)
    assert await etcd.txn([version_is(key, kv.version)], [Put(key, PartitionStateZNode.encode(state.with_isr(isr)))])


async def state(etcd: EtcdClient, topic: str, partition: int) -> LeaderAndIsr | None:
    return await metadata_store.load_partition_state(etcd, TopicPartition(topic, partition))


def log_text(p: Process) -> str:
    with open(p.log, errors="replace") as f:
        return f.read()


def failover_lines(p: Process) -> list[str]:
    return [line for line in log_text(p).splitlines() if "failover took" in line]


async def leaders_and_isrs(etcd: EtcdClient, expected: Mapping[tuple[str, int], tuple[int, tuple[int, ...]]]) -> bool:
    for (topic, partition), (leader, isr) in expected.items():
        s = await state(etcd, topic, partition)
        if s is None or (s.leader, tuple(sorted(s.isr))) != (leader, tuple(sorted(isr))):
            return False
    return True


async def test_standby_takes_over_with_what_changed_while_it_was_standby(  # type: ignore[no-untyped-def]
        etcd: Process, tmp_path) -> None:
    """Two controller processes. While controller 2 is standby (its copy loaded), the active one is
    frozen (SIGSTOP: it acts on nothing more) and the cluster changes: a topic is created, a leader
    shrinks an ISR, a broker goes. The frozen controller's lease expires, controller 2 takes over from
    its warm copy (its log says so) and acts on the changed state: broker 1 leaves every ISR, t-1
    (leader 1, ISR shrunk to [1, 0]) gets leader 0 with ISR [0] (from the old ISR it would have been
    [2, 0]), the new topic is brought online on the live brokers."""
    data_dir = str(tmp_path / "cluster")
    procs: list[Process] = []
    async with EtcdClient(f"http://{etcd.grpc}") as client:
        leases, epochs = await register_brokers(client)
        await write_topic(client, "t", 3, epochs)
        try:
            first = start_controller_with(data_dir, 1, etcd.grpc)
            procs.append(first)
            await until(lambda: failover_lines(first), 60, "controller 1 active")
            second = start_controller_with(data_dir, 2, etcd.grpc)
            procs.append(second)
            await until(lambda: "brokers/topics/ loaded" in log_text(second), 60, "controller 2's standby copy loaded")
            os.kill(first.pid, signal.SIGSTOP)

            assert await client.txn([], [Put(TopicZNode.key(client, "fresh"),
                                             TopicZNode.encode({0: [1, 0, 2]}, uuid.random_topic_id()))])
            await shrink_isr(client, "t", 1, (1, 0))
            await leases[1].revoke()

            async def second_registered() -> bool:
                return await elector.read_controller_id(client) == 2
            await until(second_registered, 30, "controller 2 elected")
            expected = {("t", 0): (0, (0, 2)), ("t", 1): (0, (0,)), ("t", 2): (2, (2, 0)), ("fresh", 0): (0, (0, 2))}
            await until(lambda: leaders_and_isrs(client, expected), 30, f"controller 2 wrote {expected}")
            lines = failover_lines(second)
            assert len(lines) == 1 and "metadata warm:" in lines[0], lines
        finally:
            kill_all(procs)
            for lease in leases.values():
                await lease.revoke()


@pytest.fixture
async def etcd_clients(etcd: Process) -> AsyncIterator[tuple[EtcdClient, EtcdClient]]:
    async with EtcdClient(f"http://{etcd.grpc}") as admin, EtcdClient(f"http://{etcd.grpc}") as own:
        yield admin, own


async def standby_with_other_active(admin: EtcdClient, own: EtcdClient, epochs: dict[int, int],
                                    topics: tuple[tuple[str, int], ...] = (("t", 3),)) -> tuple[Controller, Lease]:
    """Topics (t, 3 partitions, unless named), controller 1 a registration on a lease (active, acting on
    nothing), controller 2 in-process, standby with its copy loaded (stopped again if it never loads)."""
    for topic, partitions in topics:
        await write_topic(admin, topic, partitions, epochs)
    other = await admin.grant_lease(60)
    await elector.register_controller_and_increment_epoch(admin, 1, other.id)
    ctl = Controller(2, own, lease_ttl_ms=2000, registry=CollectorRegistry(),
                     leader_balance=LeaderBalanceConfig(auto_leader_rebalance_enable=False))
    await ctl.start()
    try:
        await until(lambda: ctl.standby_metadata.ready, 10, "the standby's copy loaded")
    except BaseException:
        await ctl.stop()
        raise
    return ctl, other


async def test_standby_whose_watches_missed_changes_acts_on_current_state(
        etcd_clients: tuple[EtcdClient, EtcdClient]) -> None:
    """The standby's watches stop (a watch that died or fell behind: every change below is missed; etcd
    then compacts past them, so no watch could replay them either), while a topic is created with a
    config, another deleted, an ISR shrunk and a broker goes. When the active controller (here a
    registration on a lease) goes, the standby's copy is stale, and the take-over re-reads what changed:
    it acts on etcd as it is now."""
    admin, own = etcd_clients
    leases, epochs = await register_brokers(admin)
    ctl, other = await standby_with_other_active(admin, own, epochs, (("t", 3), ("old", 2)))
    try:
        assert not ctl.is_active and "old" in ctl.standby_metadata.assignments
        await ctl.standby_metadata.stop()

        fresh = {0: [1, 0, 2]}
        assert await admin.txn([], [Put(TopicConfigZNode.key(admin, "fresh"),
                                        TopicConfigZNode.encode({"retention.ms": "1000"})),
                                    Put(TopicZNode.key(admin, "fresh"),
                                        TopicZNode.encode(fresh, uuid.random_topic_id()))])
        assert await admin.txn([], metadata_store.delete_topic_ops(admin, "old"))
        await shrink_isr(admin, "t", 1, (1, 0))
        await leases[1].revoke()
        await admin.compact((await admin.get_prefix(TopicZNode.prefix(admin))).revision)
        # The copy is stale: it has none of it.
        assert "fresh" not in ctl.standby_metadata.assignments and "old" in ctl.standby_metadata.assignments

        await other.revoke()  # the active controller goes
        await until(lambda: ctl.is_active and ctl.last_takeover is not None, 20, "the standby active, warm")
        takeover = ctl.last_takeover
        assert takeover is not None
        # Re-read: fresh's topic and config keys, t-1's state; gone: old's topic key and two states.
        assert takeover.reread == 3 and takeover.dropped == 3, takeover
        assert "old" not in ctl.ctx.all_topics and ctl.ctx.topic_configs["fresh"] == {"retention.ms": "1000"}
        expected = {("t", 0): (0, (0, 2)), ("t", 1): (0, (0,)), ("t", 2): (2, (2, 0)), ("fresh", 0): (0, (0, 2))}
        await until(lambda: leaders_and_isrs(admin, expected), 20, f"the new controller wrote {expected}")
        assert await state(admin, "old", 0) is None
    finally:
        await ctl.stop()
        for lease in leases.values():
            await lease.revoke()


def snapshot_fields(snap: metadata_store.TopicsSnapshot) -> tuple[object, ...]:
    return (snap.assignments, snap.topic_ids, snap.topic_revisions, snap.states, snap.configs, snap.topics_to_delete)


async def test_take_equals_a_cold_read_whatever_the_watch_saw(etcd_clients: tuple[EtcdClient, EtcdClient]) -> None:
    """The copy handed over equals load_topics (a cold read) after changes the watch saw and changes it
    missed: puts, deletions, a key deleted and written again with the same value (a new mod_revision),
    a deletion mark, a partition state whose topic is gone (left out, as a cold read leaves it)."""
    admin, own = etcd_clients
    _, epochs = await register_brokers(admin)
    for topic in ("a", "b", "c"):
        await write_topic(admin, topic, 2, epochs)
    copy = StandbyMetadata(own)
    copy.start()
    try:
        await until(lambda: copy.ready, 10, "copy loaded")
        await shrink_isr(admin, "a", 0, (0, 1))  # seen by the watch
        await admin.put(DeleteTopicsZNode.key(admin, "c"), b"")
        await until(lambda: "c" in copy.topics_to_delete and copy.states[TopicPartition("a", 0)].isr == (0, 1), 10,
                    "the watch applied the changes")
        await copy.stop()  # from here on, missed
        key = PartitionStateZNode.key(admin, "b", 1)
        kv = await admin.get(key)
        assert kv is not None
        await admin.delete(key)
        await admin.put(key, kv.value)  # same value, new revisions (its partition epoch starts again)
        await shrink_isr(admin, "a", 1, (1,))
        await admin.delete(TopicZNode.key(admin, "b"))  # b's states stay behind: not part of the snapshot
        await write_topic(admin, "d", 1, epochs)
        await admin.put(TopicConfigZNode.key(admin, "a"), TopicConfigZNode.encode({"cleanup.policy": "compact"}))
        taken = await copy.take()
        assert taken is not None
        snap, takeover = taken
        cold = await metadata_store.load_topics(admin)
        assert snapshot_fields(snap) == snapshot_fields(cold)
        assert takeover.reread >= 4 and takeover.dropped == 1, takeover
        assert not copy.ready and not copy.states  # handed over: the copy is cleared
    finally:
        await copy.stop()


async def test_take_before_the_copy_is_loaded_reads_cold(etcd_clients: tuple[EtcdClient, EtcdClient]) -> None:
    """A standby elected before its first read finished (a cluster's first controller) gets None and reads cold."""
    _, own = etcd_clients
    copy = StandbyMetadata(own)
    assert await copy.take() is None
    assert await copy.take() is None


async def test_a_failover_decided_while_standby_is_used_when_nothing_changed_since(
        etcd_clients: tuple[EtcdClient, EtcdClient]) -> None:
    """Broker 1 died while the active controller (a registration) did nothing about it. The standby
    decides the failover ahead (broker 1 out of every ISR, t-1 led by 0); when the active goes, it
    applies that decision without deciding again, and etcd shows it."""
    admin, own = etcd_clients
    leases, epochs = await register_brokers(admin)
    await leases[1].revoke()
    ctl, other = await standby_with_other_active(admin, own, epochs)
    try:
        await until(lambda: ctl.failover_prepared, 20, "the failover prepared")
        await other.revoke()
        await until(lambda: ctl.is_active and ctl.last_takeover is not None, 20, "the standby active")
        assert ctl.last_failover_prepared
        expected = {("t", 0): (0, (0, 2)), ("t", 1): (2, (2, 0)), ("t", 2): (2, (2, 0))}
        await until(lambda: leaders_and_isrs(admin, expected), 20, f"the new controller wrote {expected}")
    finally:
        await ctl.stop()
        for lease in leases.values():
            await lease.revoke()


@pytest.mark.parametrize("change", ["isr", "broker"])
async def test_a_failover_decided_while_standby_is_dropped_when_its_inputs_changed(
        etcd_clients: tuple[EtcdClient, EtcdClient], change: str) -> None:
    """The standby has decided the failover ahead; then, just before the active controller goes (too
    soon for the standby to decide again), a leader shrinks an ISR, or a broker goes. The prepared
    decision is not used: the failover decides on what etcd holds now."""
    admin, own = etcd_clients
    leases, epochs = await register_brokers(admin)
    ctl, other = await standby_with_other_active(admin, own, epochs)
    try:
        await until(lambda: ctl.failover_prepared, 20, "the failover prepared")
        if change == "isr":
            await shrink_isr(admin, "t", 1, (1, 0))
            await leases[0].revoke()  # with broker 0 gone, t-1's new ISR decides who leads it now
        else:
            await leases[1].revoke()
        await other.revoke()
        await until(lambda: ctl.is_active and ctl.last_takeover is not None, 20, "the standby active")
        assert not ctl.last_failover_prepared
        if change == "isr":
            # t-1: leader 1, ISR [1, 0] with 0 gone -> [1]; from the prepared (old) ISR it would be [1, 2].
            expected = {("t", 0): (1, (1, 2)), ("t", 1): (1, (1,)), ("t", 2): (2, (2, 1))}
        else:
            expected = {("t", 0): (0, (0, 2)), ("t", 1): (2, (2, 0)), ("t", 2): (2, (2, 0))}
        await until(lambda: leaders_and_isrs(admin, expected), 20, f"the new controller wrote {expected}")
    finally:
        await ctl.stop()
        for lease in leases.values():
            await lease.revoke()


async def test_a_malformed_value_fails_the_take_over_as_a_cold_read(
        etcd_clients: tuple[EtcdClient, EtcdClient]) -> None:
    """A partition state that is not JSON: the watch leaves it out of the copy and goes on; the take-over
    re-reads it and fails as load_topics does, instead of deciding without it."""
    admin, own = etcd_clients
    _, epochs = await register_brokers(admin)
    await write_topic(admin, "a", 2, epochs)
    copy = StandbyMetadata(own)
    copy.start()
    try:
        await until(lambda: copy.ready, 10, "copy loaded")
        await admin.put(PartitionStateZNode.key(admin, "a", 1), b"{not json")
        await write_topic(admin, "b", 1, epochs)
        await until(lambda: "b" in copy.assignments, 10, "the watch went on past the malformed value")
        assert TopicPartition("a", 1) not in copy.states
        with pytest.raises(ValueError):
            await metadata_store.load_topics(admin)
        with pytest.raises(ValueError):
            await copy.take()
    finally:
        await copy.stop()
