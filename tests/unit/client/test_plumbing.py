"""Shared plumbing the client and CLI reuse: gRPC channels and the CLI's error mapping, by what users see.

The metadata client's channels are the project's channels (one per address, sized for 8 MiB
messages, Kafka's reconnect backoff); every CLI command turns a Kafka error or an unreachable
cluster into one clean line and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
import threading
import time
from typing import Any, Iterator

import grpc
import pytest
from click.testing import CliRunner

from gregor.cli.main import cli
from gregor.client.metadata import ClusterMetadata
from gregor.common import errors, rpc

BIG = 8 << 20  # over gRPC's default 4 MiB receive limit, within the project's MAX_MESSAGE_BYTES


def _big_answer(request: bytes, context: Any) -> bytes:
    return b"x" * BIG


@pytest.fixture
def big_server() -> Iterator[str]:
    """A real gRPC server whose one method answers 8 MiB (raw bytes, no proto)."""
    server = grpc.server(ThreadPoolExecutor(2),
                         options=rpc.CHANNEL_OPTIONS)
    handler = grpc.method_handlers_generic_handler("probe.Probe", {
        "Big": grpc.unary_unary_rpc_method_handler(_big_answer)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


async def test_metadata_channels_are_shared_per_address_and_carry_8_mib_answers(big_server: str) -> None:
    md = ClusterMetadata([big_server])
    try:
        ch = md.channel(big_server)
        assert md.channel(big_server) is ch  # one connection per broker address
        call = ch.unary_unary("/probe.Probe/Big")
        assert len(await call(b"", timeout=20)) == BIG  # a default channel fails with RESOURCE_EXHAUSTED
    finally:
        await md.close()


def test_unreachable_cluster_is_one_clean_cli_error() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    result = CliRunner().invoke(cli, ["--bootstrap", dead, "topics", "list"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    assert "cannot reach the cluster" in result.output or "connection failed" in result.output, result.output


def test_kafka_errors_reach_the_user_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import gregor.cli.topics as topics_mod

    async def not_leader(*args: Any, **kwargs: Any) -> Any:
        raise errors.NotLeaderOrFollowerError("moved")  # type: ignore[attr-defined]

    monkeypatch.setattr(topics_mod.AdminClient, "list_topics", not_leader)
    result = CliRunner().invoke(cli, ["--bootstrap", "127.0.0.1:1", "topics", "list"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "NOT_LEADER_OR_FOLLOWER" in result.output and "Traceback" not in result.output


def test_channels_reconnect_with_kafkas_backoff() -> None:
    """A peer that refuses connections is retried on Kafka's reconnect.backoff.ms (50) growing to
    reconnect.backoff.max.ms (1000): several attempts in 4 s where gRPC's defaults (1 s growing by 1.6x,
    up to 120 s) make 3."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    attempts: list[float] = []
    stop = threading.Event()

    def accept_and_drop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            attempts.append(time.monotonic())
            conn.close()  # not HTTP/2: the channel's connection attempt fails

    t = threading.Thread(target=accept_and_drop, daemon=True)
    t.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{listener.getsockname()[1]}", options=rpc.CHANNEL_OPTIONS)
    try:
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(ch).result(timeout=4)
    finally:
        ch.close()
        stop.set()
        t.join()
        listener.close()
    assert len(attempts) >= 6, f"{len(attempts)} connection attempts in 4 s"
