"""The zero-copy Fetch splice (kafka/zero_copy.py): the pieces with each slice's bytes in place are byte for byte the
response kio encodes with the records inline, for a legacy (v11, int32 lengths) and a flexible (v12, uvarint
lengths) Fetch, with several partitions, an empty one and a throttled response without its markers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from kio.static.constants import EntityType

from gregor.kafka import codec, zero_copy


@dataclass
class FakeSlice:
    """Stands for a gregor_native.FileSlice: its length and the bytes sendfile would send."""

    data: bytes

    @property
    def length(self) -> int:
        return len(self.data)


def response(version: int, records: list[bytes | None]) -> Any:
    mod = codec.module(1, version, EntityType.response)
    parts = [codec.build(mod.PartitionData, partition_index=i, error_code=0, high_watermark=100 + i,
                         last_stable_offset=100 + i, log_start_offset=0, aborted_transactions=None,
                         preferred_read_replica=-1, records=r) for i, r in enumerate(records)]
    return codec.build(mod.FetchResponse, error_code=0, session_id=7, responses=[
        codec.build(mod.FetchableTopicResponse, topic="orders", partitions=parts)])


def joined(parts: list[Any]) -> bytes:
    return b"".join(p if isinstance(p, bytes) else p.data for p in parts)


@pytest.mark.parametrize("version", [4, 11, 12])
def test_spliced_pieces_are_the_inline_encoding(version: int) -> None:
    header = codec.RequestHeader(1, version, 42, "c")
    payloads = [b"a" * 300, b"", b"b" * 70000, b"c"]  # 70000: a three-byte uvarint length
    inline = codec.encode_response(header, response(version, payloads))
    collector = zero_copy.Collector()
    markers: list[bytes | None] = [collector.marker(FakeSlice(p)) if p else b"" for p in payloads]
    body = response(version, markers)
    parts = zero_copy.splice(codec.encode_response(header, body), collector, type(body).__flexible__)
    assert joined(parts) == inline
    assert [type(p) for p in parts] == [bytes, FakeSlice, bytes, FakeSlice, bytes, FakeSlice, bytes]
    assert collector.total == 300 + 70000 + 1


def test_a_response_without_its_markers_is_left_whole() -> None:
    header = codec.RequestHeader(1, 12, 1, None)
    collector = zero_copy.Collector()
    collector.marker(FakeSlice(b"x" * 10))
    frame = codec.encode_response(header, response(12, []))  # throttled: its partitions were dropped
    assert zero_copy.splice(frame, collector, True) == [frame]
