"""__consumer_offsets record layout, partitionFor and the ConsumerProtocol codec."""

from __future__ import annotations

import pytest

from gregor.common import consumer_protocol as cp
from gregor.common import errors
from gregor.coordinator import offsets_log as ol
from gregor.common.coordinator_ownership import desired_owner, desired_partitions


def test_java_string_hash_matches_java() -> None:
    # Values of "...".hashCode() in Java.
    assert ol.java_string_hash("") == 0
    assert ol.java_string_hash("a") == 97
    assert ol.java_string_hash("hello") == 99162322
    assert ol.java_string_hash("polygenelubricants") == -(1 << 31)  # Java's famous Integer.MIN_VALUE hash
    h = 0
    for ch in "my-group-with-a-long-name":
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    assert ol.java_string_hash("my-group-with-a-long-name") == (h - (1 << 32) if h >= 1 << 31 else h)
    assert ol.java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # surrogate pair: two UTF-16 units


def test_partition_for_is_abs_hash_mod_n() -> None:
    assert ol.partition_for("hello", 50) == 99162322 % 50
    assert ol.partition_for("polygenelubricants", 50) == 0  # Utils.abs(Integer.MIN_VALUE) == 0
    for g in ("g", "test-group", "x" * 100):
        assert 0 <= ol.partition_for(g, 50) < 50


def test_offset_and_group_records_round_trip() -> None:
    k = ol.OffsetKey("g", "t", 3)
    assert ol.decode_key(ol.encode_offset_key(k)) == k
    gk = ol.GroupKey("g")
    assert ol.decode_key(ol.encode_group_key(gk)) == gk
    v = ol.OffsetValue(42, 7, "meta", 1700000000000)
    assert ol.decode_offset_value(ol.encode_offset_value(v)) == v
    gv = ol.GroupValue("consumer", 5, "range", "m1", 123, [
        ol.MemberValue("m1", "i1", "c1", "/h", 30000, 10000, b"sub", b"asg"),
        ol.MemberValue("m2", "", "c2", "/h", 30000, 10000, b"", b"")])
    assert ol.decode_group_value(ol.encode_group_value(gv)) == gv
    with pytest.raises(errors.GregorError):
        ol.decode_key(b"\x00\x09")


def test_consumer_protocol_round_trip_and_versions() -> None:
    sub = cp.Subscription(["a", "b"], b"ud", [("a", [0, 2])], 4, "rack-1")
    assert cp.decode_subscription(cp.encode_subscription(sub)) == sub
    v0 = cp.decode_subscription(cp.encode_subscription(sub, version=0))
    assert (v0.topics, v0.user_data, v0.owned_partitions, v0.generation_id) == (["a", "b"], b"ud", [], -1)
    asg = cp.Assignment([("a", [1]), ("b", [0, 1])], None)
    assert cp.decode_assignment(cp.encode_assignment(asg)) == asg
    assert cp.decode_assignment(b"") == cp.Assignment([])
    # Kafka's Java client output for Subscription(["t"]) at v0: version, 1 topic "t", null user data.
    assert cp.encode_subscription(cp.Subscription(["t"]), version=0) == bytes.fromhex("0000000000010001 74ffffffff".replace(" ", ""))
    with pytest.raises(errors.GregorError):
        cp.decode_subscription(b"\x00\x01\x7f\xff\xff\xff")
    assert cp.subscribed_topics(b"junk") == set()


def test_ownership_is_deterministic_and_covers_every_partition() -> None:
    live = [3, 1, 2]
    owners = [desired_owner(p, live) for p in range(10)]
    assert owners == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    parts = [desired_partitions(i, live, 10) for i in live]
    assert set().union(*parts) == set(range(10)) and sum(map(len, parts)) == 10
    assert desired_owner(0, []) is None
