"""Consumer fetch tasks and the data-port fetcher against fakes: failures reach poll(), nothing hangs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gregor.client import consumer as consumer_mod
from gregor.client.consumer import Consumer
from gregor.client.fetcher import FRAME, DataPortFetcher, FetchResult
from gregor.client.metadata import BrokerInfo, ClusterMetadata
from gregor.client.session_fetcher import BrokerFetcher
from gregor.common import errors, records
from gregor.rpc.v1 import broker_pb2


class FakeFetcher:
    """Answers each partition from a script: a callable(call number) -> FetchResult or exception."""

    calls: dict[tuple[str, int], int] = {}

    def __init__(self, script: dict[int, Any]) -> None:
        self.script = script

    async def fetch(self, tp: tuple[str, int], offset: int, isolation: int, topic_id: bytes = b"") -> FetchResult:
        n = FakeFetcher.calls[tp] = FakeFetcher.calls.get(tp, 0) + 1
        await asyncio.sleep(0.001)
        answer = self.script[tp[1]](n)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def close(self) -> None:
        pass


@pytest.fixture(params=["grpc", "partition"])
def transport(request: pytest.FixtureRequest) -> str:
    """Both fetch paths: one session per leader broker (grpc) and one task per partition (partition)."""
    return str(request.param)


def consumer(monkeypatch: pytest.MonkeyPatch, script: dict[int, Any], transport: str = "partition",
             **config: Any) -> Consumer:
    FakeFetcher.calls = {}
    fake = FakeFetcher(script)
    monkeypatch.setattr(consumer_mod, "make_fetcher", lambda *_: fake)

    async def fake_call(self: BrokerFetcher, request: broker_pb2.FetchPartitionsRequest) -> Any:
        """A sessionless broker (session id 0: every request is a full one) answering from the script."""
        self.owner.requests += 1
        out = broker_pb2.FetchPartitionsResponse()
        for q in request.partitions:
            try:
                r = await fake.fetch((q.topic, q.partition), q.fetch_offset, request.isolation_level)
            except errors.GregorError as err:
                out.partitions.add(topic=q.topic, partition=q.partition, error=err.to_detail())
                continue
            out.partitions.add(topic=q.topic, partition=q.partition, records=r.records,
                               high_watermark=r.high_watermark, log_start_offset=r.log_start_offset)
        return out

    async def no_topic_id(self: Consumer, tp: tuple[str, int], state: Any) -> None:
        state.topic_id = b""  # no cluster behind the fake fetcher: no topic id to pin (KIP-516)

    async def leader(self: Any, topic: str, partition: int, max_wait_ms: int) -> tuple[int, None]:
        return 0, None

    monkeypatch.setattr(Consumer, "_pin_topic_id", no_topic_id)
    monkeypatch.setattr(BrokerFetcher, "_call", fake_call)
    monkeypatch.setattr(ClusterMetadata, "leader_stub", leader)
    monkeypatch.setattr(ClusterMetadata, "leader_for", lambda *_: 0)
    return Consumer({"bootstrap.servers": "127.0.0.1:1", "fetch.transport": transport, **config})


def values(n: int, size: int) -> FetchResult:
    data = records.build_batch([(None, b"x" * size, [], 1)] * n)
    return FetchResult(data, n, 0, 0)


def empty(_: int) -> FetchResult:
    return FetchResult(b"", 0, 0, 0)


async def test_a_non_gregor_exception_in_a_fetch_task_reaches_poll(monkeypatch: pytest.MonkeyPatch,
                                                                   transport: str) -> None:
    c = consumer(monkeypatch, {0: lambda n: RuntimeError("decoder bug")}, transport)
    async with c:
        c.assign([("t", 0)])
        c.seek(("t", 0), 0)
        with pytest.raises(errors.GregorError) as info:
            await asyncio.wait_for(c.poll(timeout_ms=2000), 5)
        assert isinstance(info.value.__cause__, RuntimeError)


async def test_corrupt_fetched_data_reaches_poll_as_corrupt_message(monkeypatch: pytest.MonkeyPatch,
                                                                    transport: str) -> None:
    good = records.build_batch([(None, b"v", [], 1)], compression="gzip")
    broken = bytearray(good)
    broken[-5:] = b"\xff" * 5
    c = consumer(monkeypatch, {0: lambda n: FetchResult(bytes(broken), 1, 0, 0)}, transport, **{"check.crcs": False})
    async with c:
        c.assign([("t", 0)])
        c.seek(("t", 0), 0)
        with pytest.raises(errors.CorruptMessageError):  # type: ignore[attr-defined]
            await asyncio.wait_for(c.poll(timeout_ms=2000), 5)


async def test_unassigning_a_full_partition_wakes_the_other_fetch_tasks(monkeypatch: pytest.MonkeyPatch,
                                                                       transport: str) -> None:
    # Partition 0 fills fetch.max.bytes on its own; partition 1 then waits for room.
    script = {0: lambda n: values(1, 5000) if n == 1 else empty(n), 1: lambda n: values(1, 10) if n == 1 else empty(n)}
    c = consumer(monkeypatch, script, transport, **{"fetch.max.bytes": 2000})
    async with c:
        c.assign([("t", 0), ("t", 1)])
        c.seek(("t", 0), 0)
        c.seek(("t", 1), 0)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if FakeFetcher.calls.get(("t", 0)) == 1 and FakeFetcher.calls.get(("t", 1)) == 1:
                break
        await asyncio.sleep(0.05)
        assert FakeFetcher.calls == {("t", 0): 1, ("t", 1): 1}  # both blocked on fetch.max.bytes
        c.assign([("t", 1)])  # frees partition 0's 5000 bytes without any poll()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if FakeFetcher.calls[("t", 1)] > 1:
                break
        assert FakeFetcher.calls[("t", 1)] > 1


class FakeMetadata:
    def __init__(self, port: int) -> None:
        self.brokers = {1: BrokerInfo(1, "127.0.0.1", 1, data_port=port)}
        self.client_id = "consumer-1"

    async def leader_stub(self, topic: str, partition: int, timeout_ms: int) -> tuple[int, None]:
        return 1, None

    def partition(self, topic: str, partition: int) -> None:
        return None  # no leader epoch known: the fetch carries none


async def data_port(answer: bytes) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
        await reader.readexactly(size)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(30)  # then stall

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def data_fetcher(port: int) -> DataPortFetcher:
    cfg = {"max.partition.fetch.bytes": 1000, "fetch.min.bytes": 1, "fetch.max.wait.ms": 100,
           "request.timeout.ms": 200}
    return DataPortFetcher(FakeMetadata(port), cfg)  # type: ignore[arg-type]


@pytest.mark.parametrize("stall_in", ["header", "records"])
async def test_data_port_stalling_mid_answer_times_out(stall_in: str) -> None:
    header = broker_pb2.DataFetchResponseHeader(records_length=100).SerializeToString()
    answer = FRAME.pack(len(header) + 10) if stall_in == "header" else FRAME.pack(len(header)) + header + b"abc"
    server, port = await data_port(answer)
    fetcher = data_fetcher(port)
    try:
        with pytest.raises(errors.GregorError) as info:
            await asyncio.wait_for(fetcher.fetch(("t", 0), 0, 0), 5)
        assert info.value.retriable
    finally:
        await fetcher.close()
        server.close()


async def test_data_port_undecodable_header_is_a_corrupt_message() -> None:
    server, port = await data_port(FRAME.pack(4) + b"\xff\xff\xff\xff")
    fetcher = data_fetcher(port)
    try:
        with pytest.raises(errors.CorruptMessageError):  # type: ignore[attr-defined]
            await asyncio.wait_for(fetcher.fetch(("t", 0), 0, 0), 5)
        assert fetcher._conn is None
    finally:
        await fetcher.close()
        server.close()


async def test_a_broker_without_fetch_partitions_is_fetched_one_partition_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader of an older version (UNIMPLEMENTED for FetchPartitions, mid rolling upgrade): its partitions
    fall back to single-partition Fetch tasks and records still arrive."""
    from gregor.client import session_fetcher

    script = {0: lambda n: values(2, 10) if n == 1 else empty(n), 1: lambda n: values(1, 10) if n == 1 else empty(n)}
    c = consumer(monkeypatch, script, "grpc")

    async def unimplemented(self: BrokerFetcher, request: Any) -> Any:
        self.owner.requests += 1
        raise session_fetcher._Unimplemented()

    monkeypatch.setattr(BrokerFetcher, "_call", unimplemented)
    async with c:
        c.assign([("t", 0), ("t", 1)])
        c.seek(("t", 0), 0)
        c.seek(("t", 1), 0)
        got: list[Any] = []
        for _ in range(100):
            got += await c.poll(50)
            if len(got) == 3:
                break
        assert sorted((r.partition, r.offset) for r in got) == [(0, 0), (0, 1), (1, 0)]
        assert c._fetchers is not None and c._fetchers.unsupported == {0}
