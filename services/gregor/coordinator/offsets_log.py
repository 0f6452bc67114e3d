"""Record layout of the internal topic __consumer_offsets (Kafka's GroupMetadataManager schemas).

Keys identify what a record is about, so the log is compactable: the last
record per key is the current value and a null value (tombstone) deletes it.

    OffsetCommitKey    v1: version:int16=1 group:string topic:string partition:int32
    OffsetCommitValue  v3: version:int16=3 offset:int64 leader_epoch:int32 metadata:string
                           commit_timestamp:int64
    GroupMetadataKey   v2: version:int16=2 group:string
    GroupMetadataValue v3: version:int16=3 protocol_type:string generation:int32
                           protocol:nullable_string leader:nullable_string current_state_timestamp:int64
                           members:[member_id:string group_instance_id:nullable_string client_id:string
                                    client_host:string rebalance_timeout:int32 session_timeout:int32
                                    subscription:bytes assignment:bytes]

Primitive encodings are Kafka's (see gregor.common.consumer_protocol).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gregor.common import errors
# The topic name and Kafka's group-to-partition rule live in common: brokers answer FindCoordinator with them.
from gregor.common.coordinator_ownership import OFFSETS_TOPIC, java_string_hash, partition_for  # noqa: F401
from gregor.common.consumer_protocol import Reader, Writer

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
GROUP_VALUE_VERSION = 3


@dataclass
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass
class GroupKey:
    group: str


@dataclass
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass
class MemberValue:
    member_id: str
    group_instance_id: str
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass
class GroupValue:
    protocol_type: str
    generation_id: int
    protocol_name: str
    leader_id: str
    state_timestamp_ms: int
    members: list[MemberValue] = field(default_factory=list)


def encode_offset_key(key: OffsetKey) -> bytes:
    w = Writer()
    w.int16(OFFSET_KEY_VERSION)
    w.string(key.group)
    w.string(key.topic)
    w.int32(key.partition)
    return bytes(w.buf)


def encode_group_key(key: GroupKey) -> bytes:
    w = Writer()
    w.int16(GROUP_KEY_VERSION)
    w.string(key.group)
    return bytes(w.buf)


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    """Either key kind, told apart by version (0/1: offset commit, 2: group metadata), as Kafka does."""
    r = Reader(data)
    version = r.int16()
    if version in (0, 1):
        return OffsetKey(r.string() or "", r.string() or "", r.int32())
    if version == 2:
        return GroupKey(r.string() or "")
    raise errors.error_for(errors.Code.CORRUPT_MESSAGE, f"unknown __consumer_offsets key version {version}")


def encode_offset_value(v: OffsetValue) -> bytes:
    w = Writer()
    w.int16(OFFSET_VALUE_VERSION)
    w.int64(v.offset)
    w.int32(v.leader_epoch)
    w.string(v.metadata)
    w.int64(v.commit_timestamp_ms)
    return bytes(w.buf)


def decode_offset_value(data: bytes) -> OffsetValue:
    r = Reader(data)
    version = r.int16()
    if version != OFFSET_VALUE_VERSION:
        raise errors.error_for(errors.Code.CORRUPT_MESSAGE, f"unsupported offset value version {version}")
    return OffsetValue(r.int64(), r.int32(), r.string() or "", r.int64())


def encode_group_value(v: GroupValue) -> bytes:
    w = Writer()
    w.int16(GROUP_VALUE_VERSION)
    w.string(v.protocol_type)
    w.int32(v.generation_id)
    w.string(v.protocol_name or None)
    w.string(v.leader_id or None)
    w.int64(v.state_timestamp_ms)
    w.int32(len(v.members))
    for m in v.members:
        w.string(m.member_id)
        w.string(m.group_instance_id or None)
        w.string(m.client_id)
        w.string(m.client_host)
        w.int32(m.rebalance_timeout_ms)
        w.int32(m.session_timeout_ms)
        w.nbytes(m.subscription)
        w.nbytes(m.assignment)
    return bytes(w.buf)


def decode_group_value(data: bytes) -> GroupValue:
    r = Reader(data)
    version = r.int16()
    if version != GROUP_VALUE_VERSION:
        raise errors.error_for(errors.Code.CORRUPT_MESSAGE, f"unsupported group value version {version}")
    gv = GroupValue(r.string() or "", r.int32(), r.string() or "", r.string() or "", r.int64())
    for _ in range(r.array_len()):
        gv.members.append(MemberValue(r.string() or "", r.string() or "", r.string() or "", r.string() or "",
                                      r.int32(), r.int32(), r.nbytes() or b"", r.nbytes() or b""))
    return gv
