"""Kafka's ConsumerProtocol wire format for group subscriptions and assignments (seed 003).

The consumer puts an encoded `Subscription` into JoinGroup's protocol metadata
(one per assignor it supports) and the leader returns an encoded `Assignment`
per member in SyncGroup. The coordinator treats both as opaque bytes except
for one thing: it decodes subscriptions to learn which topics a group reads,
so a change in such a topic's partition count triggers a rebalance (seed 003).

The layout is byte-for-byte Kafka's (ConsumerProtocolSubscription v0-v3,
ConsumerProtocolAssignment v0-v3, non-flexible encoding), big-endian:

    Subscription := version:int16 topics:[string] user_data:nullable_bytes
                    owned_partitions:[topic:string partitions:[int32]]  (v>=1)
                    generation_id:int32                                 (v>=2, default -1)
                    rack_id:nullable_string                             (v>=3)
    Assignment   := version:int16 assigned:[topic:string partitions:[int32]]
                    user_data:nullable_bytes

where string = int16 length + UTF-8, nullable_* uses length -1 for null,
bytes = int32 length + data, [x] = int32 count + items. Decoders accept newer
versions than they know and ignore trailing fields, as Kafka's do.

    >>> sub = Subscription(topics=["a", "b"], owned_partitions=[("a", [0, 1])], generation_id=3)
    >>> decode_subscription(encode_subscription(sub)) == sub
    True
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from gregor.common import errors

# Name of the protocol type consumers register with (JoinGroup.protocol_type).
PROTOCOL_TYPE = "consumer"
SUBSCRIPTION_VERSION = 3  # newest ConsumerProtocolSubscription version we write
ASSIGNMENT_VERSION = 3  # newest ConsumerProtocolAssignment version we write

TopicPartitions = list[tuple[str, list[int]]]


@dataclass
class Subscription:
    """What one member wants to read: topics, its owned partitions (cooperative protocol), rack."""

    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: TopicPartitions = field(default_factory=list)
    generation_id: int = -1
    rack_id: str | None = None


@dataclass
class Assignment:
    """What the leader gave one member: partitions per topic plus assignor user data."""

    partitions: TopicPartitions
    user_data: bytes | None = None


class Writer:
    """Appends Kafka primitive types to a bytearray."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def int16(self, v: int) -> None:
        self.buf += struct.pack(">h", v)

    def int32(self, v: int) -> None:
        self.buf += struct.pack(">i", v)

    def int64(self, v: int) -> None:
        self.buf += struct.pack(">q", v)

    def string(self, s: str | None) -> None:
        if s is None:
            self.int16(-1)
            return
        raw = s.encode("utf-8")
        self.int16(len(raw))
        self.buf += raw

    def nbytes(self, b: bytes | None) -> None:
        if b is None:
            self.int32(-1)
            return
        self.int32(len(b))
        self.buf += b

    def topic_partitions(self, tps: TopicPartitions) -> None:
        self.int32(len(tps))
        for topic, parts in tps:
            self.string(topic)
            self.int32(len(parts))
            for p in parts:
                self.int32(p)


class Reader:
    """Reads Kafka primitive types; any short read raises INVALID_REQUEST."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise errors.error_for(errors.Code.INVALID_REQUEST, "truncated consumer protocol data")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def int16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self._take(8))[0])

    def string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        try:
            return bytes(self._take(n)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise errors.error_for(errors.Code.INVALID_REQUEST, f"bad UTF-8 in consumer protocol: {e}") from e

    def nbytes(self) -> bytes | None:
        n = self.int32()
        if n == -1:
            return None
        return bytes(self._take(n))

    def array_len(self) -> int:
        n = self.int32()
        if n < 0 or n > self.remaining():
            raise errors.error_for(errors.Code.INVALID_REQUEST, f"bad array length {n} in consumer protocol")
        return n

    def topic_partitions(self) -> TopicPartitions:
        out: TopicPartitions = []
        for _ in range(self.array_len()):
            topic = self.string() or ""
            out.append((topic, [self.int32() for _ in range(self.array_len())]))
        return out


def encode_subscription(sub: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    """Serialise a Subscription as ConsumerProtocolSubscription `version` (0-3)."""
    w = Writer()
    w.int16(version)
    w.int32(len(sub.topics))
    for t in sub.topics:
        w.string(t)
    w.nbytes(sub.user_data)
    if version >= 1:
        w.topic_partitions(sub.owned_partitions)
    if version >= 2:
        w.int32(sub.generation_id)
    if version >= 3:
        w.string(sub.rack_id)
    return bytes(w.buf)


def decode_subscription(data: bytes) -> Subscription:
    """Parse ConsumerProtocolSubscription bytes of any version; raises INVALID_REQUEST if malformed."""
    r = Reader(data)
    version = r.int16()
    if version < 0:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"bad subscription version {version}")
    topics = [r.string() or "" for _ in range(r.array_len())]
    user_data = r.nbytes()
    sub = Subscription(topics=topics, user_data=user_data)
    if version >= 1 and r.remaining():
        sub.owned_partitions = r.topic_partitions()
    if version >= 2 and r.remaining():
        sub.generation_id = r.int32()
    if version >= 3 and r.remaining():
        sub.rack_id = r.string()
    return sub


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    """Serialise an Assignment as ConsumerProtocolAssignment (layout identical in v0-v3)."""
    w = Writer()
    w.int16(version)
    w.topic_partitions(assignment.partitions)
    w.nbytes(assignment.user_data)
    return bytes(w.buf)


def decode_assignment(data: bytes) -> Assignment:
    """Parse ConsumerProtocolAssignment bytes; empty bytes mean "nothing assigned" (Kafka does the same)."""
    if not data:
        return Assignment(partitions=[])
    r = Reader(data)
    version = r.int16()
    if version < 0:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"bad assignment version {version}")
    partitions = r.topic_partitions()
    user_data = r.nbytes() if r.remaining() else None
    return Assignment(partitions=partitions, user_data=user_data)


def subscribed_topics(metadata: bytes) -> set[str]:
    """Topics in a member's subscription metadata; empty set if it does not parse (not a consumer group)."""
    try:
        return set(decode_subscription(metadata).topics)
    except errors.GregorError:
        return set()
