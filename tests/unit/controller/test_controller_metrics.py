"""The active controller's Kafka-named gauges and counters, read back from the Prometheus registry.

A Controller over an EtcdClient whose transactions always apply (nothing connects)
runs BrokerChange decisions through `apply_actions`, which updates the metrics.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from gregor.common.etcd import Compare, Delete, EtcdClient, Put
from gregor.controller.controller import Controller, preferred_replica_imbalance_count
from gregor.controller.membership import on_controller_failover, process_broker_change
from gregor.controller.requests import ControllerActions
from gregor.controller.state import NO_LEADER, ControllerContext, LeaderAndIsr, TopicPartition


class AcceptingEtcd(EtcdClient):
    """Never connects; every guarded transaction succeeds and is recorded."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:1", cluster="c")
        self.txns: list[tuple[Sequence[Compare], Sequence[Put | Delete]]] = []

    async def guarded_txn(self, compares: Sequence[Compare], successes: Sequence[Put | Delete]) -> None:  # type: ignore[override]
        self.txns.append((compares, successes))


CLEAN = TopicPartition("clean", 0)
DIRTY = TopicPartition("dirty", 0)
OTHER = TopicPartition("other", 1)


def value(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


async def active_controller(registry: CollectorRegistry) -> Controller:
    """Active controller with topics clean (RF 2), dirty (RF 2, unclean election on) and other (2 partitions)."""
    c = Controller(1, AcceptingEtcd(), registry=registry)
    c.active_controller_id = 1
    ctx = ControllerContext(live_broker_epochs={1: 11, 2: 12, 3: 13}, epoch=4)
    for topic, parts in {"clean": {0: (1, 2)}, "dirty": {0: (1, 2)}, "other": {0: (2, 3), 1: (3, 2)}}.items():
        ctx.all_topics.add(topic)
        ctx.topic_configs[topic] = {}
        for p, replicas in parts.items():
            ctx.update_partition_replica_assignment(TopicPartition(topic, p), replicas)
    ctx.topic_configs["dirty"] = {"unclean.leader.election.enable": "true"}
    # The ISRs shrank to the leader; "other" partition 1 is led by its second replica.
    ctx.put_partition_leadership_info(CLEAN, LeaderAndIsr(1, 3, (1,), controller_epoch=4, partition_epoch=2))
    ctx.put_partition_leadership_info(DIRTY, LeaderAndIsr(1, 3, (1,), controller_epoch=4, partition_epoch=2))
    ctx.put_partition_leadership_info(TopicPartition("other", 0), LeaderAndIsr(2, 0, (2, 3), controller_epoch=4))
    ctx.put_partition_leadership_info(OTHER, LeaderAndIsr(2, 1, (2, 3), controller_epoch=4))
    c.ctx = ctx
    actions = ControllerActions()
    on_controller_failover(ctx, actions, c._election())
    await c.apply_actions(actions)
    return c


async def test_gauges_count_topics_partitions_and_imbalance() -> None:
    registry = CollectorRegistry()
    c = await active_controller(registry)
    assert value(registry, "gregor_controller_global_topics") == 3
    assert value(registry, "gregor_controller_global_partitions") == 4
    assert value(registry, "gregor_controller_offline_partitions") == 0
    assert value(registry, "gregor_controller_preferred_replica_imbalance") == 1  # other-1 led by 2, not 3
    assert value(registry, "gregor_controller_unclean_leader_elections_total") == 0
    assert preferred_replica_imbalance_count(c.ctx) == 1
    c.channels.shutdown()


async def test_last_isr_member_dies_offline_unless_unclean_then_comes_back() -> None:
    registry = CollectorRegistry()
    c = await active_controller(registry)
    actions = ControllerActions()
    process_broker_change(c.ctx, {2: 12, 3: 13}, actions, c._election())  # broker 1 dies
    await c.apply_actions(actions)
    # clean: no live ISR member, so no leader; dirty: the out-of-sync replica 2 is elected alone.
    assert c.ctx.partition_leadership_info[CLEAN].leader == NO_LEADER
    assert c.ctx.partition_leadership_info[CLEAN].isr == (1,)
    assert c.ctx.partition_leadership_info[DIRTY].leader == 2
    assert c.ctx.partition_leadership_info[DIRTY].isr == (2,)
    assert value(registry, "gregor_controller_offline_partitions") == 1
    assert value(registry, "gregor_controller_unclean_leader_elections_total") == 1
    # clean-0 (-1), dirty-0 (2) and other-1 (2) are not led by their first replica.
    assert value(registry, "gregor_controller_preferred_replica_imbalance") == 3

    # Broker 1 registers again (onBrokerStartup): the last ISR member leads clean-0 again.
    actions = ControllerActions()
    process_broker_change(c.ctx, {1: 21, 2: 12, 3: 13}, actions, c._election())
    await c.apply_actions(actions)
    assert c.ctx.partition_leadership_info[CLEAN].leader == 1
    assert c.ctx.partition_leadership_info[CLEAN].leader_epoch == 5
    assert c.ctx.partition_leadership_info[DIRTY].leader == 2  # nothing moves a live leader
    assert value(registry, "gregor_controller_offline_partitions") == 0
    assert value(registry, "gregor_controller_unclean_leader_elections_total") == 1
    assert value(registry, "gregor_controller_preferred_replica_imbalance") == 2


async def test_resignation_zeroes_the_gauges() -> None:
    registry = CollectorRegistry()
    c = await active_controller(registry)
    actions = ControllerActions()
    process_broker_change(c.ctx, {2: 12, 3: 13}, actions, c._election())
    await c.apply_actions(actions)
    assert value(registry, "gregor_controller_offline_partitions") == 1
    c.on_controller_resignation()
    for name in ("offline_partitions", "global_topics", "global_partitions",
                 "preferred_replica_imbalance", "active_controller"):
        assert value(registry, f"gregor_controller_{name}") == 0, name
