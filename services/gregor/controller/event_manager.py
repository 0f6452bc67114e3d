"""The controller's single event queue and its one consumer task (seed 001's ControllerEventManager)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Gauge, Histogram

from gregor.common.metrics import LATENCY_BUCKETS_S
from gregor.controller.state import ControllerState

log = logging.getLogger(__name__)

# Events waiting for the controller; put() waits for room beyond this (back-pressure on watchers).
EVENT_QUEUE_SIZE_MAX = 10_000
# Processed events kept for `gregor controller events`: enough to see the last rebalance or failover.
RECENT_EVENTS_MAX = 100


@dataclass(frozen=True)
class ProcessedEvent:
    """One processed event as the live view shows it (times in seconds of the manager's clock)."""

    name: str
    state: "ControllerState"
    enqueue_time_s: float
    queue_time_s: float
    processing_time_s: float
    error: str = ""


@dataclass(frozen=True)
class EventsSnapshot:
    """What the controller is doing now: its state, its queue in order, and what it did last."""

    state: "ControllerState"
    now_s: float
    queued: list[tuple[str, "ControllerState", float]]  # (name, state, enqueue age in seconds), oldest first
    processed: list[ProcessedEvent]  # newest first


class ControllerEvent(Protocol):
    """Something the controller does; `state` says which ControllerState it runs under."""

    state: ControllerState

    async def process(self) -> None:
        """Run the event on the controller's event task."""

    def preempt(self) -> None:
        """Called instead of process() when clear_and_put drops the event (e.g. fail its callback)."""


class EventManagerStopped(RuntimeError):
    """The event task is gone: the event was never processed."""


class QueuedEvent:
    """An event in the queue with its enqueue time; `wait()` returns once it was processed or preempted."""

    def __init__(self, event: ControllerEvent, enqueue_time_s: float) -> None:
        self.event = event
        self.enqueue_time_s = enqueue_time_s
        self.spent = False
        self.preempted = False
        self.error: BaseException | None = None
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _finish(self, error: BaseException | None = None) -> None:
        self.error = error
        if not self._done.done():
            self._done.set_result(None)

    @property
    def done(self) -> bool:
        return self._done.done()

    async def wait(self) -> bool:
        """True once processed, False if preempted; re-raises the error process() raised."""
        await asyncio.shield(self._done)
        if self.error is not None:
            raise self.error
        return not self.preempted

    def __repr__(self) -> str:
        return f"QueuedEvent(event={self.event!r}, enqueue_time_s={self.enqueue_time_s})"


class _ShutdownEventThread:
    """Sentinel that stops the consumer (Kafka's ShutdownEventThread)."""

    state = ControllerState.CONTROLLER_SHUTDOWN

    async def process(self) -> None:
        raise RuntimeError("ShutdownEventThread is handled by the event loop itself")

    def preempt(self) -> None:
        return None


class ControllerEventMetrics:
    """The event manager's Prometheus metrics, registered in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queue_size = Gauge(
            "gregor_controller_event_queue_size", "Events waiting in the controller event queue.", registry=registry
        )
        self.queue_time = Histogram(
            "gregor_controller_event_queue_time_seconds",
            "Time events spent in the controller event queue.",
            buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.state_time = Histogram(
            "gregor_controller_state_rate_and_time_seconds",
            "Processing time per controller state (Kafka's <State>RateAndTimeMs).",
            ["state"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.processing_time = Histogram(
            "gregor_controller_event_processing_time_seconds",
            "Time the event task spent processing one event, any state (Kafka's EventQueueProcessingTimeMs).",
            buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.state = Gauge(
            "gregor_controller_state", "ControllerState value of the event being processed (0 = Idle).",
            registry=registry,
        )


class ControllerEventManager:
    """One bounded asyncio queue drained by one consumer task that owns the controller's state.

    Concurrency: every method runs on the event loop thread; only the consumer
    task calls `process()`, so events never run concurrently. A done-callback
    fails every queued event if the task dies, so no waiter hangs.
    """

    def __init__(
        self,
        *,
        queue_size_max: int = EVENT_QUEUE_SIZE_MAX,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._queue: asyncio.Queue[QueuedEvent] = asyncio.Queue(maxsize=queue_size_max)
        self._metrics = ControllerEventMetrics(registry if registry is not None else REGISTRY)
        self._clock = clock
        self._state = ControllerState.IDLE
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._recent: deque[ProcessedEvent] = deque(maxlen=RECENT_EVENTS_MAX)

    @property
    def state(self) -> ControllerState:
        """The state of the event being processed, Idle between events."""
        return self._state

    def queue_size(self) -> int:
        return self._queue.qsize()

    def snapshot(self, last: int = RECENT_EVENTS_MAX) -> EventsSnapshot:
        """The live view (`gregor controller events`): current state, queued events, last `last` processed."""
        now = self._clock()
        # asyncio.Queue keeps its items in a deque; reading it is safe on the loop thread that owns it.
        pending = [q for q in list(self._queue._queue) if not q.spent]  # type: ignore[attr-defined]
        queued = [(_event_name(q.event), q.event.state, max(0.0, now - q.enqueue_time_s)) for q in pending]
        processed = list(self._recent)[::-1][:max(0, last)]
        return EventsSnapshot(self._state, now, queued, processed)

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("controller event manager already started")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="controller-event-thread")
        self._task.add_done_callback(self._on_task_done)

    async def put(self, event: ControllerEvent) -> QueuedEvent:
        """Enqueue an event, waiting for room if the queue is full."""
        self._check_running()
        queued = QueuedEvent(event, self._clock())
        await self._queue.put(queued)
        self._after_put(queued)
        return queued

    def put_nowait(self, event: ControllerEvent) -> QueuedEvent:
        """Enqueue an event; raises asyncio.QueueFull when the queue is full."""
        self._check_running()
        queued = QueuedEvent(event, self._clock())
        self._queue.put_nowait(queued)
        self._after_put(queued)
        return queued

    def clear_and_put(self, event: ControllerEvent) -> QueuedEvent:
        """Preempt and drop every queued event, then enqueue this one (Kafka's clearAndPut).

        Used for events that must run next and make the backlog moot: session
        expiry (Expire) and shutdown (ShutdownEventThread).
        """
        self._check_running()
        for queued in self._drain():
            self._preempt(queued)
        return self.put_nowait(event)

    async def close(self) -> None:
        """Preempt what is queued, let the current event finish, stop the task."""
        if self._task is None or self._task.done():
            self._stopped = True
            return
        self.clear_and_put(_ShutdownEventThread())
        self._stopped = True
        await asyncio.shield(self._task)

    # -- internals -------------------------------------------------------------

    def _check_running(self) -> None:
        if self._stopped or (self._task is not None and self._task.done()):
            raise EventManagerStopped("controller event manager is stopped")

    def _after_put(self, queued: QueuedEvent) -> None:
        self._metrics.queue_size.set(self._queue.qsize())
        if self._task is not None and self._task.done():
            # The task died while we waited for room: nobody will process this.
            self._fail(queued, EventManagerStopped("controller event task died"))

    def _drain(self) -> list[QueuedEvent]:
        drained = []
        while not self._queue.empty():
            drained.append(self._queue.get_nowait())
        self._metrics.queue_size.set(0)
        return drained

    def _preempt(self, queued: QueuedEvent) -> None:
        if queued.spent:
            return
        queued.spent = queued.preempted = True
        try:
            queued.event.preempt()
        except Exception:  # A failing preempt must not stop the others.
            log.exception("error preempting controller event %r", queued.event)
        queued._finish()

    @staticmethod
    def _fail(queued: QueuedEvent, error: BaseException) -> None:
        queued.spent = True
        queued._finish(error)

    async def _run(self) -> None:
        while True:
            queued = await self._queue.get()
            self._metrics.queue_size.set(self._queue.qsize())
            if isinstance(queued.event, _ShutdownEventThread):
                queued.spent = True
                queued._finish()
                return
            if queued.spent:
                continue
            queued.spent = True
            await self._process(queued)

    async def _process(self, queued: QueuedEvent) -> None:
        state = queued.event.state
        self._set_state(state)
        start = self._clock()
        queue_time_s = max(0.0, start - queued.enqueue_time_s)
        self._metrics.queue_time.observe(queue_time_s)
        error: BaseException | None = None
        try:
            await queued.event.process()
        except asyncio.CancelledError:
            queued._finish(EventManagerStopped("controller event task cancelled"))
            raise
        except Exception as exc:
            # One bad event must not stop the controller: log it and carry on.
            log.exception("uncaught error processing controller event %r", queued.event)
            error = exc
        finally:
            elapsed = max(0.0, self._clock() - start)
            if state.rate_and_time_metric_name is not None:
                self._metrics.state_time.labels(state=state.kafka_name).observe(elapsed)
            self._metrics.processing_time.observe(elapsed)
            self._recent.append(ProcessedEvent(_event_name(queued.event), state, queued.enqueue_time_s,
                                               queue_time_s, elapsed, repr(error) if error else ""))
            self._set_state(ControllerState.IDLE)
        queued._finish(error)

    def _set_state(self, state: ControllerState) -> None:
        self._state = state
        self._metrics.state.set(state.value)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._stopped = True
        reason: BaseException = EventManagerStopped("controller event task stopped")
        if not task.cancelled() and task.exception() is not None:
            reason = EventManagerStopped(f"controller event task died: {task.exception()!r}")
            log.error("controller event task died", exc_info=task.exception())
        for queued in self._drain():
            self._fail(queued, reason)


def _event_name(event: ControllerEvent) -> str:
    """An event's name for the live view: its `name` when it has one (controller events do), else its class."""
    return str(getattr(event, "name", "") or type(event).__name__.lstrip("_"))
