"""Blocking access to a Gregor cluster for the data source: metadata, ListOffsets and raw fetches.

Spark calls the data source from plain threads (the driver's planning, one
Python worker per task), so each `GregorCluster` owns a private event loop and
runs the SDK's asyncio pieces on it. Fetches return whole record batches as
bytes; decoding them is the native module's job (arrow.py), never Python's.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Iterable, Optional


from gregor.client.config import consumer_config, parse_bootstrap
from gregor.client.fetcher import FetchResult, make_fetcher
from gregor.client.metadata import ClusterMetadata, list_offset
from gregor.common import errors
from gregor.common.tls import from_client_config
from gregor.rpc.v1 import broker_pb2, common_pb2

from gregor_spark.options import EARLIEST, LATEST, GregorSourceError, SourceOptions, TopicPartition

INTERNAL_TOPIC = re.compile(r"__.*")  # __consumer_offsets, __transaction_state, ...: never matched by a pattern


class GregorCluster:
    """Metadata, offsets and fetches of one cluster; not thread-safe (one per thread / task)."""

    def __init__(self, bootstrap: str, *, transport: str = "grpc", read_committed: bool = False,
                 request_timeout_ms: int = 30000, max_partition_fetch_bytes: int = 4 * 1024 * 1024,
                 security: Optional[dict[str, str]] = None) -> None:
        self.loop = asyncio.new_event_loop()
        # max.partition.fetch.bytes 4 MiB: a bulk reader wants large answers (Kafka's default 1 MiB is for poll loops).
        self.cfg = consumer_config({"bootstrap.servers": bootstrap, "request.timeout.ms": request_timeout_ms,
                                    "max.partition.fetch.bytes": max_partition_fetch_bytes,
                                    "fetch.max.wait.ms": 0, **(security or {})})
        self.security = from_client_config(self.cfg)  # kafka.security.protocol / kafka.ssl.* options
        self.metadata = ClusterMetadata(parse_bootstrap(bootstrap), request_timeout_ms=request_timeout_ms,
                                        security=self.security)
        self.isolation = common_pb2.READ_COMMITTED if read_committed else common_pb2.READ_UNCOMMITTED
        self.fetcher = make_fetcher(transport, self.metadata, self.cfg)
        self.timeout_ms = request_timeout_ms

    @classmethod
    def of(cls, opts: SourceOptions) -> "GregorCluster":
        return cls(opts.bootstrap, transport=opts.fetch_transport, read_committed=opts.isolation_read_committed,
                   security=dict(opts.security))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        try:
            self.run(self.fetcher.close())
            self.run(self.metadata.close())
        finally:
            self.loop.close()

    # ------------------------------------------------------------ topics and partitions
    def all_topics(self) -> dict[str, list[int]]:
        """Every topic (internal ones too) with its partition numbers, from one Metadata round trip."""
        return {name: parts for name, (parts, _id) in self._describe().items()}

    def topic_ids(self) -> dict[str, bytes]:
        """Every topic's id (KIP-516; b"" when the cluster sends none), from one Metadata round trip."""
        return {name: topic_id for name, (_parts, topic_id) in self._describe().items()}

    def _describe(self) -> dict[str, tuple[list[int], bytes]]:
        md = ClusterMetadata(self.metadata.bootstrap, request_timeout_ms=self.timeout_ms, security=self.security)
        try:
            self.run(md.refresh())
            return {name: ([p.partition for p in t.partitions], t.topic_id)
                    for name, t in md.topics.items() if not t.error}
        finally:
            self.run(md.close())

    def partitions(self, opts: SourceOptions, *, allow_missing: bool = False) -> list[TopicPartition]:
        """The topic-partitions the source reads now (Spark's ConsumerStrategy).

        subscribe and assign name topics that must exist (UNKNOWN_TOPIC_OR_PARTITION otherwise, naming
        the option); a pattern matches whatever exists, internal topics only when named explicitly.
        """
        topics = self.all_topics()
        if opts.strategy == "assign":
            for t, p in opts.assign:
                if allow_missing:
                    continue
                if t not in topics:
                    raise GregorSourceError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{t}' given in option 'assign' "
                                            "does not exist")
                if p not in topics[t]:
                    raise GregorSourceError(f"UNKNOWN_TOPIC_OR_PARTITION: partition {t}-{p} given in option "
                                            f"'assign' does not exist (the topic has {len(topics[t])} partitions)")
            return sorted(set(opts.assign))
        if opts.strategy == "subscribe":
            missing = [t for t in opts.topics if t not in topics]
            if missing and not allow_missing:
                raise GregorSourceError(f"UNKNOWN_TOPIC_OR_PARTITION: topic(s) {', '.join(missing)} given in option "
                                        "'subscribe' do not exist")
            names = [t for t in opts.topics if t in topics]
        else:
            names = [t for t in topics if opts.matches(t) and
                     (not INTERNAL_TOPIC.fullmatch(t) or INTERNAL_TOPIC.fullmatch(opts.pattern or "") is not None
                      or (opts.pattern or "").startswith("__"))]
        return sorted((t, p) for t in names for p in topics[t])

    # ------------------------------------------------------------ offsets
    def list_offset(self, tp: TopicPartition, timestamp_ms: int) -> tuple[int, int]:
        """ListOffsets on the leader: (offset, timestamp); -2 earliest, -1 latest (HW, or LSO read_committed)."""
        return self.run(list_offset(self.metadata, tp, timestamp_ms, self.isolation, self.timeout_ms, 0.2))

    def earliest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.list_offset(tp, EARLIEST)[0] for tp in tps}

    def latest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.list_offset(tp, LATEST)[0] for tp in tps}

    def offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> Optional[int]:
        """The first offset whose timestamp is >= timestamp_ms, None if there is none."""
        offset, _ = self.list_offset(tp, timestamp_ms)
        return offset if offset >= 0 else None

    # ------------------------------------------------------------ fetch
    def fetch(self, tp: TopicPartition, offset: int, topic_id: bytes = b"") -> FetchResult:
        """One fetch of whole batches from `offset`; retriable errors (leader moved) are retried. With
        topic_id (KIP-516) a topic deleted and re-created under the name is UNKNOWN_TOPIC_ID, raised as
        soon as the cluster's metadata shows the new id."""
        return self.run(self._fetch(tp, offset, topic_id))

    async def _fetch(self, tp: TopicPartition, offset: int, topic_id: bytes = b"") -> FetchResult:
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            try:
                return await self.fetcher.fetch(tp, offset, self.isolation, topic_id)
            except errors.GregorError as err:
                if err.code == errors.Code.UNKNOWN_TOPIC_ID:
                    await self.metadata.refresh([tp[0]])
                    current = self.metadata.topic_id(tp[0])
                    if current and current != topic_id:
                        raise
                if not err.retriable or time.monotonic() >= deadline:
                    raise
                self.metadata.request_update(err)
                await asyncio.sleep(0.2)
