"""Partition assignors run by the group leader member: range, roundrobin, sticky, cooperative-sticky (seed 003, 6.4).

Pure functions of (partitions per topic, member subscriptions) -> member assignments,
with Kafka's algorithms and names, so a group behaves as a Java consumer group would:

- range (default, RangeAssignor): per topic, members in order; partitions/members = n
  remainder m: every member gets n consecutive partitions, the first m one more.
- roundrobin (RoundRobinAssignor): all subscribed partitions sorted by (topic, partition)
  dealt to the members in a circle, skipping members not subscribed to the topic.
- sticky (StickyAssignor): as balanced as possible (counts differ by at most one among
  members that could take each other's partitions) while keeping every member's previously
  owned partitions where balance allows. Eager protocol: members still revoke everything.
- cooperative-sticky (CooperativeStickyAssignor): sticky, but a partition never moves
  straight from one owner to another in one generation: it is left unassigned, its owner
  revokes it, and the follow-up rebalance hands it to the new owner (cooperative protocol).

Members are ordered as Kafka's MemberInfo: static members (group.instance.id) first by
instance id, then dynamic members by member id (member ids start with client.id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from gregor.client.config import ConfigError

TopicPartition = tuple[str, int]
Assignment = dict[str, list[TopicPartition]]

EAGER, COOPERATIVE = "eager", "cooperative"


@dataclass(frozen=True)
class MemberSubscription:
    """What the leader knows of one member: its topics and (sticky assignors) what it owned in which generation."""

    member_id: str
    topics: tuple[str, ...]
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = -1
    group_instance_id: str = ""
    user_data: bytes = b""


def member_order(m: MemberSubscription) -> tuple[int, str]:
    """Kafka's MemberInfo.compareTo: static members by group.instance.id, then dynamic ones by member id."""
    return (0, m.group_instance_id) if m.group_instance_id else (1, m.member_id)


def _sorted_members(members: Mapping[str, MemberSubscription]) -> list[MemberSubscription]:
    return sorted(members.values(), key=member_order)


def _all_partitions(partitions_per_topic: Mapping[str, int],
                    members: Mapping[str, MemberSubscription]) -> list[TopicPartition]:
    """Every partition of every subscribed topic that exists, sorted by (topic, partition)."""
    topics = sorted({t for m in members.values() for t in m.topics if t in partitions_per_topic})
    return [(t, p) for t in topics for p in range(partitions_per_topic[t])]


@dataclass
class Assignor:
    """Base: a name (the JoinGroup protocol name) and the rebalance protocols it supports."""

    name: str = ""
    protocols: tuple[str, ...] = (EAGER,)

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> Assignment:
        raise NotImplementedError


class RangeAssignor(Assignor):
    """Per topic: consumers in order, n = partitions // consumers, the first (partitions % consumers) get n+1."""

    def __init__(self) -> None:
        super().__init__("range", (EAGER,))

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> Assignment:
        out: Assignment = {m: [] for m in members}
        ordered = _sorted_members(members)
        topics = sorted({t for m in ordered for t in m.topics})
        for topic in topics:
            count = partitions_per_topic.get(topic)
            if count is None:
                continue  # not (yet) in the metadata: Kafka skips it
            consumers = [m.member_id for m in ordered if topic in m.topics]
            per, extra = divmod(count, len(consumers))
            for i, member in enumerate(consumers):
                start = per * i + min(i, extra)
                length = per + (1 if i < extra else 0)
                out[member].extend((topic, p) for p in range(start, start + length))
        return out


class RoundRobinAssignor(Assignor):
    """Deal all partitions, sorted by (topic, partition), to the consumers in a circle (skipping non-subscribers)."""

    def __init__(self) -> None:
        super().__init__("roundrobin", (EAGER,))

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> Assignment:
        return deal_round_robin(_all_partitions(partitions_per_topic, members), _sorted_members(members))


def deal_round_robin(partitions: Sequence[TopicPartition], ordered: Sequence[MemberSubscription]) -> Assignment:
    """Kafka's CircularIterator loop: each partition to the next member (cyclically) subscribed to its topic."""
    out: Assignment = {m.member_id: [] for m in ordered}
    if not ordered:
        return out
    i = 0
    for tp in partitions:
        for _ in range(len(ordered)):
            member = ordered[i % len(ordered)]
            i += 1
            if tp[0] in member.topics:
                out[member.member_id].append(tp)
                break
    return out


class StickyAssignor(Assignor):
    """Balanced, and keeps previously owned partitions where balance allows (eager protocol)."""

    def __init__(self) -> None:
        super().__init__("sticky", (EAGER,))

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> Assignment:
        return sticky_assign(partitions_per_topic, members)


