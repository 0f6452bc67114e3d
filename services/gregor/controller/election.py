"""Partition leader election algorithms and the leader-imbalance check, as pure functions (Kafka's PartitionLeaderElectionAlgorithms)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gregor.controller.state import ControllerContext, LeaderAndIsr, TopicPartition

# leader.imbalance.per.broker.percentage: a broker is rebalanced once more than
# this share of the partitions it is preferred leader for are led elsewhere.
LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT = 10


def offline_partition_leader_election(
    assignment: Sequence[int],
    isr: Collection[int],
    live_replicas: Collection[int],
    unclean_enabled: bool,
) -> tuple[int | None, bool]:
    """Leader for a partition whose leader went away.

    Args:
        assignment: assigned replicas, preferred leader first.
        isr: the partition's in-sync replicas.
        live_replicas: replicas whose broker is live.
        unclean_enabled: unclean.leader.election.enable for the topic.

    Returns:
        (leader, is_unclean): the first live replica in assignment order that
        is in the ISR; else, only if unclean election is enabled, the first
        live replica (is_unclean=True); else (None, False).
    """
    for replica in assignment:
        if replica in live_replicas and replica in isr:
            return replica, False
    if unclean_enabled:
        for replica in assignment:
            if replica in live_replicas:
                return replica, True
    return None, False


def reassign_partition_leader_election(
    reassignment: Sequence[int], isr: Collection[int], live_replicas: Collection[int]
) -> int | None:
    """First target replica of a reassignment that is live and in the ISR."""
    return next((r for r in reassignment if r in live_replicas and r in isr), None)


def preferred_replica_partition_leader_election(
    assignment: Sequence[int], isr: Collection[int], live_replicas: Collection[int]
) -> int | None:
    """The preferred (first assigned) replica, if it is live and in the ISR; never another one."""
    if assignment and assignment[0] in live_replicas and assignment[0] in isr:
        return assignment[0]
    return None


def controlled_shutdown_partition_leader_election(
    assignment: Sequence[int],
    isr: Collection[int],
    live_replicas: Collection[int],
    shutting_down_brokers: Collection[int],
) -> int | None:
    """First live ISR replica, in assignment order, whose broker is not shutting down."""
    return next(
        (r for r in assignment if r in live_replicas and r in isr and r not in shutting_down_brokers), None
    )


@dataclass(frozen=True)
class OfflineElection:
    """Strategy for offline and new partitions; unclean if enabled cluster-wide or for the topic."""

    allow_unclean: bool = False
    unclean_topics: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ReassignElection:
    """Strategy for a reassignment: targets come from `targets`, keyed by partition."""

    targets: dict[TopicPartition, tuple[int, ...]]


@dataclass(frozen=True)
class PreferredElection:
    """Strategy for auto and manual preferred leader elections."""


@dataclass(frozen=True)
class ControlledShutdownElection:
    """Strategy that moves leadership off brokers that are shutting down."""


ElectionStrategy = OfflineElection | ReassignElection | PreferredElection | ControlledShutdownElection


ELECTION_KINDS = ("offline", "unclean", "reassign", "preferred", "controlled_shutdown")


def election_kind(strategy: ElectionStrategy, is_unclean: bool) -> str:
    """The `kind` label of gregor_controller_leader_elections_total (Kafka's election types)."""
    if is_unclean:
        return "unclean"
    return {OfflineElection: "offline", ReassignElection: "reassign", PreferredElection: "preferred",
            ControlledShutdownElection: "controlled_shutdown"}[type(strategy)]


@dataclass(frozen=True)
class ElectionResult:
    """The outcome for one partition: the new state (None if no leader) and who must be told."""

    topic_partition: TopicPartition
    new_leader_and_isr: LeaderAndIsr | None
    live_replicas: tuple[int, ...]
    is_unclean: bool = False


def elect_leader(
    ctx: ControllerContext, tp: TopicPartition, current: LeaderAndIsr, strategy: ElectionStrategy
) -> ElectionResult:
    """Run a strategy for one partition and derive the resulting ISR as Kafka does.

    Offline: the ISR keeps its online members if the leader came from it, else
    it is the new (unclean) leader alone. Controlled shutdown: the ISR loses
    the shutting-down brokers. Preferred and reassign: the ISR is unchanged.
    """
    assignment = ctx.partition_replica_assignment(tp)
    include_shutting_down = isinstance(strategy, ControlledShutdownElection)
    live = tuple(r for r in assignment if ctx.is_replica_online(r, tp, include_shutting_down))
    isr = current.isr
    if isinstance(strategy, OfflineElection):
        unclean_enabled = strategy.allow_unclean or tp.topic in strategy.unclean_topics
        leader, unclean = offline_partition_leader_election(assignment, isr, live, unclean_enabled)
        if leader is None:
            return ElectionResult(tp, None, live)
        new_isr = [r for r in isr if ctx.is_replica_online(r, tp)] if leader in isr else [leader]
        return ElectionResult(tp, current.new_leader_and_isr(leader, new_isr), live, unclean)
    if isinstance(strategy, ReassignElection):
        found = reassign_partition_leader_election(strategy.targets.get(tp, assignment), isr, live)
        return ElectionResult(tp, None if found is None else current.new_leader(found), live)
    if isinstance(strategy, PreferredElection):
        found = preferred_replica_partition_leader_election(assignment, isr, live)
        return ElectionResult(tp, None if found is None else current.new_leader(found), live)
    shutting = ctx.shutting_down_broker_ids
    found = controlled_shutdown_partition_leader_election(assignment, isr, live, shutting)
    if found is None:
        return ElectionResult(tp, None, live)
    return ElectionResult(tp, current.new_leader_and_isr(found, [r for r in isr if r not in shutting]), live)


def leader_imbalance_ratios(ctx: ControllerContext) -> dict[int, float]:
    """Per preferred-leader broker: the share of its partitions currently led by another broker."""
    preferred: dict[int, list[TopicPartition]] = {}
    for tp in ctx.all_partitions():
        if ctx.is_topic_queued_up_for_deletion(tp.topic):
            continue
        assignment = ctx.partition_replica_assignment(tp)
        if assignment:
            preferred.setdefault(assignment[0], []).append(tp)
    ratios: dict[int, float] = {}
    for broker_id, partitions in preferred.items():
        not_led = [
            tp for tp in partitions
            if tp in ctx.partition_leadership_info and ctx.partition_leadership_info[tp].leader != broker_id
        ]
        ratios[broker_id] = len(not_led) / len(partitions)
    return ratios


def partitions_for_auto_leader_rebalance(
    ctx: ControllerContext,
    imbalance_percentage: int = LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT,
) -> set[TopicPartition]:
    """Partitions a preferred election should move, for brokers over the imbalance threshold.

    A partition qualifies when its preferred replica is not leading, its topic
    is not being deleted, and the preferred replica is online and in the ISR
    (Kafka's checkAndTriggerAutoLeaderRebalance).
    """
    ratios = leader_imbalance_ratios(ctx)
    threshold = imbalance_percentage / 100
    out: set[TopicPartition] = set()
    for tp, lai in ctx.partition_leadership_info.items():
        assignment = ctx.partition_replica_assignment(tp)
        if not assignment or ratios.get(assignment[0], 0.0) <= threshold:
            continue
        preferred = assignment[0]
        if (
            lai.leader != preferred
            and tp.topic in ctx.all_topics
            and not ctx.is_topic_queued_up_for_deletion(tp.topic)
            and ctx.is_replica_online(preferred, tp)
            and preferred in lai.isr
        ):
            out.add(tp)
    return out
