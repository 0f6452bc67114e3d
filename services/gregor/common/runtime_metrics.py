"""Process-level latency sources of a Python service: event-loop lag and cyclic-GC pauses.

Why: a stall on the produce path (issue 15) is either a request waiting on something (the
request histograms show where) or the whole process not running its loop: a long callback, or
Python's cyclic GC walking every live object in a generation-2 collection. These two metrics tell
the second case apart, and a pause longer than SLOW_PAUSE_S is also logged with its timestamp so
it can be lined up with a benchmark's slow window.

- gregor_event_loop_lag_seconds: how late a timer set SAMPLE_INTERVAL_S ahead fires.
- gregor_gc_pause_seconds{generation}: wall time of each cyclic-GC collection.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any, Optional

from prometheus_client import Histogram

from gregor.common.metrics import LATENCY_BUCKETS_S

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 0.1  # loop-lag probe period: fine enough to see a 20 ms hiccup, ~10 wake-ups/s of cost
SLOW_PAUSE_S = 0.05  # log a loop lag or GC pause at least this long (a p99-sized hiccup at 2,000 rec/s)
# Generation-0 threshold for long-running services: the default 700 makes the young collections (and the
# generation-2 ones they cascade into) run every few requests under load; 50,000 keeps short-lived request
# objects from ever being scanned, and a generation-2 walk of the (frozen-at-startup) heap stays rare.
GC_YOUNG_THRESHOLD = 50_000

EVENT_LOOP_LAG = Histogram("gregor_event_loop_lag_seconds", "How late a periodic event-loop timer fires",
                           buckets=LATENCY_BUCKETS_S)
GC_PAUSE = Histogram("gregor_gc_pause_seconds", "Wall time of one cyclic garbage collection", ["generation"],
                     buckets=LATENCY_BUCKETS_S)


class _GcTimer:
    """gc.callbacks hook: times each collection (start/stop pairs on the collecting thread)."""

    def __init__(self) -> None:
        self._start: Optional[float] = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        if self._start is None:
            return
        took = time.perf_counter() - self._start
        self._start = None
        generation = info.get("generation", -1)
        GC_PAUSE.labels(generation=str(generation)).observe(took)
        if took >= SLOW_PAUSE_S:
            log.warning("gc generation %s took %.1f ms (collected %s)", generation, took * 1000,
                        info.get("collected"))


_timer: Optional[_GcTimer] = None


def tune_gc() -> None:
    """Freeze what startup allocated (modules, config, open logs: never garbage) out of every future
    collection, and raise the young-generation threshold (GC_YOUNG_THRESHOLD)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def install_gc_timer() -> None:
    global _timer
    if _timer is None:
        _timer = _GcTimer()
        gc.callbacks.append(_timer)


async def watch_event_loop_lag(interval_s: float = SAMPLE_INTERVAL_S) -> None:
    """Run forever (a task): sample how late the loop wakes a sleeper."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        lag = max(0.0, loop.time() - due)
        EVENT_LOOP_LAG.observe(lag)
        if lag >= SLOW_PAUSE_S:
            log.warning("event loop lag %.1f ms", lag * 1000)


def start_runtime_metrics() -> "asyncio.Task[None]":
    """GC timing plus the loop-lag task (keep a reference to the task)."""
    install_gc_timer()
    return asyncio.get_running_loop().create_task(watch_event_loop_lag(), name="event-loop-lag")
