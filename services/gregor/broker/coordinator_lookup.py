"""Broker-side FindCoordinator: which group coordinator instance owns a group (seed 003, 6.5 "find the coordinator").

In Kafka every broker is a coordinator and any broker answers FindCoordinator with
the leader of `__consumer_offsets` partition `partitionFor(group.id)`. In Gregor the
coordinators are separate processes, so a broker answers from etcd instead: it
watches `coordinators/` — the lease-bound registrations `coordinators/ids/<id>` (JSON
{coordinator_id, host, port}) and claims `coordinators/partitions/<p>` (the holder's
id) — and names, for the group's partition p:

1. the live instance holding the claim on p (it serves p now, or is loading it), else
2. `coordinator_ownership.desired_owner(p, live ids)` — the instance that will claim p next
   (the coordinators' own assignment rule), so after a coordinator dies the answer
   moves to a survivor as soon as the dead one's lease expires (its registration
   and claims vanish with it), not only after the survivor's claim lands.

A group asked of an instance that is still claiming or loading p gets
COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR from it, and the client asks again.
No live instance (or no `__consumer_offsets` yet) is COORDINATOR_NOT_AVAILABLE
(retriable), as is a standalone broker, which has no coordinators at all.

Concurrency: event-loop owned; one watch task keeps `live` and `claims` current.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gregor.broker.limits import (
    LOOKUP_SYNC_WAIT_S as SYNC_WAIT_S,
    LOOKUP_RETRY_S as RETRY_S,
)
from gregor.common import errors
from gregor.common.aio import wait_for
from gregor.common.etcd import EtcdClient, EtcdError, WatchTask, follow_prefix
from gregor.common.etcd_layout import CoordinatorKey, CoordinatorsZNode, TopicZNode
from gregor.common.coordinator_ownership import (
    OFFSETS_TOPIC, TXN_TOPIC, apply_coordinator_key, desired_owner, partition_for,
)

log = logging.getLogger(__name__)

Code = errors.Code
KEY_TYPE_GROUP = 0  # Kafka's FindCoordinatorRequest key_type: 0 GROUP, 1 TRANSACTION
KEY_TYPE_TRANSACTION = 1


class CoordinatorLookup:
    """The etcd view of the coordinator instances and their claimed __consumer_offsets partitions."""

    def __init__(self, etcd: EtcdClient) -> None:
        self.etcd = etcd
        self.live: dict[int, dict[str, Any]] = {}  # coordinator id -> registration
        self.claims: dict[int, int] = {}  # offsets partition -> coordinator id holding its claim
        self.num_partitions = 0  # of __consumer_offsets; 0 until the topic exists in etcd
        self.txn_claims: dict[int, int] = {}  # __transaction_state partition -> coordinator id
        self.num_txn_partitions = 0
        self._synced = asyncio.Event()
        self._watcher = WatchTask("coordinator-lookup")

    def start(self) -> None:
        """Start watching (returns at once: the broker never waits on coordinators to serve)."""
        self._watcher.start(self._watch)

    async def stop(self) -> None:
        await self._watcher.stop()

    async def _watch(self) -> None:
        def reset() -> None:
            self.live, self.claims, self.txn_claims = {}, {}, {}

        await follow_prefix(self.etcd, CoordinatorsZNode.prefix(self.etcd), reset=reset,
                            apply=lambda key, value, _rev: self._apply(CoordinatorsZNode.parse(self.etcd, key), value),
                            loaded=lambda _rev: self._synced.set(), what="coordinator lookup", retry_s=RETRY_S)

    def _apply(self, key: CoordinatorKey | None, value: bytes | None) -> None:
        """One `coordinators/{ids,partitions,txn-partitions}/<n>` key (value None: deleted, e.g. its lease expired)."""
        try:
            apply_coordinator_key(self.live, self.claims, key, value, self.txn_claims)
        except ValueError as exc:
            log.warning("coordinator lookup: ignoring malformed %s: %s", key, exc)

    async def _partitions(self, topic: str = OFFSETS_TOPIC) -> int:
        """Partition count of __consumer_offsets (or __transaction_state), read once from etcd (never changes)."""
        known = self.num_partitions if topic == OFFSETS_TOPIC else self.num_txn_partitions
        if known == 0:
            kv = await self.etcd.get(TopicZNode.key(self.etcd, topic))
            if kv is not None:
                known = TopicZNode.partition_count(kv.value)
                if topic == OFFSETS_TOPIC:
                    self.num_partitions = known
                else:
                    self.num_txn_partitions = known
        return known

    async def find(self, group_id: str, key_type: int = KEY_TYPE_GROUP) -> tuple[int, str, int, int]:
        """(coordinator id, host, port, offsets partition) for group_id, or a typed error."""
        if key_type not in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
            raise errors.error_for(Code.INVALID_REQUEST,
                                   f"FindCoordinator key_type {key_type} is not supported: 0 (GROUP) or 1 (TRANSACTION)")
        if not group_id:
            raise errors.error_for(Code.INVALID_GROUP_ID if key_type == KEY_TYPE_GROUP else Code.INVALID_REQUEST,
                                   "group id must not be empty" if key_type == KEY_TYPE_GROUP
                                   else "transactional id must not be empty")
        topic, claims = (OFFSETS_TOPIC, self.claims) if key_type == KEY_TYPE_GROUP else (TXN_TOPIC, self.txn_claims)
        if not self._synced.is_set():
            try:
                await wait_for(self._synced.wait(), SYNC_WAIT_S)
            except asyncio.TimeoutError:
                raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                       "this broker has not read the coordinators from etcd yet") from None
        try:
            n = await self._partitions(topic)
        except (EtcdError, ValueError, KeyError) as exc:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE, f"cannot read {topic} from etcd: {exc}")
        if n == 0 and key_type == KEY_TYPE_TRANSACTION and self.live:
            # Kafka creates __transaction_state on the first transactional FindCoordinator; here the
            # coordinator named creates it on the first call it gets, answering LOAD_IN_PROGRESS meanwhile.
            owner = desired_owner(0, list(self.live))
            assert owner is not None
            return owner, str(self.live[owner]["host"]), int(self.live[owner]["port"]), -1
        if n == 0:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                   f"{topic} does not exist yet: no coordinator has started")
        p = partition_for(group_id, n)
        owner = claims.get(p)
        if owner not in self.live:
            owner = desired_owner(p, list(self.live))
        if owner is None:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE,
                                   f"no group coordinator is live (group {group_id}, offsets partition {p})")
        info = self.live[owner]
        return owner, str(info["host"]), int(info["port"]), p

