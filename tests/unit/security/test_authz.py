"""gregor.common.authz: the authorizer's config keys, the ACL cache's snapshots, the audited checks and the
Admin API's filters; gregor.cli.acls: kafka-acls.sh's expansion of --producer / --consumer and its output.
Pure logic (the etcd-backed parts run against real processes in tests/integration/test_acls.py)."""

from __future__ import annotations

import json
import logging

import click
import pytest

from gregor.cli.acls import bindings_to_add, resource_pattern
from gregor.common import errors
from gregor.common.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from gregor.common.authz import (ANONYMOUS, DENIALS, AclCache, AclFilter, Authz, AuthorizerConfig, Caller,
                                 binding_from_fields, filter_from_pb, filter_to_pb, peer_host, principal_from_subject,
                                 produce_denials, with_denials)
from gregor.common.etcd_layout import AclZNode

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
ALICE = Caller("User:alice", "10.0.0.1")


class _Keys:
    """The key space of an etcd client without a connection (AclZNode only builds keys with it)."""

    def key(self, *parts: str | int) -> bytes:
        return ("/gregor/t/" + "/".join(map(str, parts))).encode()

    def relative(self, key: bytes) -> str:
        return key.decode()[len("/gregor/t/"):]


def acl(principal: str, rtype: ResourceType, name: str, op: Operation, perm: Permission = ALLOW,
        pattern: PatternType = LIT, host: str = "*") -> AclBinding:
    return AclBinding(principal, host, rtype, name, pattern, op, perm)


def authz_with(acls: list[AclBinding], synced: bool = True, **config: object) -> Authz:
    """An Authz whose cache got these ACLs as the watch would deliver them."""
    cfg = AuthorizerConfig("gregor", **config)  # type: ignore[arg-type]
    az = Authz.create(cfg, _Keys())
    cache = az.cache
    assert isinstance(cache, AclCache)
    for a in acls:
        cache._apply(AclZNode.key(_Keys(), a), AclZNode.encode(a))
    cache._swap(7)
    if synced:
        cache.synced.set()
    return az


def test_config_keys_parse_as_kafka_names_them() -> None:
    cfg = AuthorizerConfig.from_properties({"authorizer.class.name": "org.apache.kafka.metadata.authorizer."
                                            "StandardAuthorizer", "super.users": "User:a; User:CN=b,O=c",
                                            "allow.everyone.if.no.acl.found": "TRUE"})
    assert cfg.enabled and cfg.super_users == {"User:a", "User:CN=b,O=c"} and cfg.allow_everyone_if_no_acl_found
    assert not AuthorizerConfig.from_properties({}).enabled  # off unless named
    assert not AuthorizerConfig.from_properties({}).allow_everyone_if_no_acl_found
    for bad in ({"super.users": "alice"}, {"allow.everyone.if.no.acl.found": "yes"},
                {"ssl.principal.mapping.rules": "RULE:broken"}):
        with pytest.raises(errors.GregorError) as info:
            AuthorizerConfig.from_properties({"authorizer.class.name": "gregor", **bad})
        assert info.value.code == errors.Code.INVALID_CONFIG
    with pytest.raises(errors.GregorError):  # on without etcd: the ACLs have nowhere to live
        Authz.create(AuthorizerConfig("gregor"), None)


def test_principals_and_hosts() -> None:
    assert principal_from_subject(None) == ANONYMOUS
    assert principal_from_subject("CN=billing,O=Example", "RULE:^CN=([^,]*).*$/$1/,DEFAULT") == "User:billing"
    assert peer_host("ipv4:127.0.0.1:5555") == "127.0.0.1" and peer_host("ipv6:[::1]:80") == "::1"
    assert peer_host("unix:/tmp/s") == ""


