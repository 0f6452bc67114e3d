"""The follower fetcher's truncation driver when the log cut fails (pure: a real ReplicationState, fake log and leader)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gregor.broker.fetcher_state import FollowerFetchState
from gregor.broker.replica_fetcher import ReplicaFetcher
from gregor.broker.replication_state import FetchMode, ReplicationState


class CutFailsPartition:
    """A follower whose log cannot be cut: its ReplicationState decides truncation is complete, the disk fails."""

    key = ("t", 0)
    topic, partition = "t", 0
    is_leader = False
    leader_id, leader_epoch = 1, 5

    def __init__(self) -> None:
        self.state = ReplicationState(2, 1_000, "t", 0)
        assert self.state.on_leader_and_isr(1, 5, (1, 2), [1, 2], 10, 12, 0, 0).applied
        self.log = SimpleNamespace(latest_epoch=lambda: 4)

    def truncation_query(self) -> int:
        return 4

    def restart_truncation(self) -> None:  # Partition.restart_truncation
        self.state.restart_truncation()

    def follows(self, leader_id: int, leader_epoch: int) -> bool:  # Partition.follows
        return self.state.is_current_follower(leader_id, leader_epoch)

    def on_truncation_point(self, asked_epoch: int, leader_epoch: int, end_offset: int) -> bool:
        effect, completed = self.state.on_truncation_point(leader_epoch, end_offset, [(4, 0)], 12)
        assert completed and effect.offset == 8
        raise OSError("No space left on device")  # the TruncateLog effect fails on the disk


class Leader:
    async def OffsetForLeaderEpoch(self, request: object, timeout: float) -> SimpleNamespace:
        return SimpleNamespace(leader_epoch=4, end_offset=8)


def test_a_failed_log_cut_leaves_the_partition_truncating_not_fetching_from_the_uncut_leo() -> None:
    async def run() -> tuple[FetchMode, float, float]:
        p = CutFailsPartition()
        rm = SimpleNamespace(partitions={p.key: p}, config=SimpleNamespace(broker_id=2))
        fetcher = object.__new__(ReplicaFetcher)  # no task: drive one truncation by hand
        fetcher.leader_id = 1
        fetcher.state = FollowerFetchState.for_lag_time(30_000)
        st = fetcher.state.add(p.key, leader_epoch=5)
        loop = asyncio.get_running_loop()
        await fetcher._truncate_guarded(rm, Leader(), p.key, st, p, loop)  # type: ignore[arg-type]
        return p.state.fetch_mode, st.backoff_until, loop.time()

    mode, backoff_until, now = asyncio.run(run())
    assert mode is FetchMode.TRUNCATING  # fetching now would start at the divergent LEO 12, not 8
    assert backoff_until > now
