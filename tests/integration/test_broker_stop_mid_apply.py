"""A broker stopped while it applies a large LeaderAndIsr (issue 24): the apply goes on after its caller gave
up (the controller's call timed out), so a clean stop could close the logs under it; at 10,000 partitions the
old process logged `Task exception was never retrieved ... LogClosedError('log is closed')`. Now the apply
stops at its next chunk once the broker is stopping, answers the partitions it did not apply with
NOT_LEADER_OR_FOLLOWER, and the logs close after it."""

from __future__ import annotations

import asyncio
import os

from gregor.broker.broker import Broker
from gregor.common import errors
from gregor.common.config import BrokerConfig
from gregor.rpc.v1 import broker_pb2
from tests.helpers.wait import until

PARTITIONS = 3000


async def test_a_broker_stopped_mid_leader_and_isr_stops_the_apply_before_closing_its_logs(
        tmp_path: os.PathLike[str]) -> None:
    cfg = BrokerConfig(broker_id=0, log_dirs=os.path.join(str(tmp_path), "logs"), port=0, data_port=-1,
                       metrics_port=-1)
    broker = Broker(cfg)
    await broker.start()
    rm = broker.replica_manager
    states = [broker_pb2.LeaderAndIsrPartitionState(topic="big", partition=p, leader=0, leader_epoch=1, isr=[0],
                                                    replicas=[0], partition_epoch=1) for p in range(PARTITIONS)]
    apply = asyncio.create_task(rm.apply_leader_and_isr(states, {}, []))
    try:
        await until(lambda: len(rm.partitions) >= 100 or apply.done(), 120, "the apply under way")
        assert not apply.done(), "the apply finished before the stop: raise PARTITIONS"
    finally:
        await broker.stop(0)
    failed = await asyncio.wait_for(apply, 60)  # before: LogClosedError from a chunk applied to closed logs
    applied = len(rm.partitions)
    assert 100 <= applied < PARTITIONS
    assert len(failed) == PARTITIONS - applied
    assert set(failed.values()) == {errors.Code.NOT_LEADER_OR_FOLLOWER}
