"""A controller write that loses its compare to a partition leader's ISR change is re-run (real etcd, in-process controller).

The controller loads `t-0` = leader 1, ISR [1, 2, 3]. Broker 1 asks for a
controlled shutdown; the controller reads the state (ISR [1, 2, 3]) and plans
"leader 2, ISR [2, 3]". Right then, between its read and its write, the leader
shrinks the ISR to [1, 3] with its own compare-and-swap (seed 000): the etcd client
of the controller performs that write just before the controller's first partition
write. The controller's write loses the zkVersion compare; it re-reads the state and
re-runs the election on ISR [1, 3]: broker 3 leads, and the answer says nothing is
left on broker 1 (Kafka's updateLeaderAndIsr retry).
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from gregor.common.uuid import random_topic_id
from gregor.common.etcd import Compare, Delete, EtcdClient, Put, TxnResult, version_is
from gregor.controller import metadata_store
from gregor.controller.controller import Controller, LeaderBalanceConfig
from gregor.controller.state import LeaderAndIsr, TopicPartition
from gregor.cli.local_cluster import start_etcd
from tests.helpers.cluster import Process, stop_process
from tests.integration.test_controller_election import register_broker
from tests.helpers.wait import until

TP = TopicPartition("t", 0)


@pytest.fixture
async def client(etcd: Process) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(f"http://{etcd.grpc}", cluster="gregor") as c:
        yield c


async def _true(value: bool) -> bool:
    return value


class RacingEtcd(EtcdClient):
    """A real etcd client that runs `before_next_write` (once) just before its next guarded transaction."""

    before_next_write: Callable[[], Awaitable[None]] | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.puts_per_txn: list[int] = []

    async def guarded_txn(self, compares: Sequence[Compare], successes: Sequence[Put | Delete]) -> TxnResult:
        self.puts_per_txn.append(len(successes))
        race, self.before_next_write = self.before_next_write, None
        if race is not None:
            await race()
        return await super().guarded_txn(compares, successes)


async def seed_topic(client: EtcdClient, tps: list[TopicPartition]) -> dict[int, int]:
    """Brokers 1-3 registered (their epochs returned), topic t with `tps` on [1, 2, 3], each led by 1."""
    epochs = {b: await register_broker(client, b) for b in (1, 2, 3)}
    await client.put(metadata_store.topic_key(client, "t"), metadata_store.encode_assignment(
        {tp.partition: [1, 2, 3] for tp in tps}, random_topic_id()))
    for tp in tps:
        await client.put(metadata_store.partition_state_key(client, tp),
                         metadata_store.encode_partition_state(LeaderAndIsr(1, 0, (1, 2, 3))))
    return epochs


@contextlib.asynccontextmanager
async def active_controller(endpoint: str, tps: list[TopicPartition],
                            registry: CollectorRegistry) -> AsyncIterator[tuple[Controller, RacingEtcd]]:
    """An in-process controller on its own RacingEtcd client, active with `tps` loaded; stopped on exit."""
    async with RacingEtcd(endpoint, cluster="gregor") as own:
        ctl = Controller(0, own, lease_ttl_ms=2000, registry=registry,
                         leader_balance=LeaderBalanceConfig(auto_leader_rebalance_enable=False))
        await ctl.start()
        try:
            await until(lambda: _true(ctl.is_active and all(tp in ctl.ctx.partition_leadership_info for tp in tps)),
                        5, f"controller active with {len(tps)} partitions loaded")
            yield ctl, own
        finally:
            await ctl.stop()


async def test_controlled_shutdown_election_is_rerun_on_the_isr_the_leader_just_wrote(client: EtcdClient) -> None:
    epochs = await seed_topic(client, [TP])
    state_key = metadata_store.partition_state_key(client, TP)
    registry = CollectorRegistry()
    async with active_controller(client.endpoint, [TP], registry) as (ctl, own):
        assert ctl.ctx.partition_leadership_info[TP].isr == (1, 2, 3)

        async def leader_shrinks_isr() -> None:  # the leader's own compare-and-swap: zkVersion 1 -> 2
            await client.guarded_txn([version_is(state_key, 1)], [Put(
                state_key, metadata_store.encode_partition_state(LeaderAndIsr(1, 0, (1, 3), controller_epoch=1)))])

        own.before_next_write = leader_shrinks_isr
        remaining = await ctl.controlled_shutdown(1, epochs[1])
        assert own.before_next_write is None  # the race happened
        assert remaining == set()
        kv = await client.get(state_key)
        assert kv is not None and kv.version == 3
        stored = json.loads(kv.value)
        assert (stored["leader"], stored["leader_epoch"], stored["isr"]) == (3, 1, [3])
        # The re-run election records the registration of its leader, like the first attempt.
        assert stored["leader_broker_epoch"] == epochs[3]
        assert ctl.ctx.partition_leadership_info[TP] == LeaderAndIsr(3, 1, (3,), ctl.ctx.epoch, 2,
                                                                     leader_broker_epoch=epochs[3])
        assert registry.get_sample_value("gregor_controller_partition_state_write_retries_total") == 1.0
        assert registry.get_sample_value("gregor_controller_controlled_shutdowns_total",
                                         {"result": "done"}) == 1.0
        assert ctl.ctx.shutting_down_broker_ids == {1}
        assert registry.get_sample_value("gregor_controller_shutting_down_brokers") == 1.0


async def test_a_batch_that_loses_one_compare_is_written_partition_by_partition(client: EtcdClient) -> None:
    """Five partitions led by broker 1 go in one transaction when it shuts down (issue 24: a partition
    each was 5,000 transactions for a 5,000-partition creation). The leader of t-2 shrinks its ISR
    just before: the transaction applies nothing, then each partition is written on its own, t-2 re-run
    on the ISR its leader wrote."""
    tps = [TopicPartition("t", p) for p in range(5)]
    epochs = await seed_topic(client, tps)
    raced = metadata_store.partition_state_key(client, tps[2])
    registry = CollectorRegistry()
    async with active_controller(client.endpoint, tps, registry) as (ctl, own):
        async def leader_shrinks_isr() -> None:
            await client.guarded_txn([version_is(raced, 1)], [Put(
                raced, metadata_store.encode_partition_state(LeaderAndIsr(1, 0, (1, 3), controller_epoch=1)))])

        own.before_next_write = leader_shrinks_isr
        own.puts_per_txn.clear()
        assert await ctl.controlled_shutdown(1, epochs[1]) == set()
        assert own.puts_per_txn[0] == 5, own.puts_per_txn  # the five partitions in one transaction, lost
        assert sorted(own.puts_per_txn[1:]) == [1, 1, 1, 1, 1, 1]  # then one by one: t-2 twice
        for tp in tps:
            kv = await client.get(metadata_store.partition_state_key(client, tp))
            assert kv is not None
            stored = json.loads(kv.value)
            want = (3, 1, [3]) if tp == tps[2] else (2, 1, [2, 3])
            assert (stored["leader"], stored["leader_epoch"], stored["isr"]) == want, tp
            assert kv.version == (3 if tp == tps[2] else 2)
        assert registry.get_sample_value("gregor_controller_partition_state_write_retries_total") == 1.0


async def test_an_etcd_that_refuses_large_transactions_gets_one_partition_each(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An etcd run with --max-txn-ops 4 refuses the five-partition transaction ("too many operations in
    txn request"): nothing of it applied, the controller writes each partition on its own and keeps doing
    so (one warning), and every partition is led again."""
    proc = start_etcd(str(tmp_path / "etcd"), extra_args=("--max-txn-ops", "4"))
    try:
        async with EtcdClient(f"http://{proc.grpc}", cluster="gregor") as setup:
            tps = [TopicPartition("t", p) for p in range(5)]
            epochs = await seed_topic(setup, tps)
            async with active_controller(setup.endpoint, tps, CollectorRegistry()) as (ctl, own):
                own.puts_per_txn.clear()
                assert await ctl.controlled_shutdown(1, epochs[1]) == set()
                assert own.puts_per_txn == [5, 1, 1, 1, 1, 1]
                assert ctl.partition_write_batch == 1
                for tp in tps:
                    kv = await setup.get(metadata_store.partition_state_key(setup, tp))
                    assert kv is not None and json.loads(kv.value)["leader"] == 2
    finally:
        stop_process(proc, signal.SIGTERM)


