"""A LeaderAndIsr's new leaders get their leader epoch written into leader-epoch-checkpoint by a worker thread
(Kafka's makeLeader assigns it), not by their first append on the event loop (an fsync per partition: issue 24)."""

from __future__ import annotations

import asyncio
import os
import threading
from types import SimpleNamespace
from typing import Any

from gregor.broker.log_manager import LogManager
from gregor.broker.replica_manager import ReplicaManager
from gregor.common.config import BrokerConfig
from tests.helpers.batches import make_batch
from tests.helpers.wait import until


def _state(partition: int, leader: int, epoch: int) -> Any:
    return SimpleNamespace(topic="t", partition=partition, leader=leader, leader_epoch=epoch, isr=[0, 1],
                           replicas=[0, 1], partition_epoch=epoch, topic_id=b"")


async def test_new_leaders_epochs_are_written_off_the_loop_before_the_first_append(tmp_path, monkeypatch) -> None:
    config = BrokerConfig(broker_id=0, log_dirs=str(tmp_path))
    rm = ReplicaManager(config, LogManager(config))
    writers: list[str] = []
    real = ReplicaManager.assign_leader_epochs

    def recording(self: ReplicaManager) -> None:
        writers.append(threading.current_thread().name)
        real(self)

    monkeypatch.setattr(ReplicaManager, "assign_leader_epochs", recording)
    # Partitions 0-2 led here at epoch 3, partition 3 followed (broker 1 leads).
    await rm.apply_leader_and_isr([_state(p, 0, 3) for p in range(3)] + [_state(3, 1, 3)], {"t": {}})
    await until(lambda: all(rm.partitions[("t", p)].log.epoch_entries() == [(3, 0)] for p in range(3)), 10,
                "every new leader's epoch 3 assigned at offset 0 before any append")
    assert writers and "MainThread" not in writers
    for p in range(3):
        with open(os.path.join(rm.partitions[("t", p)].log.dir, "leader-epoch-checkpoint")) as f:
            assert f.read().split() == ["0", "1", "3", "0"]
    assert rm.partitions[("t", 3)].log.epoch_entries() == [], "a follower learns its epochs from the leader's data"

    # An append after it keeps the one entry; a leader that moved away before the writer ran gets none.
    info, _ = rm.partitions[("t", 0)].append_records_to_leader(make_batch([b"a"]), 1)
    assert info.first_offset == 0 and rm.partitions[("t", 0)].log.epoch_entries() == [(3, 0)]
    rm._epoch_starts[("t", 1)] = (rm.partitions[("t", 1)], 4, 0)  # queued for epoch 4 ...
    await rm.apply_leader_and_isr([_state(1, 1, 5)], {"t": {}})  # ... but broker 1 leads at epoch 5 first
    await until(lambda: not rm._epoch_starts, 10, "the writer drained its queue")
    await asyncio.sleep(0)
    assert rm.partitions[("t", 1)].log.epoch_entries() == [(3, 0)]
    rm.log_manager.close()
