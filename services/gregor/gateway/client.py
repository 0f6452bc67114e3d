"""A thin Python client of the producer gateway (what any-language clients do), with failover.

    async with GatewayClient(["127.0.0.1:7001", "127.0.0.1:7002"]) as gw:
        results = await gw.produce("orders", [record(b"v", key=b"k")])

Failover: a gateway that answers UNAVAILABLE (killed, restarting) is left for the
next one. A record whose RPC failed that way may or may not have been written
(its result never came back); resending it can duplicate it, exactly like a
Kafka producer retry without idempotence across sessions.
"""

from __future__ import annotations

import asyncio
from typing import Optional, Sequence

import grpc

from gregor.common import errors
from gregor.common.rpc import channel
from gregor.common.tls import TlsConfig
from gregor.rpc.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})


def record(value: Optional[bytes], key: Optional[bytes] = None, headers: Sequence[tuple[str, bytes]] = (),
           timestamp_ms: int = 0) -> common_pb2.Record:
    """A proto Record (None key/value stay absent: null)."""
    rec = common_pb2.Record(headers=[common_pb2.RecordHeader(key=k, value=v) for k, v in headers],
                            timestamp_ms=timestamp_ms)
    if key is not None:
        rec.key = key
    if value is not None:
        rec.value = value
    return rec


class GatewayClient:
    """Produce through any of several gateways (event-loop owned; one channel per gateway)."""

    def __init__(self, targets: Sequence[str] | str, retry_backoff_ms: int = 100,
                 security: Optional[TlsConfig] = None) -> None:
        self.targets = [t.strip() for t in (targets.split(",") if isinstance(targets, str) else targets) if t.strip()]
        if not self.targets:
            raise errors.InvalidConfigError("no gateway address given")  # type: ignore[attr-defined]
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.current = 0
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.security = security  # TLS to the gateways (None: the process's, gregor.common.tls)

    def stub(self, target: Optional[str] = None) -> gateway_pb2_grpc.ProducerGatewayServiceStub:
        target = target or self.targets[self.current]
        ch = self._channels.get(target)
        if ch is None:
            ch = self._channels[target] = channel(target, self.security)
        return gateway_pb2_grpc.ProducerGatewayServiceStub(ch)

    def fail_over(self) -> None:
        """Move to the next gateway."""
        self.current = (self.current + 1) % len(self.targets)

    async def produce(self, topic: str, records: Sequence[common_pb2.Record], partition: Optional[int] = None,
                      timeout: float = 30.0, attempts: Optional[int] = None) -> list[gateway_pb2.GatewayRecordResult]:
        """One result per record; on UNAVAILABLE the next gateway is tried (up to attempts, default 2 rounds)."""
        req = gateway_pb2.GatewayProduceRequest(topic=topic, records=list(records))
        if partition is not None:
            req.partition = partition
        last: Optional[grpc.RpcError] = None
        for _ in range(attempts or 2 * len(self.targets)):
            try:
                return list((await self.stub().Produce(req, timeout=timeout)).results)
            except grpc.RpcError as exc:
                if exc.code() not in FAILOVER_CODES:
                    raise errors.from_rpc_error(exc) from None
                last = exc
                self.fail_over()
                await asyncio.sleep(self.retry_backoff_s)
        assert last is not None
        raise errors.from_rpc_error(last)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)

    async def __aenter__(self) -> "GatewayClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
