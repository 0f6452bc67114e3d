"""ProducePartitionsRequest wire bytes built straight from the encoded batches (no protobuf message).

A produce request is up to max.request.size (1 MiB) of record batches. Built as a protobuf
message, its batches were joined per partition, copied into the message and serialized (together
~200 µs of the producer's CPU per 1 MiB request here, upb's serializer most of it) before gRPC
copied the result. Here the request's few small fields are encoded directly and the batches'
own bytes objects stay pieces, so ProduceStream joins everything once (~20 µs per MiB) and
gRPC copies that. The bytes are exactly what
`ProducePartitionsRequest.SerializeToString()` makes of the same message (fields in number order,
proto3 defaults omitted), so the broker parses them with its ordinary stub;
tests/unit/client/test_produce_request.py holds the two encodings equal.
"""

from __future__ import annotations

from gregor.rpc.v1 import broker_pb2

# Tags (field number << 3 | wire type) of ProducePartitionsRequest and ProducePartitionData.
_ACKS = b"\x08"  # acks = 1, varint
_TIMEOUT_MS = b"\x10"  # timeout_ms = 2, varint
_PARTITIONS = b"\x22"  # partitions = 4, length-delimited ProducePartitionData
_CORRELATION_ID = b"\x28"  # correlation_id = 5, varint
_TOPIC = b"\x0a"  # ProducePartitionData.topic = 1, length-delimited
_PARTITION = b"\x10"  # ProducePartitionData.partition = 2, varint
_RECORDS = b"\x1a"  # ProducePartitionData.records = 3, length-delimited

# ProduceStream's method path, from the descriptor the stubs are generated from.
PRODUCE_STREAM_METHOD = "/{}/{}".format(*broker_pb2.DESCRIPTOR.services_by_name["BrokerService"]
                                        .methods_by_name["ProduceStream"].full_name.rsplit(".", 1))


def varint(value: int) -> bytes:
    """A protobuf varint; negative int32/int64 values take ten bytes (two's complement on 64 bits)."""
    if 0 <= value < 0x80:
        return bytes((value,))
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _int_field(tag: bytes, value: int) -> bytes:
    return tag + varint(value) if value else b""  # proto3: a zero is not written


class ProduceRequestEncoder:
    """The pieces of one producer's ProducePartitionsRequests (acks and timeout_ms are fixed per producer).

    Concurrency: event-loop owned (the topic cache is a plain dict).
    """

    def __init__(self, acks: int, timeout_ms: int) -> None:
        self._head = _int_field(_ACKS, acks) + _int_field(_TIMEOUT_MS, timeout_ms)
        self._topics: dict[str, bytes] = {}  # topic -> its encoded topic field

    def start(self) -> list[bytes]:
        """A new request's pieces: the fixed fields; add_partition() appends to it."""
        return [self._head]

    def add_partition(self, pieces: list[bytes], topic: str, partition: int, payloads: list[bytes],
                      records_bytes: int) -> None:
        """One ProducePartitionData entry carrying payloads (whole batches, records_bytes in total)."""
        topic_field = self._topics.get(topic)
        if topic_field is None:
            raw = topic.encode()
            topic_field = self._topics[topic] = _TOPIC + varint(len(raw)) + raw if raw else b""
        fields = topic_field + _int_field(_PARTITION, partition)
        if records_bytes:
            fields += _RECORDS + varint(records_bytes)
        pieces.append(_PARTITIONS + varint(len(fields) + records_bytes) + fields)
        pieces.extend(payloads)


def finish(pieces: list[bytes], correlation_id: int) -> bytes:
    """The request's bytes: its pieces and its correlation_id (field 5, last), joined once."""
    pieces.append(_int_field(_CORRELATION_ID, correlation_id))
    return b"".join(pieces)