def test_checks_follow_the_snapshot_and_deny_wins() -> None:
    az = authz_with([acl("User:alice", T, "app-", Operation.WRITE, pattern=PRE),
                     acl("User:alice", T, "app-locked", Operation.WRITE, DENY)], super_users=frozenset({"User:root"}))
    assert az.check(ALICE, Operation.WRITE, T, "app-orders")
    assert az.check(ALICE, Operation.DESCRIBE, T, "app-orders")  # Describe implied by Write
    assert not az.check(ALICE, Operation.WRITE, T, "app-locked")
    assert not az.check(ALICE, Operation.READ, T, "app-orders")
    assert not az.check(ALICE, Operation.WRITE, T, "other")  # no ACL: allow.everyone.if.no.acl.found=false
    assert az.check(Caller("User:root"), Operation.WRITE, T, "app-locked")
    with pytest.raises(errors.GregorError) as info:
        az.require(ALICE, Operation.WRITE, T, "app-locked", "Produce", topic="app-locked")
    assert info.value.code == errors.Code.TOPIC_AUTHORIZATION_FAILED and info.value.topic == "app-locked"
    for rtype, code in ((G, errors.Code.GROUP_AUTHORIZATION_FAILED), (C, errors.Code.CLUSTER_AUTHORIZATION_FAILED),
                        (X, errors.Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)):
        with pytest.raises(errors.GregorError) as info:
            az.require(ALICE, Operation.DESCRIBE, rtype, "kafka-cluster" if rtype is C else "x")
        assert info.value.code == code and info.value.status_code.name == "PERMISSION_DENIED"
    # A change swaps the snapshot and empties the memo: the same question gets the new answer.
    cache = az.cache
    assert cache is not None
    locked = acl("User:alice", T, "app-locked", Operation.WRITE, DENY)
    cache._apply(AclZNode.key(_Keys(), locked), None)
    cache._swap(8)
    assert az.check(ALICE, Operation.WRITE, T, "app-locked")


def test_until_the_acls_are_read_only_super_users_pass() -> None:
    az = authz_with([acl("User:alice", T, "t", Operation.ALL)], synced=False, super_users=frozenset({"User:root"}))
    assert not az.check(ALICE, Operation.WRITE, T, "t")
    assert az.check(Caller("User:root"), Operation.WRITE, T, "t")
    assert az.cache is not None
    az.cache.synced.set()
    assert az.check(ALICE, Operation.WRITE, T, "t")  # the early denial was not memoized


def test_a_denial_is_counted_and_audited_as_one_json_line(caplog: pytest.LogCaptureFixture) -> None:
    az = authz_with([])
    before = DENIALS.labels(resource_type="Group", operation="Read")._value.get()
    with caplog.at_level(logging.INFO, logger="gregor.audit"):
        assert not az.check(ALICE, Operation.READ, G, "billing", "JoinGroup")
        assert not az.check(ALICE, Operation.READ, G, "billing", "JoinGroup", audit=False)  # Metadata-style filter
    assert DENIALS.labels(resource_type="Group", operation="Read")._value.get() == before + 1
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gregor.audit"]
    assert len(lines) == 1
    assert {k: lines[0][k] for k in ("principal", "host", "operation", "resource_type", "resource_name", "api",
                                     "decision")} == {
        "principal": "User:alice", "host": "10.0.0.1", "operation": "Read", "resource_type": "Group",
        "resource_name": "billing", "api": "JoinGroup", "decision": "Denied"}


def test_an_authorizer_that_is_off_allows_everything_without_looking() -> None:
    az = Authz()
    assert not az.enabled and az.check(ALICE, Operation.WRITE, T, "x")
    assert produce_denials(az, ALICE, "tx", ["x"]) == {}


def test_produce_answers_per_partition_and_checks_the_transactional_id() -> None:
    az = authz_with([acl("User:alice", T, "ok", Operation.WRITE), acl("User:alice", X, "tx", Operation.WRITE)])
    denied = produce_denials(az, ALICE, "", ["ok", "no", "no"])
    assert set(denied) == {"no"}
    appended: list[list[tuple[str, int, bytes]]] = []

    def start(parts: list[tuple[str, int, bytes]]) -> list[str]:
        appended.append(parts)
        return [f"{t}-{p}" for t, p, _ in parts]
    out = with_denials([("no", 0, b""), ("ok", 1, b""), ("no", 2, b"")], denied, start)
    assert appended == [[("ok", 1, b"")]]  # the denied partitions were never appended
    assert out[1] == "ok-1" and [(e.code, e.topic, e.partition) for e in (out[0], out[2])] == [
        (errors.Code.TOPIC_AUTHORIZATION_FAILED, "no", 0), (errors.Code.TOPIC_AUTHORIZATION_FAILED, "no", 2)]
    assert produce_denials(az, ALICE, "tx", ["ok"]) == {}
    with pytest.raises(errors.GregorError) as info:
        produce_denials(az, ALICE, "other-tx", ["ok"])
    assert info.value.code == errors.Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # KIP-679: an idempotent producer needs IdempotentWrite on the Cluster or Write on some topic.
    assert az.can_write_idempotently(ALICE, ["no", "ok"]) and not az.can_write_idempotently(ALICE, ["no"])


