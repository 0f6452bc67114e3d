"""The consumer's fetches per leader broker: one FetchPartitions session (KIP-227) for all its partitions there.

Why: one fetch task and one single-partition RPC per assigned partition cost a consumer of 1,000
partitions 1,000 long polls parked on the brokers and ~1,000 RPCs per round; Kafka's consumer sends
one Fetch per leader and, with an incremental fetch session, names only the partitions whose
position changed (FetchSessionHandler). Here the Consumer hands each partition that has a position
to BrokerFetchers.add (consumer.py does the positions, resets and errors per partition, as before);
the BrokerFetcher of its leader fetches it with the others it leads and passes each partition's
answer back (Consumer._on_fetch_result, or Consumer._recover on an error, which takes the partition
out of the session until it has a position and a leader again). A partition whose leader moved
goes to the new leader's fetcher. Concurrency: the consumer's event loop, one task per broker.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol

import grpc

from gregor.client.fetcher import FetchResult, GrpcFetcher, aborted_of
from gregor.client.metadata import call_error
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2, common_pb2

if TYPE_CHECKING:
    from gregor.client.metadata import ClusterMetadata
    from gregor.client.subscription_state import PartitionState, SubscriptionState

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# What the broker's session holds of a partition: fetch offset, leader epoch, max bytes, topic id.
Spec = tuple[int, int, int, bytes]
INITIAL_EPOCH = 0


class FetchOwner(Protocol):
    """What the fetchers need of the consumer (consumer.py's _FetchHooks implements it)."""

    @property
    def config(self) -> Mapping[str, Any]: ...

    @property
    def metadata(self) -> "ClusterMetadata": ...

    @property
    def subscriptions(self) -> "SubscriptionState": ...

    @property
    def partition_bytes(self) -> int: ...

    @property
    def fetch_max_bytes(self) -> int: ...

    @property
    def isolation(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def buffers_full(self) -> bool:
        """fetch.max.bytes are buffered over all partitions: nothing is fetched until poll() drains some."""

    def on_fetch_result(self, tp: TopicPartition, state: "PartitionState", result: FetchResult) -> None:
        """A partition's records and watermarks, at the fetch offset its state has."""

    def recover(self, tp: TopicPartition, state: "PartitionState", gen: int, err: errors.GregorError) -> None:
        """A partition's fetch failed and it left its session: handle the error and bring it back."""

    def park(self, tp: TopicPartition, state: "PartitionState", gen: int, exc: BaseException) -> None:
        """A partition's fetch failed for good: poll() raises it."""

    def fetch_alone(self, tp: TopicPartition, state: "PartitionState", gen: int) -> None:
        """Fetch this partition with its own single-partition Fetch task (its leader has no FetchPartitions)."""


class _Unimplemented(Exception):
    """The broker does not serve FetchPartitions (a broker of an older version, mid rolling upgrade)."""


@dataclass
class FetchSessionHandler:
    """The client's half of one KIP-227 session (Kafka's FetchSessionHandler): what the broker's session
    holds, so the next request names only what changed. A session error or a lost answer starts over
    with a full request (epoch 0), which also replaces the old session on the broker."""

    session_id: int = 0
    epoch: int = INITIAL_EPOCH
    sent: dict[TopicPartition, Spec] = field(default_factory=dict)
    full_requests: int = 0
    incremental_requests: int = 0

    def build(self, wanted: dict[TopicPartition, Spec]) -> tuple[list[tuple[TopicPartition, Spec]], list[TopicPartition]]:
        """The partitions to name and the ones to forget for a request wanting exactly `wanted`."""
        if self.epoch == INITIAL_EPOCH:
            self.full_requests += 1
            return list(wanted.items()), []
        self.incremental_requests += 1
        sent = self.sent
        changed = [(tp, spec) for tp, spec in wanted.items() if sent.get(tp) != spec]
        return changed, [tp for tp in sent if tp not in wanted]

    def applied(self, wanted: dict[TopicPartition, Spec], session_id: int) -> None:
        """The broker took the request: the session now holds `wanted`, and expects the next epoch."""
        if session_id == 0:
            self.reset()
            return
        self.session_id = session_id
        self.epoch = 1 if self.epoch >= 2**31 - 1 else self.epoch + 1
        self.sent = dict(wanted)

    def reset(self) -> None:
        self.epoch = INITIAL_EPOCH
        self.sent = {}


class BrokerFetcher:
    """The fetch loop of one leader broker: one FetchPartitions at a time for every fetchable partition it leads."""

    def __init__(self, owner: "BrokerFetchers", leader: int) -> None:
        self.owner = owner
        self.consumer = owner.consumer
        self.leader = leader
        self.partitions: dict[TopicPartition, tuple["PartitionState", int]] = {}  # tp -> (state, generation)
        self.session = FetchSessionHandler()
        self.changed = asyncio.Event()
        self.task: Optional["asyncio.Task[None]"] = None

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    def _live(self, tp: TopicPartition, state: "PartitionState", gen: int) -> bool:
        return self.consumer.subscriptions.states.get(tp) is state and state.generation == gen

    def _wanted(self) -> dict[TopicPartition, Spec]:
        """Drop revoked or seeked partitions, move those whose leader moved, and spec the fetchable rest."""
        c = self.consumer
        md = c.metadata
        fetcher = self.owner.rpc
        wanted: dict[TopicPartition, Spec] = {}
        if c.buffers_full():
            return wanted
        for tp, (state, gen) in list(self.partitions.items()):
            if not self._live(tp, state, gen):
                del self.partitions[tp]
                continue
            leader = md.leader_for(tp[0], tp[1])
            if leader >= 0 and leader != self.leader:
                del self.partitions[tp]
                self.owner.add(tp, state, gen)
                continue
            if state.error is not None or state.fetch_offset is None or state.buffered_bytes >= c.partition_bytes:
                continue
            epoch = fetcher.current_leader_epoch(tp, self.leader)
            wanted[tp] = (state.fetch_offset, -1 if epoch is None else epoch, c.partition_bytes, state.topic_id or b"")
        return wanted

    def _request(self, wanted: dict[TopicPartition, Spec]) -> broker_pb2.FetchPartitionsRequest:
        named, forgotten = self.session.build(wanted)
        f = self.owner.rpc
        return broker_pb2.FetchPartitionsRequest(
            min_bytes=f.min_bytes, max_wait_ms=f.max_wait_ms, max_bytes=self.consumer.fetch_max_bytes,
            isolation_level=self.consumer.isolation,  # type: ignore[arg-type]
            session_id=self.session.session_id, session_epoch=self.session.epoch,
            partitions=[broker_pb2.FetchPartition(topic=tp[0], partition=tp[1], fetch_offset=s[0],
                                                  current_leader_epoch=s[1], partition_max_bytes=s[2], topic_id=s[3])
                        for tp, s in named],
            forgotten=[common_pb2.TopicPartition(topic=tp[0], partition=tp[1]) for tp in forgotten])

    async def _run(self) -> None:
        c = self.consumer
        rpc = self.owner.rpc
        try:
            while not c.closed:
                self.changed.clear()
                wanted = self._wanted()
                if not self.partitions:
                    return  # the owner starts a new loop when a partition comes back
                if not wanted:
                    await self._wait_changed()
                    continue
                await rpc.throttles.wait(self.leader)
                wanted = self._wanted()  # the throttle wait may have taken a while
                if not wanted:
                    continue
                full = self.session.epoch == INITIAL_EPOCH
                request = self._request(wanted)
                sent_at = {tp: (self.partitions[tp], s[0]) for tp, s in wanted.items()}
                call = asyncio.ensure_future(self._call(request))
                dropped = False
                while not call.done():
                    self.changed.clear()
                    waker = asyncio.ensure_future(self.changed.wait())
                    await asyncio.wait((call, waker), return_when=asyncio.FIRST_COMPLETED)
                    waker.cancel()
                    if not call.done() and self._wanted() != wanted:
                        # A partition came, went, moved or has room again: ask again now rather than after
                        # the parked fetch's max wait. The broker already moved the session to the next epoch
                        # (it resolves a request on arrival); a full request's session id is lost with it.
                        call.cancel()
                        dropped = True
                        if full:
                            self.session.reset()
                        else:
                            self.session.applied(wanted, self.session.session_id)
                        break
                if dropped:
                    await asyncio.gather(call, return_exceptions=True)
                    continue
                try:
                    response = call.result()
                except _Unimplemented:
                    log.warning("broker %d does not serve FetchPartitions (an older version?): its partitions are "
                                "fetched one Fetch per partition", self.leader)
                    self.owner.unsupported.add(self.leader)
                    for tp, (state, gen) in list(self.partitions.items()):
                        del self.partitions[tp]
                        if self._live(tp, state, gen):
                            c.fetch_alone(tp, state, gen)
                    return
                except errors.GregorError as err:
                    self._failed(err, sent_at)
                    self.session.reset()
                    continue
                if response.HasField("error") and response.error.code:
                    # FETCH_SESSION_ID_NOT_FOUND (evicted) / INVALID_FETCH_SESSION_EPOCH: a full request next.
                    log.debug("broker %d: fetch session %d: %s; starting a new session", self.leader,
                              self.session.session_id, errors.code_name(response.error.code))
                    self.owner.session_errors += 1
                    self.session.reset()
                    continue
                rpc.throttles.record(self.leader, response.throttle_time_ms)
                self.session.applied(wanted, response.session_id)
                self._deliver(response, sent_at)
        except Exception as exc:  # a bug, not a fetch error: every partition here reports it through poll()
            log.error("broker %d: fetch loop failed", self.leader, exc_info=exc)
            for tp, (state, gen) in list(self.partitions.items()):
                if self._live(tp, state, gen):
                    c.park(tp, state, gen, exc)
            self.partitions.clear()
        finally:
            if self.owner.fetchers.get(self.leader) is self and not self.partitions:
                del self.owner.fetchers[self.leader]

    async def _call(self, request: broker_pb2.FetchPartitionsRequest) -> broker_pb2.FetchPartitionsResponse:
        rpc = self.owner.rpc
        self.owner.requests += 1
        try:
            return await self.consumer.metadata.broker_stub(self.leader).FetchPartitions(
                request, timeout=rpc.timeout_s)
        except (grpc.RpcError, asyncio.TimeoutError) as exc:
            if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # type: ignore[attr-defined]
                raise _Unimplemented() from None
            raise call_error(exc) from None

    async def _wait_changed(self) -> None:
        """Nothing fetchable: wait for a partition to come, go or have room again."""
        await self.changed.wait()

    def _failed(self, err: errors.GregorError, sent_at: dict[TopicPartition, Any]) -> None:
        """The whole request failed (the broker is unreachable, ...): each partition recovers on its own
        (metadata refresh, backoff, its leader again), as a partition whose fetch failed."""
        for tp, ((state, gen), _) in sent_at.items():
            if self.partitions.get(tp) == (state, gen):
                del self.partitions[tp]
                if self._live(tp, state, gen):
                    self.consumer.recover(tp, state, gen, err)

    def _deliver(self, response: broker_pb2.FetchPartitionsResponse, sent_at: dict[TopicPartition, Any]) -> None:
        c = self.consumer
        for pd in response.partitions:
            tp = (pd.topic, pd.partition)
            asked = sent_at.get(tp)
            if asked is None:
                continue
            (state, gen), offset = asked
            if self.partitions.get(tp) != (state, gen) or not self._live(tp, state, gen):
                continue  # seeked, revoked or moved since: the answer is for an older position
            if pd.HasField("error") and pd.error.code:
                del self.partitions[tp]
                c.recover(tp, state, gen, errors.from_detail(pd.error))
                continue
            if state.fetch_offset != offset:
                continue
            c.on_fetch_result(tp, state, FetchResult(pd.records, pd.high_watermark, pd.log_start_offset,
                                                      pd.leader_epoch, aborted_of(pd), pd.last_stable_offset))


class BrokerFetchers:
    """A consumer's BrokerFetcher per leader broker; partitions go to their leader's."""

    def __init__(self, consumer: FetchOwner) -> None:
        self.consumer = consumer
        self.rpc = GrpcFetcher(consumer.metadata, consumer.config)  # config, leader epochs, throttles
        self.fetchers: dict[int, BrokerFetcher] = {}
        self.requests = 0  # FetchPartitions calls sent (tests and benchmarks read it)
        self.session_errors = 0
        self.unsupported: set[int] = set()  # brokers without FetchPartitions: their partitions fetch alone

    def add(self, tp: TopicPartition, state: "PartitionState", gen: int) -> None:
        """A partition with a position and a known leader: fetch it in its leader's session."""
        leader = self.consumer.metadata.leader_for(tp[0], tp[1])
        if leader < 0:  # the metadata lost it since the partition found its leader: find it again
            self.consumer.recover(tp, state, gen, errors.error_for(
                errors.Code.LEADER_NOT_AVAILABLE, "no leader", topic=tp[0], partition=tp[1]))
            return
        if leader in self.unsupported:
            self.consumer.fetch_alone(tp, state, gen)
            return
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = self.fetchers[leader] = BrokerFetcher(self, leader)
        fetcher.partitions[tp] = (state, gen)
        fetcher.changed.set()
        fetcher.start()

    def wake(self) -> None:
        """Partitions were dropped or have room again: each fetcher looks at its set."""
        for f in self.fetchers.values():
            f.changed.set()

    async def close(self) -> None:
        tasks = [f.task for f in self.fetchers.values() if f.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.fetchers.clear()
