"""The controller's in-memory metadata (seed 001's ControllerContext) and the value types it holds."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Iterable, NamedTuple

from gregor.common.etcd_layout import NO_LEADER, UNKNOWN_BROKER_EPOCH

# Kafka's sentinels (InitialLeaderEpoch, InitialPartitionEpoch); NoLeader comes with the partition-state layout.
INITIAL_LEADER_EPOCH = 0
INITIAL_PARTITION_EPOCH = 0
INITIAL_CONTROLLER_EPOCH = 0
INITIAL_CONTROLLER_EPOCH_VERSION = 0


class ControllerState(enum.Enum):
    """What the controller's event task is doing; every event maps to one (seed 001).

    `value` is Kafka's byte (exported as the gregor_controller_state gauge);
    `rate_and_time_metric_name` is Kafka's `<State>RateAndTimeMs` timer name, or
    None for states that are not timed (Idle, UpdateMetadataResponseReceived).
    """

    IDLE = 0
    CONTROLLER_CHANGE = 1
    BROKER_CHANGE = 2
    TOPIC_CHANGE = 3
    TOPIC_DELETION = 4
    ALTER_PARTITION_REASSIGNMENT = 5
    AUTO_LEADER_BALANCE = 6
    MANUAL_LEADER_BALANCE = 7
    CONTROLLED_SHUTDOWN = 8
    ISR_CHANGE = 9
    LEADER_AND_ISR_RESPONSE_RECEIVED = 10
    LOG_DIR_CHANGE = 11
    CONTROLLER_SHUTDOWN = 12
    UNCLEAN_LEADER_ELECTION_ENABLE = 13
    TOPIC_UNCLEAN_LEADER_ELECTION_ENABLE = 14
    LIST_PARTITION_REASSIGNMENT = 15
    UPDATE_METADATA_RESPONSE_RECEIVED = 16
    UPDATE_FEATURES = 17

    @property
    def kafka_name(self) -> str:
        """Kafka's CamelCase case-object name, e.g. 'TopicChange'."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def rate_and_time_metric_name(self) -> str | None:
        """Kafka's timer name, e.g. 'TopicChangeRateAndTimeMs'; None if the state is not timed."""
        if self in _UNTIMED_STATES:
            return None
        return _LEGACY_METRIC_NAMES.get(self, self.kafka_name) + "RateAndTimeMs"


_UNTIMED_STATES = frozenset({ControllerState.IDLE, ControllerState.UPDATE_METADATA_RESPONSE_RECEIVED})
# Kafka kept these timer names when the states were renamed, so dashboards keep working.
_LEGACY_METRIC_NAMES = {
    ControllerState.BROKER_CHANGE: "LeaderElection",
    ControllerState.ALTER_PARTITION_REASSIGNMENT: "PartitionReassignment",
}


class PartitionState(enum.Enum):
    """States of Kafka's partition state machine."""

    NON_EXISTENT = "NonExistentPartition"
    NEW = "NewPartition"
    ONLINE = "OnlinePartition"
    OFFLINE = "OfflinePartition"


class ReplicaState(enum.Enum):
    """States of Kafka's replica state machine."""

    NON_EXISTENT = "NonExistentReplica"
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"
    DELETION_SUCCESSFUL = "ReplicaDeletionSuccessful"
    DELETION_INELIGIBLE = "ReplicaDeletionIneligible"


