"""Leader-side ISR maintenance on a cluster-mode broker (seed 000).

isr-expiration runs every replica.lag.time.max.ms/2 and shrinks the ISR of led
partitions whose followers fell behind; follower fetches expand it. Each change
is written to `brokers/topics/<t>/partitions/<p>/state` with a compare-and-swap
on the key's mod_revision (ZooKeeper's zkVersion), applied in memory only once
written, recorded, and propagated every 2.5 s as `isr_change_notification/`
entries (after 5 s of quiet, or at most 60 s late) for the controller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client import Counter

from gregor.broker.limits import ISR_WRITE_ATTEMPTS
from gregor.common.clock import now_ms
from gregor.common.etcd import EtcdClient, EtcdError
from gregor.common.etcd_layout import IsrChangeNotificationZNode, PartitionStateZNode
from gregor.common.isr import ISR_CHANGE_PROPAGATION_CHECK_INTERVAL_MS, IsrChangePropagation, isr_expiration_interval_ms

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replication_state import ProposeIsr
    from gregor.broker.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

ISR_SHRINKS = Counter("gregor_broker_isr_shrinks_total", "ISR shrinks written by this broker as leader")
ISR_EXPANDS = Counter("gregor_broker_isr_expands_total", "ISR expansions written by this broker as leader")
FAILED_ISR_UPDATES = Counter("gregor_broker_failed_isr_updates_total",
                             "ISR writes given up (leader epoch moved or etcd unavailable)")


def isr_after_proposal(stored_leader: int, stored_leader_epoch: int, stored_isr: list[int], broker_id: int,
                       proposal: "ProposeIsr") -> list[int] | None:
    """The ISR to compare-and-swap into the stored partition state for a leader's proposal (AlterIsr's rule).

    None when the stored state says broker_id no longer leads at the proposal's leader epoch (give up);
    otherwise the stored ISR without `remove`, then `add` in order. IsrManager and the simulation (tests/sim)
    both decide the write with this.
    """
    if stored_leader != broker_id or stored_leader_epoch != proposal.leader_epoch:
        return None
    return [r for r in stored_isr if r not in proposal.remove] + sorted(r for r in proposal.add if r not in stored_isr)


class IsrManager:
    """ISR shrink/expand writes and their propagation. Concurrency: event loop; one write per partition at a time."""

    def __init__(self, replica_manager: "ReplicaManager", etcd: EtcdClient, broker_id: int,
                 replica_lag_time_max_ms: int) -> None:
        self.replicas = replica_manager
        self.etcd = etcd
        self.broker_id = broker_id
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        # Kafka starts lastIsrPropagationMs at startup, so the first change also waits out the 5 s of quiet.
        self.propagation = IsrChangePropagation(last_propagation_ms=now_ms())
        self._tasks: list[asyncio.Task[None]] = []
        self._writes: set[asyncio.Task[None]] = set()
        self._seq = 0

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._every(isr_expiration_interval_ms(self.replica_lag_time_max_ms),
                                                       self.maybe_shrink_isr), name="isr-expiration"),
                       asyncio.create_task(self._every(ISR_CHANGE_PROPAGATION_CHECK_INTERVAL_MS,
                                                       self.maybe_propagate_isr_changes),
                                           name="isr-change-propagation")]

    async def stop(self) -> None:
        for t in [*self._tasks, *self._writes]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._writes, return_exceptions=True)
        self._tasks = []

    async def _every(self, interval_ms: int, body: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(max(interval_ms, 10) / 1000.0)
            try:
                await body()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed round is retried next round; the task must not die
                log.exception("periodic ISR task failed")

    # -- shrink / expand -----------------------------------------------------------
    async def maybe_shrink_isr(self) -> None:
        """isr-expiration: each led partition's ReplicationState proposes dropping followers that fell behind."""
        now = now_ms()
        for p in list(self.replicas.partitions.values()):
            if p.is_leader:
                self.replicas.run_effects(p, p.on_tick(now))

    def write_isr(self, p: "Partition", proposal: "ProposeIsr") -> None:
        """Carry out a ProposeIsr (the ReplicationState allows one in flight per partition)."""
        task = asyncio.create_task(self._write_isr(p, proposal))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def _state_key(self, p: "Partition") -> bytes:
        return PartitionStateZNode.key(self.etcd, p.topic, p.partition)

    async def _write_isr(self, p: "Partition", proposal: "ProposeIsr") -> None:
        """CAS the change into the partition state; give up once the leader epoch moved; report the result."""
        leader_epoch = proposal.leader_epoch
        result: tuple[list[int], int] | None = None
        unknown = False  # etcd failed: the compare-and-swap may have landed
        try:
            key = self._state_key(p)
            for _ in range(ISR_WRITE_ATTEMPTS):
                kv = await self.etcd.get(key)
                if kv is None:
                    break
                state = PartitionStateZNode.decode(kv.value, kv.version)
                if not p.is_leader or p.leader_epoch != leader_epoch:
                    break
                old = list(state.isr)
                new = isr_after_proposal(state.leader, state.leader_epoch, old, self.broker_id, proposal)
                if new is None:
                    break
                if new == old:
                    result = (new, state.partition_epoch)
                    break
                if await self.etcd.cas(key, PartitionStateZNode.encode(state.with_isr(new)), kv.mod_revision):
                    # The put bumped the key's etcd version by one.
                    result = (new, PartitionStateZNode.partition_epoch(kv.version + 1))
                    if p.is_leader and p.leader_epoch == leader_epoch:
                        (ISR_SHRINKS if len(new) < len(old) else ISR_EXPANDS).inc()
                        self.propagation.record_isr_change(p.topic, p.partition, now_ms())
                        log.info("%s-%d: ISR %s -> %s (leader epoch %d)", p.topic, p.partition, old, new,
                                 leader_epoch)
                    break
            if result is None:
                FAILED_ISR_UPDATES.inc()
                log.info("%s-%d: ISR update given up (leader epoch %d moved or state gone)", p.topic, p.partition,
                         leader_epoch)
        except EtcdError as exc:
            FAILED_ISR_UPDATES.inc()
            unknown = True
            log.warning("%s-%d: ISR update failed: %s", p.topic, p.partition, exc)
        finally:
            isr, version = result if result is not None else (None, -1)
            # The HW may advance once a lagging follower left the ISR (seed 000).
            self.replicas.run_effects(p, p.on_isr_write_result(leader_epoch, isr, version, outcome_unknown=unknown))

    # -- propagation -----------------------------------------------------------------
    async def maybe_propagate_isr_changes(self) -> None:
        """isr-change-propagation: publish batched changes as one notification entry."""
        changed = self.propagation.maybe_propagate(now_ms())
        if not changed:
            return
        self._seq += 1
        key = IsrChangeNotificationZNode.key(self.etcd, time.time_ns(), self.broker_id, self._seq)
        try:
            await self.etcd.put(key, IsrChangeNotificationZNode.encode(changed))
        except EtcdError as exc:
            log.warning("ISR change propagation failed, retrying next round: %s", exc)
            for t, p in changed:
                self.propagation.record_isr_change(t, p, now_ms())