async def test_failover_elects_again_when_the_leader_registered_anew(client: EtcdClient) -> None:
    """A leader that re-registered while no controller watched does not lead on at its leader epoch.

    t-0 was given to broker 1 at leader epoch 3 under its first registration; broker 1
    then restarts (its key is deleted and created again: a new broker epoch) before any
    controller runs. The controller that starts reads only the new registration, and
    the state's `leader_broker_epoch` tells it the leader bounced: t-0 gets a new leader
    epoch (docs/controller.md, tests/sim/test_bounced_leader.py).
    """
    epochs = {b: await register_broker(client, b) for b in (1, 2, 3)}
    await client.put(metadata_store.topic_key(client, "t"), metadata_store.encode_assignment({0: [1, 2, 3]}, random_topic_id()))
    state_key = metadata_store.partition_state_key(client, TP)
    await client.put(state_key, metadata_store.encode_partition_state(
        LeaderAndIsr(1, 3, (1, 2, 3), leader_broker_epoch=epochs[1])))
    await client.delete(client.key("brokers", "ids", 1))
    epochs[1] = await register_broker(client, 1)
    async with EtcdClient(client.endpoint, cluster="gregor") as own:
        ctl = Controller(0, own, lease_ttl_ms=2000, registry=CollectorRegistry(),
                         leader_balance=LeaderBalanceConfig(auto_leader_rebalance_enable=False))
        await ctl.start()
        try:
            async def elected_again() -> bool:
                kv = await client.get(state_key)
                return kv is not None and metadata_store.decode_partition_state(kv).leader in (2, 3)

            await until(elected_again, 5, "t-0 elected again at failover")
            kv = await client.get(state_key)
            assert kv is not None
            stored = metadata_store.decode_partition_state(kv)
            assert stored.leader_epoch > 3 and 1 not in stored.isr, stored
            assert stored.leader_broker_epoch == epochs[stored.leader]
            assert ctl.ctx.live_broker_epochs == epochs
        finally:
            await ctl.stop()
