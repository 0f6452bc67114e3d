"""A replica in an offline log dir answers LeaderAndIsr with KAFKA_STORAGE_ERROR and is left as it is (Kafka's
offline replica): the controller learns from the answer that it is offline. The same replica applies LeaderAndIsr
again once its dir is back. A real ReplicaManager over native logs in two log dirs; the dir is taken offline the
way a failed write does (LogDirHealth.failed_dir), and the change is reported to LogDirHealth.on_change."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from gregor.broker.log_manager import LogManager
from gregor.broker.replica_manager import ReplicaManager
from gregor.common import errors
from gregor.common.config import BrokerConfig


@dataclass
class State:
    topic: str
    partition: int
    leader: int = 0
    leader_epoch: int = 1
    isr: tuple[int, ...] = (0, 1)
    replicas: tuple[int, ...] = (0, 1)
    partition_epoch: int = 1


def test_leader_and_isr_for_a_replica_in_an_offline_dir_answers_storage_error(tmp_path: Path) -> None:
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    config = BrokerConfig(broker_id=0, log_dirs=",".join(dirs))
    manager = LogManager(config)
    try:
        rm = ReplicaManager(config, manager)
        assert rm.become_leader_or_follower([State("t", 0), State("t", 1)], {"t": {}}) == {}
        in_a = [k for k, p in rm.partitions.items() if os.path.dirname(p.log.dir) == os.path.normpath(dirs[0])]
        in_b = [k for k in rm.partitions if k not in in_a]
        assert len(in_a) == len(in_b) == 1  # new logs go to the dir with the fewest
        changes: list[tuple[str, bool]] = []
        manager.health.on_change = lambda d, online: changes.append((d, online))
        manager.health.failed_dir(dirs[0], OSError(errno.ENOSPC, "No space left on device"), "t-0")
        manager.health.failed_dir(dirs[0], OSError(errno.ENOSPC, "No space left on device"), "t-0")  # told once
        assert changes == [(os.path.normpath(dirs[0]), False)]
        # A new leader epoch, leader moved to broker 1: the offline replica is not touched.
        failed = rm.become_leader_or_follower([State("t", k[1], leader=1, leader_epoch=2) for k in in_a + in_b],
                                              {"t": {}})
        assert failed == {in_a[0]: errors.Code.KAFKA_STORAGE_ERROR}
        assert rm.partitions[in_a[0]].state.leader_epoch == 1 and rm.partitions[in_a[0]].state.is_leader
        assert rm.partitions[in_b[0]].state.leader_epoch == 2 and not rm.partitions[in_b[0]].state.is_leader
        manager.health.online(os.path.normpath(dirs[0]))
        assert changes[-1] == (os.path.normpath(dirs[0]), True)
        assert rm.become_leader_or_follower([State("t", in_a[0][1], leader=1, leader_epoch=2)], {"t": {}}) == {}
        assert rm.partitions[in_a[0]].state.leader_epoch == 2 and not rm.partitions[in_a[0]].state.is_leader
    finally:
        manager.close()


def test_new_logs_go_to_an_online_dir(tmp_path: Path) -> None:
    """Kafka places a new log in a live dir only: one created in the offline dir would be offline at once, and
    its LeaderAndIsr answer (the first one, applied) would not tell the controller."""
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    config = BrokerConfig(broker_id=0, log_dirs=",".join(dirs))
    manager = LogManager(config)
    try:
        rm = ReplicaManager(config, manager)
        manager.health.failed_dir(dirs[0], OSError(errno.ENOSPC, "No space left on device"), "t-0")
        assert rm.become_leader_or_follower([State("t", p) for p in range(3)], {"t": {}}) == {}
        assert sorted(os.listdir(dirs[1])) == ["t-0", "t-1", "t-2"]
        assert not [n for n in os.listdir(dirs[0]) if n.startswith("t-")]
    finally:
        manager.close()
