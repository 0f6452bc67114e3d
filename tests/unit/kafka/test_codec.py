"""Kafka framing over kio (gregor.kafka.codec): headers, tagged fields, typed coercion, bad input."""

from __future__ import annotations

import struct

import pytest
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.serial import entity_reader

from gregor.kafka import codec


def test_flexible_request_with_unknown_tagged_fields_parses() -> None:
    # Metadata v12 request: header v2 (client id "c", one unknown tagged field), topics null, two bools, no tags.
    head = struct.pack(">hhih", 3, 12, 42, 1) + b"c" + bytes([1, 5, 2]) + b"xy"
    body = bytes([0]) + bytes([1, 0]) + bytes([0])
    header, pos = codec.read_header(head + body)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (3, 12, 42, "c")
    req = codec.parse_body(head + body, pos, header)
    assert req.topics is None and req.allow_auto_topic_creation is True


def test_truncated_frames_raise_protocol_error() -> None:
    with pytest.raises(codec.ProtocolError):
        codec.read_header(b"\x00\x03")
    head = struct.pack(">hhih", 3, 12, 42, -1) + bytes([0])
    header, pos = codec.read_header(head)
    with pytest.raises(codec.ProtocolError):
        codec.parse_body(head + b"\x05", pos, header)


def test_build_fills_defaults_and_response_round_trips() -> None:
    header = codec.RequestHeader(3, 12, 9, None)
    body = codec.build(MetadataResponse, brokers=[codec.build(MetadataResponseBroker, node_id=1, host="h",
                                                              port=9094, rack=None)],
                       cluster_id="c", controller_id=1, topics=[], throttle_time=0)
    data = codec.encode_response(header, body)
    size, corr = struct.unpack_from(">ii", data, 0)
    assert size == len(data) - 4 and corr == 9 and data[8] == 0  # response header v1: empty tagged fields
    parsed, _ = entity_reader(MetadataResponse)(memoryview(data), 9)
    assert parsed.brokers[0].port == 9094 and parsed.cluster_id == "c" and parsed.brokers[0].rack is None


def test_listener_config_parses_kafka_names() -> None:
    from gregor.kafka.server import parse_listener

    assert parse_listener("GRPC://a:1,PLAINTEXT://0.0.0.0:9094") == ("PLAINTEXT", "0.0.0.0", 9094)
    assert parse_listener("GRPC://a:1") is None
    with pytest.raises(ValueError):
        parse_listener("localhost:9094")


@pytest.mark.parametrize("version", range(3, 10))
def test_produce_responses_written_by_struct_are_kios_bytes(version: int) -> None:
    """encode_produce_response (the Produce fast path) writes exactly what kio's generic writer writes: topics,
    partitions with and without errors, an error message, record errors (v8+), a throttle time, a log append time."""
    import datetime
    import io

    from kio.serial import entity_writer
    from kio.static.constants import EntityType

    mod = codec.module(0, version, EntityType.response)
    extra = {"record_errors": [codec.build(mod.BatchIndexAndErrorMessage, batch_index=2,
                                           batch_index_error_message="bad record")]} if version >= 8 else {}
    parts = [codec.build(mod.PartitionProduceResponse, index=0, error_code=0, base_offset=1 << 40, log_append_time=-1,
                         log_start_offset=7, error_message=None),
             codec.build(mod.PartitionProduceResponse, index=3, error_code=87, base_offset=-1,
                         log_append_time=1_700_000_000_123, log_start_offset=-1, error_message="invalid récord",
                         **extra)]
    body = codec.build(mod.ProduceResponse, throttle_time=datetime.timedelta(milliseconds=250), responses=[
        codec.build(mod.TopicProduceResponse, name="orders", partition_responses=parts),
        codec.build(mod.TopicProduceResponse, name="ü", partition_responses=[])])
    header = codec.RequestHeader(0, version, 99, "c")
    out = io.BytesIO()
    out.write(b"\0\0\0\0" + struct.pack(">i", 99) + (b"\0" if version >= 9 else b""))
    entity_writer(type(body))(out, body)
    expected = bytearray(out.getvalue())
    struct.pack_into(">i", expected, 0, len(expected) - 4)
    assert codec.encode_produce_response(header, body) == bytes(expected)
    assert codec.encode_response(header, body) == bytes(expected)


@pytest.mark.parametrize("version", range(0, 13))
def test_metadata_responses_with_encoded_topics_are_kios_bytes(version: int) -> None:
    """A Metadata answer whose topics were encoded beforehand (EncodedTopics, the listener's per-topic cache)
    is byte for byte kio's encoding of the same answer, in every version: topics before and after the cluster
    fields, with and without authorized operations (v8-v10) and tagged fields (v9+), none and several topics."""
    import dataclasses
    import datetime
    import uuid as uuid_

    from kio.static.constants import EntityType

    mod = codec.module(3, version, EntityType.response)
    header = codec.RequestHeader(3, version, 7, "c")
    parts = [codec.build(mod.MetadataResponsePartition, error_code=0, partition_index=i, leader_id=i % 3,
                         leader_epoch=2, replica_nodes=[0, 1, 2], isr_nodes=[0, 2], offline_replicas=[1])
             for i in range(3)]
    topics = [codec.build(mod.MetadataResponseTopic, error_code=0, name="orders", topic_id=uuid_.uuid4(),
                          is_internal=False, partitions=parts, topic_authorized_operations=-2147483648),
              codec.build(mod.MetadataResponseTopic, error_code=3, name="gone", topic_id=uuid_.UUID(int=0),
                          is_internal=False, partitions=[], topic_authorized_operations=-2147483648)]
    for chosen in ([], topics[:1], topics):
        body = codec.build(mod.MetadataResponse, throttle_time=datetime.timedelta(milliseconds=30),
                           brokers=[codec.build(mod.MetadataResponseBroker, node_id=1, host="h", port=9092, rack=None)],
                           cluster_id="cid", controller_id=1, topics=chosen, cluster_authorized_operations=-2147483648)
        spliced = dataclasses.replace(body, topics=codec.EncodedTopics(codec.encode_entity(t) for t in chosen))
        assert codec.encode_response(header, spliced) == codec.encode_response(header, body)
