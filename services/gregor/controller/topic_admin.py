"""AdminService's topic operations on the active controller: validate, write etcd, then run the topic events.

Every public coroutine here runs on the controller's event task (through
`Controller.run_request`), so it may read and change the context directly. The
etcd writes carry the controller-epoch guard; the TopicChange / TopicDeletion
processing then runs inline, so an answered CreateTopics already has leaders for its
first batch of partitions and their LeaderAndIsr / UpdateMetadata queued (the watch's
own event is then a no-op).

A creation is atomic where it is stored: the topic key with every partition's
assignment (and its config) is one guarded etcd transaction, so the topic exists
whole or not at all, and a controller that takes over mid-creation creates the
partitions still New. Bringing the partitions online is not one event: the first
`new.partitions.per.event` (1,000) go New -> Online inline, the rest in
NewPartitionCreation events queued behind whatever already waits, so other admin
requests and broker changes are answered between the batches of a 10,000-partition
creation (as Kafka's controller bounds its record batches). The RPC answers once the
topic key is written and the first batch is online, as Kafka answers CreateTopics once
the topic is in the metadata, not once every replica exists (a 10,000-partition creation
used to outlive the brokers' 30 s forward timeout, issue 24); until the last batch is
done Metadata shows the partitions created so far, and a CreatePartitions counts the
ones still to come.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gregor.common import errors, uuid
from gregor.common.config import effective_topic_configs, validate_topic_configs
from gregor.common.etcd import CompareFailed, Put, mod_revision_is
from gregor.common.topics import validate_topic_name
from gregor.controller import metadata_store
from gregor.controller.replica_assignment import add_partitions_assignment, assign_replicas_to_brokers
from gregor.controller.requests import ControllerActions

if TYPE_CHECKING:
    from gregor.controller.controller import Controller

NUM_PARTITIONS_DEFAULT = 1  # num.partitions: used when a request asks for -1
DEFAULT_REPLICATION_FACTOR = 1  # default.replication.factor: used when a request asks for -1


# Descriptors a broker keeps for other things than each replica's active segment (connections, checkpoints,
# rolled segments) when the controller checks a creation against the broker's open-file limit (issue 24).
OPEN_FILES_RESERVED = 1024
MAX_PARTITIONS_PER_REQUEST = 10_000  # Kafka 4.0's per-operation limit (QuorumController.MAX_RECORDS_PER_USER_OP)


@dataclass(frozen=True)
class NewTopic:
    """A CreateTopics entry: counts (-1 = default) or an explicit partition -> replicas assignment."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    assignments: Mapping[int, Sequence[int]] = field(default_factory=dict)
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicOutcome:
    name: str
    num_partitions: int = 0
    replication_factor: int = 0
    error: errors.GregorError | None = None
    topic_id: bytes = b""  # CreateTopics: the new topic's id (KIP-516)


