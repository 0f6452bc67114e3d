"""Kafka's authorizer decision (gregor.common.acl) on examples from Kafka's documentation and on
generated ACL sets checked against the rules stated independently below."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gregor.common.acl import (
    CLUSTER_NAME, AclBinding, AclError, Authorizer, Operation as Op, PatternType, Permission, ResourceType as RT,
    VALID_OPERATIONS, filter_acls,
)

ALICE, BOB = "User:CN=alice", "User:CN=bob"


def acl(principal: str, op: Op, rt: RT = RT.TOPIC, name: str = "orders", pattern: PatternType = PatternType.LITERAL,
        permission: Permission = Permission.ALLOW, host: str = "*") -> AclBinding:
    return AclBinding(principal, host, rt, name, pattern, op, permission).validate()


def test_no_acl_on_a_resource_follows_allow_everyone_if_no_acl_found() -> None:
    assert not Authorizer([]).authorize(ALICE, "10.0.0.1", Op.READ, RT.TOPIC, "orders")
    assert Authorizer([], allow_everyone_if_no_acl_found=True).authorize(ALICE, "10.0.0.1", Op.READ, RT.TOPIC,
                                                                           "orders")
    # An ACL for someone else on the resource: no longer "no ACL found", so alice is denied.
    auth = Authorizer([acl(BOB, Op.READ)], allow_everyone_if_no_acl_found=True)
    assert not auth.authorize(ALICE, "10.0.0.1", Op.READ, RT.TOPIC, "orders")


def test_deny_beats_allow_and_super_users_beat_deny() -> None:
    auth = Authorizer([acl(ALICE, Op.ALL), acl(ALICE, Op.WRITE, permission=Permission.DENY)], super_users=[BOB])
    assert auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    assert not auth.authorize(ALICE, "h", Op.WRITE, RT.TOPIC, "orders")
    deny_all = Authorizer([acl("User:*", Op.ALL, permission=Permission.DENY)], super_users=[BOB])
    assert deny_all.authorize(BOB, "h", Op.WRITE, RT.TOPIC, "orders")
    assert not deny_all.authorize(ALICE, "h", Op.WRITE, RT.TOPIC, "orders")


def test_implied_operations() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert Authorizer([acl(ALICE, op)]).authorize(ALICE, "h", Op.DESCRIBE, RT.TOPIC, "orders"), op
    assert Authorizer([acl(ALICE, Op.ALTER_CONFIGS)]).authorize(ALICE, "h", Op.DESCRIBE_CONFIGS, RT.TOPIC, "orders")
    # Not the other way round, and no other implication.
    assert not Authorizer([acl(ALICE, Op.DESCRIBE)]).authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    assert not Authorizer([acl(ALICE, Op.READ)]).authorize(ALICE, "h", Op.WRITE, RT.TOPIC, "orders")
    # A DENY of READ does not deny DESCRIBE (Kafka denies only the operation named, or ALL).
    auth = Authorizer([acl(ALICE, Op.DESCRIBE), acl(ALICE, Op.READ, permission=Permission.DENY)])
    assert auth.authorize(ALICE, "h", Op.DESCRIBE, RT.TOPIC, "orders")


def test_prefixed_and_wildcard_patterns_and_hosts() -> None:
    auth = Authorizer([acl(ALICE, Op.WRITE, name="billing-", pattern=PatternType.PREFIXED),
                       acl(BOB, Op.READ, name="*"),
                       acl(ALICE, Op.READ, name="audit", host="10.0.0.7")])
    assert auth.authorize(ALICE, "h", Op.WRITE, RT.TOPIC, "billing-invoices")
    assert not auth.authorize(ALICE, "h", Op.WRITE, RT.TOPIC, "billing")  # not a prefix match
    assert auth.authorize(BOB, "h", Op.READ, RT.TOPIC, "anything")
    assert not auth.authorize(BOB, "h", Op.READ, RT.GROUP, "anything")  # other resource type
    assert auth.authorize(ALICE, "10.0.0.7", Op.READ, RT.TOPIC, "audit")
    assert not auth.authorize(ALICE, "10.0.0.8", Op.READ, RT.TOPIC, "audit")


def test_invalid_bindings_are_refused() -> None:
    with pytest.raises(AclError, match="not valid for resource type Group"):
        acl(ALICE, Op.WRITE, rt=RT.GROUP)
    with pytest.raises(AclError, match="TYPE:NAME"):
        acl("alice", Op.READ)
    with pytest.raises(AclError, match="cluster resource"):
        acl(ALICE, Op.CLUSTER_ACTION, rt=RT.CLUSTER, name="other")
    with pytest.raises(AclError, match="wildcard"):
        acl(ALICE, Op.READ, name="*", pattern=PatternType.PREFIXED)
    acl(ALICE, Op.CLUSTER_ACTION, rt=RT.CLUSTER, name=CLUSTER_NAME)


def test_filter_as_kafka_acls_list() -> None:
    acls = [acl(ALICE, Op.READ), acl(BOB, Op.READ), acl(ALICE, Op.WRITE, name="x")]
    assert filter_acls(acls, principal=ALICE) == [acls[0], acls[2]]
    assert filter_acls(acls, resource_type=RT.TOPIC, resource_name="orders") == acls[:2]


# ------------------------------------------------------------------ generated ACL sets

PRINCIPALS = [ALICE, BOB, "User:*"]
NAMES = ["orders", "ord", "o", "billing", "*"]
HOSTS = ["*", "10.0.0.1"]


@st.composite
def bindings(draw: st.DrawFn) -> AclBinding:
    rt = draw(st.sampled_from([RT.TOPIC, RT.GROUP]))
    pattern = draw(st.sampled_from(list(PatternType)))
    name = draw(st.sampled_from([n for n in NAMES if not (pattern is PatternType.PREFIXED and n == "*")]))
    return AclBinding(draw(st.sampled_from(PRINCIPALS)), draw(st.sampled_from(HOSTS)), rt, name, pattern,
                      draw(st.sampled_from(sorted(VALID_OPERATIONS[rt], key=lambda o: o.value))),
                      draw(st.sampled_from(list(Permission))))


def reference(acls: list[AclBinding], principal: str, host: str, op: Op, rt: RT, name: str, supers: set[str],
              allow_if_none: bool) -> bool:
    """Kafka's rules written out case by case (docs: 'Authorization and ACLs'), independent of acl.py."""
    if principal in supers:
        return True

    def on_resource(a: AclBinding) -> bool:
        if a.resource_type != rt:
            return False
        if a.pattern_type == PatternType.PREFIXED:
            return name[:len(a.resource_name)] == a.resource_name
        return a.resource_name in (name, "*")

    relevant = [a for a in acls if on_resource(a)]
    if len(relevant) == 0:
        return allow_if_none
    applies = [a for a in relevant if a.principal in (principal, "User:*") and a.host in (host, "*")]
    for a in applies:
        if a.permission == Permission.DENY and (a.operation == op or a.operation == Op.ALL):
            return False
    implied = {Op.DESCRIBE: [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER], Op.DESCRIBE_CONFIGS: [Op.ALTER_CONFIGS]}
    for a in applies:
        if a.permission == Permission.ALLOW and (a.operation in (op, Op.ALL) or a.operation in implied.get(op, [])):
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(acls=st.lists(bindings(), max_size=8), principal=st.sampled_from([ALICE, BOB, "User:CN=carol"]),
       host=st.sampled_from(["10.0.0.1", "10.0.0.2"]), rt=st.sampled_from([RT.TOPIC, RT.GROUP]),
       name=st.sampled_from(["orders", "ord", "billing", "other"]), op=st.sampled_from(list(Op)),
       supers=st.sets(st.sampled_from([ALICE, BOB])), allow_if_none=st.booleans())
def test_decisions_agree_with_kafkas_rules(acls: list[AclBinding], principal: str, host: str, rt: RT, name: str,
                                           op: Op, supers: set[str], allow_if_none: bool) -> None:
    auth = Authorizer(acls, supers, allow_if_none)
    assert auth.authorize(principal, host, op, rt, name) == reference(acls, principal, host, op, rt, name, supers,
                                                                      allow_if_none)


@settings(max_examples=200, deadline=None)
@given(acls=st.lists(bindings(), max_size=6), op=st.sampled_from([Op.READ, Op.DESCRIBE, Op.DELETE]))
def test_a_matching_deny_always_wins(acls: list[AclBinding], op: Op) -> None:
    deny = AclBinding(ALICE, "*", RT.TOPIC, "ord", PatternType.PREFIXED, op, Permission.DENY)
    assert not Authorizer([*acls, deny]).authorize(ALICE, "10.0.0.1", op, RT.TOPIC, "orders")


@given(bindings())
def test_bindings_round_trip_through_their_stored_json(b: AclBinding) -> None:
    assert AclBinding.from_json(b.to_json()) == b
