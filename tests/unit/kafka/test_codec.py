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
