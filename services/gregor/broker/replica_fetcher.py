"""Replica fetchers: a follower copies its leaders' logs (seeds 002, 004).

One asyncio task per leader broker (Kafka's ReplicaFetcherThread per source
broker) fetches every partition this broker follows from that leader, one long
poll per partition in flight, each re-issued as soon as it is answered. Before a
partition's first fetch under a leader epoch it truncates by leader epoch:
OffsetForLeaderEpoch for our latest epoch, truncate to min(answer, own LEO),
falling back to the high watermark when the epoch is undefined. Fetched batches
are appended with their offsets and epochs; the follower HW is
min(leader HW, own LEO).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import grpc
from prometheus_client import Gauge

from gregor.broker.limits import (
    REPLICA_FETCH_MAX_BYTES,
    REPLICA_FETCH_WAIT_MAX_MS,
    REPLICA_FETCH_BACKOFF_S,
    FETCH_RPC_TIMEOUT_S,
    MAX_TRUNCATION_ROUNDS,
)
from gregor.common import errors
from gregor.broker.replica_state import FetchMode
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

FETCHER_LAG = Gauge("gregor_broker_replica_fetcher_max_lag",
                    "Largest (leader HW - follower LEO) over the partitions fetched from a leader", ["leader"])

BACKOFF_CODES = frozenset({errors.Code.FENCED_LEADER_EPOCH, errors.Code.NOT_LEADER_OR_FOLLOWER,
                           errors.Code.UNKNOWN_LEADER_EPOCH, errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
                           errors.Code.NETWORK_EXCEPTION, errors.Code.REQUEST_TIMED_OUT,
                           errors.Code.KAFKA_STORAGE_ERROR,
                           # The leader knows a newer incarnation of us: our re-registration is under way.
                           errors.Code.STALE_BROKER_EPOCH})


@dataclass
class PartitionFetchState:
    """The fetcher's own bookkeeping; whether to truncate first is the ReplicaState's fetch_mode."""

    leader_epoch: int
    out_of_range: bool = False
    backoff_until: float = 0.0


class ReplicaFetcher:
    """Fetches the partitions led by one leader. Concurrency: one task; partitions change only on the loop."""

    def __init__(self, manager: "ReplicaFetcherManager", leader_id: int) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.partitions: dict[tuple[str, int], PartitionFetchState] = {}
        self._wake = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"replica-fetcher-{leader_id}")
        self.task.add_done_callback(self._on_done)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("replica fetcher for leader %d died", self.leader_id, exc_info=task.exception())

    def add(self, key: tuple[str, int], leader_epoch: int) -> None:
        self.partitions[key] = PartitionFetchState(leader_epoch)
        self._wake.set()

    async def _run(self) -> None:
        rm = self.manager.replicas
        while True:
            if not self.partitions:
                self._wake.clear()
                await self._wake.wait()
                continue
            target = self.manager.endpoint_of(self.leader_id)
            if target is None:
                await asyncio.sleep(REPLICA_FETCH_BACKOFF_S)
                continue
            async with channel(target) as ch:
                await self._fetch_from(rm, broker_pb2_grpc.BrokerServiceStub(ch), target)

    async def _fetch_from(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub, target: str) -> None:
        """One fetch per partition in flight, each re-issued as soon as it is answered.

        Kafka's single multi-partition Fetch returns when any partition has data; per-partition
        long polls must not wait for each other either: a quiet partition's 500 ms poll would
        otherwise pace a busy one (one acks=all round trip per poll), as happened when a
        partition stalled on a dead ISR member shared a fetcher with a partition that just
        moved to this leader.
        """
        in_flight: dict[tuple[str, int], asyncio.Task[None]] = {}
        try:
            while self.partitions and self.manager.endpoint_of(self.leader_id) == target:
                for key in list(self.partitions):
                    if key not in in_flight:
                        in_flight[key] = asyncio.create_task(self._fetch_one(rm, stub, key))
                self._wake.clear()
                wake = asyncio.create_task(self._wake.wait())
                await asyncio.wait([*in_flight.values(), wake], return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                for key, task in list(in_flight.items()):
                    if task.done():
                        del in_flight[key]
                        task.result()  # _fetch_one handles its errors; anything else is a bug: fail loudly
        finally:
            for task in in_flight.values():
                task.cancel()
            await asyncio.gather(*in_flight.values(), return_exceptions=True)

    def _current(self, rm: "ReplicaManager", key: tuple[str, int], st: PartitionFetchState) -> "Partition | None":
        """The partition if we still follow this leader at this epoch, else None (and drop it)."""
        p = rm.partitions.get(key)
        if (p is None or p.is_leader or p.leader_id != self.leader_id or p.leader_epoch != st.leader_epoch
                or self.partitions.get(key) is not st):
            if self.partitions.get(key) is st:
                del self.partitions[key]
            return None
        return p

    async def _fetch_one(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub,
                         key: tuple[str, int]) -> None:
        st = self.partitions.get(key)
        if st is None:
            return
        loop = asyncio.get_running_loop()
        if st.backoff_until > loop.time():
            await asyncio.sleep(st.backoff_until - loop.time())
        p = self._current(rm, key, st)
        if p is None:
            return
        try:
            if p.state.fetch_mode is FetchMode.TRUNCATING:
                await self._truncate(rm, stub, p, st)
                p = self._current(rm, key, st)
                if p is None:
                    return
            fetch_offset = p.log_end_offset
            resp = await stub.Fetch(broker_pb2.FetchRequest(
                topic=p.topic, partition=p.partition, fetch_offset=fetch_offset,
                max_bytes=REPLICA_FETCH_MAX_BYTES, min_bytes=1, max_wait_ms=REPLICA_FETCH_WAIT_MAX_MS,
                replica_id=rm.config.broker_id, current_leader_epoch=st.leader_epoch,
                replica_broker_epoch=self.manager.broker_epoch(), replica_log_start_offset=p.log.log_start_offset),
                timeout=FETCH_RPC_TIMEOUT_S)
            p = self._current(rm, key, st)
            if p is None or p.log_end_offset != fetch_offset:
                return
            # Also applies the batches to the producer state; the follower HW is the ReplicaState's.
            rm.run_effects(p, p.append_fetched(resp.records, resp.high_watermark))
            FETCHER_LAG.labels(leader=str(self.leader_id)).set(max(0, resp.high_watermark - p.log_end_offset))
        except grpc.aio.AioRpcError as exc:
            err = errors.from_rpc_error(exc)
            if err.code == errors.Code.OFFSET_OUT_OF_RANGE:
                log.info("%s-%d: out of range at the leader; truncating again", key[0], key[1])
                st.out_of_range = True
                p = self._current(rm, key, st)
                if p is not None:
                    p.state.restart_truncation()
            else:
                if err.code not in BACKOFF_CODES:
                    log.warning("%s-%d: fetch from leader %d failed: %s", key[0], key[1], self.leader_id, err)
                st.backoff_until = loop.time() + REPLICA_FETCH_BACKOFF_S
        except Exception as exc:  # a bad batch or a storage error: back off, truncate and retry
            log.warning("%s-%d: replication from leader %d failed: %s", key[0], key[1], self.leader_id, exc)
            p = self._current(rm, key, st)
            if p is not None:
                p.state.restart_truncation()
            st.backoff_until = loop.time() + REPLICA_FETCH_BACKOFF_S

    async def _truncate(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub, p: "Partition",
                        st: PartitionFetchState) -> None:
        """Ask OffsetForLeaderEpoch until the ReplicaState's truncation converges (seed 002)."""
        for _ in range(MAX_TRUNCATION_ROUNDS):
            latest = p.truncation_query()
            if latest is None:
                break  # no epochs at all: truncated to the HW
            resp = await stub.OffsetForLeaderEpoch(broker_pb2.OffsetForLeaderEpochRequest(
                topic=p.topic, partition=p.partition, leader_epoch=latest, current_leader_epoch=st.leader_epoch,
                replica_id=rm.config.broker_id), timeout=FETCH_RPC_TIMEOUT_S)
            if self._current(rm, p.key, st) is None:
                return
            if p.on_truncation_point(latest, resp.leader_epoch, resp.end_offset) or p.log.latest_epoch() == latest:
                break
        if st.out_of_range:
            await self._reset_out_of_range(rm, stub, p, st)
        p.state.finish_truncation(p.log_end_offset)
        st.out_of_range = False

    async def _reset_out_of_range(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub,
                                  p: "Partition", st: PartitionFetchState) -> None:
        """OFFSET_OUT_OF_RANGE after epoch truncation: behind the leader's log start, or past its end."""
        earliest = await stub.ListOffsets(broker_pb2.ListOffsetsRequest(
            topic=p.topic, partition=p.partition, timestamp_ms=-2, current_leader_epoch=st.leader_epoch),
            timeout=FETCH_RPC_TIMEOUT_S)
        latest = await stub.ListOffsets(broker_pb2.ListOffsetsRequest(
            topic=p.topic, partition=p.partition, timestamp_ms=-1, current_leader_epoch=st.leader_epoch),
            timeout=FETCH_RPC_TIMEOUT_S)
        effect = p.state.on_leader_log_range(earliest.offset, latest.offset, p.log_end_offset)
        if effect is not None:
            log.info("%s-%d: out of range at the leader (log start %d, HW %d): %s", p.topic, p.partition,
                     earliest.offset, latest.offset, effect)
            p.apply_log_effects([effect])


