"""Topic ids (KIP-516): Kafka's Uuid text form (base64url, no padding), reserved ids, bad input."""

from __future__ import annotations

import base64

import pytest

from gregor.common import errors, uuid


def test_kafka_text_form_round_trips() -> None:
    # Kafka's Uuid.toString of these two longs: base64url of the 16 big-endian bytes, no "==".
    assert uuid.to_string(uuid.ZERO_UUID) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert uuid.to_string(uuid.METADATA_TOPIC_ID) == "AAAAAAAAAAAAAAAAAAAAAQ"
    raw = bytes.fromhex("fb8c7d2a3e1f4b6c9d0e1f2a3b4c5d6e")
    text = uuid.to_string(raw)
    assert text == base64.urlsafe_b64encode(raw).decode().rstrip("=") == "-4x9Kj4fS2ydDh8qO0xdbg"
    assert len(text) == 22 and uuid.from_string(text) == raw
    # An empty id (nothing known) prints as Kafka prints Uuid.ZERO_UUID.
    assert uuid.to_string(b"") == "AAAAAAAAAAAAAAAAAAAAAA"


def test_random_ids_are_v4_never_reserved_never_dash_first() -> None:
    seen = {uuid.random_topic_id() for _ in range(2000)}
    assert len(seen) == 2000
    for topic_id in seen:
        assert len(topic_id) == 16 and topic_id not in uuid.RESERVED and uuid.is_assigned(topic_id)
        assert (topic_id[6] >> 4) == 4 and (topic_id[8] >> 6) == 0b10  # version 4, IETF variant
        assert not uuid.to_string(topic_id).startswith("-")
        assert uuid.from_string(uuid.to_string(topic_id)) == topic_id


@pytest.mark.parametrize("text", ["", "AAAA", "AAAAAAAAAAAAAAAAAAAAAA==", "AAAAAAAAAAAAAAAAAAAAA!",
                                  "AAAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAB"])
def test_bad_text_is_a_typed_error(text: str) -> None:
    # The last one decodes, but to bits that 22 characters of a 16-byte uuid never carry.
    with pytest.raises(errors.InvalidRequestError):  # type: ignore[attr-defined]
        uuid.from_string(text)


def test_wrong_length_bytes_are_refused() -> None:
    with pytest.raises(ValueError):
        uuid.to_string(b"\x01" * 15)
    assert not uuid.is_assigned(uuid.ZERO_UUID) and not uuid.is_assigned(b"")
