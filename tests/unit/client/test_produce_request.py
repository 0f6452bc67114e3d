"""ProduceRequestEncoder makes exactly the bytes protobuf makes of the same ProducePartitionsRequest."""

from __future__ import annotations

import pytest

from gregor.client.produce_request import PRODUCE_STREAM_METHOD, ProduceRequestEncoder, finish, varint
from gregor.common.records import build_batch
from gregor.rpc.v1 import broker_pb2


def _batch(n: int, value: bytes = b"v" * 100) -> bytes:
    return build_batch([(None, value, (), 1_700_000_000_000 + i) for i in range(n)])


@pytest.mark.parametrize("value", [1, 127, 128, 300, 16_383, 16_384, 1 << 31, (1 << 63) - 1, -1, -2, -(1 << 31)])
def test_varint_matches_protobuf(value: int) -> None:
    expected = broker_pb2.ProducePartitionsRequest(correlation_id=value).SerializeToString()
    assert b"\x28" + varint(value) == expected


@pytest.mark.parametrize("acks,timeout_ms,correlation_id", [(1, 30_000, 1), (-1, 30_000, 7), (0, 0, 0),
                                                             (-1, 2_147_483_647, (1 << 40) + 3)])
def test_request_bytes_equal_serialize_to_string(acks: int, timeout_ms: int, correlation_id: int) -> None:
    parts = [("orders", 0, [_batch(3)]), ("orders", 15, [_batch(1), _batch(20, b"x" * 1024)]),
             ("ünïcode-topic", 200, [_batch(2)]), ("t" * 300, 1, [_batch(5)])]
    encoder = ProduceRequestEncoder(acks, timeout_ms)
    for _ in range(2):  # the second request uses the cached topic fields
        pieces = encoder.start()
        for topic, partition, payloads in parts:
            encoder.add_partition(pieces, topic, partition, payloads, sum(map(len, payloads)))
        ours = finish(pieces, correlation_id)
        message = broker_pb2.ProducePartitionsRequest(acks=acks, timeout_ms=timeout_ms, correlation_id=correlation_id)
        for topic, partition, payloads in parts:
            message.partitions.add(topic=topic, partition=partition, records=b"".join(payloads))
        assert ours == message.SerializeToString()
        assert broker_pb2.ProducePartitionsRequest.FromString(ours) == message


def test_an_empty_request_is_only_its_fixed_fields() -> None:
    ours = finish(ProduceRequestEncoder(1, 500).start(), 9)
    assert ours == broker_pb2.ProducePartitionsRequest(acks=1, timeout_ms=500, correlation_id=9).SerializeToString()


def test_method_path_is_the_stub_path() -> None:
    assert PRODUCE_STREAM_METHOD == "/gregor.rpc.v1.BrokerService/ProduceStream"
