"""Kafka's Uuid for topic ids (KIP-516): 16 random bytes, shown as base64url without padding.

`AAAAAAAAAAAAAAAAAAAAAA` is Kafka's ZERO_UUID ("no id"), `AAAAAAAAAAAAAAAAAAAAAQ` its
METADATA_TOPIC_ID; neither is ever handed out, and neither is an id whose text starts with
"-" (a command-line tool would read it as a flag), as Kafka's Uuid.randomUuid avoids.
On the wire (proto `bytes topic_id`) an id is its 16 bytes; empty means "unknown / not checked".
"""

from __future__ import annotations

import base64
import binascii
import os

from gregor.common import errors

UUID_BYTES = 16
ZERO_UUID = bytes(UUID_BYTES)
METADATA_TOPIC_ID = bytes(UUID_BYTES - 1) + b"\x01"
RESERVED = frozenset({ZERO_UUID, METADATA_TOPIC_ID})


def to_string(uuid: bytes) -> str:
    """Kafka's Uuid.toString: base64url of the 16 bytes, no padding (22 characters).

    An empty value (no id known) prints as the zero uuid, as Kafka prints Uuid.ZERO_UUID.
    """
    if not uuid:
        uuid = ZERO_UUID
    if len(uuid) != UUID_BYTES:
        raise ValueError(f"a topic id is {UUID_BYTES} bytes, got {len(uuid)}")
    return base64.urlsafe_b64encode(uuid).decode("ascii").rstrip("=")


def from_string(text: str) -> bytes:
    """Kafka's Uuid.fromString; anything that is not 22 base64url characters of 16 bytes is
    INVALID_REQUEST (a typed error, never a crash)."""
    if len(text) != 22 or not all(c.isalnum() or c in "-_" for c in text):
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"Invalid topic id {text!r}: "
                               "expected 22 base64url characters (Kafka's Uuid format)")
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError) as exc:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"Invalid topic id {text!r}: {exc}") from exc
    if len(raw) != UUID_BYTES or to_string(raw) != text:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"Invalid topic id {text!r}: not a 16-byte uuid")
    return raw


def random_topic_id() -> bytes:
    """A new topic id: random (a version 4 uuid), never reserved, never printed with a leading '-'."""
    while True:
        raw = bytearray(os.urandom(UUID_BYTES))
        raw[6] = (raw[6] & 0x0F) | 0x40  # version 4, as java.util.UUID.randomUUID
        raw[8] = (raw[8] & 0x3F) | 0x80  # IETF variant
        uuid = bytes(raw)
        if uuid not in RESERVED and not to_string(uuid).startswith("-"):
            return uuid


def is_assigned(uuid: bytes) -> bool:
    """True for a real topic id (16 bytes, not the zero uuid)."""
    return len(uuid) == UUID_BYTES and uuid != ZERO_UUID
