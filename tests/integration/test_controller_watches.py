"""The active controller sees brokers and topics only through its etcd watches (real etcd, in-process
controller). A watch that ends for any reason other than resignation or stop() stops the controller,
so its lease goes and a standby takes over, instead of leaving an active controller that no longer
notices broker deaths (what a silently cancelled broker watch did)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from gregor.common.etcd import EtcdClient
from gregor.controller.controller import Controller, LeaderBalanceConfig
from tests.helpers.cluster import Process
from tests.helpers.wait import until


@pytest.fixture
async def controller(etcd: Process) -> AsyncIterator[Controller]:
    async with EtcdClient(f"http://{etcd.grpc}", cluster="gregor") as client:
        ctl = Controller(0, client, lease_ttl_ms=2000, registry=CollectorRegistry(),
                         leader_balance=LeaderBalanceConfig(auto_leader_rebalance_enable=False))
        await ctl.start()

        async def active() -> bool:
            return ctl.is_active and len(ctl._active_watches) == 5
        await until(active, 5, "controller active with its five watches (brokers, topics, deletions, ISR changes, log dir events)")
        try:
            yield ctl
        finally:
            await ctl.stop()


async def test_a_watch_cancelled_behind_the_controllers_back_stops_it(controller: Controller) -> None:
    broker_watch = next(t for t in controller._active_watches if t.get_name() == "broker-watch")
    broker_watch.cancel()
    with pytest.raises(RuntimeError, match="broker-watch was cancelled"):
        await asyncio.wait_for(asyncio.shield(controller.stopped), 5)


async def test_resignation_cancels_the_watches_and_the_controller_goes_on(controller: Controller) -> None:
    watches = list(controller._active_watches)
    controller.on_controller_resignation()
    await asyncio.wait(watches, timeout=5)
    assert all(t.cancelled() for t in watches)
    await asyncio.sleep(0.1)  # the done callbacks have run
    assert not controller.stopped.done()
