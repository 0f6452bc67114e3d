"""Write admission of the coordinator (docs/groups.md "Fencing"): a write to an offsets partition is
admitted only if it ends before the instance's ownership lease can expire, with a margin."""

from __future__ import annotations

from typing import Any

import pytest

from gregor.common import errors
from gregor.common.clock import monotonic_ms
from gregor.coordinator.coordinator import CoordinatorConfig, GroupCoordinator

Code = errors.Code


def coordinator(lease_ttl_ms: int = 2000, **kw: Any) -> GroupCoordinator:
    c = GroupCoordinator(0, None, "127.0.0.1", 0, CoordinatorConfig(lease_ttl_ms=lease_ttl_ms, **kw))  # type: ignore[arg-type]
    c.offsets.owned = {1}
    return c


class NoSend:
    """A producer that must not be reached."""

    async def send(self, *a: Any, **kw: Any) -> Any:
        raise AssertionError("a fenced write reached the producer")


async def test_write_timeout_and_margin_follow_the_lease() -> None:
    assert (coordinator(2000).write_timeout_ms, coordinator(2000).fence_margin_ms) == (800, 200)
    assert coordinator(10000).write_timeout_ms == 4000  # 2/5 of the TTL
    assert coordinator(20000).write_timeout_ms == 5000  # offsets.commit.timeout.ms
    assert coordinator(10000, offsets_commit_timeout_ms=300).write_timeout_ms == 300


async def test_write_admitted_only_while_the_lease_outlives_it() -> None:
    c = coordinator(2000)
    c.fence._valid_until_ms = monotonic_ms() + 1500
    c.check_fence(1)  # 1500 ms left >= 800 write timeout + 200 margin
    c.fence._valid_until_ms = monotonic_ms() + 900
    with pytest.raises(errors.GregorError) as ei:
        c.check_fence(1)
    assert ei.value.code == Code.NOT_COORDINATOR and "fenced" in ei.value.message
    c.fence._valid_until_ms = monotonic_ms() + 1500
    with pytest.raises(errors.GregorError) as ei:
        c.check_fence(2)  # not ours
    assert ei.value.code == Code.NOT_COORDINATOR
    c.offsets.closing = True
    with pytest.raises(errors.GregorError) as ei:
        c.check_fence(1)
    assert ei.value.code == Code.NOT_COORDINATOR


async def test_fenced_append_never_reaches_the_producer() -> None:
    c = coordinator(2000)
    c._producer = NoSend()  # type: ignore[assignment]
    c.fence._valid_until_ms = monotonic_ms() + 500
    with pytest.raises(errors.GregorError) as ei:
        await c.append(1, [(b"k", b"v")])
    assert ei.value.code == Code.NOT_COORDINATOR and not c.offsets.inflight(1)


async def test_requests_refused_once_the_lease_may_have_expired() -> None:
    c = coordinator(2000)
    group = next(f"g{i}" for i in range(1000) if c.partition_of(f"g{i}") == 1)
    c.fence._valid_until_ms = monotonic_ms() + 1000
    assert c.check_owner(group) == 1  # serving (reads, joins) while the lease certainly lives
    c.fence._valid_until_ms = monotonic_ms() - 1  # e.g. resumed after SIGSTOP past the TTL
    with pytest.raises(errors.GregorError) as ei:
        c.check_owner(group)
    assert ei.value.code == Code.NOT_COORDINATOR
