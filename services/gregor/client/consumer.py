"""The Gregor consumer: asyncio `Consumer` and thread-backed `SyncConsumer`, manual assignment or consumer groups.

    async with Consumer({"bootstrap.servers": "127.0.0.1:9092", "auto.offset.reset": "earliest"}) as c:
        c.assign([("orders", 0)])
        for rec in await c.poll(timeout_ms=1000):
            print(rec.offset, rec.value)

    async with Consumer({"bootstrap.servers": "...", "group.id": "billing"}) as c:
        c.subscribe(["orders"], listener=MyListener())    # or subscribe(pattern="orders-.*")
        for rec in await c.poll(timeout_ms=1000):
            ...                                             # positions auto-committed (enable.auto.commit)

Group membership (JoinGroup/SyncGroup, heartbeats, rebalance listener, commits) lives in
group_membership.GroupMember (seed 003, 6.4-6.5); this module owns fetching and positions.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import re
import time
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence


from gregor.common.aio import wait_for
from gregor.common.tls import from_client_config
from gregor.client.config import client_id_for, consumer_config, parse_bootstrap
from gregor.client.fetcher import FetchResult, GrpcFetcher, make_fetcher
from gregor.client.group_membership import ConsumerRebalanceListener, GroupMember
from gregor.client.session_fetcher import BrokerFetchers
from gregor.client.loop_thread import CALLBACK, LISTENER, LoopThread
from gregor.client.txn_filter import committed_rows
from gregor.client.metadata import ClusterMetadata, call_error, list_offset
from gregor.client.subscription_state import PartitionState, SubscriptionState
from gregor.common import errors, uuid
from gregor.common.records import batch_headers, fetched_rows
from gregor.rpc.v1 import broker_pb2, common_pb2

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
EARLIEST, LATEST = -2, -1


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: list[tuple[str, bytes]]


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class ConsumerGroupMetadata(NamedTuple):
    """Kafka's ConsumerGroupMetadata: what Producer.send_offsets_to_transaction needs to commit as this member."""
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: Optional[str]


CommitCallback = Callable[[Mapping[TopicPartition, int], Optional[BaseException]], Any]


