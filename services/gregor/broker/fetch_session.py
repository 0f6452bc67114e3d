"""Incremental fetch sessions (KIP-227): the broker's one session cache, shared by the Kafka listener's Fetch
and the gRPC FetchPartitions of Gregor's consumers (broker/consumer_fetch.py reads and answers for both).

A client opens a session with a full fetch at epoch 0 (session id 0); the broker answers with a
session id. Later fetches carry (id, epoch 1, 2, ...) and name only partitions whose fetch
position changed (added or updated) or that it no longer wants (forgotten); the broker answers
only partitions with something new (records, a moved high watermark / LSO / log start, or an
error). Epoch -1 (FINAL) closes a session; a full fetch without a session uses id 0, epoch -1.

Kafka's defaults: max.incremental.fetch.session.cache.slots = 1000 sessions per broker; the
least recently used one is evicted when a new one needs its slot.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client import Counter

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INVALID_SESSION_ID = 0
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
MAX_SLOTS = 1000  # max.incremental.fetch.session.cache.slots

TopicPartition = tuple[str, int]

# Kafka's IncrementalFetchSessionEvictionsPerSec: a session pushed out of a full cache (its client then gets
# FETCH_SESSION_ID_NOT_FOUND and starts a new session with a full fetch).
EVICTIONS = Counter("gregor_broker_fetch_session_evictions_total",
                    "Incremental fetch sessions evicted from the full session cache (KIP-227)")


@dataclass
class CachedPartition:
    """What the session remembers of a partition: the client's position, and what we last told it."""

    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    topic_id: bytes = b""  # KIP-516: the id the client's position belongs to; b"" skips the check
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1

    def changed(self, hw: int, lso: int, log_start: int) -> bool:
        """Record what the response says; True when it differs from what the client last heard."""
        moved = (hw, lso, log_start) != (self.high_watermark, self.last_stable_offset, self.log_start_offset)
        self.high_watermark, self.last_stable_offset, self.log_start_offset = hw, lso, log_start
        return moved


@dataclass
class FetchSession:
    session_id: int
    epoch: int  # the epoch the next incremental request must carry
    partitions: "OrderedDict[TopicPartition, CachedPartition]" = field(default_factory=OrderedDict)

    def next_epoch(self) -> None:
        self.epoch = 1 if self.epoch >= 2**31 - 1 else self.epoch + 1


class FetchSessionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class FetchContext:
    """One Fetch request resolved against the cache: the partitions to read, and how to answer."""

    session: FetchSession | None  # None: sessionless full fetch (answer with session id 0)
    incremental: bool
    partitions: list[tuple[TopicPartition, CachedPartition]]


class FetchSessionCache:
    def __init__(self, max_slots: int = MAX_SLOTS) -> None:
        self.max_slots = max_slots
        self.sessions: "OrderedDict[int, FetchSession]" = OrderedDict()
        self._ids = itertools.count(1)

    def _new_id(self) -> int:
        while True:
            sid = next(self._ids) % (2**31 - 1) or next(self._ids)
            if sid not in self.sessions:
                return sid

    def resolve(self, session_id: int, epoch: int, wanted: list[tuple[TopicPartition, CachedPartition]],
                forgotten: list[TopicPartition]) -> FetchContext:
        """Apply a request's session fields; raises FetchSessionError with Kafka's error code."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.sessions.pop(session_id, None)  # close (FINAL) or replace (INITIAL) the old session
            if epoch == FINAL_EPOCH:
                return FetchContext(None, False, wanted)
            session = FetchSession(self._new_id(), 1, OrderedDict(wanted))
            self.sessions[session.session_id] = session
            while len(self.sessions) > self.max_slots:
                self.sessions.popitem(last=False)  # least recently used
                EVICTIONS.inc()
            return FetchContext(session, False, list(session.partitions.items()))
        found = self.sessions.get(session_id) if session_id != INVALID_SESSION_ID else None
        if found is None:
            raise FetchSessionError(FETCH_SESSION_ID_NOT_FOUND, f"fetch session {session_id} not found")
        session = found
        if epoch != session.epoch:
            raise FetchSessionError(INVALID_FETCH_SESSION_EPOCH,
                                    f"fetch session {session_id} expected epoch {session.epoch}, got {epoch}")
        self.sessions.move_to_end(session_id)
        for tp in forgotten:
            session.partitions.pop(tp, None)
        for tp, part in wanted:
            old = session.partitions.get(tp)
            if old is not None:  # keep what we last told the client about it
                part.high_watermark, part.last_stable_offset, part.log_start_offset = (
                    old.high_watermark, old.last_stable_offset, old.log_start_offset)
            session.partitions[tp] = part
        session.next_epoch()
        return FetchContext(session, True, list(session.partitions.items()))
