"""ControllerEventManager: one consumer in order, clear_and_put preemption, error isolation, metrics."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from gregor.controller.event_manager import ControllerEventManager, EventManagerStopped
from gregor.controller.state import ControllerState


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Event:
    name: str
    log: list[str]
    state: ControllerState = ControllerState.TOPIC_CHANGE
    gate: asyncio.Event | None = None
    fail: bool = False
    advance_s: float = 0.0
    clock: FakeClock | None = None
    seen_states: list[ControllerState] = field(default_factory=list)
    manager: ControllerEventManager | None = None

    async def process(self) -> None:
        if self.manager is not None:
            self.seen_states.append(self.manager.state)
        if self.gate is not None:
            await self.gate.wait()
        if self.clock is not None:
            self.clock.now += self.advance_s
        if self.fail:
            raise ValueError(f"{self.name} failed")
        self.log.append(self.name)

    def preempt(self) -> None:
        self.log.append(f"preempted {self.name}")


def _sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    assert value is not None, name
    return value


async def test_events_run_one_at_a_time_in_order_and_state_is_reported() -> None:
    registry = CollectorRegistry()
    manager = ControllerEventManager(registry=registry)
    log: list[str] = []
    gate = asyncio.Event()
    first = Event("a", log, state=ControllerState.BROKER_CHANGE, gate=gate, manager=manager)
    manager.start()
    waits = [await manager.put(first)] + [await manager.put(Event(n, log)) for n in "bcd"]
    await asyncio.sleep(0)
    assert manager.state is ControllerState.BROKER_CHANGE
    assert _sample(registry, "gregor_controller_state") == ControllerState.BROKER_CHANGE.value
    assert log == [] and manager.queue_size() == 3
    gate.set()
    assert [await w.wait() for w in waits] == [True] * 4
    assert log == ["a", "b", "c", "d"] and first.seen_states == [ControllerState.BROKER_CHANGE]
    assert manager.state is ControllerState.IDLE and _sample(registry, "gregor_controller_state") == 0
    await manager.close()


async def test_clear_and_put_preempts_queued_events_and_runs_next() -> None:
    manager = ControllerEventManager(registry=CollectorRegistry())
    log: list[str] = []
    gate = asyncio.Event()
    manager.start()
    running = await manager.put(Event("running", log, gate=gate))
    await asyncio.sleep(0)
    queued = [await manager.put(Event(n, log)) for n in ("x", "y")]
    expire = manager.clear_and_put(Event("expire", log, state=ControllerState.CONTROLLER_CHANGE))
    assert log == ["preempted x", "preempted y"] and manager.queue_size() == 1
    assert [await q.wait() for q in queued] == [False, False]
    gate.set()
    assert await running.wait() and await expire.wait()
    assert log == ["preempted x", "preempted y", "running", "expire"]
    await manager.close()


async def test_failing_event_is_logged_and_the_task_keeps_going(caplog: pytest.LogCaptureFixture) -> None:
    manager = ControllerEventManager(registry=CollectorRegistry())
    log: list[str] = []
    manager.start()
    bad = await manager.put(Event("bad", log, fail=True))
    good = await manager.put(Event("good", log))
    with pytest.raises(ValueError, match="bad failed"):
        await bad.wait()
    assert await good.wait() and log == ["good"]
    assert "uncaught error processing controller event" in caplog.text
    await manager.close()


async def test_metrics_queue_time_and_per_state_rate_and_time() -> None:
    registry, clock = CollectorRegistry(), FakeClock()
    manager = ControllerEventManager(registry=registry, clock=clock)
    log: list[str] = []
    await manager.put(Event("a", log, state=ControllerState.ISR_CHANGE, advance_s=0.2, clock=clock))
    await manager.put(Event("b", log, state=ControllerState.ISR_CHANGE, advance_s=0.3, clock=clock))
    last = await manager.put(Event("idle-ish", log, state=ControllerState.UPDATE_METADATA_RESPONSE_RECEIVED))
    assert _sample(registry, "gregor_controller_event_queue_size") == 3
    clock.now += 1.0  # Everything waits a second before the task starts.
    manager.start()
    await last.wait()
    assert _sample(registry, "gregor_controller_event_queue_size") == 0
    assert _sample(registry, "gregor_controller_event_queue_time_seconds_count") == 3
    # Queue times: 1.0, 1.2 (after a's 0.2 s), 1.5 (after b's 0.3 s).
    assert _sample(registry, "gregor_controller_event_queue_time_seconds_sum") == pytest.approx(3.7)
    labels = {"state": "IsrChange"}
    assert _sample(registry, "gregor_controller_state_rate_and_time_seconds_count", labels) == 2
    assert _sample(registry, "gregor_controller_state_rate_and_time_seconds_sum", labels) == pytest.approx(0.5)
    untimed = {"state": "UpdateMetadataResponseReceived"}
    assert registry.get_sample_value("gregor_controller_state_rate_and_time_seconds_count", untimed) is None
    await manager.close()


async def test_bounded_queue_applies_back_pressure() -> None:
    manager = ControllerEventManager(registry=CollectorRegistry(), queue_size_max=1)
    log: list[str] = []
    manager.put_nowait(Event("a", log))
    with pytest.raises(asyncio.QueueFull):
        manager.put_nowait(Event("b", log))
    blocked = asyncio.ensure_future(manager.put(Event("c", log)))
    await asyncio.sleep(0)
    assert not blocked.done()
    manager.start()
    assert await (await blocked).wait() and log == ["a", "c"]
    await manager.close()


async def test_waiters_fail_when_the_task_dies_and_puts_are_refused_after_close() -> None:
    manager = ControllerEventManager(registry=CollectorRegistry())
    log: list[str] = []
    gate = asyncio.Event()
    manager.start()
    await manager.put(Event("stuck", log, gate=gate))
    await asyncio.sleep(0)
    pending = await manager.put(Event("pending", log))
    assert manager._task is not None
    manager._task.cancel()
    with pytest.raises(EventManagerStopped):
        await asyncio.wait_for(pending.wait(), 1)
    with pytest.raises(EventManagerStopped):
        await manager.put(Event("late", log))
    await manager.close()
    assert log == []


async def test_snapshot_shows_state_queue_in_order_with_age_and_processed_events_newest_first() -> None:
    """The live view of `gregor controller events`: what runs now, what waits (oldest first, with its
    enqueue age) and what ran (newest first, with queue and processing time); errors are named."""
    registry = CollectorRegistry()
    clock = FakeClock()
    manager = ControllerEventManager(registry=registry, clock=clock)
    log: list[str] = []
    gate = asyncio.Event()
    manager.start()
    first = await manager.put(Event("BrokerChange", log, state=ControllerState.BROKER_CHANGE, gate=gate,
                                    clock=clock, advance_s=0.25))
    await asyncio.sleep(0)  # the consumer takes the first event and blocks on its gate
    clock.now += 1.0
    await manager.put(Event("TopicChange", log))
    clock.now += 0.5
    await manager.put(Event("Broken", log, fail=True))
    snap = manager.snapshot()
    assert snap.state is ControllerState.BROKER_CHANGE
    assert [(name, state, age) for name, state, age in snap.queued] == [
        ("TopicChange", ControllerState.TOPIC_CHANGE, 0.5), ("Broken", ControllerState.TOPIC_CHANGE, 0.0)]
    assert snap.processed == []
    gate.set()
    await first.wait()
    while manager.queue_size():
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    snap = manager.snapshot()
    assert snap.state is ControllerState.IDLE and snap.queued == []
    names = [e.name for e in snap.processed]
    assert names == ["Broken", "TopicChange", "BrokerChange"]
    broker_change = snap.processed[-1]
    assert broker_change.state is ControllerState.BROKER_CHANGE
    # It ran while the clock moved 1.0 + 0.5 s (the two puts) and its own 0.25 s.
    assert broker_change.queue_time_s == 0.0 and broker_change.processing_time_s == pytest.approx(1.75)
    assert snap.processed[1].queue_time_s == pytest.approx(0.75)  # enqueued 1.0 s in, started at 1.75 s
    assert "Broken failed" in snap.processed[0].error and snap.processed[1].error == ""
    assert [e.name for e in manager.snapshot(last=1).processed] == ["Broken"]
    assert _sample(registry, "gregor_controller_event_processing_time_seconds_count") == 3
    await manager.close()
