"""Assignors against seed 003's examples (6.4) and the sticky / cooperative-sticky properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gregor.client.assignors import (
    COOPERATIVE, EAGER, CooperativeStickyAssignor, MemberSubscription, RangeAssignor, RoundRobinAssignor,
    StickyAssignor, assignor_name, deal_round_robin, make_assignors, rebalance_protocol, sticky_assign,
)
from gregor.common import errors


def members(*names: str, topics: tuple[str, ...] = ("TOPIC_A",)) -> dict[str, MemberSubscription]:
    return {n: MemberSubscription(n, topics) for n in names}


def fmt(assignment: dict[str, list[tuple[str, int]]]) -> dict[str, list[str]]:
    return {m: [f"{t}-{p}" for t, p in tps] for m, tps in assignment.items()}


# ------------------------------------------------------------------ range (seed 003, 6.4.1)
def test_range_seed_example_1_topic_a_5_partitions_over_3_consumers() -> None:
    out = RangeAssignor().assign({"TOPIC_A": 5}, members("C1", "C2", "C3"))
    assert fmt(out) == {"C1": ["TOPIC_A-0", "TOPIC_A-1"], "C2": ["TOPIC_A-2", "TOPIC_A-3"], "C3": ["TOPIC_A-4"]}


def test_range_seed_example_2_two_topics_over_2_consumers() -> None:
    out = RangeAssignor().assign({"TOPIC_A": 5, "TOPIC_B": 3}, members("C1", "C2", topics=("TOPIC_A", "TOPIC_B")))
    assert fmt(out) == {"C1": ["TOPIC_A-0", "TOPIC_A-1", "TOPIC_A-2", "TOPIC_B-0", "TOPIC_B-1"],
                        "C2": ["TOPIC_A-3", "TOPIC_A-4", "TOPIC_B-2"]}


def test_range_orders_members_by_id_not_by_insertion() -> None:
    out = RangeAssignor().assign({"t": 3}, members("c-b", "c-a", topics=("t",)))
    assert out == {"c-a": [("t", 0), ("t", 1)], "c-b": [("t", 2)]}


def test_range_static_members_first_by_instance_id() -> None:
    ms = {"z": MemberSubscription("z", ("t",), group_instance_id="i-1"),
          "a": MemberSubscription("a", ("t",)),
          "y": MemberSubscription("y", ("t",), group_instance_id="i-0")}
    out = RangeAssignor().assign({"t": 3}, ms)
    assert out == {"y": [("t", 0)], "z": [("t", 1)], "a": [("t", 2)]}


def test_range_only_subscribers_of_a_topic_share_it_and_unknown_topics_are_skipped() -> None:
    ms = {"C1": MemberSubscription("C1", ("A", "B")), "C2": MemberSubscription("C2", ("A", "missing"))}
    out = RangeAssignor().assign({"A": 2, "B": 2}, ms)
    assert out == {"C1": [("A", 0), ("B", 0), ("B", 1)], "C2": [("A", 1)]}


# ------------------------------------------------------------------ roundrobin (seed 003, 6.4.2)
def test_round_robin_seed_example_dealing_order() -> None:
    # The seed deals example 2's partitions in TopicAndPartition hashCode order (the old Scala
    # consumer's sort). Dealt to C1, C2 the seed's lists come out; the seed's last line
    # ("C3 TOPIC_A-4", no TOPIC_B-2) is a slip: with two consumers A-4 goes to C1 and B-2 to C2.
    order = [("TOPIC_A", 0), ("TOPIC_B", 0), ("TOPIC_A", 1), ("TOPIC_A", 2), ("TOPIC_B", 1), ("TOPIC_A", 3),
             ("TOPIC_A", 4), ("TOPIC_B", 2)]
    ms = list(members("C1", "C2", topics=("TOPIC_A", "TOPIC_B")).values())
    out = fmt(deal_round_robin(order, ms))
    assert out["C1"][:3] == ["TOPIC_A-0", "TOPIC_A-1", "TOPIC_B-1"]
    assert out["C2"][:3] == ["TOPIC_B-0", "TOPIC_A-2", "TOPIC_A-3"]
    assert out == {"C1": ["TOPIC_A-0", "TOPIC_A-1", "TOPIC_B-1", "TOPIC_A-4"],
                   "C2": ["TOPIC_B-0", "TOPIC_A-2", "TOPIC_A-3", "TOPIC_B-2"]}


def test_round_robin_kafka_order_is_sorted_topic_partition() -> None:
    # The Java RoundRobinAssignor sorts by (topic, partition), then deals: C1 A0 A3 B1, C2 A1 A4 B2, C3 A2 B0.
    out = RoundRobinAssignor().assign({"TOPIC_A": 5, "TOPIC_B": 3},
                                      members("C1", "C2", "C3", topics=("TOPIC_A", "TOPIC_B")))
    assert fmt(out) == {"C1": ["TOPIC_A-0", "TOPIC_A-3", "TOPIC_B-1"],
                        "C2": ["TOPIC_A-1", "TOPIC_A-4", "TOPIC_B-2"],
                        "C3": ["TOPIC_A-2", "TOPIC_B-0"]}


def test_round_robin_kafka_javadoc_identical_subscriptions() -> None:
    out = RoundRobinAssignor().assign({"t0": 3, "t1": 3}, members("C0", "C1", topics=("t0", "t1")))
    assert out == {"C0": [("t0", 0), ("t0", 2), ("t1", 1)], "C1": [("t0", 1), ("t1", 0), ("t1", 2)]}


def test_round_robin_skips_members_not_subscribed() -> None:
    ms = {"C0": MemberSubscription("C0", ("t0",)), "C1": MemberSubscription("C1", ("t0", "t1")),
          "C2": MemberSubscription("C2", ("t0", "t1", "t2"))}
    out = RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3}, ms)
    # Kafka's javadoc example: C0 [t0p0], C1 [t1p0], C2 [t1p1, t2p0, t2p1, t2p2].
    assert out == {"C0": [("t0", 0)], "C1": [("t1", 0)], "C2": [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)]}


# ------------------------------------------------------------------ names and protocols
@pytest.mark.parametrize("value,name", [
    ("range", "range"), ("roundrobin", "roundrobin"), ("sticky", "sticky"),
    ("cooperative-sticky", "cooperative-sticky"),
    ("org.apache.kafka.clients.consumer.RangeAssignor", "range"),
    ("org.apache.kafka.clients.consumer.RoundRobinAssignor", "roundrobin"),
    ("org.apache.kafka.clients.consumer.StickyAssignor", "sticky"),
    ("org.apache.kafka.clients.consumer.CooperativeStickyAssignor", "cooperative-sticky"),
    ("CooperativeStickyAssignor", "cooperative-sticky"),
])
def test_assignor_names(value: str, name: str) -> None:
    assert assignor_name(value) == name


def test_unknown_assignor_is_a_config_error() -> None:
    with pytest.raises(errors.InvalidConfigError):  # type: ignore[attr-defined]
        assignor_name("org.example.MyAssignor")


def test_rebalance_protocol_is_cooperative_only_if_every_assignor_supports_it() -> None:
    assert rebalance_protocol(make_assignors("cooperative-sticky")) == COOPERATIVE
    assert rebalance_protocol(make_assignors("range,cooperative-sticky")) == EAGER
    assert rebalance_protocol(make_assignors(["sticky"])) == EAGER
    assert [a.name for a in make_assignors("range, range ,roundrobin")] == ["range", "roundrobin"]


# ------------------------------------------------------------------ sticky properties
def owned(assignment: dict[str, list[tuple[str, int]]], generation: int = 1,
          topics: tuple[str, ...] = ("t",)) -> dict[str, MemberSubscription]:
    return {m: MemberSubscription(m, topics, tuple(tps), generation) for m, tps in assignment.items()}


def counts(assignment: dict[str, list[tuple[str, int]]]) -> list[int]:
    return [len(v) for v in assignment.values()]


def check_complete(assignment: dict[str, list[tuple[str, int]]], partitions: int) -> None:
    flat = [tp for tps in assignment.values() for tp in tps]
    assert sorted(flat) == [("t", p) for p in range(partitions)]


@settings(max_examples=150, deadline=None)
@given(partitions=st.integers(0, 40), n=st.integers(1, 8), seed_gen=st.integers(0, 3))
def test_sticky_balanced_within_one_and_complete(partitions: int, n: int, seed_gen: int) -> None:
    out = sticky_assign({"t": partitions}, members(*(f"c{i}" for i in range(n)), topics=("t",)))
    check_complete(out, partitions)
    assert max(counts(out)) - min(counts(out)) <= 1


@settings(max_examples=150, deadline=None)
@given(partitions=st.integers(0, 40), n=st.integers(1, 7))
def test_sticky_member_join_moves_only_to_the_new_member(partitions: int, n: int) -> None:
    names = [f"c{i}" for i in range(n)]
    before = sticky_assign({"t": partitions}, members(*names, topics=("t",)))
    subs = owned(before)
    subs["new"] = MemberSubscription("new", ("t",))
    after = sticky_assign({"t": partitions}, subs)
    check_complete(after, partitions)
    assert max(counts(after)) - min(counts(after)) <= 1
    for m in names:  # an old member only ever loses partitions, and only to the newcomer
        assert set(after[m]) <= set(before[m])
    moved = sum(len(set(before[m]) - set(after[m])) for m in names)
    assert moved == len(after["new"])
    assert len(after["new"]) in (partitions // (n + 1), -(-partitions // (n + 1)))


@settings(max_examples=150, deadline=None)
@given(partitions=st.integers(0, 40), n=st.integers(2, 8), leaver=st.integers(0, 7))
def test_sticky_member_leave_moves_only_the_leavers_partitions(partitions: int, n: int, leaver: int) -> None:
    names = [f"c{i}" for i in range(n)]
    before = sticky_assign({"t": partitions}, members(*names, topics=("t",)))
    gone = names[leaver % n]
    subs = owned({m: tps for m, tps in before.items() if m != gone})
    after = sticky_assign({"t": partitions}, subs)
    check_complete(after, partitions)
    assert max(counts(after)) - min(counts(after)) <= 1
    for m in after:
        assert set(before[m]) <= set(after[m])


def test_sticky_higher_generation_claim_wins_and_equal_claims_cancel() -> None:
    subs = {"a": MemberSubscription("a", ("t",), (("t", 0),), 5),
            "b": MemberSubscription("b", ("t",), (("t", 0), ("t", 1)), 4)}
    out = sticky_assign({"t": 2}, subs)
    assert out == {"a": [("t", 0)], "b": [("t", 1)]}


def test_sticky_drops_partitions_of_unsubscribed_topics_and_vanished_partitions() -> None:
    subs = {"a": MemberSubscription("a", ("t",), (("u", 0), ("t", 5)), 1), "b": MemberSubscription("b", ("t",))}
    out = sticky_assign({"t": 2, "u": 1}, subs)
    check_complete(out, 2)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 3), min_size=2, max_size=5), partitions=st.integers(1, 30))
def test_sticky_unequal_subscriptions_no_member_could_take_from_one_with_two_more(
        sizes: list[int], partitions: int) -> None:
    topics = ["t0", "t1", "t2"]
    subs = {f"c{i}": MemberSubscription(f"c{i}", tuple(topics[:k])) for i, k in enumerate(sizes)}
    ppt = {t: partitions for t in topics}
    out = sticky_assign(ppt, subs)
    subscribed = {t for s in subs.values() for t in s.topics}
    assert sorted(tp for v in out.values() for tp in v) == [(t, p) for t in sorted(subscribed) for p in range(partitions)]
    for m, tps in out.items():
        for tp in tps:
            assert tp[0] in subs[m].topics
            for other, s in subs.items():
                if tp[0] in s.topics:
                    assert len(out[other]) >= len(tps) - 1


def test_sticky_keeps_everything_when_already_balanced() -> None:
    prev = {"a": [("t", 0), ("t", 3)], "b": [("t", 1), ("t", 4)], "c": [("t", 2), ("t", 5)]}
    assert StickyAssignor().assign({"t": 6}, owned(prev)) == prev


# ------------------------------------------------------------------ cooperative-sticky
def run_cooperative(partitions: int, before: dict[str, list[tuple[str, int]]], joiners: list[str],
                    leavers: list[str]) -> list[dict[str, list[tuple[str, int]]]]:
    """Rounds of cooperative rebalancing until stable; each member revokes what it lost before the next round."""
    current = {m: tps for m, tps in before.items() if m not in leavers}
    current.update({j: [] for j in joiners})
    rounds = []
    gen = 1
    for _ in range(5):
        out = CooperativeStickyAssignor().assign({"t": partitions}, owned(current, gen))
        rounds.append(out)
        gen += 1
        # Cooperative protocol: a member keeps the intersection, revokes the rest, rejoins if it revoked.
        revoked_any = any(set(current[m]) - set(out[m]) for m in out)
        current = out
        if not revoked_any and sorted(tp for v in out.values() for tp in v) == [("t", p) for p in range(partitions)]:
            break
    return rounds


@settings(max_examples=100, deadline=None)
@given(partitions=st.integers(0, 30), n=st.integers(1, 6), join=st.integers(0, 2), leave=st.integers(0, 2))
def test_cooperative_sticky_never_moves_a_partition_between_owners_in_one_generation(
        partitions: int, n: int, join: int, leave: int) -> None:
    names = [f"c{i}" for i in range(n)]
    before = sticky_assign({"t": partitions}, members(*names, topics=("t",)))
    leavers = names[:min(leave, n - 1)]
    rounds = run_cooperative(partitions, before, [f"j{i}" for i in range(join)], leavers)
    prev_owner = {tp: m for m, tps in before.items() if m not in leavers for tp in tps}
    for out in rounds:
        for m, tps in out.items():
            for tp in tps:
                assert prev_owner.get(tp, m) == m, f"{tp} went straight from {prev_owner[tp]} to {m}"
        prev_owner = {tp: m for m, tps in out.items() for tp in tps}
    final = rounds[-1]
    check_complete(final, partitions)
    assert max(counts(final)) - min(counts(final)) <= 1
    assert len(rounds) <= 2  # converges in the follow-up rebalance


def test_cooperative_sticky_join_withholds_moving_partitions_then_hands_them_over() -> None:
    before = {"a": [("t", 0), ("t", 1), ("t", 2)], "b": [("t", 3), ("t", 4), ("t", 5)]}
    rounds = run_cooperative(6, before, ["c"], [])
    first, second = rounds
    assert first["c"] == []  # nothing handed over directly
    assert sorted(first["a"] + first["b"]) != [("t", p) for p in range(6)]  # two partitions withheld
    assert len(second["c"]) == 2 and set(first["a"]) == set(second["a"]) and set(first["b"]) == set(second["b"])


# ------------------------------------------------------------------ consumer configuration of groups
def test_group_config_errors_are_config_errors_before_connecting() -> None:
    from gregor.client import ConfigError, Consumer

    async def make(**cfg: object) -> None:
        await Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **cfg}).close()

    import asyncio
    with pytest.raises(ConfigError, match="partition.assignment.strategy"):
        asyncio.run(make(**{"partition.assignment.strategy": "org.example.Nope"}))
    with pytest.raises(ConfigError, match="heartbeat.interval.ms"):
        asyncio.run(make(**{"heartbeat.interval.ms": 50000}))
    with pytest.raises(ConfigError, match="session.timeout.ms"):
        asyncio.run(make(**{"session.timeout.ms": "soon"}))
    asyncio.run(make(**{"partition.assignment.strategy": "org.apache.kafka.clients.consumer.RoundRobinAssignor,range",
                        "group.instance.id": "i-1"}))
