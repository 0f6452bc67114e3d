"""The leader's side of a multi-partition replica fetch (Kafka's Fetch with replica_id set).

Why: a follower used to hold one long poll per partition, so an idle 3-broker cluster with 100
partitions of RF 3 answered ~400 empty fetches a second (one per partition per
replica.fetch.wait.max.ms per follower), a third of a core of gRPC and Python for nothing. Kafka's
follower sends one Fetch for every partition it copies from a leader, and the leader parks it in
the fetch purgatory (DelayedFetch) until min_bytes are there over all partitions, a partition
fails, or max_wait_ms passes: an idle follower then costs one request per max_wait_ms per leader.

Each partition is read and recorded as the follower's progress exactly like a single-partition
follower Fetch (ReplicaManager.read / on_follower_fetch); errors are per partition, so one moved
partition does not fail the others. The session's rules (ReplicaFetchSession: apply_request, news, sent)
are IO-free: tests/sim drives the same class over its in-memory log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable, Union

from gregor.broker.purgatory import DelayedOperation, DelayedOperationPurgatory
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replica_manager import FetchResult, ReplicaManager

Outcome = Union["FetchResult", errors.GregorError]


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_PARTITIONS_TAG = b"\x0a"  # ReplicaFetchResponse.partitions: field 1, length-delimited
_RECORDS_TAG = b"\x32"  # ReplicaFetchPartitionResponse.records: field 6, length-delimited


def encode_replica_fetch_response(answered: "list[tuple[ReplicaFetchPart, FetchResult | errors.GregorError]]",
                                  framed: bool = False) -> bytes:
    """A ReplicaFetchResponse's wire bytes, the records spliced in by hand.

    Why: built as a message, each partition's records (~1 MB under a librdkafka acks=all load) were copied
    into the message and again by SerializeToString, per follower, on the leader's event loop between its
    append and the followers' fetch answers: the acks=all round trip, which paces a client that keeps one
    batch per partition in flight. Here the small fields go through protobuf and the records are joined
    after them as field 6 (a message's encoding is the concatenation of its fields'), one copy. Parses
    exactly as the message would (tests/unit/broker/test_replica_fetch_wire.py). framed: prefixed with its length
    as a 4-byte big-endian int (the data port's frame), in the same copy."""
    out: list[bytes] = []
    for part, outcome in answered:
        if isinstance(outcome, errors.GregorError):
            inner = [broker_pb2.ReplicaFetchPartitionResponse(
                topic=part.topic, partition=part.partition, error=outcome.to_detail()).SerializeToString()]
        else:
            inner = [broker_pb2.ReplicaFetchPartitionResponse(
                topic=part.topic, partition=part.partition, high_watermark=outcome.high_watermark,
                log_start_offset=outcome.log_start_offset).SerializeToString()]
            records = outcome.slice.read()
            if records:
                inner += [_RECORDS_TAG, _varint(len(records)), records]
        out += [_PARTITIONS_TAG, _varint(sum(map(len, inner))), *inner]
    if framed:
        out.insert(0, sum(map(len, out)).to_bytes(4, "big"))
    return b"".join(out)


@dataclass
class ReplicaFetchPart:
    """One partition of a replica fetch, as the follower asked for it."""

    topic: str
    partition: int
    fetch_offset: int
    current_leader_epoch: int
    max_bytes: int
    topic_id: bytes = b""  # the follower's replica's topic id (KIP-516); b"" skips the check
    log_start_offset: int = -1  # the follower's log start offset (DeleteRecords' low watermark); -1: not given


@dataclass
class _Watched:
    """A partition the parked fetch waits on: what to read and what 'new data' means for it."""

    partition: "Partition"
    fetch_offset: int
    leader_epoch: int
    read: Callable[[], "FetchResult"]


def _read_or_error(read: Callable[[], "FetchResult"]) -> Outcome:
    try:
        return read()
    except errors.GregorError as err:
        return err


def _size(outcomes: list[Outcome]) -> int:
    return sum(o.slice.length for o in outcomes if not isinstance(o, errors.GregorError))


@dataclass
class _SessionEntry:
    """One partition of a fetch session: what the follower last asked and what it was last told."""

    part: ReplicaFetchPart
    slot: Union[_Watched, errors.GregorError]
    sent_hw: int = -1  # -1: nothing sent yet on this session (a fresh stream answers every partition)
    sent_log_start: int = -1
    error_sent: bool = False


class ReplicaFetchSession:
    """Kafka's incremental fetch session (KIP-227) for one follower's ReplicaFetch stream.

    Why: with every partition of a leader in each fetch, a busy partition beside 100 idle ones paid
    for reading, encoding and applying the 100 on every fetch (at 2,000 acks=all records/s the
    brokers' CPU went from ~0.25 to ~0.45 cores with an idle 100-partition topic). The session keeps
    each partition's last fetch offset and the HW last sent; an incremental request names only
    partitions that moved, and the answer carries only partitions with news.

    With `changes` (the broker's fetch purgatory) the session listens to its partitions' changes (every
    append, HW move, log start move and leadership change reports its key there) and looks only at the
    partitions named in the request or reported changed since: a fetch costs O(partitions that moved),
    not O(session) as when it walked all ~50 of a leader's partitions twice per fetch (issue 24: the
    leader's largest per-fetch cost at 2,000 records/s beside bench_vs_kafka's 150 idle partitions).
    Retention reports its log start moves there too (LogManager.on_log_start_moved); anything else
    unreported would still reach the follower with its next full request (at least every
    replica.lag.time.max.ms / 3). Without `changes` (tests/sim, whose log reports nothing) every fetch
    looks at every partition. close() must end the listening when the stream ends.
    """

    def __init__(self, changes: "DelayedOperationPurgatory[Any] | None" = None) -> None:
        self.entries: dict[tuple[str, int], _SessionEntry] = {}
        self._changes = changes
        self._changed: dict[tuple[str, int], None] = {}  # reported since the last news() (ordered set)
        self.parked: "DelayedSessionFetch | None" = None  # the fetch waiting for news, if any

    def _on_change(self, key: Hashable) -> bool:
        """The purgatory's report of a change to key; wakes the parked fetch when that partition moved."""
        self._changed[key] = None  # type: ignore[index]
        if self._changes is not None and self._changes.noting:
            return False  # the purgatory tells of more changes before it completes (check_and_complete_all)
        op = self.parked
        return op is not None and not op.is_completed and op.try_complete_for(key)

    @property
    def listening(self) -> bool:
        return self._changes is not None

    def close(self) -> None:
        """The stream ended: stop listening."""
        if self._changes is not None:
            for key in self.entries:
                self._changes.unlisten(key, self._on_change)
        self.entries, self._changed, self.parked = {}, {}, None

    def apply_request(self, parts: list[ReplicaFetchPart], incremental: bool,
                      open_part: Callable[[ReplicaFetchPart], "tuple[Partition, Callable[[], FetchResult], FetchResult]"]
                      ) -> dict[tuple[str, int], Outcome]:
        """One request of the session (IO-free; the broker and tests/sim drive it): a full request replaces the
        session's partitions, an incremental one updates those it names. open_part validates and reads one named
        partition (recording the follower's fetch): the partition, how to read it again, and the first read; or it
        raises the partition's error. Returns what each named partition got, for news()."""
        before = self.entries
        if not incremental:
            self.entries = {}
            self._changed = {}  # every partition is named now
        listed: dict[tuple[str, int], Outcome] = {}
        for part in parts:
            key = (part.topic, part.partition)
            slot: Union[_Watched, errors.GregorError]
            try:
                p, read, listed[key] = open_part(part)
                slot = _Watched(p, part.fetch_offset, p.leader_epoch, read)
            except errors.GregorError as err:
                slot = listed[key] = err
            prev = before.get(key)
            if prev is None and self._changes is not None and key not in self.entries:  # once, even if named twice
                self._changes.listen(key, self._on_change)
            entry = self.entries[key] = _SessionEntry(part, slot)
            if prev is not None:
                entry.sent_hw, entry.sent_log_start = prev.sent_hw, prev.sent_log_start
        if not incremental and self._changes is not None:
            for key in before:
                if key not in self.entries:
                    self._changes.unlisten(key, self._on_change)
        return listed

    def news(self, listed: dict[tuple[str, int], Outcome], hosted: "dict[tuple[str, int], Partition]",
             consume: bool = True) -> list[tuple[_SessionEntry, Outcome]]:
        """The partitions to answer now: listed ones with records, a new HW or log start or an error; unlisted
        ones whose log grew, HW or log start moved or leadership changed (with a change feed: of those reported
        changed, which consume forgets; else of all, in session order).
        hosted: the broker's partitions now (a partition deleted or created anew since it was listed
        is an error for the follower, which then lists it again)."""
        out: list[tuple[_SessionEntry, Outcome]] = []
        if self._changes is None:
            for key, e in self.entries.items():
                self._examine(key, e, listed, hosted, out)
            return out
        changed = self._changed
        if consume:
            self._changed = {}
        entries = self.entries
        for key in listed:
            found = len(out)
            self._examine(key, entries[key], listed, hosted, out)
            if consume and len(out) == found and key in changed:
                # Changed after its read in this request (the HW this very fetch moved): its listed outcome is
                # older than the change, so it is looked at again when the parked fetch completes.
                self._changed[key] = None
        for key in changed:
            if key not in listed and (entry := entries.get(key)) is not None:
                self._examine(key, entry, listed, hosted, out)
        return out

    @staticmethod
    def _examine(key: tuple[str, int], e: _SessionEntry, listed: dict[tuple[str, int], Outcome],
                 hosted: "dict[tuple[str, int], Partition]", out: list[tuple[_SessionEntry, Outcome]]) -> None:
        outcome = listed.get(key)
        if outcome is None:
            slot = e.slot
            if isinstance(slot, errors.GregorError):
                return  # told once; the follower drops or re-lists it
            p = slot.partition
            if hosted.get(key) is not p:
                outcome = errors.error_for(errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
                                           "the partition was deleted or created anew since it was fetched",
                                           topic=key[0], partition=key[1])
            elif (p.log_end_offset <= slot.fetch_offset and p.is_leader and p.leader_epoch == slot.leader_epoch
                    and p.high_watermark == e.sent_hw and p.log.log_start_offset == e.sent_log_start):
                return
            else:
                outcome = _read_or_error(slot.read)
        if isinstance(outcome, errors.GregorError):
            if not e.error_sent:
                out.append((e, outcome))
        elif (outcome.slice.length or outcome.high_watermark != e.sent_hw
              or outcome.log_start_offset != e.sent_log_start):
            out.append((e, outcome))

    @staticmethod
    def sent(answered: list[tuple[_SessionEntry, Outcome]]) -> None:
        for e, outcome in answered:
            if isinstance(outcome, errors.GregorError):
                e.error_sent = True
            else:
                e.sent_hw, e.sent_log_start = outcome.high_watermark, outcome.log_start_offset


class DelayedSessionFetch(DelayedOperation[list[tuple[_SessionEntry, Outcome]]]):
    """A follower's session fetch parked until a session partition grew past the follower's offset or
    changed leadership, then min_bytes over the partitions with news, or its max wait; it answers only
    the partitions with news.

    The wake-up check is an offset comparison of the partition a change was reported for (no read):
    appends to a busy partition wake it often, and reading or walking every partition on each wake-up
    would cost O(partitions). Watched in the purgatory under every session key (a session without a
    change feed), or under none when the session's listener wakes it (ReplicaFetchSession.parked).
    """

    def __init__(self, delay_ms: int, session: ReplicaFetchSession, min_bytes: int,
                 hosted: "dict[tuple[str, int], Partition]") -> None:
        super().__init__(delay_ms)
        self.session = session
        self.hosted = hosted
        self.min_bytes = min_bytes

    def _slot_moved(self, key: object, e: _SessionEntry) -> bool:
        """Grew past the follower's offset, leadership changed, or the log start moved (DeleteRecords: the
        follower learns it now rather than after its max wait, and a parked DeleteRecords waits on that); or
        the partition is no longer the hosted one (deleted, or re-created under its name: news() tells the
        follower). Checked first: a deleted partition's log is closed, and reading its end offset raised
        LogClosedError into whoever reported the change (a re-creation's LeaderAndIsr, the new topic's first
        produce), found by test_topic_ids with the followers on the data port."""
        w = e.slot
        if not isinstance(w, _Watched):
            return False
        p = w.partition
        if self.hosted.get(key) is not p:  # type: ignore[call-overload]
            return True
        return (p.log_end_offset > w.fetch_offset or not p.is_leader or p.leader_epoch != w.leader_epoch
                or p.log.log_start_offset != e.sent_log_start)

    def try_complete_for(self, key: object) -> bool:
        """An append, HW move or leadership change on one partition: only its slot can have moved, so a
        fetch watching ~50 partitions is not walked whole on every produce and HW move (issue 15)."""
        e = self.session.entries.get(key)  # type: ignore[call-overload]
        if e is None or not self._slot_moved(key, e):
            return False
        return self._complete_with_enough()

    def try_complete(self) -> bool:
        if not any(self._slot_moved(key, e) for key, e in self.session.entries.items()):
            return False
        return self._complete_with_enough()

    def _complete_with_enough(self) -> bool:
        if self.min_bytes > 1 and _size([o for _, o in self.session.news({}, self.hosted, consume=False)]) \
                < self.min_bytes:
            return False  # Kafka's DelayedFetch: wait for replica.fetch.min.bytes over the partitions
        return self.force_complete()

    def on_complete(self) -> list[tuple[_SessionEntry, Outcome]]:
        return self.session.news({}, self.hosted)


async def handle_replica_fetch(rm: "ReplicaManager", replica_id: int, broker_epoch: int, min_bytes: int,
                               max_wait_ms: int, parts: list[ReplicaFetchPart],
                               session: "ReplicaFetchSession | None" = None,
                               incremental: bool = False) -> list[tuple[ReplicaFetchPart, Outcome]]:
    """Read every listed part (recording the follower's fetch offset), answer at once when a session
    partition has news, else park one fetch watching every session partition. A full request
    (incremental=False) replaces the session's partitions; an incremental one updates those listed."""
    if replica_id < 0 or min_bytes < 0 or max_wait_ms < 0:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"invalid replica fetch: replica_id={replica_id} "
                               f"min_bytes={min_bytes} max_wait_ms={max_wait_ms}")
    if session is None:
        session = ReplicaFetchSession()  # one request, no stream: no listening to close
    live_epoch = rm.live_broker_epoch(replica_id)

    def open_part(part: ReplicaFetchPart) -> "tuple[Partition, Callable[[], FetchResult], FetchResult]":
        where = {"topic": part.topic, "partition": part.partition}
        if part.max_bytes <= 0:
            raise errors.error_for(errors.Code.INVALID_FETCH_SIZE, f"max_bytes={part.max_bytes}", **where)
        if part.fetch_offset < 0:
            raise errors.error_for(errors.Code.OFFSET_OUT_OF_RANGE, f"negative fetch offset {part.fetch_offset}",
                                   **where)
        p = rm.get_partition(part.topic, part.partition)
        p.check_topic_id(part.topic_id)
        p.check_follower_broker_epoch(replica_id, broker_epoch, live_epoch)
        max_bytes = min(part.max_bytes, rm.config.fetch_max_bytes)

        def read() -> "FetchResult":
            return rm.read(p, part.fetch_offset, max_bytes, True, part.current_leader_epoch)

        result = read()
        rm.on_follower_fetch(p, replica_id, part.fetch_offset, broker_epoch, part.log_start_offset)
        return p, read, result

    listed = session.apply_request(parts, incremental, open_part)
    answered = session.news(listed, rm.partitions)
    if not answered and max_wait_ms > 0 and session.entries:
        op = DelayedSessionFetch(max_wait_ms, session, max(min_bytes, 1), rm.partitions)
        if session.listening:  # the session's listener wakes it: watched under no key
            keys: list[Hashable] = []
            session.parked = op
        else:
            keys = [e.slot.partition.key for e in session.entries.values() if isinstance(e.slot, _Watched)]
        # news() just found nothing moved, and no await since (one event loop): skip the two walks.
        rm.fetch_purgatory.try_complete_else_watch(op, keys, checked=True)  # type: ignore[arg-type]
        try:
            answered = await op.future  # type: ignore[assignment]
        finally:
            session.parked = None
    session.sent(answered)
    return [(e.part, outcome) for e, outcome in answered]


async def answer_replica_fetch(rm: "ReplicaManager", request: broker_pb2.ReplicaFetchRequest,
                               session: ReplicaFetchSession, framed: bool = False) -> bytes:
    """One request of a follower's fetch session, answered as ReplicaFetchResponse bytes: what the gRPC stream
    (server.py's ReplicaFetch) and the data port (data_port.py) both serve. A GregorError is the request's as a
    whole (each transport ends the session with it)."""
    parts = [ReplicaFetchPart(q.topic, q.partition, q.fetch_offset, q.current_leader_epoch, q.max_bytes, q.topic_id,
                              q.log_start_offset) for q in request.partitions]
    answered = await handle_replica_fetch(
        rm, request.replica_id, request.replica_broker_epoch if request.replica_broker_epoch > 0 else -1,  # 0: none
        request.min_bytes, request.max_wait_ms, parts, session, request.incremental)
    return encode_replica_fetch_response(answered, framed)
