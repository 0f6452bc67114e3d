"""FileSlice.send_to (sendfile) and FileSlice.read over real sockets."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Callable

import gregor_native as native
import pytest

from tests.reference import codec
from tests.unit.native.support import values_batch


class Reader(threading.Thread):
    """Reads a socket to EOF on its own thread, optionally slowly."""

    def __init__(self, sock: socket.socket, chunk: int = 65536, pause_s: float = 0.0, pauses: int = 0) -> None:
        super().__init__(daemon=True)
        self.sock, self.chunk, self.pause_s, self.pauses = sock, chunk, pause_s, pauses
        self.data = bytearray()

    def run(self) -> None:
        n = 0
        while True:
            got = self.sock.recv(self.chunk)
            if not got:
                return
            self.data += got
            n += 1
            if n <= self.pauses:
                time.sleep(self.pause_s)

    def result(self) -> bytes:
        self.join(timeout=60)
        assert not self.is_alive(), "reader did not see EOF"
        return bytes(self.data)


def big_log(path: Path, batches: int = 40, value_bytes: int = 50_000, **config: int) -> native.Log:
    log = native.Log(str(path), native.LogConfig(**config))
    for i in range(batches):
        log.append_as_leader(values_batch(2, value_bytes, tag=i), leader_epoch=0)
    return log


def send(slice_: native.FileSlice, make_pair: Callable[[], tuple[socket.socket, socket.socket]],
         prefix: bytes = b"", **reader: float) -> tuple[int, bytes]:
    sender, receiver = make_pair()
    r = Reader(receiver, **reader)  # type: ignore[arg-type]
    r.start()
    try:
        sent = slice_.send_to(sender.fileno(), prefix)
    finally:
        sender.close()
    data = r.result()
    receiver.close()
    return sent, data


def tcp_pair(sndbuf: int = 0, rcvbuf: int = 0) -> Callable[[], tuple[socket.socket, socket.socket]]:
    def make() -> tuple[socket.socket, socket.socket]:
        with socket.create_server(("127.0.0.1", 0)) as server:
            client = socket.socket()
            if rcvbuf:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            client.connect(server.getsockname())
            conn, _ = server.accept()
        if sndbuf:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        conn.setblocking(False)  # send_to must poll on EAGAIN
        return conn, client
    return make


@pytest.fixture
def log(tmp_path: Path):  # type: ignore[no-untyped-def]
    log = big_log(tmp_path / "p")
    yield log
    log.close()


def test_socketpair_whole_segment(log: native.Log) -> None:
    slice_ = log.read_slice(0, 1 << 30)
    expected = slice_.read()
    assert len(expected) == slice_.length > 4_000_000
    assert expected == log.read(0, 1 << 30)
    sent, got = send(slice_, socket.socketpair)
    assert sent == slice_.length
    assert got == expected


def test_slice_is_a_range_of_the_segment_file(log: native.Log) -> None:
    slice_ = log.read_slice(17, 310_000)  # offset 17 is in batch 8 (offsets 16..17)
    segment = Path(log.segments()[0].log_path).read_bytes()
    assert slice_.start_offset == 16
    assert slice_.read() == segment[slice_.position:slice_.position + slice_.length]
    assert [h.base_offset for h in codec.parse_batches(slice_.read())] == [16, 18, 20]


def test_prefix_then_range(log: native.Log) -> None:
    slice_ = log.read_slice(10, 500_000)
    prefix = b"\x00\x00\x01\x00" + bytes(range(256)) * 3
    sent, got = send(slice_, socket.socketpair, prefix=prefix)
    assert sent == slice_.length
    assert got == prefix + slice_.read()


def test_empty_slice_sends_only_the_prefix(log: native.Log) -> None:
    slice_ = log.read_slice(log.log_end_offset, 1000)
    assert (slice_.length, slice_.start_offset, slice_.read()) == (0, -1, b"")
    assert send(slice_, socket.socketpair, prefix=b"hdr") == (0, b"hdr")


def test_tcp_nonblocking_sender_slow_reader(log: native.Log) -> None:
    """A small send buffer, a non-blocking sender and a reader that sleeps: the
    sender hits EAGAIN again and again and must wait in poll(2), with the GIL
    released (the reader is a Python thread and would starve otherwise)."""
    slice_ = log.read_slice(0, 1 << 30)
    pauses, pause_s = 40, 0.01
    start = time.monotonic()
    sent, got = send(slice_, tcp_pair(sndbuf=16_384, rcvbuf=16_384), prefix=b"P" * 100,
                     chunk=8_192, pause_s=pause_s, pauses=pauses)
    elapsed = time.monotonic() - start
    assert sent == slice_.length
    assert got == b"P" * 100 + slice_.read()
    # The sender could not finish before the reader did its slow part: it waited.
    assert elapsed >= pauses * pause_s


def test_tcp_fast_reader_many_slices(log: native.Log) -> None:
    make = tcp_pair()
    offset, total = 0, 0
    while offset < log.log_end_offset:
        slice_ = log.read_slice(offset, 200_000)
        sent, got = send(slice_, make, prefix=offset.to_bytes(8, "big"))
        assert got == offset.to_bytes(8, "big") + slice_.read()
        total += sent
        offset = codec.parse_batches(slice_.read())[-1].next_offset
    assert total == log.size_bytes


def test_slice_survives_deletion_by_retention(tmp_path: Path) -> None:
    log = big_log(tmp_path / "p", batches=12, value_bytes=20_000, segment_bytes=200_000, retention_bytes=0,
                  retention_ms=-1)
    first = log.segments()[0]
    slice_ = log.read_slice(0, 1 << 30)
    expected = Path(first.log_path).read_bytes()[slice_.position:slice_.position + slice_.length]
    segments_before = log.num_segments
    assert segments_before >= 3
    assert log.delete_old_segments() == segments_before - 1
    assert not Path(first.log_path).exists()
    with pytest.raises(native.OffsetOutOfRangeError):
        log.read(0, 100)
    assert slice_.read() == expected
    sent, got = send(slice_, socket.socketpair, prefix=b"late")
    assert (sent, got) == (len(expected), b"late" + expected)
    log.close()


def test_send_to_a_closed_socket_fails(log: native.Log) -> None:
    slice_ = log.read_slice(0, 1 << 30)
    a, b = socket.socketpair()
    b.close()
    with pytest.raises(OSError):
        slice_.send_to(a.fileno())
    a.close()


def test_send_to_a_peer_that_stops_reading_times_out(tmp_path: Path) -> None:
    log = big_log(tmp_path / "p", batches=80)  # ~8 MB: far more than two socket buffers
    slice_ = log.read_slice(0, 1 << 30)
    a, b = socket.socketpair()  # b never reads
    a.setblocking(False)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        slice_.send_to(a.fileno(), b"", timeout_ms=300)
    assert time.monotonic() - started < 5
    a.close()
    b.close()
    log.close()