class TopicPartition(NamedTuple):
    """A partition of a topic."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class PartitionReplica(NamedTuple):
    """One replica of a partition: the partition and the broker hosting it (Kafka's PartitionAndReplica)."""

    topic_partition: TopicPartition
    replica: int


@dataclass(frozen=True)
class LeaderAndIsr:
    """A partition's leader, leader epoch and ISR as stored in `.../partitions/<p>/state`.

    `partition_epoch` is the version of the stored state (ZooKeeper's zkVersion,
    Kafka's partitionEpoch): every writer, controller or leader, compares it
    before writing and bumps it by one, so concurrent writers fence each other.
    `controller_epoch` is the epoch of the controller that last wrote the state.
    `leader_broker_epoch` is the broker epoch (registration) of the leader this
    leader epoch was given to, UNKNOWN_BROKER_EPOCH when none or not recorded
    (states written before the field existed): a live leader registered under
    another epoch restarted since it was elected, and may have lost records it
    had appended under this leader epoch, so it must not lead on at it.
    """

    leader: int
    leader_epoch: int = INITIAL_LEADER_EPOCH
    isr: tuple[int, ...] = ()
    controller_epoch: int = INITIAL_CONTROLLER_EPOCH
    partition_epoch: int = INITIAL_PARTITION_EPOCH
    leader_broker_epoch: int = UNKNOWN_BROKER_EPOCH

    def __post_init__(self) -> None:
        object.__setattr__(self, "isr", tuple(self.isr))

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    def new_leader_and_isr(self, leader: int, isr: Iterable[int]) -> LeaderAndIsr:
        """A new leader and ISR: the leader epoch moves on, the partition epoch is the writer's to bump.

        The leader's broker epoch is unknown until the writer stamps it
        (`ControllerActions.write`): a stale one would read as a bounce.
        """
        return replace(self, leader=leader, leader_epoch=self.leader_epoch + 1, isr=tuple(isr),
                       leader_broker_epoch=UNKNOWN_BROKER_EPOCH)

    def new_leader(self, leader: int) -> LeaderAndIsr:
        """A new leader with the same ISR (preferred and reassignment elections)."""
        return self.new_leader_and_isr(leader, self.isr)

    def new_epoch(self) -> LeaderAndIsr:
        """Same leader and ISR under a new leader epoch."""
        return self.new_leader_and_isr(self.leader, self.isr)

    def with_isr(self, isr: Iterable[int]) -> LeaderAndIsr:
        """A leader-side ISR change (seed 000): same leader epoch, the ISR alone changes."""
        return replace(self, isr=tuple(isr))

    def with_partition_epoch(self, partition_epoch: int) -> LeaderAndIsr:
        return replace(self, partition_epoch=partition_epoch)

    def with_controller_epoch(self, controller_epoch: int) -> LeaderAndIsr:
        return replace(self, controller_epoch=controller_epoch)

    def with_leader_broker_epoch(self, leader_broker_epoch: int) -> LeaderAndIsr:
        return replace(self, leader_broker_epoch=leader_broker_epoch)


@dataclass
class ControllerContext:
    """The active controller's view of the cluster (seed 001's ControllerContext).

    Concurrency: not thread-safe; exactly one owner, the controller's event task,
    reads and writes it (the drivers feed it from etcd before an event runs).
    """

    live_broker_epochs: dict[int, int] = field(default_factory=dict)
    # Each live broker's open-file limit (soft RLIMIT_NOFILE) as it registered it; absent or -1: unlimited/unknown.
    broker_open_file_limits: dict[int, int] = field(default_factory=dict)
    shutting_down_broker_ids: set[int] = field(default_factory=set)
    epoch: int = INITIAL_CONTROLLER_EPOCH
    epoch_version: int = INITIAL_CONTROLLER_EPOCH_VERSION
    all_topics: set[str] = field(default_factory=set)
    partition_assignments: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    partition_leadership_info: dict[TopicPartition, LeaderAndIsr] = field(default_factory=dict)
    partitions_being_reassigned: set[TopicPartition] = field(default_factory=set)
    partition_states: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    replica_states: dict[PartitionReplica, ReplicaState] = field(default_factory=dict)
    replicas_on_offline_dirs: dict[int, set[TopicPartition]] = field(default_factory=dict)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    # Each topic's id (KIP-516), as stored in its `brokers/topics/<topic>` key.
    topic_ids: dict[str, bytes] = field(default_factory=dict)
    topics_to_be_deleted: set[str] = field(default_factory=set)
    topics_with_deletion_started: set[str] = field(default_factory=set)
    topics_ineligible_for_deletion: set[str] = field(default_factory=set)
    offline_partition_count: int = 0
    preferred_replica_imbalance_count: int = 0

    # -- brokers ---------------------------------------------------------------

    @property
    def live_broker_ids(self) -> set[int]:
        """Registered brokers that are not shutting down (Kafka's liveBrokerIds)."""
        return set(self.live_broker_epochs) - self.shutting_down_broker_ids

    @property
    def live_or_shutting_down_broker_ids(self) -> set[int]:
        return set(self.live_broker_epochs)

    def add_live_brokers(self, broker_epochs: dict[int, int]) -> None:
        self.live_broker_epochs.update(broker_epochs)

    def remove_live_brokers(self, broker_ids: Iterable[int]) -> None:
        for broker_id in broker_ids:
            self.live_broker_epochs.pop(broker_id, None)

    def broker_epoch(self, broker_id: int) -> int:
        """The registered epoch of a live broker; UNKNOWN_BROKER_EPOCH when it is not registered."""
        return self.live_broker_epochs.get(broker_id, UNKNOWN_BROKER_EPOCH)

    def is_replica_online(
        self, broker_id: int, tp: TopicPartition, include_shutting_down: bool = False
    ) -> bool:
        """A replica is online when its broker is live and its log dir is not offline."""
        brokers = self.live_or_shutting_down_broker_ids if include_shutting_down else self.live_broker_ids
        return broker_id in brokers and tp not in self.replicas_on_offline_dirs.get(broker_id, set())

    def offline_dir_replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        """The partition's replicas on live brokers whose log dir is offline (UpdateMetadata's offline replicas)."""
        if not self.replicas_on_offline_dirs:
            return ()
        return tuple(r for r in self.partition_replica_assignment(tp)
                     if tp in self.replicas_on_offline_dirs.get(r, ()))

    # -- topics and assignments ------------------------------------------------

    def partition_replica_assignment(self, tp: TopicPartition) -> tuple[int, ...]:
        """The assigned replicas of a partition, preferred leader first; () if unknown."""
        return self.partition_assignments.get(tp.topic, {}).get(tp.partition, ())

    def update_partition_replica_assignment(self, tp: TopicPartition, replicas: Iterable[int]) -> None:
        self.partition_assignments.setdefault(tp.topic, {})[tp.partition] = tuple(replicas)

    def all_partitions(self) -> set[TopicPartition]:
        return {TopicPartition(t, p) for t, parts in self.partition_assignments.items() for p in parts}

    def partitions_for_topic(self, topic: str) -> set[TopicPartition]:
        return {TopicPartition(topic, p) for p in self.partition_assignments.get(topic, {})}

    def partitions_on_broker(self, broker_id: int) -> set[TopicPartition]:
        return {
            TopicPartition(t, p)
            for t, parts in self.partition_assignments.items()
            for p, replicas in parts.items()
            if broker_id in replicas
        }

    def replicas_on_brokers(self, broker_ids: Iterable[int]) -> set[PartitionReplica]:
        wanted = set(broker_ids)
        return {
            PartitionReplica(TopicPartition(t, p), r)
            for t, parts in self.partition_assignments.items()
            for p, replicas in parts.items()
            for r in replicas
            if r in wanted
        }

    def replicas_for_partitions(self, partitions: Iterable[TopicPartition]) -> list[PartitionReplica]:
        return [PartitionReplica(tp, r) for tp in partitions for r in self.partition_replica_assignment(tp)]

    def remove_topic(self, topic: str) -> None:
        """Forget a deleted topic and everything recorded about its partitions."""
        for tp in self.partitions_for_topic(topic):
            self.partition_leadership_info.pop(tp, None)
            if self.partition_states.pop(tp, None) is PartitionState.OFFLINE:
                self.offline_partition_count -= 1
        self.replica_states = {k: v for k, v in self.replica_states.items() if k.topic_partition.topic != topic}
        for broker_id, offline in list(self.replicas_on_offline_dirs.items()):
            offline -= {tp for tp in offline if tp.topic == topic}
            if not offline:
                del self.replicas_on_offline_dirs[broker_id]
        self.partition_assignments.pop(topic, None)
        self.topic_configs.pop(topic, None)
        self.topic_ids.pop(topic, None)
        self.all_topics.discard(topic)

    def is_topic_queued_up_for_deletion(self, topic: str) -> bool:
        return topic in self.topics_to_be_deleted

    def is_topic_deletion_in_progress(self, topic: str) -> bool:
        return topic in self.topics_with_deletion_started

    # -- leadership and states -------------------------------------------------

    def put_partition_leadership_info(self, tp: TopicPartition, leader_and_isr: LeaderAndIsr) -> None:
        self.partition_leadership_info[tp] = leader_and_isr

    def partitions_with_leaders(self) -> set[TopicPartition]:
        """Partitions that have leadership info and are not queued for deletion."""
        return {
            tp for tp in self.partition_leadership_info if not self.is_topic_queued_up_for_deletion(tp.topic)
        }

    def partitions_with_offline_leader(self) -> set[TopicPartition]:
        """Partitions whose recorded leader is not online (Kafka's partitionsWithOfflineLeader)."""
        return {
            tp
            for tp, lai in self.partition_leadership_info.items()
            if not self.is_replica_online(lai.leader, tp) and not self.is_topic_queued_up_for_deletion(tp.topic)
        }

    def partition_state(self, tp: TopicPartition) -> PartitionState:
        return self.partition_states.get(tp, PartitionState.NON_EXISTENT)

    def put_partition_state(self, tp: TopicPartition, target: PartitionState) -> None:
        """Record a partition's state and keep offline_partition_count in step (updatePartitionStateMetrics)."""
        current = self.partition_state(tp)
        if not self.is_topic_deletion_in_progress(tp.topic):
            if current is not PartitionState.OFFLINE and target is PartitionState.OFFLINE:
                self.offline_partition_count += 1
            elif current is PartitionState.OFFLINE and target is not PartitionState.OFFLINE:
                self.offline_partition_count -= 1
        self.partition_states[tp] = target

    def partitions_in_states(self, *states: PartitionState) -> set[TopicPartition]:
        return {tp for tp, s in self.partition_states.items() if s in states}

    def replica_state(self, replica: PartitionReplica) -> ReplicaState:
        return self.replica_states.get(replica, ReplicaState.NON_EXISTENT)

    def put_replica_state(self, replica: PartitionReplica, target: ReplicaState) -> None:
        self.replica_states[replica] = target

    def remove_replica_state(self, replica: PartitionReplica) -> None:
        self.replica_states.pop(replica, None)

    def replicas_in_state(self, topic: str, state: ReplicaState) -> set[PartitionReplica]:
        return {r for r, s in self.replica_states.items() if r.topic_partition.topic == topic and s is state}
