"""DescribeClientQuotas' filter matching and AlterClientQuotas' entity checks (kafka/quota_handlers.py), as Kafka's."""

from __future__ import annotations

import pytest

from gregor.common import errors
from gregor.kafka.quota_handlers import (
    CLIENT_ID, MATCH_DEFAULT, MATCH_EXACT, MATCH_SPECIFIED, USER, entity_pb, matches, validate_filters,
)

ALICE = {USER: "alice"}
ALICE_C1 = {USER: "alice", CLIENT_ID: "c1"}
DEFAULT_USER = {USER: None}


def test_exact_default_and_specified_matches() -> None:
    assert matches(ALICE, [(USER, MATCH_EXACT, "alice")], strict=False)
    assert not matches(ALICE, [(USER, MATCH_EXACT, "bob")], strict=False)
    assert matches(DEFAULT_USER, [(USER, MATCH_DEFAULT, None)], strict=False)
    assert not matches(ALICE, [(USER, MATCH_DEFAULT, None)], strict=False)
    assert matches(ALICE, [(USER, MATCH_SPECIFIED, None)], strict=False)
    assert matches(DEFAULT_USER, [(USER, MATCH_SPECIFIED, None)], strict=False)
    assert not matches({CLIENT_ID: "c1"}, [(USER, MATCH_SPECIFIED, None)], strict=False)


def test_strict_keeps_only_entities_without_other_components() -> None:
    user_filter = [(USER, MATCH_EXACT, "alice")]
    assert matches(ALICE_C1, user_filter, strict=False)
    assert not matches(ALICE_C1, user_filter, strict=True)
    assert matches(ALICE, user_filter, strict=True)
    assert matches(ALICE_C1, [], strict=False)  # no component: every entity
    assert not matches(ALICE_C1, [], strict=True)


def test_bad_filters_and_entities_are_invalid_request() -> None:
    for bad in ([(USER, MATCH_EXACT, "a"), (USER, MATCH_DEFAULT, None)], [("topic", MATCH_SPECIFIED, None)],
                [(USER, 7, None)], [(USER, MATCH_EXACT, None)]):
        with pytest.raises(errors.GregorError) as exc:
            validate_filters(bad)
        assert exc.value.code == errors.Code.INVALID_REQUEST
    for entity in ([("ip", "10.0.0.1")], [], [(USER, "a"), (USER, "b")], [("group", "g")]):
        with pytest.raises(errors.GregorError) as exc:
            entity_pb(entity)
        assert exc.value.code == errors.Code.INVALID_REQUEST
    pb = entity_pb([(USER, None), (CLIENT_ID, "c1")])
    assert (pb.user, pb.client_id) == ("<default>", "c1")
