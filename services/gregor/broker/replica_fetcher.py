"""Replica fetchers: a follower copies its leaders' logs (seeds 002, 004).

One asyncio task per leader broker (Kafka's ReplicaFetcherThread per source
broker) fetches every partition this broker follows from that leader in one
multi-partition long poll (ReplicaFetch, answered by the leader's
replica_fetch_server module), re-issued as soon as it is answered. The polls go
over the leader's data port (a framed TCP connection, data_port.py) when it has
one and replica.fetch.transport is `data` (the default), else over a gRPC
ReplicaFetch stream; either connection is the fetch session. Before a
partition's first fetch under a leader epoch it truncates by leader epoch:
OffsetForLeaderEpoch for our latest epoch, truncate to min(answer, own LEO),
falling back to the high watermark when the epoch is undefined. Fetched batches
are appended with their offsets and epochs; the follower HW is
min(leader HW, own LEO).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Any, Callable, Union

import grpc
from prometheus_client import Gauge

from gregor.common import errors
from gregor.broker.fetcher_state import BACKOFF_CODES, FollowerFetchState, PartitionFetchState
from gregor.broker.limits import (
    REPLICA_FETCH_MAX_BYTES,
    REPLICA_FETCH_WAIT_MAX_MS,
    REPLICA_FETCH_MIN_BYTES,
    REPLICA_FETCH_BACKOFF_S,
    FETCH_RPC_TIMEOUT_S,
    REPLICA_FETCH_INTERRUPT_MAX_PARTITIONS,
    REPLICA_FRAME,
)
from gregor.common.aio import wait_for
from gregor.common.rpc import channel
from gregor.common.tls import client_ssl
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

FETCHER_LAG = Gauge("gregor_broker_replica_fetcher_max_lag",
                    "Largest (leader HW - follower LEO) over the partitions fetched from a leader", ["leader"])

class _Cuttable:
    """A follower's fetch session whose read in progress a wake-up (a partition added while the poll is out)
    or the timeout cuts short by resetting the session (reset: the transport's own way)."""

    def __init__(self) -> None:
        self._wake: asyncio.Event | None = None  # the wake-up event of the read in progress
        self._cut_by: str | None = None  # why the read in progress was cut short: "wake" or "timeout"

    @property
    def fresh(self) -> bool:
        """The next request starts a new session (a full request)."""
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def woken(self) -> None:
        """The fetcher's wake event was set: cut the read in progress short (if it waits on that event)."""
        if self._wake is not None and self._wake.is_set():
            self._cut("wake")

    def _cut(self, why: str) -> None:
        if self._cut_by is None and not self.fresh:
            self._cut_by = why
            self.reset()


class _FetchStream(_Cuttable):
    """The ReplicaFetch stream to one leader: each request written is answered by one response.

    The response is awaited directly (no task per read, no waker task and asyncio.wait per fetch: at
    ~200 fetches a second those were two tasks, a waiter and an extra loop pass each, between a
    follower's append and its next fetch, issue 24); a wake-up or the timeout cuts the read short by
    cancelling the call (cut), which the read sees as CancelledError.
    """

    def __init__(self, stub: broker_pb2_grpc.BrokerServiceStub) -> None:
        super().__init__()
        self.stub = stub
        self.call: Any = None

    @property
    def fresh(self) -> bool:
        """No stream, or the leader ended it."""
        return self.call is None or self.call.done()

    def reset(self) -> None:
        if self.call is not None:
            self.call.cancel()
            self.call = None

    async def exchange(self, request: broker_pb2.ReplicaFetchRequest,
                       wake: asyncio.Event | None) -> "broker_pb2.ReplicaFetchResponse | None":
        """The response to request; None if wake fired first (the stream is then reset; wake None: the poll
        is never cut short). Raises AioRpcError for a failed stream, REQUEST_TIMED_OUT after FETCH_RPC_TIMEOUT_S."""
        if self.call is None or self.call.done():  # first use, or the leader ended the last stream
            self.call = self.stub.ReplicaFetch()
        call = self.call
        try:
            await call.write(request)
        except asyncio.InvalidStateError:  # it ended between the check and the write
            self.reset()
            raise errors.error_for(errors.Code.NETWORK_EXCEPTION, "the replica fetch stream ended") from None
        if wake is not None and wake.is_set():  # set while the request was built or written
            self.reset()
            return None
        self._wake, self._cut_by = wake, None
        timer = asyncio.get_running_loop().call_later(FETCH_RPC_TIMEOUT_S, self._cut, "timeout")
        try:
            resp = await call.read()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._cut_by is None or (task is not None and task.cancelling()):
                raise  # the fetcher itself is cancelled
            resp = None
        finally:
            timer.cancel()
            self._wake = None
        if resp is None:
            if self._cut_by == "wake":
                return None
            raise errors.error_for(errors.Code.REQUEST_TIMED_OUT,
                                   f"no replica fetch response within {FETCH_RPC_TIMEOUT_S} s")
        if resp is grpc.aio.EOF:
            self.call = None
            raise errors.error_for(errors.Code.NETWORK_EXCEPTION, "the leader closed the replica fetch stream")
        return resp  # type: ignore[no-any-return]


_FRAME = struct.Struct(">I")
_RESPONSE_MAX_BYTES = 1 << 31  # a length past this is not a frame the leader wrote: the connection is lost


class _DataPortStream(_Cuttable):
    """The fetch session on the leader's data port: each request frame written is answered by one response
    frame (data_port.py). The same contract as _FetchStream: a wake-up or the timeout cuts the read short,
    here by aborting the connection (the leader's session ends with it; the next request is a full one on a
    new connection)."""

    def __init__(self, address: str) -> None:
        super().__init__()
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    @property
    def fresh(self) -> bool:
        return self.conn is None

    def reset(self) -> None:
        if self.conn is not None:
            self.conn[1].transport.abort()  # the read in progress, if any, sees the connection lost
            self.conn = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.conn is None:
            ssl_context = client_ssl()  # TLS as the gRPC channels (security.protocol=SSL)
            try:
                self.conn = await wait_for(asyncio.open_connection(
                    self.host, self.port, ssl=ssl_context, server_hostname=self.host if ssl_context else None),
                    FETCH_RPC_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                raise errors.error_for(errors.Code.NETWORK_EXCEPTION,
                                       f"data port {self.host}:{self.port}: {exc}") from None
        return self.conn

    async def exchange(self, request: broker_pb2.ReplicaFetchRequest,
                       wake: asyncio.Event | None) -> "broker_pb2.ReplicaFetchResponse | None":
        """As _FetchStream.exchange; a request the leader refused as a whole raises its error (the leader has
        closed the connection), a lost connection NETWORK_EXCEPTION."""
        reader, writer = await self._connect()
        body = request.SerializeToString()
        writer.write(_FRAME.pack(len(body) | REPLICA_FRAME) + body)
        if wake is not None and wake.is_set():
            self.reset()
            return None
        self._wake, self._cut_by = wake, None
        timer = asyncio.get_running_loop().call_later(FETCH_RPC_TIMEOUT_S, self._cut, "timeout")
        try:
            (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
            if size >= _RESPONSE_MAX_BYTES:
                raise ConnectionResetError(f"a response frame of {size} bytes")
            data = await reader.readexactly(size)
        except (asyncio.IncompleteReadError, OSError) as exc:
            self.reset()
            if self._cut_by == "wake":
                return None
            if self._cut_by == "timeout":
                raise errors.error_for(errors.Code.REQUEST_TIMED_OUT,
                                       f"no replica fetch response within {FETCH_RPC_TIMEOUT_S} s") from None
            raise errors.error_for(errors.Code.NETWORK_EXCEPTION,
                                   f"the leader's data port {self.host}:{self.port} closed the connection: "
                                   f"{exc!r}") from None
        finally:
            timer.cancel()
            self._wake = None
        resp = broker_pb2.ReplicaFetchResponse.FromString(data)
        if resp.HasField("error"):
            self.reset()
            raise errors.from_detail(resp.error)
        return resp


class ReplicaFetcher:
    """Fetches the partitions led by one leader. Concurrency: one task; partitions change only on the loop.

    The decisions (which partitions to name, incremental or full, backoff, truncation rounds) are the
    IO-free FollowerFetchState's (fetcher_state.py, driven by tests/sim too); this class does the IO.
    """

    def __init__(self, manager: "ReplicaFetcherManager", leader_id: int) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.state: FollowerFetchState[tuple[str, int]] = FollowerFetchState.for_lag_time(
            manager.replicas.config.replica_lag_time_max_ms)
        self._wake = asyncio.Event()
        self._stream: Union[_FetchStream, _DataPortStream, None] = None  # the session of the fetch in progress
        self._lag_gauge = FETCHER_LAG.labels(leader=str(leader_id))  # labels() per fetch costs ~2 µs
        self.task = asyncio.create_task(self._run(), name=f"replica-fetcher-{leader_id}")
        self.task.add_done_callback(self._on_done)

    @property
    def partitions(self) -> dict[tuple[str, int], PartitionFetchState]:
        return self.state.partitions

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("replica fetcher for leader %d died", self.leader_id, exc_info=task.exception())

    def add(self, key: tuple[str, int], leader_epoch: int) -> None:
        self.state.add(key, leader_epoch)
        self._wake.set()
        if self._stream is not None:
            self._stream.woken()

    async def _run(self) -> None:
        rm = self.manager.replicas
        while True:
            if not self.partitions:
                self._wake.clear()
                await self._wake.wait()
                continue
            target = self.manager.targets(self.leader_id)
            if target[0] is None:
                await asyncio.sleep(REPLICA_FETCH_BACKOFF_S)
                continue
            async with channel(target[0]) as ch:  # truncation's RPCs, and the fetches without a data port
                await self._fetch_from(rm, broker_pb2_grpc.BrokerServiceStub(ch), target)

    async def _fetch_from(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub,
                          target: tuple[str | None, str | None]) -> None:
        """One multi-partition ReplicaFetch in flight (Kafka's fetcher thread shape).

        The leader answers as soon as any partition has data (min_bytes=1 over all of them), so a
        quiet partition never paces a busy one, and an idle follower costs one request per
        replica.fetch.wait.max.ms per leader instead of one per partition. The fetches are messages
        of one stream (no call setup per fetch: the largest cost of the acks=all path in the py-spy
        profile). A partition added while a poll is out (a leadership move) resets the stream, so it
        is fetched at once, unless the session is larger than REPLICA_FETCH_INTERRUPT_MAX_PARTITIONS (then
        it is named in the next, incremental, request).
        """
        loop = asyncio.get_running_loop()
        stream = self._stream = _DataPortStream(target[1]) if target[1] is not None else _FetchStream(stub)
        try:
            await self._fetch_loop(rm, stub, target, stream, loop)
        finally:
            self._stream = None
            stream.reset()

    async def _fetch_loop(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub,
                          target: tuple[str | None, str | None], stream: "_FetchStream | _DataPortStream",
                          loop: asyncio.AbstractEventLoop) -> None:
        state = self.state
        # The steady case (issue 24): the last walk found every partition ready (none backing off or truncating)
        # and nothing was added, dropped or forgotten since (state.version), so only the partitions whose answers
        # were applied (`applied`) can have a new fetch offset or log start: the next request is built from those,
        # in O(moved), instead of walking every partition of this leader (~50 in bench_vs_kafka's fixed-rate cell,
        # ~200 fetches a second) twice. steady maps key -> [key, state, partition, fetch offset].
        steady: dict[tuple[str, int], list[Any]] | None = None
        steady_version = -1
        applied: list[tuple[str, int]] = []
        batch: list[Any] = []
        while self.partitions and self.manager.targets(self.leader_id) == target:
            self._wake.clear()
            listed_items: list[Any] | None = None
            if steady is not None and state.version == steady_version and not stream.fresh:
                moved = []
                for key in applied:
                    item = steady.get(key)
                    if item is not None and (p := self._current(rm, key, item[1])) is not None:
                        item[3] = p.log_end_offset
                        moved.append(item)
                if state.version == steady_version:  # _current dropped none
                    indexes = state.moved_request(
                        [(key, st, offset, p.log.log_start_offset) for key, st, p, offset in moved], loop.time())
                    if indexes is not None:
                        listed_items, incremental = [moved[i] for i in indexes], True
            if listed_items is None:
                batch = await self._ready_partitions(rm, stub, loop)
                if not batch:
                    steady = None
                    try:
                        await wait_for(self._wake.wait(), timeout=state.wait_time(loop.time()))
                    except asyncio.TimeoutError:
                        pass
                    continue
                listed, incremental = state.session_request(
                    [(key, st, offset) for key, st, _p, offset in batch],
                    stream.fresh, loop.time(),
                    [p.log.log_start_offset for _key, _st, p, _offset in batch])
                listed_items = [batch[i] for i in listed]
                # Steady from now on only if the walk covered every partition (none backing off or truncating).
                steady = {item[0]: list(item) for item in batch} if len(batch) == len(self.partitions) else None
                steady_version = state.version
            applied = []
            request = broker_pb2.ReplicaFetchRequest(
                replica_id=rm.config.broker_id, replica_broker_epoch=self.manager.broker_epoch(),
                min_bytes=REPLICA_FETCH_MIN_BYTES, max_wait_ms=REPLICA_FETCH_WAIT_MAX_MS, incremental=incremental,
                partitions=[broker_pb2.ReplicaFetchPartition(
                    topic=p.topic, partition=p.partition, fetch_offset=offset, current_leader_epoch=st.leader_epoch,
                    max_bytes=REPLICA_FETCH_MAX_BYTES, log_start_offset=p.log.log_start_offset, topic_id=p.topic_id)
                    for _key, st, p, offset in listed_items])
            every = steady.values() if steady is not None else batch
            interruptible = len(self.partitions) <= REPLICA_FETCH_INTERRUPT_MAX_PARTITIONS
            try:
                resp = await stream.exchange(request, self._wake if interruptible else None)
            except grpc.aio.AioRpcError as exc:
                stream.reset()
                for key, st, _p, _offset in list(every):
                    self._on_error(rm, key, st, errors.from_rpc_error(exc), loop)
                continue
            except errors.GregorError as err:
                for key, st, _p, _offset in list(every):
                    self._on_error(rm, key, st, err, loop)
                continue
            if resp is None:
                continue  # new partitions while the poll was out: ask again with them
            if resp.partitions:
                by_key: dict[tuple[str, int], Any] = steady if steady is not None else {item[0]: item for item in batch}
                lag = 0
                for part in resp.partitions:
                    key = (part.topic, part.partition)
                    item = by_key.get(key)
                    if item is not None:
                        lag = max(lag, self._apply(rm, item[0], item[1], item[3], part, loop))
                        applied.append(key)
                self._lag_gauge.set(lag)

    async def _ready_partitions(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub,
                                loop: asyncio.AbstractEventLoop) -> list[tuple[tuple[str, int], PartitionFetchState,
                                                                              "Partition", int]]:
        """(key, state, partition, fetch offset) of every partition to fetch now: not backing off,
        still followed from this leader, truncated first where needed (concurrently)."""
        todo = self.state.ready(loop.time())
        batch, truncating = [], []
        health = rm.log_manager.health
        for key, st in todo:  # one pass when nothing truncates: this runs once per fetch
            if (p := self._current(rm, key, st)) is not None:
                if health.offline and health.is_offline(p.log.dir):
                    # Its log dir is offline (full): fetch nothing for it, check again after the backoff. The
                    # leader drops it from the ISR after replica.lag.time.max.ms, as Kafka's offline replica.
                    self.state.on_apply_failed(key, st, loop.time())
                    p.restart_truncation()
                    continue
                if p.is_truncating:
                    truncating.append((key, st, p))
                else:
                    batch.append((key, st, p, p.log_end_offset))
        if not truncating:
            return batch
        await asyncio.gather(*(self._truncate_guarded(rm, stub, key, st, p, loop) for key, st, p in truncating))
        batch = []  # the partitions may have changed while truncation was out
        for key, st in todo:
            p = self._current(rm, key, st)
            if p is not None and not p.is_truncating and st.backoff_until <= loop.time():
                batch.append((key, st, p, p.log_end_offset))
        return batch

    async def _truncate_guarded(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub,
                                key: tuple[str, int], st: PartitionFetchState, p: "Partition",
                                loop: asyncio.AbstractEventLoop) -> None:
        try:
            await self._truncate(rm, stub, p, st)
        except Exception as exc:
            # The ReplicationState may already say FETCHING while the log cut it asked for failed (or the
            # ListOffsets after it did): truncate again before any fetch from the untruncated LEO.
            if (cur := self._current(rm, key, st)) is not None:
                cur.restart_truncation()
            if isinstance(exc, grpc.aio.AioRpcError):
                self._on_error(rm, key, st, errors.from_rpc_error(exc), loop)
                return
            log.warning("%s-%d: truncation against leader %d failed: %s", key[0], key[1], self.leader_id, exc)
            self.state.on_truncation_failed(st, loop.time())

    def _apply(self, rm: "ReplicaManager", key: tuple[str, int], st: PartitionFetchState, fetch_offset: int,
               part: broker_pb2.ReplicaFetchPartitionResponse, loop: asyncio.AbstractEventLoop) -> int:
        """One partition's answer: append its records and move the follower HW; returns its lag."""
        if part.HasField("error"):
            self._on_error(rm, key, st, errors.from_detail(part.error), loop)
            return 0
        p = self._current(rm, key, st)
        if p is None or p.log_end_offset != fetch_offset:
            return 0
        try:
            # Also applies the batches to the producer state; the follower HW is the ReplicationState's.
            rm.run_effects(p, p.append_fetched(part.records, part.high_watermark))
            if part.log_start_offset > p.log.log_start_offset:
                # The leader's log start moved (DeleteRecords, retention): Kafka's follower follows it.
                p.log.maybe_increment_log_start_offset(min(part.log_start_offset, p.log.log_end_offset))
        except Exception as exc:  # a bad batch or a storage error: back off, truncate and retry
            if isinstance(exc, errors.GregorError) and exc.code == errors.Code.KAFKA_STORAGE_ERROR:
                # The log dir went offline: LogDirHealth logged it once for the whole dir.
                log.debug("%s-%d: replication from leader %d failed: %s", key[0], key[1], self.leader_id, exc)
            else:
                log.warning("%s-%d: replication from leader %d failed: %s", key[0], key[1], self.leader_id, exc)
            self.state.on_apply_failed(key, st, loop.time())
            p.restart_truncation()
            return 0
        return max(0, part.high_watermark - p.log_end_offset)

    def _on_error(self, rm: "ReplicaManager", key: tuple[str, int], st: PartitionFetchState,
                  err: errors.GregorError,
                  loop: asyncio.AbstractEventLoop) -> None:
        outcome = self.state.on_error(key, st, err.code, loop.time())
        if outcome.restart_truncation:
            log.info("%s-%d: out of range at the leader; truncating again", key[0], key[1])
            p = self._current(rm, key, st)
            if p is not None:
                p.restart_truncation()
        elif outcome.unexpected:
            log.warning("%s-%d: fetch from leader %d failed: %s", key[0], key[1], self.leader_id, err)

    def _current(self, rm: "ReplicaManager", key: tuple[str, int], st: PartitionFetchState) -> "Partition | None":
        """The partition if we still follow this leader at this epoch, else None (and drop it)."""
        p = rm.partitions.get(key)
        follows = p is not None and p.follows(self.leader_id, st.leader_epoch)
        return p if self.state.keep(key, st, follows) else None

    async def _truncate(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub, p: "Partition",
                        st: PartitionFetchState) -> None:
        """Ask OffsetForLeaderEpoch until the ReplicationState's truncation converges (seed 002)."""
        while True:
            latest = p.truncation_query()
            if latest is None:
                break  # no epochs at all: truncated to the HW
            resp = await stub.OffsetForLeaderEpoch(broker_pb2.OffsetForLeaderEpochRequest(
                topic=p.topic, partition=p.partition, leader_epoch=latest, current_leader_epoch=st.leader_epoch,
                replica_id=rm.config.broker_id), timeout=FETCH_RPC_TIMEOUT_S)
            if self._current(rm, p.key, st) is None:
                return
            completed = p.on_truncation_point(latest, resp.leader_epoch, resp.end_offset)
            if self.state.truncation_round_done(st, completed, latest, p.log.latest_epoch()):
                break
        if st.out_of_range and not await self._reset_out_of_range(rm, stub, p, st):
            return
        p.finish_truncation()
        self.state.truncation_finished(st)

    async def _reset_out_of_range(self, rm: "ReplicaManager", stub: broker_pb2_grpc.BrokerServiceStub,
                                  p: "Partition", st: PartitionFetchState) -> bool:
        """OFFSET_OUT_OF_RANGE after epoch truncation: behind the leader's log start, or past its end.
        False if a LeaderAndIsr took the partition away (or restarted it) while ListOffsets was out."""
        earliest = await stub.ListOffsets(broker_pb2.ListOffsetsRequest(
            topic=p.topic, partition=p.partition, timestamp_ms=-2, current_leader_epoch=st.leader_epoch),
            timeout=FETCH_RPC_TIMEOUT_S)
        latest = await stub.ListOffsets(broker_pb2.ListOffsetsRequest(
            topic=p.topic, partition=p.partition, timestamp_ms=-1, current_leader_epoch=st.leader_epoch),
            timeout=FETCH_RPC_TIMEOUT_S)
        if self._current(rm, p.key, st) is None:
            return False
        effect = p.reset_to_leader_log_range(earliest.offset, latest.offset)
        if effect is not None:
            log.info("%s-%d: out of range at the leader (log start %d, HW %d): %s", p.topic, p.partition,
                     earliest.offset, latest.offset, effect)
        return True


class ReplicaFetcherManager:
    """The fetchers of one follower broker, keyed by leader id (Kafka's ReplicaFetcherManager).

    Concurrency: event-loop owned; each fetcher is one task.
    """

    def __init__(self, replicas: "ReplicaManager", endpoint_of: Callable[[int], str | None],
                 broker_epoch: Callable[[], int],
                 data_endpoint_of: Callable[[int], str | None] | None = None) -> None:
        self.replicas = replicas
        self.endpoint_of = endpoint_of
        self.data_endpoint_of = data_endpoint_of  # None: every fetch over gRPC (replica.fetch.transport=grpc)
        self.broker_epoch = broker_epoch
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.stopped = False

    def targets(self, leader_id: int) -> tuple[str | None, str | None]:
        """(gRPC endpoint, data port endpoint or None) of a leader: a fetcher reconnects when either changes."""
        data = self.data_endpoint_of(leader_id) if self.data_endpoint_of is not None else None
        return self.endpoint_of(leader_id), data

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
                fetcher.state.drop(key)

    async def shutdown(self) -> None:
        self.stopped = True
        for f in self.fetchers.values():
            f.task.cancel()
        await asyncio.gather(*(f.task for f in self.fetchers.values()), return_exceptions=True)
        self.fetchers.clear()
