"""Delayed operations and their purgatory, as Kafka's DelayedOperationPurgatory.

A request that cannot be answered yet (acks=all before the ISR caught up, a
fetch before min_bytes arrived) parks here, watched under the keys of the
partitions it waits on. Whoever changes a partition calls check_and_complete
for its key; the operation completes when its condition holds, or expires on
its timer. Concurrency: single event loop, no locks; everything runs on the
loop that created the purgatory.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Callable, Generic, Hashable, TypeVar

from prometheus_client import Counter, Gauge, Histogram

from gregor.common.metrics import LATENCY_BUCKETS_S

T = TypeVar("T")

PURGATORY_SIZE = Gauge(
    "gregor_broker_purgatory_size", "Operations waiting in a purgatory", ["purgatory"]
)
# Kafka's RequestMetrics RemoteTimeMs: time a request waited in purgatory (only requests that were parked).
REMOTE_TIME = Histogram("gregor_request_remote_time_seconds",
                        "Time a request waited in purgatory for other brokers or more data (RemoteTimeMs)",
                        ["api"], buckets=LATENCY_BUCKETS_S)
EXPIRATIONS = Counter("gregor_broker_purgatory_expirations_total",
                      "Delayed operations completed by their timeout (ExpiresPerSec)", ["purgatory"])


class DelayedOperation(Generic[T]):
    """An operation that completes when try_complete() says so or its delay expires.

    Subclasses implement try_complete() (call force_complete() when done) and
    on_complete() (compute the result); on_expiration() runs before an expired
    operation's on_complete().
    """

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self.future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._timer: asyncio.TimerHandle | None = None
        self.expired = False

    @property
    def is_completed(self) -> bool:
        return self.future.done()

    def try_complete(self) -> bool:
        raise NotImplementedError

    def on_complete(self) -> T:
        raise NotImplementedError

    def try_complete_for(self, key: Hashable) -> bool:
        """try_complete() after a change to `key`'s partition: an operation watching many keys may
        look at that one only (DelayedSessionFetch)."""
        return self.try_complete()

    def on_expiration(self) -> None:
        """Hook for expiry metrics; the result still comes from on_complete()."""

    def force_complete(self) -> bool:
        """Complete now (once); returns False if it already was."""
        if self.future.done():
            return False
        if self._timer is not None:
            self._timer.cancel()
        try:
            self.future.set_result(self.on_complete())
        except Exception as exc:  # the waiter gets the error instead of hanging
            self.future.set_exception(exc)
        return True

    def _expire(self) -> None:
        if not self.future.done():
            self.expired = True
            self.on_expiration()
            self.force_complete()


class DelayedOperationPurgatory(Generic[T]):
    """Watch lists of delayed operations keyed by partition (one event loop)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._watchers: dict[Hashable, list[DelayedOperation[T]]] = defaultdict(list)
        # Standing listeners per key (a follower's fetch session): told of every check_and_complete of the key
        # for as long as they listen, so a session learns which of its partitions changed without walking all.
        self._listeners: dict[Hashable, list[Callable[[Hashable], bool]]] = defaultdict(list)
        self._unkeyed: set[DelayedOperation[T]] = set()  # waiting ops watched under no key (a listener wakes them)
        # True while check_and_complete_all tells the listeners of every key before completing anything.
        self.noting = False
        self._gauge = PURGATORY_SIZE.labels(purgatory=name)
        self._gauge.set_function(self.size)
        self._remote_time = REMOTE_TIME.labels(api=name)
        self._expirations = EXPIRATIONS.labels(purgatory=name)

    def size(self) -> int:
        """Watched entries of waiting operations. Called from the metrics server's thread while the loop changes
        the watch lists: iterate a copy (list() of a dict's values is one step under the GIL), or a scrape
        that races a fetch parking on 1,000 partitions fails with 'dictionary changed size during iteration'."""
        return (sum(1 for ops in list(self._watchers.values()) for op in list(ops) if not op.is_completed)
                + len(self._unkeyed))

    def listen(self, key: Hashable, listener: Callable[[Hashable], bool]) -> None:
        """Call listener(key) on every check_and_complete(key) until unlisten (it returns whether that completed
        an operation of its own). Standing, unlike a watch: registered once, not per parked operation."""
        self._listeners[key].append(listener)

    def unlisten(self, key: Hashable, listener: Callable[[Hashable], bool]) -> None:
        listeners = self._listeners.get(key)
        if listeners is None:
            return
        try:
            listeners.remove(listener)
        except ValueError:
            pass
        if not listeners:
            del self._listeners[key]

    def try_complete_else_watch(self, op: DelayedOperation[T], keys: list[Hashable], checked: bool = False) -> bool:
        """Complete op at once if it can; otherwise watch it under keys and arm its timer.

        checked: the caller has just seen the condition false with no await since (one event loop, so
        nothing can have changed): skip both checks (a replica fetch's check walks all its partitions)."""
        if not checked and op.try_complete():
            return True
        for key in keys:
            self._watchers[key].append(op)
        # The condition may have become true between the check and the watch.
        if not checked and op.try_complete():
            return True
        if not keys:
            self._unkeyed.add(op)
        loop = asyncio.get_running_loop()
        parked_at = loop.time()
        op._timer = loop.call_later(op.delay_ms / 1000.0, op._expire)
        op.future.add_done_callback(lambda _f: self._on_done(op, keys, loop.time() - parked_at))
        return False

    def _on_done(self, op: DelayedOperation[T], keys: list[Hashable], waited_s: float) -> None:
        self._unwatch(op, keys)
        self._unkeyed.discard(op)
        self._remote_time.observe(waited_s)
        if op.expired:
            self._expirations.inc()

    def check_and_complete(self, key: Hashable) -> int:
        """Tell key's listeners, then try to complete every operation watching key; returns how many completed."""
        completed = 0
        listeners = self._listeners.get(key)
        if listeners:
            for listener in list(listeners):
                completed += listener(key)
        ops = self._watchers.get(key)
        if not ops:
            return completed
        for op in list(ops):
            if not op.is_completed and op.try_complete_for(key):
                completed += 1
        return completed

    def check_and_complete_all(self, keys: list[Hashable]) -> int:
        """check_and_complete for several keys changed together (a multi-partition produce): every listener hears
        of every key first (with `noting` set, a listener only notes the change), then each key's operations and
        listeners complete, so an operation completing at the first key sees the changes of all of them (a
        follower's session fetch answers every partition of the produce, not the first alone)."""
        self.noting = True
        try:
            for key in keys:
                for listener in list(self._listeners.get(key, ())):
                    listener(key)
        finally:
            self.noting = False
        return sum(self.check_and_complete(key) for key in keys)

    def _unwatch(self, op: DelayedOperation[T], keys: list[Hashable]) -> None:
        for key in keys:
            ops = self._watchers.get(key)
            if ops is None:
                continue
            try:
                ops.remove(op)
            except ValueError:
                pass
            if not ops:
                del self._watchers[key]

    def cancel_all(self, exc: BaseException) -> None:
        """Fail every waiting operation (shutdown), so nothing hangs."""
        for ops in [*self._watchers.values(), list(self._unkeyed)]:
            for op in list(ops):
                if not op.future.done():
                    if op._timer is not None:
                        op._timer.cancel()
                    op.future.set_exception(exc)
        self._watchers.clear()
        self._unkeyed.clear()
