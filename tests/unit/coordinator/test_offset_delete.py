"""Kafka's OffsetDelete checks (GroupManager.validate_offset_delete), on the pure group state machine."""

from __future__ import annotations

import pytest

from gregor.common import errors
from tests.unit.coordinator.test_group_manager import manager, stable_group


async def test_a_consumer_group_with_members_keeps_the_offsets_of_its_subscribed_topics() -> None:
    m = manager()
    await stable_group(m, 1)  # subscribes to "t"
    group, kept = m.validate_offset_delete("g", [("t", 0), ("other", 0)])
    assert group is m.groups["g"] and kept == {"t"}


async def test_an_empty_group_may_lose_every_offset_and_an_unknown_one_is_not_found() -> None:
    m = manager()
    m.validate_offset_commit("simple", -1, "", "", 0)  # a standalone consumer's group: Empty
    assert m.validate_offset_delete("simple", [("t", 0)])[1] == set()
    with pytest.raises(errors.GregorError) as ei:
        m.validate_offset_delete("nope", [("t", 0)])
    assert ei.value.code == errors.Code.GROUP_ID_NOT_FOUND


async def test_a_non_consumer_group_with_members_refuses() -> None:
    m = manager()
    await stable_group(m, 1)
    m.groups["g"].protocol_type = "connect"
    with pytest.raises(errors.GregorError) as ei:
        m.validate_offset_delete("g", [("t", 0)])
    assert ei.value.code == errors.Code.NON_EMPTY_GROUP