class Consumer:
    """Asyncio consumer (event-loop owned). One fetch loop per leader broker (fetch.transport=grpc).

    Each partition first gets a position (committed offset, seek or auto.offset.reset) and its
    leader in a short task of its own; then its leader's BrokerFetcher (session_fetcher.py) fetches
    it with every other partition it leads in one FetchPartitions long poll with an incremental fetch
    session (fetch.min.bytes, fetch.max.wait.ms, fetch.max.bytes, max.partition.fetch.bytes). A
    partition keeps at most about one fetch of records buffered ahead of poll() (it leaves the
    session meanwhile); all together stay under fetch.max.bytes. A fetch error takes the partition
    out of its session until it recovers (reset, new leader); a non-retriable one is parked for poll()
    to raise. fetch.transport=partition and =data keep one fetch task per partition (the old path).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = cfg = consumer_config(config, **kwargs)
        self.metadata = ClusterMetadata(parse_bootstrap(cfg["bootstrap.servers"]),
                                        request_timeout_ms=cfg["request.timeout.ms"], security=from_client_config(cfg),
                                        retry_backoff_ms=cfg["retry.backoff.ms"],
                                        metadata_max_age_ms=cfg["metadata.max.age.ms"],
                                        client_id=client_id_for(cfg, "consumer"))
        self.request_timeout_ms = int(cfg["request.timeout.ms"])
        self.backoff_s = cfg["retry.backoff.ms"] / 1000
        self.max_poll_records = int(cfg["max.poll.records"])
        self.partition_bytes = int(cfg["max.partition.fetch.bytes"])
        self.fetch_max_bytes = int(cfg["fetch.max.bytes"])
        self.check_crcs = bool(cfg["check.crcs"])
        self.isolation = (common_pb2.READ_COMMITTED if cfg["isolation.level"] == "read_committed"
                          else common_pb2.READ_UNCOMMITTED)
        self._rr = 0
        self._data_ready = asyncio.Event()
        self.subscriptions = SubscriptionState(self._start_added, self._stop, self._data_ready.set)
        self._space_freed = asyncio.Event()
        self._buffered_total = 0
        self._closed = False
        self._fetchers: Optional[BrokerFetchers] = (BrokerFetchers(_FetchHooks(self)) if cfg["fetch.transport"] == "grpc"
                                                    else None)
        # Group membership and commits (needs group.id); heartbeats start with subscribe().
        self._group: Optional[GroupMember] = GroupMember(self.subscriptions, self.metadata, cfg) if cfg["group.id"] else None

    async def __aenter__(self) -> "Consumer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Commit (enable.auto.commit), wait for pending async commits (their callbacks run), revoke, leave."""
        if self._closed:
            return
        if self._group is not None:
            self._group.check_not_in_listener("close()")
            await self._group.close()  # commits, revokes, leaves while fetch state still exists
        self._closed = True
        tasks = [s.task for s in self.subscriptions.states.values() if s.task is not None]
        for state in self.subscriptions.states.values():
            self._stop(state)  # new generation too: a task that misses its cancellation still exits
        self._space_freed.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._fetchers is not None:
            await self._fetchers.close()
        await self.metadata.close()

    # ------------------------------------------------------------ assignment and positions
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replaces any previous assignment)."""
        if self._group is not None and self._group.subscribed:
            raise errors.InvalidRequestError(  # type: ignore[attr-defined]
                "Subscription to topics, partitions and pattern are mutually exclusive: unsubscribe() first")
        self.subscriptions.assign(partitions)

    def assignment(self) -> list[TopicPartition]:
        return list(self.subscriptions.order)

    def subscribe(self, topics: Sequence[str] | str | re.Pattern[str] | None = None, *,
                  pattern: str | re.Pattern[str] | None = None,
                  listener: Optional[ConsumerRebalanceListener] = None) -> None:
        """Join group.id reading these topics (or every topic matching pattern); the next poll() joins.

        A str or compiled regex as `topics` is taken as a pattern, as Kafka's subscribe(Pattern).
        """
        group = self._require_group("subscribe()")
        if isinstance(topics, (str, re.Pattern)) and pattern is None:
            topics, pattern = None, topics
        if (topics is None) == (pattern is None):
            raise errors.InvalidRequestError("subscribe() takes a list of topics or a pattern")  # type: ignore[attr-defined]
        if self.subscriptions.order and not group.subscribed:
            raise errors.InvalidRequestError(  # type: ignore[attr-defined]
                "Subscription to topics, partitions and pattern are mutually exclusive: assign([]) first")
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        names = [str(t) for t in topics or []] if not isinstance(topics, (str, re.Pattern)) else []
        if topics is not None and any(not t.strip() for t in names):
            raise errors.InvalidTopicExceptionError(  # type: ignore[attr-defined]
                "Topic collection to subscribe to cannot contain null or empty topic")
        group.subscribe(names, regex, listener)

    async def unsubscribe(self) -> None:
        """Revoke everything (committing first with enable.auto.commit) and leave the group."""
        if self._group is not None and self._group.subscribed:
            self._group.check_not_in_listener("unsubscribe()")
            await self._group.unsubscribe()

    def subscription(self) -> list[str]:
        return sorted(self._group.topics) if self._group is not None and self._group.subscribed else []

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member's group id, generation and member id now (Kafka's groupMetadata())."""
        group = self._require_group("group_metadata()")
        return ConsumerGroupMetadata(group.group_id, group.generation, group.member_id, group.instance_id or None)

    def _require_group(self, what: str) -> GroupMember:
        if self._group is None:
            raise errors.InvalidGroupIdError(  # type: ignore[attr-defined]
                f"To use the group management or offset commit APIs ({what}), you must provide a valid "
                "group.id in the consumer configuration.")
        return self._group

    # ------------------------------------------------------------ commits (seed 003: committed offsets)
    async def commit_sync(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit offsets (default: the positions of everything poll() returned); raises on failure.

        As Kafka's: sent after every earlier commit_async() completed (their callbacks ran first), so
        committed offsets follow call order."""
        group = self._require_group("commit_sync()")
        await group.commit(dict(offsets) if offsets is not None else self.subscriptions.consumed_positions())

    def commit_async(self, offsets: Mapping[TopicPartition, int] | None = None,
                     callback: Optional[CommitCallback] = None) -> "asyncio.Future[None]":
        """Commit in the background; callback(offsets, exception_or_None) runs when it completes.

        Commits are sent in call order and callbacks run in that order (Kafka's commitAsync); a later
        commit_sync()/close() completes after this one. The returned future is the commit's outcome."""
        group = self._require_group("commit_async()")
        snapshot = dict(offsets) if offsets is not None else self.subscriptions.consumed_positions()

        def done(exc: Optional[BaseException]) -> None:
            if callback is not None:
                try:
                    callback(snapshot, exc)
                except Exception:  # a user callback never kills the consumer
                    log.exception("commit callback failed")
            elif exc is not None:
                log.warning("async commit of %s failed: %s", snapshot, exc)
        return group.commit_in_order(snapshot, on_done=done)

    async def committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, Optional[int]]:
        """The group's committed offset of each partition (None where nothing is committed)."""
        return await self._require_group("committed()").committed(tps)

    def _start_added(self, tp: TopicPartition) -> None:
        """A partition just entered the assignment: learn its topic's metadata and start fetching."""
        self.metadata.add_topics(tp[0])
        self._start(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Next poll() returns records of tp from offset (fetching restarts there)."""
        state = self._state(tp)
        if offset < 0:
            raise errors.OffsetOutOfRangeError(f"cannot seek to negative offset {offset}")  # type: ignore[attr-defined]
        self._restart(tp, state, position=offset)

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        for tp in tps or self.subscriptions.order:
            self._restart(tp, self._state(tp), reset=EARLIEST)

    def seek_to_end(self, *tps: TopicPartition) -> None:
        for tp in tps or self.subscriptions.order:
            self._restart(tp, self._state(tp), reset=LATEST)

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record poll() returns (resolving a pending reset)."""
        state = self._state(tp)
        await self._ensure_position(tp, state)
        assert state.position is not None
        return state.position

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: await self.list_offset(tp, EARLIEST) for tp in tps}

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: await self.list_offset(tp, LATEST) for tp in tps}

    async def partitions_for(self, topic: str) -> list[int]:
        parts = await self.metadata.wait_for_topic(topic, self.request_timeout_ms)
        return [p.partition for p in parts]

    def highwater(self, tp: TopicPartition) -> int:
        """The high watermark seen by the last fetch of tp (-1 before the first)."""
        return self._state(tp).high_watermark

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[
            TopicPartition, Optional[OffsetAndTimestamp]]:
        """Earliest offset whose timestamp >= the given one, per partition (None when there is none)."""
        out: dict[TopicPartition, Optional[OffsetAndTimestamp]] = {}
        for tp, ts in timestamps.items():
            if ts < 0:
                raise errors.InvalidRequestError(f"negative timestamp {ts} for {tp}")  # type: ignore[attr-defined]
            offset, found_ts = await self._list_offsets(tp, ts)
            out[tp] = OffsetAndTimestamp(offset, found_ts) if offset >= 0 else None
        return out

    async def list_offset(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """ListOffsets on the leader: -2 earliest, -1 latest, else the first offset at or after the time."""
        return (await self._list_offsets(tp, timestamp_ms))[0]

    async def _list_offsets(self, tp: TopicPartition, timestamp_ms: int) -> tuple[int, int]:
        return await list_offset(self.metadata, tp, timestamp_ms, self.isolation, self.request_timeout_ms,
                                 self.backoff_s)

    # ------------------------------------------------------------ poll
    async def poll(self, timeout_ms: int = 0, max_records: Optional[int] = None) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to timeout_ms for the first ones.

        Raises the GregorError a partition's fetch hit (e.g. OFFSET_OUT_OF_RANGE
        with auto.offset.reset=none); that partition then waits for a seek().
        """
        limit = max_records or self.max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        if self._group is not None:
            self._group.check_not_in_listener("poll()")
        while True:
            if self._group is not None:
                # Liveness (max.poll.interval.ms), auto-commit, and any pending rebalance (up to the deadline).
                await self._group.on_poll(deadline)
            self._data_ready.clear()
            out = self._drain(limit)
            if out:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (not self.subscriptions.states and (self._group is None or not self._group.subscribed)):
                return out
            try:
                await wait_for(self._data_ready.wait(), remaining)
            except asyncio.TimeoutError:
                return []

    def _drain(self, limit: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        n = len(self.subscriptions.order)
        for i in range(n):
            tp = self.subscriptions.order[(self._rr + i) % n]
            state = self.subscriptions.states[tp]
            if state.error is not None and not state.buffer:
                err, state.error = state.error, None
                if out:  # return what we have; raise on the next poll
                    state.error = err
                    break
                raise err
            if not state.buffer:
                continue
            buffered = len(state.buffer)
            take = state.buffer[:limit - len(out)]
            del state.buffer[:len(take)]
            # The buffer's bytes are accounted per fetch: free them in proportion, exactly at empty.
            freed = state.buffered_bytes if len(take) == buffered else state.buffered_bytes * len(take) // buffered
            state.buffered_bytes -= freed
            self._buffered_total -= freed
            out.extend(take)
            state.position = take[-1].offset + 1
            if len(take) == buffered and state.fetch_offset is not None:
                # Every fetched record is returned: batches fetched after the last one (control batches,
                # aborted transactions) are behind the position too, as Kafka's nextFetchOffset.
                state.position = max(state.position, state.fetch_offset)
            if len(out) >= limit:
                break
        if n:
            self._rr = (self._rr + 1) % n
        if out:
            self._room()
        return out

    def _room(self) -> None:
        """Buffer space was freed or a partition left: fetching may resume."""
        self._space_freed.set()
        if self._fetchers is not None:
            self._fetchers.wake()

    # ------------------------------------------------------------ fetch tasks
    def _state(self, tp: TopicPartition) -> PartitionState:
        state = self.subscriptions.states.get((tp[0], tp[1]))
        if state is None:
            raise errors.InvalidRequestError(f"partition {tp[0]}-{tp[1]} is not assigned")  # type: ignore[attr-defined]
        return state

    def _start(self, tp: TopicPartition) -> None:
        state = self.subscriptions.states[tp]
        if self._fetchers is None:
            state.task = asyncio.ensure_future(self._fetch_loop(tp, state, state.generation))
        else:
            state.task = asyncio.ensure_future(self._session_partition(tp, state, state.generation))

    def _recover(self, tp: TopicPartition, state: PartitionState, gen: int, err: errors.GregorError) -> None:
        """tp's fetch in its leader's session failed: it is out of the session; handle the error (reset,
        metadata refresh, backoff) and bring it back once it has a position and a leader again."""
        state.task = asyncio.ensure_future(self._session_partition(tp, state, gen, err))

    async def _session_partition(self, tp: TopicPartition, state: PartitionState, gen: int,
                                 err: Optional[errors.GregorError] = None) -> None:
        """Until tp can be fetched: its topic id, its position and its leader; then to its leader's fetcher."""
        assert self._fetchers is not None
        try:
            if err is not None:
                await self._on_fetch_error(tp, state, err)
            while state.generation == gen and state.error is None:
                if state.topic_id is None:
                    await self._with_retry(state, gen, self._pin_topic_id(tp, state))
                    continue
                if state.position is None:
                    await self._with_retry(state, gen, self._ensure_position(tp, state))
                    continue
                try:
                    await self.metadata.leader_stub(tp[0], tp[1], self.request_timeout_ms)
                except errors.GregorError as exc:
                    if not exc.retriable:
                        raise
                    self.metadata.request_update(exc)
                    await asyncio.sleep(self.backoff_s)
                    continue
                if state.generation == gen and state.error is None:
                    self._fetchers.add(tp, state, gen)
                return
        except Exception as exc:  # anything but cancellation: park it for poll() instead of dying silently
            self._park(tp, state, gen, exc)

    def _park(self, tp: TopicPartition, state: PartitionState, gen: int, exc: BaseException) -> None:
        """A partition's fetch failed for good: poll() raises it (a GregorError as is, anything else wrapped)."""
        if state.generation != gen:
            return
        if isinstance(exc, errors.GregorError):
            state.error = exc
        else:
            log.error("%s-%s: fetch failed", *tp, exc_info=exc)
            wrapped = errors.GregorError(f"fetch of {tp[0]}-{tp[1]} failed: {type(exc).__name__}: {exc}",
                                         topic=tp[0], partition=tp[1])
            wrapped.__cause__ = exc
            state.error = wrapped
        self._data_ready.set()

    def _stop(self, state: PartitionState) -> None:
        state.generation += 1
        if state.task is not None:
            state.task.cancel()
            state.task = None
        if state.resetting is not None:  # its offset is the old generation's; position() waiters look again
            state.resetting.cancel()
            state.resetting = None
        self._buffered_total -= state.buffered_bytes
        state.buffer.clear()
        state.buffered_bytes = 0
        self._room()  # other partitions' fetches may be waiting for that room; its session forgets it

    def _restart(self, tp: TopicPartition, state: PartitionState, *, position: Optional[int] = None,
                 reset: Optional[int] = None) -> None:
        self._stop(state)
        state.error = None
        state.topic_id = None  # a seek starts over: the position is taken on the topic as it is now
        state.position = state.fetch_offset = position
        state.reset = reset
        self._start(tp)

    async def _ensure_position(self, tp: TopicPartition, state: PartitionState) -> None:
        """Until tp has a position: start the partition's one pending reset, or wait for the one in flight.

        Kafka's SubscriptionState: a partition awaiting reset is reset once, and position() waits for
        (or performs) that same reset. Two independent resets (the fetch task's and position()'s) would
        race: the later one rewinds a fetch that already advanced, and poll() returns records twice.
        A reset never overwrites a position: its result applies only if the partition still has none
        in the generation that asked (a seek in between wins)."""
        while state.position is None:
            if self.subscriptions.states.get((tp[0], tp[1])) is not state:
                raise errors.InvalidRequestError(  # type: ignore[attr-defined]
                    f"partition {tp[0]}-{tp[1]} is no longer assigned")
            task = state.resetting
            if task is None or task.done():
                task = state.resetting = asyncio.ensure_future(self._initial_position(tp, state, state.generation))
                task.add_done_callback(functools.partial(self._reset_done, state))
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if not task.cancelled() or (me is not None and me.cancelling()):
                    raise  # we are cancelled ourselves
                # The reset was cancelled by a seek or revocation: look at the partition again.

    @staticmethod
    def _reset_done(state: PartitionState, task: "asyncio.Task[None]") -> None:
        if state.resetting is task:
            state.resetting = None  # a failed reset is retried by the next caller
        if not task.cancelled():
            task.exception()  # its waiters raise it; never "exception was never retrieved"

    async def _initial_position(self, tp: TopicPartition, state: PartitionState, gen: int) -> None:
        """A partition without a position: the group's committed offset (Kafka does this for assign() too,
        when group.id is set), else auto.offset.reset / the pending seek_to_*. Only through _ensure_position."""
        if self._group is not None and state.reset is None and not state.committed_checked:
            committed = (await self._group.committed([tp])).get(tp)
            if state.generation != gen or state.position is not None:
                return  # a seek or revocation came in between
            state.committed_checked = True
            if committed is not None:
                state.position = state.fetch_offset = committed
                return
        strategy = state.reset
        if strategy is None:
            policy = self.config["auto.offset.reset"]
            if policy == "none":
                raise errors.OffsetOutOfRangeError(  # type: ignore[attr-defined]
                    f"no position for {tp[0]}-{tp[1]} and auto.offset.reset=none", topic=tp[0], partition=tp[1])
            strategy = EARLIEST if policy == "earliest" else LATEST
        offset = await self.list_offset(tp, strategy)
        if state.generation == gen and state.position is None:
            state.position = state.fetch_offset = offset
            state.reset = None

    async def _fetch_loop(self, tp: TopicPartition, state: PartitionState, gen: int) -> None:
        fetcher = make_fetcher(self.config["fetch.transport"], self.metadata, self.config)
        try:
            while state.generation == gen:
                if state.topic_id is None:
                    # Pin the topic id before the position is taken (KIP-516): every fetch carries it,
                    # so a topic deleted and re-created under the name is refused, not read at our offsets.
                    await self._with_retry(state, gen, self._pin_topic_id(tp, state))
                    continue
                if state.position is None:
                    await self._with_retry(state, gen, self._ensure_position(tp, state))
                    continue
                while state.buffered_bytes >= self.partition_bytes or self._buffered_total >= self.fetch_max_bytes:
                    self._space_freed.clear()
                    await self._space_freed.wait()
                assert state.fetch_offset is not None
                try:
                    result = await fetcher.fetch(tp, state.fetch_offset, self.isolation, state.topic_id or b"")
                except errors.GregorError as err:
                    if state.generation != gen:
                        return
                    await self._on_fetch_error(tp, state, err)
                    if state.error is not None:
                        return
                    continue
                if state.generation != gen:
                    return
                self._on_fetch_result(tp, state, result)
        except Exception as exc:  # anything but cancellation: park it for poll() instead of dying silently
            self._park(tp, state, gen, exc)
        finally:
            await fetcher.close()

    async def _with_retry(self, state: PartitionState, gen: int, coro: Any) -> None:
        try:
            await coro
        except errors.GregorError as err:
            if not err.retriable:
                raise
            self.metadata.request_update(err)
            await asyncio.sleep(self.backoff_s)

    async def _pin_topic_id(self, tp: TopicPartition, state: PartitionState) -> None:
        await self.metadata.wait_for_topic(tp[0], int(self.config["request.timeout.ms"]), tp[1])
        state.topic_id = self.metadata.topic_id(tp[0])

    async def _on_fetch_error(self, tp: TopicPartition, state: PartitionState, err: errors.GregorError) -> None:
        if err.code == errors.Code.UNKNOWN_TOPIC_ID:
            # The leader's topic under this name is not the one our position belongs to. If the
            # cluster's metadata agrees, the topic was deleted and re-created: the offsets are not
            # this topic's, so raise (a seek starts over on the new topic). Else the leader is
            # behind the controller: retry.
            try:
                await self.metadata.refresh([tp[0]])
            except errors.GregorError:
                await asyncio.sleep(self.backoff_s)
                return
            current = self.metadata.topic_id(tp[0])
            if current and state.topic_id and current != state.topic_id:
                state.error = errors.error_for(
                    errors.Code.UNKNOWN_TOPIC_ID,
                    f"topic {tp[0]} was deleted and re-created (topic id {uuid.to_string(state.topic_id)} is now "
                    f"{uuid.to_string(current)}): position {state.fetch_offset} of {tp[0]}-{tp[1]} belongs to the "
                    "deleted topic; seek to start over on the new one", topic=tp[0], partition=tp[1])
                self._data_ready.set()
                return
            await asyncio.sleep(self.backoff_s)
            return
        if err.code == errors.Code.OFFSET_OUT_OF_RANGE:
            if self.config["auto.offset.reset"] == "none":
                state.error = err
                self._data_ready.set()
            else:
                log.info("%s-%s: offset %s out of range, resetting (%s)", *tp, state.fetch_offset,
                         self.config["auto.offset.reset"])
                # Records already buffered stay valid; fetching restarts from the reset point.
                state.position = None if not state.buffer else state.position
                state.fetch_offset = None
                if not state.buffer:
                    state.committed_checked = True  # out of range resets by policy, not to the committed offset
                    await self._ensure_position(tp, state)
                else:
                    state.fetch_offset = await self.list_offset(
                        tp, EARLIEST if self.config["auto.offset.reset"] == "earliest" else LATEST)
            return
        if err.retriable:
            self.metadata.request_update(err)
            await asyncio.sleep(self.backoff_s)
            return
        state.error = err
        self._data_ready.set()

    def _on_fetch_result(self, tp: TopicPartition, state: PartitionState, result: FetchResult) -> None:
        state.high_watermark = result.high_watermark
        state.log_start_offset = result.log_start_offset
        known = self.metadata.partition(*tp)
        if known is not None and result.leader_epoch > known.leader_epoch:
            self.metadata.request_update()  # a new leader epoch: our view is old
        if not result.records:
            return
        assert state.fetch_offset is not None
        headers = batch_headers(result.records, self.check_crcs)
        start = state.fetch_offset
        if result.aborted_transactions:
            recs = [_new_tuple(ConsumerRecord, row) for row in committed_rows(
                result.records, headers, result.aborted_transactions, min_offset=start, prefix=tp)]
        else:
            recs = _consumer_records(tp[0], tp[1], result.records, headers, start)
        state.fetch_offset = max(start, headers[-1].base_offset + headers[-1].last_offset_delta + 1)
        if recs:
            # Flow control counts fetched bytes (records plus their framing), not per-record sizes.
            size = len(result.records)
            state.buffer.extend(recs)
            state.buffered_bytes += size
            self._buffered_total += size
            self._data_ready.set()
        elif state.position is not None and not state.buffer:
            state.position = state.fetch_offset  # only control batches / skipped records


