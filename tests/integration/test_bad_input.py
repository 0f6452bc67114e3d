"""Bad input against a real broker: each gets a typed error, and nothing already written changes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import struct
import time

import grpc
import pytest

from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc
from tests.helpers.batches import make_batch, record_values
from tests.helpers.cluster import broker_process
from tests.integration.test_broker import create_topic, fetch, produce

Code = errors.Code


def log_digest(data_dir: str, topic: str) -> str:
    """Hash of every file of a partition directory (segments and indexes)."""
    h = hashlib.sha256()
    pdir = os.path.join(data_dir, f"{topic}-0")
    for name in sorted(os.listdir(pdir)):
        path = os.path.join(pdir, name)
        if os.path.isfile(path) and not name.startswith("."):
            h.update(name.encode() + open(path, "rb").read())
    return h.hexdigest()


async def expect_error(call, code: int) -> errors.GregorError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    err = errors.from_rpc_error(info.value)
    assert err.code == code, f"expected {errors.code_name(code)}, got {err}"
    assert info.value.code() == err.status_code
    return err


async def test_corrupt_and_oversize_batches_are_rejected_whole(broker) -> None:
    await create_topic(broker.grpc, "guarded", **{"max_message_bytes": "4096"})
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        await produce(stub, "guarded", make_batch([b"kept-1", b"kept-2"]))
        before = log_digest(broker.data_dir, "guarded")
        good = make_batch([b"good"])

        truncated = good[:-3]
        await expect_error(produce(stub, "guarded", truncated), Code.CORRUPT_MESSAGE)
        # A good batch followed by a torn one: the whole request is refused, the good one too.
        await expect_error(produce(stub, "guarded", good + truncated), Code.CORRUPT_MESSAGE)
        flipped = bytearray(good)
        flipped[-1] ^= 0x01
        await expect_error(produce(stub, "guarded", bytes(flipped)), Code.CORRUPT_MESSAGE)
        flipped_attr = bytearray(good)
        flipped_attr[21] ^= 0x10  # attributes are covered by the CRC
        await expect_error(produce(stub, "guarded", bytes(flipped_attr)), Code.CORRUPT_MESSAGE)
        wrong_magic = bytearray(good)
        wrong_magic[16] = 1
        await expect_error(produce(stub, "guarded", bytes(wrong_magic)), Code.INVALID_RECORD)
        await expect_error(produce(stub, "guarded", make_batch([os.urandom(8000)])), Code.MESSAGE_TOO_LARGE)
        await expect_error(produce(stub, "guarded", b""), Code.CORRUPT_MESSAGE)
        await expect_error(produce(stub, "guarded", b"\xde\xad" * 150), Code.CORRUPT_MESSAGE)  # negative length
        await expect_error(produce(stub, "guarded", good, acks=2), Code.INVALID_REQUIRED_ACKS)

        assert log_digest(broker.data_dir, "guarded") == before
        resp = await fetch(stub, "guarded", 0)
        assert record_values(resp.records) == [b"kept-1", b"kept-2"] and resp.high_watermark == 2
        # The broker still appends after all that.
        assert (await produce(stub, "guarded", good)).base_offset == 2


async def test_unknown_topic_partition_and_bad_offsets(broker) -> None:
    await create_topic(broker.grpc, "known")
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        await produce(stub, "known", make_batch([b"a", b"b", b"c"]))
        err = await expect_error(produce(stub, "unknown", make_batch([b"x"])), Code.UNKNOWN_TOPIC_OR_PARTITION)
        assert err.topic == "unknown"
        await expect_error(produce(stub, "known", make_batch([b"x"]), partition=7), Code.UNKNOWN_TOPIC_OR_PARTITION)
        await expect_error(fetch(stub, "known", 0, partition=-1), Code.UNKNOWN_TOPIC_OR_PARTITION)
        await expect_error(fetch(stub, "known", -5), Code.OFFSET_OUT_OF_RANGE)
        await expect_error(fetch(stub, "known", 4), Code.OFFSET_OUT_OF_RANGE)
        await expect_error(fetch(stub, "known", 0, max_bytes=0), Code.INVALID_FETCH_SIZE)
        await expect_error(fetch(stub, "known", 0, max_bytes=-1), Code.INVALID_FETCH_SIZE)
        await expect_error(fetch(stub, "known", 0, min_bytes=-1), Code.INVALID_FETCH_SIZE)
        await expect_error(fetch(stub, "known", 0, max_wait_ms=-1), Code.INVALID_REQUEST)
        # An absurd but legal bound is clamped to fetch.max.bytes and just works.
        huge = await fetch(stub, "known", 0, max_bytes=2**31 - 1)
        assert record_values(huge.records) == [b"a", b"b", b"c"]
        # Fetching exactly at the end is not an error: it is empty.
        assert (await fetch(stub, "known", 3)).records == b""
        await expect_error(stub.ListOffsets(broker_pb2.ListOffsetsRequest(topic="known", partition=0,
                                                                          timestamp_ms=-7)), Code.INVALID_REQUEST)


async def test_deadline_is_honoured_by_long_poll(broker) -> None:
    await create_topic(broker.grpc, "deadline")
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Fetch(broker_pb2.FetchRequest(topic="deadline", partition=0, fetch_offset=0, max_bytes=1024,
                                                     min_bytes=1, max_wait_ms=30000), timeout=0.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The abandoned long poll does not wedge the partition.
        await produce(stub, "deadline", make_batch([b"ok"]))
        assert record_values((await fetch(stub, "deadline", 0)).records) == [b"ok"]


def _data_port_roundtrip(address: str, payload: bytes) -> tuple[broker_pb2.DataFetchResponseHeader, bytes]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(payload)
        return _read_answer(s)


def _read_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def _read_answer(s: socket.socket) -> tuple[broker_pb2.DataFetchResponseHeader, bytes]:
    (n,) = struct.unpack(">I", _read_exact(s, 4))
    header = broker_pb2.DataFetchResponseHeader.FromString(_read_exact(s, n))
    return header, _read_exact(s, header.records_length)


def _frame(req: broker_pb2.FetchRequest) -> bytes:
    body = req.SerializeToString()
    return struct.pack(">I", len(body)) + body


async def test_data_port_serves_the_same_bytes_as_grpc(broker) -> None:
    await create_topic(broker.grpc, "zc")
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        for i in range(50):
            await produce(stub, "zc", make_batch([os.urandom(1000) for _ in range(10)]))
        via_grpc = (await fetch(stub, "zc", 0, max_bytes=1 << 20)).records
    req = broker_pb2.FetchRequest(topic="zc", partition=0, fetch_offset=0, max_bytes=1 << 20)
    header, raw = await asyncio.to_thread(_data_port_roundtrip, broker.data, _frame(req))
    assert header.error.code == 0
    assert header.response.high_watermark == 500
    assert raw == via_grpc and len(raw) > 400_000
    # Several requests on one connection, and an error answer in between.
    host, port = broker.data.rsplit(":", 1)

    def session() -> list[tuple[int, int]]:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            out = []
            for offset in (0, 999, 250):
                s.sendall(_frame(broker_pb2.FetchRequest(topic="zc", partition=0, fetch_offset=offset,
                                                         max_bytes=20000)))
                h, body = _read_answer(s)
                out.append((h.error.code, len(body)))
            return out

    answers = await asyncio.to_thread(session)
    assert answers[0][0] == 0 and answers[0][1] > 0
    assert answers[1] == (Code.OFFSET_OUT_OF_RANGE, 0)
    assert answers[2][0] == 0 and answers[2][1] > 0


@pytest.mark.parametrize("garbage", [
    b"\xff\xff\xff\xff" + b"x" * 16,          # absurd frame length
    b"\x00\x00\x00\x00",                      # empty frame
    struct.pack(">I", 12) + b"\xff" * 12,     # not a protobuf
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",    # wrong protocol entirely
])
async def test_garbage_on_the_data_port_gets_an_error_and_a_closed_connection(broker, garbage) -> None:
    await create_topic(broker.grpc, "safe")

    def talk() -> tuple[int, bytes]:
        host, port = broker.data.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(garbage)
            header, _ = _read_answer(s)
            rest = s.recv(10)  # the server closes after a malformed frame
            return header.error.code, rest

    code, rest = await asyncio.to_thread(talk)
    assert code == Code.INVALID_REQUEST and rest == b""
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        assert (await produce(stub, "safe", make_batch([b"still fine"]))).base_offset == 0


def test_stalled_data_port_readers_are_cut_off_after_the_send_timeout(tmp_path) -> None:
    """More peers that stop reading than the port has send threads: each is disconnected after
    data.port.send.timeout.ms, so a well-behaved reader behind them is served within a bounded time."""
    with broker_process(str(tmp_path / "b"), overrides={"num.network.threads": "1",
                                                        "data.port.send.timeout.ms": "1500"}) as proc:
        asyncio.run(create_topic(proc.grpc, "big"))

        async def fill() -> None:
            async with channel(proc.grpc) as ch:
                stub = broker_pb2_grpc.BrokerServiceStub(ch)
                for _ in range(40):
                    await produce(stub, "big", make_batch([os.urandom(100_000) for _ in range(5)]))
        asyncio.run(fill())
        host, port = proc.data.rsplit(":", 1)
        whole = _frame(broker_pb2.FetchRequest(topic="big", partition=0, fetch_offset=0, max_bytes=50 << 20))
        stalled = []
        for _ in range(3):  # three times the send threads
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((host, int(port)))
            s.sendall(whole)
            stalled.append(s)
        time.sleep(0.3)
        started = time.monotonic()
        header, body = _data_port_roundtrip(proc.data, _frame(broker_pb2.FetchRequest(
            topic="big", partition=0, fetch_offset=0, max_bytes=200_000)))
        assert header.error.code == 0 and len(body) > 0
        # Served behind at most the stalled sends' timeouts, one after another on the single thread.
        assert time.monotonic() - started < 3 * 1.5 + 5
        for s in stalled:
            s.settimeout(30)
            got = 0
            while True:  # drain what was sent before the cut; then the broker's close shows as EOF
                try:
                    chunk = s.recv(1 << 20)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                got += len(chunk)
            assert got < 20 * 500_000, "a stalled reader was sent the whole answer"
            s.close()