def _exists(name: str) -> errors.GregorError:
    return errors.error_for(errors.Code.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.", topic=name)


def _unknown(name: str) -> errors.GregorError:
    return errors.error_for(errors.Code.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist.", topic=name)


def check_assignment(name: str, assignment: Mapping[int, Sequence[int]], brokers: set[int]) -> None:
    """Kafka's validateReplicaAssignment: partitions 0..n-1, one replication factor, no duplicate, known brokers."""
    def bad(message: str) -> errors.GregorError:
        return errors.error_for(errors.Code.INVALID_REPLICA_ASSIGNMENT, message, topic=name)

    if sorted(assignment) != list(range(len(assignment))):
        raise bad("Partitions should be a consecutive 0-based integer sequence.")
    factors = {len(r) for r in assignment.values()}
    if len(factors) != 1 or 0 in factors:
        raise bad("All partitions should have the same number of replicas, at least one.")
    for partition, replicas in assignment.items():
        if len(set(replicas)) != len(replicas):
            raise bad(f"Duplicate replica assignment found for partition {partition}: {list(replicas)}.")
        unknown = sorted(set(replicas) - brokers)
        if unknown:
            raise bad(f"Unknown broker(s) {unknown} in the assignment of partition {partition}.")


class TopicAdmin:
    """Topic creation, deletion, partition additions and configs on the active controller (event task only)."""

    def __init__(self, controller: "Controller") -> None:
        self.controller = controller

    @property
    def _ctx(self) -> Any:
        return self.controller.ctx

    def _plan(self, t: NewTopic) -> dict[int, list[int]]:
        validate_topic_name(t.name)
        if t.name in self._ctx.all_topics or t.name in self._ctx.topics_to_be_deleted:
            raise _exists(t.name)
        validate_topic_configs(t.configs)
        if t.assignments:
            check_partitions_per_request(len(t.assignments))
            check_assignment(t.name, t.assignments, self._ctx.live_broker_ids)
            planned = {p: list(r) for p, r in t.assignments.items()}
        else:
            n = NUM_PARTITIONS_DEFAULT if t.num_partitions == -1 else t.num_partitions
            rf = DEFAULT_REPLICATION_FACTOR if t.replication_factor == -1 else t.replication_factor
            check_partitions_per_request(n)
            planned = assign_replicas_to_brokers(n, rf, sorted(self._ctx.live_broker_ids))
        check_open_file_limits(self._ctx, planned, self.controller.backlogged_replicas())
        return planned

    async def create_topic(self, t: NewTopic, validate_only: bool) -> TopicOutcome:
        """Validate, write `brokers/topics/<t>` + `config/topics/<t>` (guarded), then run TopicChange."""
        try:
            assignment = self._plan(t)
        except errors.GregorError as err:
            err.topic = err.topic or t.name
            return TopicOutcome(t.name, error=err)
        outcome = TopicOutcome(t.name, len(assignment), len(next(iter(assignment.values()))))
        if validate_only:
            return outcome
        # A new topic is a new id (KIP-516), even under the name of a deleted one.
        topic_id = uuid.random_topic_id()
        compares, ops = metadata_store.create_topic_ops(self.controller.etcd, t.name, assignment,
                                                        {k: str(v) for k, v in t.configs.items()}, topic_id)
        try:
            await self.controller.guarded_write(compares, ops)
        except CompareFailed:
            return TopicOutcome(t.name, error=_exists(t.name))
        await self.controller.on_topic_change()
        return dataclasses.replace(outcome, topic_id=topic_id)

    async def delete_topic(self, name: str) -> TopicOutcome:
        """Mark the topic under admin/delete_topics (delete.topic.enable), then run TopicDeletion."""
        if not self.controller.delete_topic_enable:
            return TopicOutcome(name, error=errors.error_for(
                errors.Code.TOPIC_DELETION_DISABLED, "Topic deletion is disabled (delete.topic.enable=false).",
                topic=name))
        if name not in self._ctx.all_topics:
            return TopicOutcome(name, error=_unknown(name))
        etcd = self.controller.etcd
        await self.controller.guarded_write([], [Put(metadata_store.delete_topic_key(etcd, name), b"")])
        await self.controller.on_topic_deletion()
        return TopicOutcome(name)

    async def create_partitions(self, name: str, count: int, validate_only: bool) -> TopicOutcome:
        """Assign the added partitions like Kafka's AdminUtils, write the grown assignment, run TopicChange."""
        if name not in self._ctx.all_topics:
            raise _unknown(name)
        # Partitions of a creation still under way count too (they are in etcd, not yet in the context).
        current = self.controller.assigned_partitions(name)
        check_partitions_per_request(count - len(current))
        added = add_partitions_assignment(current, count, sorted(self._ctx.live_broker_ids))
        check_open_file_limits(self._ctx, added, self.controller.backlogged_replicas())
        rf = len(current[0])
        if not validate_only:
            etcd = self.controller.etcd
            key = metadata_store.topic_key(etcd, name)
            kv = await etcd.get(key)
            expected = kv.mod_revision if kv is not None else 0
            # The topic keeps its id; one written before ids gets it now (the controller's backfill).
            topic_id = (metadata_store.decode_topic_id(kv.value) if kv is not None else b"") \
                or self._ctx.topic_ids.get(name) or uuid.random_topic_id()
            await self.controller.guarded_write(
                [mod_revision_is(key, expected)],
                [Put(key, metadata_store.encode_assignment({**current, **added}, topic_id))])
            await self.controller.on_topic_change()
        return TopicOutcome(name, count, rf)

    def describe_configs(self, names: Sequence[str]) -> list[tuple[str, dict[str, str], errors.GregorError | None]]:
        """(topic, overrides, error) per topic; all topics when names is empty."""
        out: list[tuple[str, dict[str, str], errors.GregorError | None]] = []
        for name in names or sorted(self._ctx.all_topics):
            if name in self._ctx.all_topics:
                out.append((name, dict(self._ctx.topic_configs.get(name, {})), None))
            else:
                out.append((name, {}, _unknown(name)))
        return out

    async def alter_configs(self, name: str, set_: Mapping[str, str], delete: Sequence[str],
                            validate_only: bool) -> dict[str, str]:
        """New overrides for a topic, written guarded; replicas hear of them through a LeaderAndIsr resend."""
        if name not in self._ctx.all_topics:
            raise _unknown(name)
        configs = {k: v for k, v in self._ctx.topic_configs.get(name, {}).items() if k not in set(delete)}
        configs.update({k: str(v) for k, v in set_.items()})
        validate_topic_configs(configs)
        if validate_only:
            return configs
        etcd = self.controller.etcd
        await self.controller.guarded_write([], [Put(metadata_store.config_key(etcd, name),
                                                     metadata_store.encode_config(configs))])
        self._ctx.topic_configs[name] = configs
        actions = ControllerActions()
        for tp in sorted(self._ctx.partitions_for_topic(name)):
            lai = self._ctx.partition_leadership_info.get(tp)
            if lai is not None:
                live = [r for r in self._ctx.partition_replica_assignment(tp) if self._ctx.is_replica_online(r, tp)]
                actions.batch.add_leader_and_isr(self._ctx, live, tp, lai)
        await self.controller.apply_actions(actions)
        return configs


def check_partitions_per_request(n: int) -> None:
    """Kafka 4's limit on one operation (KAFKA-17870): at most MAX_PARTITIONS_PER_REQUEST new partitions,
    checked before any replica is placed, so one oversized request cannot tie up the controller's queue
    and every broker's file descriptors (a 100,000-partition create once took a broker down)."""
    if n > MAX_PARTITIONS_PER_REQUEST:
        raise errors.error_for(
            errors.Code.POLICY_VIOLATION,
            f"Excessively large number of partitions per request: {n} > {MAX_PARTITIONS_PER_REQUEST}. "
            f"Create the topic with fewer partitions and add the rest with CreatePartitions.")


def check_open_file_limits(ctx: Any, added: Mapping[int, Sequence[int]],
                           pending: Iterable[Sequence[int]] = ()) -> None:
    """Refuse, before any replica is placed, new replicas that would take a broker past its open-file limit
    (the `ulimit -n` it registered): each replica holds one descriptor per segment, and at the limit a broker
    fails unrelated requests with "Too many open files" (issue 24). Counted: one per replica (its active
    segment's .log) plus a reserve for connections, checkpoints and further segments: OPEN_FILES_RESERVED,
    or a quarter of a smaller limit."""
    limits: Mapping[int, int] = ctx.broker_open_file_limits
    adding = Counter(b for replicas in added.values() for b in replicas if b in limits)
    if not adding:
        return
    held = Counter(b for parts in ctx.partition_assignments.values() for replicas in parts.values()
                   for b in replicas if b in adding)
    # Partitions of a creation still under way (its later batches) are the brokers' replicas too.
    held.update(b for replicas in pending for b in replicas if b in adding)
    for broker_id, n in sorted(adding.items()):
        replicas, limit = held[broker_id] + n, limits[broker_id]
        reserve = min(OPEN_FILES_RESERVED, limit // 4)
        if replicas + reserve > limit:
            raise errors.error_for(
                errors.Code.POLICY_VIOLATION,
                f"Broker {broker_id} would hold {replicas} replicas: one open file each plus "
                f"{reserve} kept for connections and further segments is {replicas + reserve}"
                f" > its open-file limit (ulimit -n, RLIMIT_NOFILE) of {limit}. Raise the brokers' ulimit -n "
                f"(see docs/operations.md), add brokers, or create fewer partitions.")


def effective_configs(overrides: Mapping[str, str]) -> dict[str, Any]:
    """Every topic config with its value: overrides over Kafka's defaults."""
    return effective_topic_configs(overrides)


__all__ = ["NewTopic", "TopicAdmin", "TopicOutcome", "check_assignment", "effective_configs"]