class _FetchHooks:
    """The consumer as its BrokerFetchers see it (session_fetcher.FetchOwner), without widening its public API."""

    def __init__(self, c: Consumer) -> None:
        self._c = c
        self.config, self.metadata, self.subscriptions = c.config, c.metadata, c.subscriptions
        self.partition_bytes, self.fetch_max_bytes, self.isolation = c.partition_bytes, c.fetch_max_bytes, c.isolation

    @property
    def closed(self) -> bool:
        return self._c._closed

    def buffers_full(self) -> bool:
        return self._c._buffered_total >= self._c.fetch_max_bytes

    def on_fetch_result(self, tp: TopicPartition, state: PartitionState, result: FetchResult) -> None:
        self._c._on_fetch_result(tp, state, result)

    def recover(self, tp: TopicPartition, state: PartitionState, gen: int, err: errors.GregorError) -> None:
        self._c._recover(tp, state, gen, err)

    def park(self, tp: TopicPartition, state: PartitionState, gen: int, exc: BaseException) -> None:
        self._c._park(tp, state, gen, exc)

    def fetch_alone(self, tp: TopicPartition, state: PartitionState, gen: int) -> None:
        state.task = asyncio.ensure_future(self._c._fetch_loop(tp, state, gen))


_new_tuple = tuple.__new__