class CooperativeStickyAssignor(Assignor):
    """Sticky, but a partition changing owner is withheld for one generation (cooperative protocol)."""

    def __init__(self) -> None:
        super().__init__("cooperative-sticky", (COOPERATIVE, EAGER))

    def assign(self, partitions_per_topic: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> Assignment:
        target = sticky_assign(partitions_per_topic, members)
        previous = valid_owners(partitions_per_topic, members)
        # Kafka's adjustAssignment: a partition whose owner changes is not handed over in this
        # generation; its owner revokes it and rejoins, and the next rebalance assigns it.
        return {m: [tp for tp in tps if previous.get(tp, m) == m] for m, tps in target.items()}


def valid_owners(partitions_per_topic: Mapping[str, int],
                 members: Mapping[str, MemberSubscription]) -> dict[TopicPartition, str]:
    """partition -> member that owns it and may keep it (still subscribed, partition exists).

    Claims of the highest generation win; two claims of that same generation cancel out
    (Kafka's StickyAssignor treats such a partition as unowned).
    """
    best: dict[TopicPartition, tuple[int, list[str]]] = {}
    for m in members.values():
        for tp in m.owned_partitions:
            if tp[0] not in m.topics or tp[1] >= partitions_per_topic.get(tp[0], 0) or tp[1] < 0:
                continue
            gen, claimants = best.get(tp, (-2, []))
            if m.generation_id > gen:
                best[tp] = (m.generation_id, [m.member_id])
            elif m.generation_id == gen:
                claimants.append(m.member_id)
    return {tp: c[0] for tp, (_, c) in best.items() if len(c) == 1}


def sticky_assign(partitions_per_topic: Mapping[str, int],
                  members: Mapping[str, MemberSubscription]) -> Assignment:
    """The sticky plan: keep valid owned partitions, place the rest on the least loaded, then rebalance.

    Rebalancing moves one partition at a time from the most loaded member to the least
    loaded member that may take it, until no member could take a partition from one with
    two or more partitions more (Kafka's isBalanced). A newly placed partition moves
    before a kept one, so a member keeps what it owned whenever balance allows.
    """
    ordered = _sorted_members(members)
    rank = {m.member_id: i for i, m in enumerate(ordered)}
    subs = {m.member_id: set(m.topics) for m in ordered}
    out: Assignment = {m.member_id: [] for m in ordered}
    if not ordered:
        return out
    all_parts = _all_partitions(partitions_per_topic, members)
    owner = valid_owners(partitions_per_topic, members)
    kept = set()
    for tp in all_parts:
        m = owner.get(tp)
        if m is not None:
            out[m].append(tp)
            kept.add(tp)
    # Unowned partitions: the ones with the fewest possible consumers first.
    eligible = {t: [m.member_id for m in ordered if t in subs[m.member_id]] for t in {tp[0] for tp in all_parts}}
    pending = sorted((tp for tp in all_parts if tp not in kept), key=lambda tp: (len(eligible[tp[0]]), tp))
    for tp in pending:
        target = min(eligible[tp[0]], key=lambda m: (len(out[m]), rank[m]))
        out[target].append(tp)
    _balance(out, subs, eligible, rank, kept, owner)
    for tps in out.values():
        tps.sort()
    return out


def _balance(out: Assignment, subs: dict[str, set[str]], eligible: dict[str, list[str]],
             rank: dict[str, int], kept: set[TopicPartition], owner: dict[TopicPartition, str]) -> None:
    """Move partitions from overloaded members to members with at least two fewer, sticky ones last."""
    limit = sum(len(v) for v in out.values()) * max(1, len(out)) + 1
    for _ in range(limit):
        move = _next_move(out, eligible, rank, owner)
        if move is None:
            return
        src, tp, dst = move
        out[src].remove(tp)
        out[dst].append(tp)
        kept.discard(tp)


def _next_move(out: Assignment, eligible: dict[str, list[str]], rank: dict[str, int],
               owner: dict[TopicPartition, str]) -> tuple[str, TopicPartition, str] | None:
    """The most loaded member's best partition to give away (one it did not own before first), and to whom."""
    lowest = min(len(v) for v in out.values())
    for src in sorted(out, key=lambda m: (-len(out[m]), rank[m])):
        n = len(out[src])
        if n - lowest <= 1:
            return None  # nobody has two fewer than this member or any member after it
        for sticky in (False, True):
            for tp in reversed(out[src]):  # newest placements first
                if (owner.get(tp) == src) != sticky:
                    continue
                takers = [m for m in eligible[tp[0]] if len(out[m]) < n - 1]
                if takers:
                    return src, tp, min(takers, key=lambda m: (len(out[m]), rank[m]))
    return None


ASSIGNORS: dict[str, type[Assignor]] = {
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
    "sticky": StickyAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
}

# Kafka's class names, accepted in partition.assignment.strategy as the Java client takes them.
KAFKA_CLASS_NAMES = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.StickyAssignor": "sticky",
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky",
}


def assignor_name(value: str) -> str:
    """'range', 'RangeAssignor' or Kafka's class name -> our protocol name; InvalidConfigError otherwise."""
    v = value.strip()
    if v in ASSIGNORS:
        return v
    if v in KAFKA_CLASS_NAMES:
        return KAFKA_CLASS_NAMES[v]
    short = {k.rsplit(".", 1)[1]: n for k, n in KAFKA_CLASS_NAMES.items()}
    if v in short:
        return short[v]
    raise ConfigError(
        f"partition.assignment.strategy {value!r} is not one of {', '.join(ASSIGNORS)} "
        f"(or Kafka's class names, e.g. org.apache.kafka.clients.consumer.RangeAssignor)")


def make_assignors(strategy: str | Sequence[str]) -> list[Assignor]:
    """partition.assignment.strategy (comma-separated or a list, most preferred first) -> assignors."""
    items = strategy.split(",") if isinstance(strategy, str) else list(strategy)
    names = list(dict.fromkeys(assignor_name(s) for s in items if s.strip()))
    if not names:
        raise ConfigError("partition.assignment.strategy is empty")
    return [ASSIGNORS[n]() for n in names]


def rebalance_protocol(assignors: Sequence[Assignor]) -> str:
    """Kafka's rule: cooperative only if every configured assignor supports it, else eager."""
    return COOPERATIVE if all(COOPERATIVE in a.protocols for a in assignors) else EAGER


@dataclass
class AssignmentDiff:
    """What a member must revoke and add when it moves from `owned` to `assigned`."""

    revoked: list[TopicPartition] = field(default_factory=list)
    added: list[TopicPartition] = field(default_factory=list)


def diff(owned: Sequence[TopicPartition], assigned: Sequence[TopicPartition]) -> AssignmentDiff:
    a, b = set(owned), set(assigned)
    return AssignmentDiff(sorted(a - b), sorted(b - a))