class ReplicaFetcherManager:
    """The fetchers of one follower broker, keyed by leader id (Kafka's ReplicaFetcherManager).

    Concurrency: event-loop owned; each fetcher is one task.
    """

    def __init__(self, replicas: "ReplicaManager", endpoint_of: Callable[[int], str | None],
                 broker_epoch: Callable[[], int]) -> None:
        self.replicas = replicas
        self.endpoint_of = endpoint_of
        self.broker_epoch = broker_epoch
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.stopped = False

    def add_partition(self, p: "Partition") -> None:
        """Follow p from its leader (removing it from any other fetcher first); truncation runs first.

        After shutdown() (a broker on its way out of a controlled shutdown) a late
        LeaderAndIsr does not start a new fetcher."""
        self.remove_partitions([p.key])
        if self.stopped:
            return
        fetcher = self.fetchers.get(p.leader_id)
        if fetcher is None or fetcher.task.done():
            fetcher = self.fetchers[p.leader_id] = ReplicaFetcher(self, p.leader_id)
        fetcher.add(p.key, p.leader_epoch)

    def remove_partitions(self, keys: list[tuple[str, int]]) -> None:
        for fetcher in self.fetchers.values():
            for key in keys:
                fetcher.partitions.pop(key, None)

    async def shutdown(self) -> None:
        self.stopped = True
        for f in self.fetchers.values():
            f.task.cancel()
        await asyncio.gather(*(f.task for f in self.fetchers.values()), return_exceptions=True)
        self.fetchers.clear()