def test_filters_match_as_kafkas_acl_binding_filter() -> None:
    acls = [acl("User:a", T, "app-", Operation.READ, pattern=PRE), acl("User:a", T, "app-x", Operation.READ),
            acl("User:a", T, "*", Operation.READ), acl("User:b", T, "other", Operation.READ)]

    def names(f: AclFilter) -> list[str]:
        return [a.resource_name for a in acls if f.matches(a)]
    assert names(AclFilter(resource_type=T, resource_name="app-x", pattern_type="Literal")) == ["app-x"]
    assert names(AclFilter(resource_type=T, resource_name="app-x", pattern_type="Match")) == ["app-", "app-x", "*"]
    assert names(AclFilter(resource_name="app-", pattern_type="Any")) == ["app-"]
    assert names(AclFilter(principal="User:b")) == ["other"]
    f = AclFilter("User:a", None, T, "n", "Match", Operation.READ, DENY)
    assert filter_from_pb(filter_to_pb(f)) == f
    with pytest.raises(errors.GregorError) as info:
        binding_from_fields("User:a", "*", "Topic", "t", "Literal", "Fly", "Allow")
    assert info.value.code == errors.Code.INVALID_REQUEST
    assert binding_from_fields("User:a", "", "transactional-id", "t", "prefixed", "idempotent_write".replace(
        "idempotent_write", "write"), "allow") == acl("User:a", X, "t", Operation.WRITE, pattern=PRE)


def test_kafka_acls_convenience_flags_expand_as_kafka_does() -> None:
    out = bindings_to_add(("User:p",), (), (), (), (), ("t",), (), False, ("tx",), "prefixed", True, False, True)
    assert {(a.resource_type, a.resource_name, a.pattern_type, a.operation) for a in out} == {
        (T, "t", PRE, Operation.WRITE), (T, "t", PRE, Operation.DESCRIBE), (T, "t", PRE, Operation.CREATE),
        (X, "tx", PRE, Operation.WRITE), (X, "tx", PRE, Operation.DESCRIBE),
        (C, "kafka-cluster", LIT, Operation.IDEMPOTENT_WRITE)}
    out = bindings_to_add(("User:c",), ("User:d",), (), ("10.0.0.9",), (), ("t",), ("g",), False, (), "literal",
                          False, True, False)
    assert {(a.principal, a.host, a.permission, a.resource_type, a.operation) for a in out} >= {
        ("User:c", "*", ALLOW, G, Operation.READ), ("User:d", "10.0.0.9", DENY, T, Operation.READ)}
    assert all(a.operation is Operation.ALL for a in bindings_to_add(("User:e",), (), (), (), (), (), (), True, (),
                                                                     "literal", False, False, False))
    with pytest.raises(click.UsageError):  # --consumer needs a group
        bindings_to_add(("User:c",), (), (), (), (), ("t",), (), False, (), "literal", False, True, False)
    with pytest.raises(click.UsageError):  # add needs a principal
        bindings_to_add((), (), (), (), ("Read",), ("t",), (), False, (), "literal", False, False, False)
    with pytest.raises(errors.GregorError):  # Write is not an operation of a Group (kafka-acls.sh refuses it)
        bindings_to_add(("User:a",), (), (), (), ("Write",), (), ("g",), False, (), "literal", False, False, False)
    assert resource_pattern(T, "t", PRE) == "ResourcePattern(resourceType=TOPIC, name=t, patternType=PREFIXED)"
