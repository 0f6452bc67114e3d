"""Zero-copy Fetch on plain-text Kafka connections: the records go from the segment files to the socket with
sendfile(2), as Kafka's FileRecords.writeTo does, never through Python.

A Fetch response is Kafka's nested structure, so each partition's `records` field sits between header bytes
(topic and partition fields before it, the next partitions after it). The listener encodes the response with
kio as usual, but with a 16-byte marker in place of each non-empty segment slice (`Collector.marker`, which the
Fetch handler calls instead of reading the slice); `splice` then cuts the encoded frame at the markers and puts
each slice's real length prefix (int32 up to v11, compact uvarint from v12) in front of it. `send` writes the
pieces in order: each header piece and the slice after it leave in one native call (`FileSlice.send_to`: write,
then sendfile of the file range, the GIL released, on a worker thread), and the tail through the transport.

The connection's order holds: a Fetch is handled only once every earlier answer of the connection was written
(server.py), and the transport's buffer is emptied before the first raw write. TLS connections keep the copying
path (OpenSSL must see the bytes). `kafka.fetch.zero.copy.enable=false` turns it off (the benchmark's baseline).
"""

from __future__ import annotations

import asyncio
import os
import struct
from concurrent.futures import Executor
from contextvars import ContextVar
from typing import Any, Union

import gregor_native as native
from prometheus_client import Counter

MARKER_LEN = 16
_I32 = struct.Struct(">i")
_INDEX = struct.Struct(">I")

ZERO_COPY_BYTES = Counter("gregor_kafka_zero_copy_bytes_total",
                          "Record bytes of Kafka Fetch responses sent with sendfile (plain-text listener)")

Part = Union[bytes, "native.FileSlice"]  # header bytes, or a segment slice

# The collector of the Fetch being handled on this connection's task, if it may use zero-copy.
_CURRENT: ContextVar["Collector | None"] = ContextVar("kafka_zero_copy", default=None)


class Collector:
    """The slices a Fetch response will carry by sendfile, each behind a marker unique to this response."""

    def __init__(self) -> None:
        self._token = os.urandom(MARKER_LEN - _INDEX.size)
        self.slices: list[tuple[bytes, Any]] = []
        self.total = 0

    def marker(self, file_slice: Any) -> bytes:
        m = self._token + _INDEX.pack(len(self.slices))
        self.slices.append((m, file_slice))
        self.total += int(file_slice.length)
        return m


def current() -> Collector | None:
    """The Fetch handler's question: put markers (a collector) or the slices' bytes (None)?"""
    return _CURRENT.get()


def begin() -> tuple[Collector, Any]:
    collector = Collector()
    return collector, _CURRENT.set(collector)


def end(token: Any) -> None:
    _CURRENT.reset(token)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def splice(frame: bytes, collector: Collector, flexible: bool) -> list[Part]:
    """The encoded response frame (size-prefixed) cut at the markers: [bytes, slice, bytes, slice, ..., bytes],
    each marker's length prefix replaced by its slice's, and the frame's size fixed. Markers a throttled response
    dropped are simply absent."""
    found = sorted((frame.find(m), m, s) for m, s in collector.slices)
    found = [f for f in found if f[0] >= 0]
    if not found:
        return [frame]
    prefix_len = 1 if flexible else 4  # uvarint(16 + 1) is one byte; legacy bytes: int32
    parts: list[Part] = []
    prev = 0
    size = len(frame) - 4
    for pos, _m, s in found:
        n = int(s.length)
        length = _uvarint(n + 1) if flexible else _I32.pack(n)
        parts.append(frame[prev:pos - prefix_len] + length)
        parts.append(s)
        size += len(length) + n - prefix_len - MARKER_LEN
        prev = pos + MARKER_LEN
    parts.append(frame[prev:])
    first = parts[0]
    assert isinstance(first, bytes)
    parts[0] = _I32.pack(size) + first[4:]
    return parts


async def send(writer: asyncio.StreamWriter, parts: list[Part], executor: Executor, timeout_ms: int) -> None:
    """Write the spliced response: the transport's buffer emptied first (nothing of ours may be left behind the
    raw writes), then each header piece and its slice in one native call, then the tail through the transport.
    A slice shorter than promised (the segment was truncated under the read) breaks the framing: the connection
    ends and the client reconnects."""
    transport = writer.transport
    if transport.get_write_buffer_size():
        low, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0)  # drain() now waits until the buffer is empty
        try:
            await writer.drain()
        finally:
            transport.set_write_buffer_limits(high=high, low=low)
    fd = writer.get_extra_info("socket").fileno()
    loop = asyncio.get_running_loop()
    for i in range(0, len(parts) - 1, 2):
        head, file_slice = parts[i], parts[i + 1]
        assert isinstance(head, bytes) and not isinstance(file_slice, bytes)
        sent = await loop.run_in_executor(executor, file_slice.send_to, fd, head, timeout_ms)
        ZERO_COPY_BYTES.inc(sent)
        if sent < file_slice.length:
            raise ConnectionResetError(f"sent {sent} of {file_slice.length} promised bytes")
    tail = parts[-1]
    assert isinstance(tail, bytes)
    writer.write(tail)
    await writer.drain()
