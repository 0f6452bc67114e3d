"""One TransactionalProduceStream: a transactional producer owned by the stream (seed 003 §6.8).

The gateway's shared producer is idempotent only; a transaction belongs to one
transactional.id, so each stream gets its own Producer with the client's id and
the gateway's producer settings. Messages are handled in order: init,
begin, records (their results arrive once acknowledged, before a following
commit's result, since commit flushes first), commit, abort.
Concurrency: event-loop owned, one session per stream.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from gregor.client.producer import Producer
from gregor.common import errors
from gregor.gateway.gateway import InRecord, Result

NO_RESULT: Result = (-1, -1, -1, None)
# Kafka's default max.block.ms: init/commit wait this long for the transaction coordinator (the shared
# producer's max.block.ms is 0 so that it never blocks the gateway; a stream's own producer may wait).
TXN_MAX_BLOCK_MS = 60000


class TxnSession:
    """The stream's transactional producer and the operations the client sends."""

    def __init__(self, base_config: Mapping[str, Any]) -> None:
        self.base_config = dict(base_config)
        self.producer: Optional[Producer] = None

    async def init(self, transactional_id: str, timeout_ms: int) -> Result:
        if self.producer is not None:
            raise errors.error_for(errors.Code.INVALID_TXN_STATE, "init may only be the stream's first message")
        if not transactional_id:
            raise errors.error_for(errors.Code.INVALID_REQUEST, "init needs a transactional_id")
        cfg = {**self.base_config, "transactional.id": transactional_id, "enable.idempotence": True,
               "max.block.ms": TXN_MAX_BLOCK_MS}
        if timeout_ms > 0:
            cfg["transaction.timeout.ms"] = timeout_ms
        self.producer = Producer(cfg)
        await self.producer.init_transactions()
        return NO_RESULT

    def _producer(self) -> Producer:
        if self.producer is None:
            raise errors.error_for(errors.Code.INVALID_TXN_STATE, "send init (a transactional_id) first")
        return self.producer

    async def begin(self) -> Result:
        await self._producer().begin_transaction()
        return NO_RESULT

    async def commit(self) -> Result:
        await self._producer().commit_transaction()
        return NO_RESULT

    async def abort(self) -> Result:
        await self._producer().abort_transaction()
        return NO_RESULT

    async def send(self, rec: InRecord, on_done: Callable[[Result], None]) -> None:
        """Buffer one record of the transaction; on_done gets its result once acknowledged (or failed)."""
        handle = await self._producer().send(rec.topic, rec.value, rec.key, headers=list(rec.headers) or None,
                                             partition=rec.partition, timestamp_ms=rec.timestamp_ms)

        def done(md: Any, exc: Optional[BaseException]) -> None:
            if exc is None:
                on_done((md.partition, md.offset, md.timestamp, None))
                return
            err = exc if isinstance(exc, errors.GregorError) else errors.GregorError(f"{type(exc).__name__}: {exc}")
            on_done((rec.partition if rec.partition is not None else -1, -1, -1, err))

        handle.add_done_callback(done)

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.close()