def _consumer_records(topic: str, partition: int, data: bytes, headers: list[Any],
                      min_offset: int) -> list[ConsumerRecord]:
    """ConsumerRecords of whole fetched batches at or above min_offset, control batches skipped.

    Decoding is records.fetched_rows (one native pass per batch, rows already carrying topic
    and partition); this only makes each row a ConsumerRecord.
    """
    cls = ConsumerRecord
    return [_new_tuple(cls, row) for row in fetched_rows(data, headers, min_offset=min_offset,
                                                         prefix=(topic, partition))]


class SyncConsumer:
    """Blocking facade over Consumer: the loop thread owns the Consumer; rebalance listeners and commit
    callbacks run on the calling thread, inside poll()/close()/unsubscribe() (callbacks also inside
    commit_sync()/commit_async()), as Kafka's, so a listener may call commit_sync/position/seek/committed.

    Each call blocks on its own queue (LoopThread.run): the loop posts either the call's outcome or
    work for this thread (a listener call, a commit callback), whose result goes back to the waiting
    task on the loop. The Consumer is not thread-safe, as Kafka's: one thread at a time.
    """

    _POLL = (LISTENER, CALLBACK)
    _COMMIT = (CALLBACK,)

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._loop = LoopThread("gregor-consumer")
        self._listener_depth = 0  # caller-thread owned: > 0 while a rebalance listener runs here
        try:
            self._consumer: Consumer = self._loop.run(self._make(config, kwargs))
        except BaseException:
            self._loop.stop()
            raise

    @staticmethod
    async def _make(config: Mapping[str, Any] | None, kwargs: dict[str, Any]) -> Consumer:
        return Consumer(config, **kwargs)

    def _call(self, fn: Any, *args: Any) -> Any:
        async def run() -> Any:
            return fn(*args)
        return self._loop.run(run())

    def _not_in_listener(self, what: str) -> None:
        if self._listener_depth:
            raise errors.error_for(errors.Code.INVALID_REQUEST, f"{what} may not be called from a rebalance listener")

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._call(self._consumer.assign, list(partitions))

    def assignment(self) -> list[TopicPartition]:
        return self._call(self._consumer.assignment)  # type: ignore[no-any-return]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._call(self._consumer.seek, tp, offset)

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self._call(self._consumer.seek_to_beginning, *tps)

    def seek_to_end(self, *tps: TopicPartition) -> None:
        self._call(self._consumer.seek_to_end, *tps)

    def position(self, tp: TopicPartition) -> int:
        return self._loop.run(self._consumer.position(tp))

    def subscribe(self, topics: Sequence[str] | str | re.Pattern[str] | None = None, *,
                  pattern: str | re.Pattern[str] | None = None,
                  listener: Optional[ConsumerRebalanceListener] = None) -> None:
        wrapped = _CallerThreadListener(self, listener) if listener is not None else None

        async def run() -> None:
            self._consumer.subscribe(topics, pattern=pattern, listener=wrapped)
        self._loop.run(run())

    def unsubscribe(self) -> None:
        self._not_in_listener("unsubscribe()")
        self._loop.run(self._consumer.unsubscribe(), accept=self._POLL)

    def subscription(self) -> list[str]:
        return self._call(self._consumer.subscription)  # type: ignore[no-any-return]

    def group_metadata(self) -> ConsumerGroupMetadata:
        return self._call(self._consumer.group_metadata)  # type: ignore[no-any-return]

    def commit_sync(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Returns after every earlier commit_async() completed and its callback ran (on this thread)."""
        self._loop.run(self._consumer.commit_sync(offsets), accept=self._COMMIT)

    def commit_async(self, offsets: Mapping[TopicPartition, int] | None = None,
                     callback: Optional[CommitCallback] = None) -> None:
        """The callback runs on the consumer's thread, in call order, from within a later poll(),
        commit_sync(), commit_async() or close() (as Kafka's)."""
        post = self._loop.post_to_caller

        def on_done(offsets: Mapping[TopicPartition, int], exc: Optional[BaseException]) -> None:
            if callback is not None:
                post(CALLBACK, self._run_callback, callback, offsets, exc)
            elif exc is not None:
                log.warning("async commit of %s failed: %s", dict(offsets), exc)

        async def run() -> None:
            self._consumer.commit_async(offsets, on_done)
        self._loop.run(run(), accept=self._COMMIT)

    @staticmethod
    def _run_callback(callback: CommitCallback, offsets: Mapping[TopicPartition, int],
                      exc: Optional[BaseException]) -> None:
        try:
            callback(offsets, exc)
        except Exception:  # a user callback never breaks the call it runs inside
            log.exception("commit callback failed")

    def committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, Optional[int]]:
        return self._loop.run(self._consumer.committed(list(tps)))

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[
            TopicPartition, Optional[OffsetAndTimestamp]]:
        return self._loop.run(self._consumer.offsets_for_times(dict(timestamps)))

    def poll(self, timeout_ms: int = 0, max_records: Optional[int] = None) -> list[ConsumerRecord]:
        self._not_in_listener("poll()")
        return self._loop.run(self._consumer.poll(timeout_ms, max_records), accept=self._POLL)

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._loop.run(self._consumer.end_offsets(list(tps)))

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._loop.run(self._consumer.beginning_offsets(list(tps)))

    def close(self) -> None:
        self._not_in_listener("close()")
        try:
            self._loop.run(self._consumer.close(), accept=self._POLL)
        finally:
            self._loop.stop()

    def __enter__(self) -> "SyncConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _CallerThreadListener(ConsumerRebalanceListener):
    """Loop side of a SyncConsumer's listener: each call runs on the caller's thread (LoopThread.call_on_caller)."""

    def __init__(self, facade: SyncConsumer, user: ConsumerRebalanceListener) -> None:
        self.facade, self.user = facade, user

    def _on_caller(self, fn: Callable[[list[TopicPartition]], Any], partitions: list[TopicPartition]) -> Any:
        facade = self.facade

        def call() -> Any:
            facade._listener_depth += 1
            try:
                return fn(partitions)
            finally:
                facade._listener_depth -= 1
        return call

    async def _dispatch(self, name: str, partitions: list[TopicPartition]) -> None:
        fn = getattr(self.user, name, None)
        if fn is None and name == "on_partitions_lost":
            fn = getattr(self.user, "on_partitions_revoked", None)  # Kafka's default for onPartitionsLost
        if fn is None:
            return
        result = await self.facade._loop.call_on_caller(LISTENER, self._on_caller(fn, partitions))
        if inspect.isawaitable(result):  # a coroutine listener still runs on the loop
            await result

    async def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        await self._dispatch("on_partitions_revoked", partitions)

    async def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        await self._dispatch("on_partitions_assigned", partitions)

    async def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        await self._dispatch("on_partitions_lost", partitions)


__all__ = ["Consumer", "SyncConsumer", "ConsumerRecord", "ConsumerGroupMetadata", "ConsumerRebalanceListener", "GrpcFetcher",
           "OffsetAndTimestamp"]
