"""Moving leadership on purpose, as pure functions over ControllerContext (seed 001's KafkaController).

- `do_controlled_shutdown`: a broker about to stop hands its leaderships to other ISR
  members and leaves the ISRs it follows (ControlledShutdown event).
- `process_replica_leader_election`: preferred or unclean election on demand
  (ElectLeaders, kafka-leader-election.sh) and for the auto-rebalance.
- `check_and_trigger_auto_leader_rebalance`: the periodic
  AutoPreferredReplicaLeaderElection event (auto.leader.rebalance.enable).

Each appends etcd writes and control requests to a ControllerActions that the
driver applies; none performs I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from gregor.common import errors
from gregor.controller import partition_state_machine as psm
from gregor.controller import replica_state_machine as rsm
from gregor.controller.election import (LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT, ControlledShutdownElection,
                                        OfflineElection, PreferredElection, partitions_for_auto_leader_rebalance)
from gregor.controller.requests import ControllerActions
from gregor.controller.state import NO_LEADER, ControllerContext, PartitionReplica, PartitionState, ReplicaState, TopicPartition

from gregor.common.etcd_layout import UNKNOWN_BROKER_EPOCH  # noqa: E402  (the epoch is not checked)


class ElectionType(enum.IntEnum):
    """Kafka's ElectionType (the ElectLeaders request's byte)."""

    PREFERRED = 0
    UNCLEAN = 1


class ElectionTrigger(enum.Enum):
    """Why an election ran (Kafka's ElectionTrigger); labels the preferred-election counter."""

    AUTO = "auto"
    ADMIN = "admin"


def do_controlled_shutdown(
    ctx: ControllerContext, broker_id: int, broker_epoch: int, actions: ControllerActions
) -> set[TopicPartition]:
    """Kafka's doControlledShutdown: move leadership off `broker_id`; returns the partitions it still leads.

    The broker joins `shutting_down_broker_ids` (it stays registered, but is no
    longer live for elections). Every replicated partition it leads moves to the
    first live ISR replica not shutting down (ControlledShutdownPartitionLeaderElectionStrategy),
    the ISR losing the shutting-down brokers; LeaderAndIsr goes to the live replicas
    and to the old leader, which becomes a follower. Every partition it follows gets StopReplica
    (no delete) on it and the OfflineReplica transition: out of the ISR, LeaderAndIsr
    to the others.

    Returns the replicated partitions it still leads and that another live broker
    hosts (the broker asks again after `controlled.shutdown.retry.backoff.ms`).
    Deviation: a partition no other live broker hosts is not reported, since no
    retry can move it; Kafka reports it and the broker exhausts its retries.

    Raises:
        GregorError STALE_BROKER_EPOCH if the request comes from an older incarnation;
        BROKER_NOT_AVAILABLE if the broker is not registered.
    """
    cached = ctx.live_broker_epochs.get(broker_id)
    if broker_epoch != UNKNOWN_BROKER_EPOCH and cached is not None and broker_epoch < cached:
        raise errors.error_for(errors.Code.STALE_BROKER_EPOCH,
                               f"Received controlled shutdown request from an old broker epoch {broker_epoch} "
                               f"for broker {broker_id}. Current broker epoch is {cached}.")
    if broker_id not in ctx.live_or_shutting_down_broker_ids:
        raise errors.error_for(errors.Code.BROKER_NOT_AVAILABLE, f"Broker id {broker_id} does not exist.")
    ctx.shutting_down_broker_ids.add(broker_id)
    to_act_on = sorted(
        tp for tp in ctx.partitions_on_broker(broker_id)
        if len(ctx.partition_replica_assignment(tp)) > 1
        and tp in ctx.partition_leadership_info
        and not ctx.is_topic_queued_up_for_deletion(tp.topic)
    )
    led = [tp for tp in to_act_on if ctx.partition_leadership_info[tp].leader == broker_id]
    followed = [tp for tp in to_act_on if ctx.partition_leadership_info[tp].leader != broker_id]
    # The election's LeaderAndIsr goes to the live and shutting-down replicas, the old leader included: it
    # becomes a follower, as in Kafka. Leaders do not wait for it in the high watermark (it is left out of
    # UpdateMetadata's live brokers: not ISR-eligible, KIP-841) nor take it back into the ISR.
    psm.handle_state_changes(ctx, [tp for tp in led if ctx.partition_state(tp) is PartitionState.ONLINE],
                             PartitionState.ONLINE, actions, ControlledShutdownElection())
    for tp in followed:
        actions.batch.add_stop_replica([broker_id], tp, delete_partition=False)
    followers = [PartitionReplica(tp, broker_id) for tp in followed]
    rsm.handle_state_changes(
        ctx, [r for r in followers if ctx.replica_state(r) in rsm.VALID_PREVIOUS_STATES[ReplicaState.OFFLINE]],
        ReplicaState.OFFLINE, actions)
    return partitions_still_led(ctx, broker_id)


def partitions_still_led(ctx: ControllerContext, broker_id: int) -> set[TopicPartition]:
    """Replicated partitions `broker_id` leads that some other live broker could take over."""
    out = set()
    for tp in ctx.partitions_on_broker(broker_id):
        lai = ctx.partition_leadership_info.get(tp)
        assignment = ctx.partition_replica_assignment(tp)
        if lai is None or lai.leader != broker_id or len(assignment) <= 1:
            continue
        if ctx.is_topic_queued_up_for_deletion(tp.topic):
            continue
        if any(r != broker_id and ctx.is_replica_online(r, tp) for r in assignment):
            out.add(tp)
    return out


@dataclass(frozen=True)
class ElectionOutcome:
    """One partition's answer to ElectLeaders: the leader now, or the error (Kafka's ApiError)."""

    leader: int
    error: errors.GregorError | None = None


def process_replica_leader_election(
    ctx: ControllerContext,
    partitions: Iterable[TopicPartition] | None,
    election_type: ElectionType,
    actions: ControllerActions,
) -> dict[TopicPartition, ElectionOutcome]:
    """Kafka's processReplicaLeaderElection + onReplicaElection over the given partitions (None: all).

    Per partition: UNKNOWN_TOPIC_OR_PARTITION if it does not exist;
    INVALID_TOPIC_EXCEPTION if its topic is being deleted; ELECTION_NOT_NEEDED when
    the preferred replica already leads (PREFERRED) or the leader is live (UNCLEAN);
    otherwise the election runs: PREFERRED elects the first assigned replica if it
    is live and in the ISR, else PREFERRED_LEADER_NOT_AVAILABLE; UNCLEAN elects the
    first live ISR replica, else the first live replica (counted as unclean), else
    ELIGIBLE_LEADERS_NOT_AVAILABLE. With `partitions` None, partitions that need no
    election are left out of the answer, as Kafka does for "all partitions".
    """
    all_partitions = partitions is None
    wanted = sorted(ctx.all_partitions() if partitions is None else set(partitions))
    out: dict[TopicPartition, ElectionOutcome] = {}
    valid: list[TopicPartition] = []
    for tp in wanted:
        lai = ctx.partition_leadership_info.get(tp)
        if tp.partition not in ctx.partition_assignments.get(tp.topic, {}) or lai is None:
            out[tp] = ElectionOutcome(NO_LEADER, errors.error_for(
                errors.Code.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.",
                topic=tp.topic, partition=tp.partition))
        elif ctx.is_topic_queued_up_for_deletion(tp.topic):
            out[tp] = ElectionOutcome(lai.leader, errors.error_for(
                errors.Code.INVALID_TOPIC_EXCEPTION, "The topic is being deleted",
                topic=tp.topic, partition=tp.partition))
        elif _election_needed(ctx, tp, election_type):
            valid.append(tp)
        elif not all_partitions:
            out[tp] = ElectionOutcome(lai.leader, errors.error_for(
                errors.Code.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.",
                topic=tp.topic, partition=tp.partition))
    out.update(on_replica_election(ctx, valid, election_type, actions))
    return out


def _election_needed(ctx: ControllerContext, tp: TopicPartition, election_type: ElectionType) -> bool:
    lai = ctx.partition_leadership_info[tp]
    if election_type is ElectionType.PREFERRED:
        assignment = ctx.partition_replica_assignment(tp)
        return bool(assignment) and lai.leader != assignment[0]
    return lai.leader == NO_LEADER or not ctx.is_replica_online(lai.leader, tp)


def on_replica_election(
    ctx: ControllerContext, partitions: Iterable[TopicPartition], election_type: ElectionType,
    actions: ControllerActions,
) -> dict[TopicPartition, ElectionOutcome]:
    """Kafka's onReplicaElection: move the partitions Online under the election type's strategy."""
    parts = sorted(set(partitions))
    if not parts:
        return {}
    # OnlinePartition is reachable from New, Online and Offline; anything else cannot be elected.
    movable = [tp for tp in parts if ctx.partition_state(tp) in psm.VALID_PREVIOUS_STATES[PartitionState.ONLINE]]
    strategy = PreferredElection() if election_type is ElectionType.PREFERRED else OfflineElection(allow_unclean=True)
    results = psm.handle_state_changes(ctx, movable, PartitionState.ONLINE, actions, strategy)
    code = (errors.Code.PREFERRED_LEADER_NOT_AVAILABLE if election_type is ElectionType.PREFERRED
            else errors.Code.ELIGIBLE_LEADERS_NOT_AVAILABLE)
    out: dict[TopicPartition, ElectionOutcome] = {}
    for tp in parts:
        elected = results.get(tp)
        if elected is not None:
            out[tp] = ElectionOutcome(elected.leader)
            continue
        reason = actions.failed.get(tp) or f"Failed to elect leader for partition {tp} under strategy " \
                                            f"{type(strategy).__name__}"
        lai = ctx.partition_leadership_info.get(tp)
        out[tp] = ElectionOutcome(lai.leader if lai is not None else NO_LEADER,
                                  errors.error_for(code, reason, topic=tp.topic, partition=tp.partition))
    return out


def check_and_trigger_auto_leader_rebalance(
    ctx: ControllerContext,
    actions: ControllerActions,
    imbalance_percentage: int = LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT,
) -> dict[TopicPartition, ElectionOutcome]:
    """Kafka's checkAndTriggerAutoLeaderRebalance: preferred elections for brokers over the imbalance threshold.

    A broker's imbalance is (partitions it is preferred for but does not lead) /
    (partitions it is preferred for), topics being deleted excepted; above
    `leader.imbalance.per.broker.percentage` its partitions are elected back,
    skipping those whose preferred replica is not live, shutting down or out of the
    ISR, and doing nothing while partitions are being reassigned.
    """
    if ctx.partitions_being_reassigned:
        return {}
    candidates = partitions_for_auto_leader_rebalance(ctx, imbalance_percentage)
    return on_replica_election(ctx, candidates, ElectionType.PREFERRED, actions)
