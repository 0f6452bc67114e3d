"""The member side of a consumer group (Kafka's ConsumerCoordinator, seed 003 6.5): find the coordinator,
JoinGroup/SyncGroup (the leader member runs the assignor), heartbeats, rebalance listener calls, commits.

Rebalance protocols (seed 003, 6.5.2):

- eager: before joining, a member commits, calls on_partitions_revoked(everything) and stops
  fetching; after SyncGroup it calls on_partitions_assigned(its whole new assignment).
- cooperative (every configured assignor supports it, e.g. cooperative-sticky): a member keeps
  fetching what it owns while it rejoins; after SyncGroup it revokes only what it lost
  (on_partitions_revoked(lost)), calls on_partitions_assigned(only what is new) and, if it
  revoked anything, rejoins at once so the follow-up rebalance hands those partitions over.

A member whose generation is gone (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID,
or it left after max.poll.interval.ms without poll()) calls on_partitions_lost: it cannot
commit for them any more, someone else may own them already.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence

import grpc

from gregor.client.assignors import (
    COOPERATIVE, Assignor, MemberSubscription, diff, make_assignors, rebalance_protocol,
)
from gregor.client.config import ConfigError
from gregor.client.metadata import call_error
from gregor.client.throttles import Throttles
from gregor.common import consumer_protocol as cp
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2, coordinator_pb2, coordinator_pb2_grpc

if TYPE_CHECKING:
    from gregor.client.subscription_state import SubscriptionState
    from gregor.client.metadata import ClusterMetadata

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Code = errors.Code

# Errors after which the coordinator we talk to is the wrong one or gone: find it again.
COORDINATOR_GONE = frozenset({Code.NOT_COORDINATOR, Code.COORDINATOR_NOT_AVAILABLE, Code.NETWORK_EXCEPTION,
                              Code.REQUEST_TIMED_OUT, Code.BROKER_NOT_AVAILABLE})
RETRY_COORDINATOR = COORDINATOR_GONE | {Code.COORDINATOR_LOAD_IN_PROGRESS}
# FindCoordinator answers no retry can change: a bad group id, or the authorizer refusing the group (Kafka's
# GroupAuthorizationException is fatal to the consumer).
FATAL_FIND_COORDINATOR = frozenset({Code.INVALID_GROUP_ID, Code.INVALID_REQUEST, Code.GROUP_AUTHORIZATION_FAILED,
                                    Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})
# Errors that end this member's generation: its partitions are lost.
GENERATION_GONE = frozenset({Code.UNKNOWN_MEMBER_ID, Code.ILLEGAL_GENERATION, Code.FENCED_INSTANCE_ID})


class ConsumerRebalanceListener:
    """Kafka's ConsumerRebalanceListener. Methods may be plain functions or coroutines.

    on_partitions_lost defaults to on_partitions_revoked, as in Kafka. Consumer: listeners run
    on the consumer's event loop and may await its methods (commit_sync, position, seek, committed).
    SyncConsumer: they run on the thread that called poll() (or close()/unsubscribe()), as
    Kafka's, and may call the blocking methods. on_partitions_revoked runs while the partitions
    are still assigned (commit_sync() with no arguments commits them); poll(), close() and
    unsubscribe() may not be called from a listener.
    """

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> Any:
        pass

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> Any:
        pass

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> Any:
        return self.on_partitions_revoked(partitions)


def grouped(tps: Iterable[TopicPartition]) -> cp.TopicPartitions:
    """[(t, p), ...] -> [(t, [p, ...]), ...] as the consumer protocol carries them."""
    out: dict[str, list[int]] = {}
    for t, p in sorted(tps):
        out.setdefault(t, []).append(p)
    return list(out.items())


def flat(tps: cp.TopicPartitions) -> list[TopicPartition]:
    return sorted((t, p) for t, ps in tps for p in ps)


async def find_coordinator(metadata: "ClusterMetadata", group_id: str, overrides: Sequence[str],
                           timeout_s: float) -> tuple[str, int]:
    """One FindCoordinator round (Kafka's lookupCoordinator): (host:port, coordinator id) of group_id's coordinator.

    Asks the known brokers, then bootstrap.servers (BrokerService.FindCoordinator, answered
    from etcd), then the Gregor-only `coordinator.bootstrap.servers` override, if set, directly
    (GroupCoordinatorService.FindCoordinator); the first answer wins. Raises the most telling
    error otherwise: a broker's COORDINATOR_NOT_AVAILABLE over a transport failure; the error
    carries `unimplemented=True` when no one asked serves FindCoordinator (pre-FindCoordinator brokers).
    """
    request = coordinator_pb2.FindCoordinatorRequest(group_id=group_id, key_type=0)  # key_type GROUP
    brokers = list(dict.fromkeys([b.address for b in metadata.brokers.values()] + metadata.bootstrap))
    targets = [(a, False) for a in brokers] + [(a, True) for a in dict.fromkeys(overrides) if a not in brokers]
    best: Optional[errors.GregorError] = None
    unimplemented = 0
    for address, direct in targets:
        ch = metadata.channel(address)
        stub: Any = coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch) if direct else \
            broker_pb2_grpc.BrokerServiceStub(ch)
        try:
            resp = await stub.FindCoordinator(request, timeout=timeout_s)
        except (grpc.RpcError, asyncio.TimeoutError) as exc:
            err = call_error(exc)
            if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                unimplemented += 1
            if err.code in FATAL_FIND_COORDINATOR:
                raise err from None
            if best is None or (err.code == Code.COORDINATOR_NOT_AVAILABLE
                                and best.code != Code.COORDINATOR_NOT_AVAILABLE):
                best = err
            continue
        return f"{resp.host}:{resp.port}", int(resp.coordinator_id)
    out: errors.GregorError = best or errors.error_for(Code.COORDINATOR_NOT_AVAILABLE, "nowhere to ask FindCoordinator")
    out.unimplemented = unimplemented == len(targets)  # type: ignore[attr-defined]
    raise out




class GroupMember:
    """Event-loop owned: one consumer's membership of its group; driven by Consumer.poll() plus a heartbeat task.

    State: member id, generation, what it owns; `need_rejoin` is set by heartbeats
    (REBALANCE_IN_PROGRESS), subscription changes and cooperative revocations, and the
    next poll() runs the rebalance as a task (poll never waits past its timeout for it).
    """

    def __init__(self, subscriptions: "SubscriptionState", metadata: "ClusterMetadata",
                 cfg: Mapping[str, Any]) -> None:
        # What it is given of its consumer: the assignment and positions (changed only through
        # SubscriptionState's public methods) and the cluster metadata; nothing else of the Consumer.
        self.subscriptions = subscriptions
        self.metadata = metadata
        self.group_id = str(cfg["group.id"])
        self.instance_id = str(cfg["group.instance.id"])
        self.client_id = metadata.client_id  # JoinGroup names it (every call carries it: ClusterMetadata)
        self.assignors: list[Assignor] = make_assignors(cfg["partition.assignment.strategy"])
        self.protocol = rebalance_protocol(self.assignors)
        self.session_timeout_ms = int(cfg["session.timeout.ms"])
        self.heartbeat_interval_s = int(cfg["heartbeat.interval.ms"]) / 1000
        self.max_poll_interval_ms = int(cfg["max.poll.interval.ms"])
        self.request_timeout_s = int(cfg["request.timeout.ms"]) / 1000
        self.api_timeout_s = int(cfg["default.api.timeout.ms"]) / 1000
        self.backoff_s = int(cfg["retry.backoff.ms"]) / 1000
        self.auto_commit = bool(cfg["enable.auto.commit"])
        self.auto_commit_interval_s = int(cfg["auto.commit.interval.ms"]) / 1000
        self.pattern_refresh_s = int(cfg["metadata.max.age.ms"]) / 1000
        self.throttles = Throttles()  # coordinators that answered with throttle_time_ms (KIP-219)
        self.coordinator_bootstrap = [a.strip() for a in str(cfg["coordinator.bootstrap.servers"]).split(",")
                                      if a.strip()]
        if self.heartbeat_interval_s * 1000 >= self.session_timeout_ms:
            raise ConfigError("heartbeat.interval.ms must be lower than session.timeout.ms")
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.protocol_name = ""
        self.owned: list[TopicPartition] = []
        self.previous: list[TopicPartition] = []  # what we owned before an eager revocation (sticky input)
        self.topics: set[str] = set()  # current subscription (resolved pattern)
        self.pattern: Optional[re.Pattern[str]] = None
        self.listener: ConsumerRebalanceListener = ConsumerRebalanceListener()
        self.subscribed = False
        self.need_rejoin = False
        self.lost_pending = False
        self.coordinator: Optional[str] = None  # host:port
        self._join_task: Optional[asyncio.Task[None]] = None
        self._hb_task: Optional[asyncio.Task[None]] = None
        self._commit_task: Optional[asyncio.Task[None]] = None
        # Every OffsetCommit of this member goes out after the previous one finished (Kafka sends
        # commits in call order): an older commit never lands after a newer one.
        self._commit_tail: Optional["asyncio.Future[None]"] = None
        self._listener_task: Optional["asyncio.Future[None]"] = None  # the listener call in progress
        self._listener_error: Optional[BaseException] = None
        self._last_poll = time.monotonic()
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_s
        self._next_pattern_check = 0.0
        self._last_committed: dict[TopicPartition, int] = {}
        self._closed = False
        self._warned_no_coordinator = False
        self._join_prepared = False
        self.rebalance_count = 0
        # The leader's partition counts of the subscribed topics when it last assigned (Kafka's
        # assignmentSnapshot): metadata that differs later (a topic deleted, created, grown) means rejoin.
        self._assignment_snapshot: Optional[tuple[list[str], dict[str, int]]] = None

    # ------------------------------------------------------------ subscription
    def subscribe(self, topics: Sequence[str] | None, pattern: Optional[re.Pattern[str]],
                  listener: Optional[ConsumerRebalanceListener]) -> None:
        self.pattern = pattern
        self.topics = set(topics or [])
        self.listener = listener or self.listener
        self.subscribed = True
        self.need_rejoin = True
        self._next_pattern_check = 0.0
        self.metadata.add_topics(*self.topics)
        if self._hb_task is None:
            self._hb_task = asyncio.ensure_future(self._heartbeat_loop())

    async def unsubscribe(self) -> None:
        await self._cancel_join()
        await self._revoke_all(leaving=True)
        await self.leave_group("the consumer unsubscribed")
        self.subscribed = False
        self.topics = set()
        self.pattern = None

    # ------------------------------------------------------------ poll hook
    async def on_poll(self, deadline: float) -> None:
        """Called at the start of every poll(): liveness, auto-commit, pattern check, rebalance (up to deadline)."""
        self._last_poll = time.monotonic()
        if self._listener_error is not None:
            err, self._listener_error = self._listener_error, None
            raise err
        self.maybe_auto_commit()
        if not self.subscribed:
            return
        if self.pattern is not None and time.monotonic() >= self._next_pattern_check:
            await self._refresh_pattern()
        if self.lost_pending and self._join_task is None:
            await self._lose_all()
        self._maybe_metadata_changed()
        if self.need_rejoin and self._join_task is None:
            self._join_task = asyncio.ensure_future(self._rebalance())
        if self._join_task is not None:
            remaining = deadline - time.monotonic()
            if remaining > 0:
                await asyncio.wait({self._join_task}, timeout=remaining)
            await self.listener_settled()  # never return records while a listener still runs
            if self._join_task is not None and self._join_task.done():
                task, self._join_task = self._join_task, None
                task.result()  # a fatal join error (e.g. INCONSISTENT_GROUP_PROTOCOL) surfaces from poll()

    def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """Partition count per topic as the metadata knows it; topics it does not know are left out."""
        counts = {}
        for t in topics:
            n = len(self.metadata.partitions_for(t))
            if n:
                counts[t] = n
        return counts

    def _maybe_metadata_changed(self) -> bool:
        """Kafka's ConsumerCoordinator.rejoinNeededOrPending: the leader rejoins when the metadata of the
        subscribed topics no longer matches what it assigned (the coordinator also rebalances on the
        etcd change; this catches what it cannot see, e.g. metadata the leader refreshed after a
        fetch error on a deleted topic)."""
        if (self._assignment_snapshot is None or self.need_rejoin or self._join_task is not None
                or self.generation < 0 or self.leader != self.member_id):
            return False
        topics, counts = self._assignment_snapshot
        now = self._partition_counts(topics)
        if now == counts:
            return False
        log.info("group %s: subscribed topics' metadata changed since the assignment (%s -> %s): rejoining",
                 self.group_id, counts, now)
        self._assignment_snapshot = None
        self.need_rejoin = True
        return True

    @property
    def rebalancing(self) -> bool:
        return self._join_task is not None or (self.subscribed and self.need_rejoin)

    def check_not_in_listener(self, what: str) -> None:
        task = self._listener_task
        if task is not None and not task.done() and asyncio.current_task() is task:
            raise errors.error_for(Code.INVALID_REQUEST, f"{what} may not be called from a rebalance listener")

    async def listener_settled(self) -> None:
        """Wait until no listener call is in progress (one started is always finished, whatever its deadline)."""
        while self._listener_task is not None and not self._listener_task.done():
            await asyncio.wait({self._listener_task})

    async def _cancel_join(self) -> None:
        await self.listener_settled()  # a listener call in progress finishes: it is never cut in half
        if self._join_task is not None:
            self._join_task.cancel()
            await asyncio.gather(self._join_task, return_exceptions=True)
            self._join_task = None

    # ------------------------------------------------------------ coordinator
    async def ensure_coordinator(self, deadline: float) -> str:
        """FindCoordinator through any broker (coordinator.bootstrap.servers as a fallback), retried until deadline."""
        while self.coordinator is None:
            try:
                self.coordinator, cid = await find_coordinator(
                    self.metadata, self.group_id, self.coordinator_bootstrap, self.request_timeout_s)
                log.info("group %s: coordinator %s at %s", self.group_id, cid, self.coordinator)
                break
            except errors.GregorError as err:
                if err.code in FATAL_FIND_COORDINATOR:
                    raise
                if getattr(err, "unimplemented", False) and not self._warned_no_coordinator:
                    self._warned_no_coordinator = True
                    log.warning("group %s: no broker serves FindCoordinator (%s); set coordinator.bootstrap.servers "
                                "to a group coordinator", self.group_id, err.message)
                if time.monotonic() >= deadline:
                    out = errors.CoordinatorNotAvailableError(  # type: ignore[attr-defined]
                        f"no coordinator found for group {self.group_id!r}: {err.message}")
                    out.discovery_failed = True
                    raise out from None
            await asyncio.sleep(max(self.backoff_s, 0.2))
        return self.coordinator

    def coordinator_dead(self, why: str) -> None:
        if self.coordinator is not None:
            log.info("group %s: marking coordinator %s dead (%s)", self.group_id, self.coordinator, why)
        self.coordinator = None

    async def call(self, method: str, request: Any, *, timeout_s: Optional[float] = None,
                   deadline: Optional[float] = None) -> Any:
        """One coordinator RPC, rediscovering the coordinator and retrying on coordinator errors until deadline."""
        deadline = deadline if deadline is not None else time.monotonic() + self.api_timeout_s
        while True:
            address = await self.ensure_coordinator(deadline)
            stub = coordinator_pb2_grpc.GroupCoordinatorServiceStub(self.metadata.channel(address))
            await self.throttles.wait(address)  # KIP-219: a throttled coordinator gets nothing before its time
            try:
                resp = await getattr(stub, method)(request, timeout=timeout_s or self.request_timeout_s,
)
                self.throttles.record(address, resp.throttle_time_ms)
                return resp
            except (grpc.RpcError, asyncio.TimeoutError) as exc:
                err = call_error(exc)
            if err.code not in RETRY_COORDINATOR or time.monotonic() >= deadline:
                raise err
            if err.code in COORDINATOR_GONE:
                self.coordinator_dead(err.name)
            await asyncio.sleep(self.backoff_s)

    # ------------------------------------------------------------ rebalance
    async def _rebalance(self) -> None:
        """Kafka's joinGroupIfNeeded: prepare, JoinGroup, SyncGroup, complete; loops while a rejoin is needed."""
        while self.need_rejoin and self.subscribed and not self._closed:
            self.need_rejoin = False
            if self.lost_pending:
                await self._lose_all()
            if self.protocol != COOPERATIVE and not self._join_prepared:
                # Kafka's onJoinPrepare, once per rebalance however often JoinGroup is retried.
                await self._revoke_all(leaving=False)
                self._join_prepared = True
                await self.commits_drained()  # the old generation's commits land before the new one starts
            try:
                assignment = await self._join_and_sync()
            except errors.GregorError as err:
                self.need_rejoin = True
                if err.code in (Code.UNKNOWN_MEMBER_ID, Code.ILLEGAL_GENERATION):
                    self._reset_generation(err.code == Code.UNKNOWN_MEMBER_ID)
                elif err.code == Code.REBALANCE_IN_PROGRESS:
                    pass
                elif getattr(err, "discovery_failed", False):
                    raise  # no coordinator for default.api.timeout.ms: tell poll(); the next poll() tries again
                elif err.code in RETRY_COORDINATOR:
                    if err.code in COORDINATOR_GONE:
                        self.coordinator_dead(err.name)
                else:
                    raise  # FENCED_INSTANCE_ID, INCONSISTENT_GROUP_PROTOCOL, GROUP_MAX_SIZE_REACHED, ...
                await asyncio.sleep(self.backoff_s)
                continue
            self.rebalance_count += 1
            self._join_prepared = False
            await self._on_join_complete(assignment)

    async def _join_and_sync(self) -> list[TopicPartition]:
        deadline = time.monotonic() + max(self.api_timeout_s, self.max_poll_interval_ms / 1000 + 5)
        topics = sorted(self.topics)
        # sticky (eager) remembers what it owned before revoking (Kafka keeps it in userData);
        # cooperative-sticky reports what it owns now (nothing after an eager revocation, so a mixed,
        # eager group never withholds partitions waiting for a follow-up rebalance that would not come).
        sticky_owned = self.owned if self.protocol == COOPERATIVE else self.previous
        metadata = {
            "sticky": cp.Subscription(topics, owned_partitions=grouped(sticky_owned), generation_id=self.generation),
            "cooperative-sticky": cp.Subscription(topics, owned_partitions=grouped(self.owned),
                                                  generation_id=self.generation),
        }
        # range/roundrobin ignore ownership: their metadata is the topics alone, so a static member that
        # restarts with the same subscription presents the same metadata (no rebalance, KIP-345).
        encoded = {a.name: cp.encode_subscription(metadata.get(a.name, cp.Subscription(topics)))
                   for a in self.assignors}
        # JoinGroup waits for the whole group (up to the rebalance timeout = max.poll.interval.ms).
        join_timeout = self.max_poll_interval_ms / 1000 + 5
        while True:
            req = coordinator_pb2.JoinGroupRequest(
                group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=self.max_poll_interval_ms, member_id=self.member_id,
                group_instance_id=self.instance_id, protocol_type=cp.PROTOCOL_TYPE, client_id=self.client_id,
                protocols=[coordinator_pb2.GroupProtocol(name=a.name, metadata=encoded[a.name]) for a in self.assignors])
            resp = await self.call("JoinGroup", req, timeout_s=join_timeout, deadline=deadline)
            if resp.HasField("error") and resp.error.code == Code.MEMBER_ID_REQUIRED:
                self.member_id = resp.member_id  # KIP-394: the coordinator named us; join again with that id
                continue
            if resp.HasField("error") and resp.error.code != 0:
                raise errors.from_detail(resp.error)
            break
        self.member_id, self.generation = resp.member_id, resp.generation_id
        self.leader, self.protocol_name = resp.leader, resp.protocol_name
        assignments: list[coordinator_pb2.SyncGroupAssignment] = []
        if resp.leader == resp.member_id:
            plan = await self._perform_assignment(resp.protocol_name, resp.members)
            assignments = [coordinator_pb2.SyncGroupAssignment(
                member_id=m, assignment=cp.encode_assignment(cp.Assignment(grouped(tps)))) for m, tps in plan.items()]
        sync = await self.call("SyncGroup", coordinator_pb2.SyncGroupRequest(
            group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id, assignments=assignments),
            timeout_s=join_timeout, deadline=deadline)
        return flat(cp.decode_assignment(sync.assignment).partitions)

    async def _perform_assignment(self, protocol_name: str,
                                  members: Sequence[coordinator_pb2.JoinGroupMember]) -> dict[str, list[TopicPartition]]:
        """The leader's job (seed 003, 6.5.2): decode every subscription and run the chosen assignor."""
        assignor = next((a for a in self.assignors if a.name == protocol_name), None)
        if assignor is None:
            raise errors.InconsistentGroupProtocolError(  # type: ignore[attr-defined]
                f"the coordinator chose assignor {protocol_name!r}, which this member does not have")
        subs: dict[str, MemberSubscription] = {}
        for m in members:
            s = cp.decode_subscription(m.metadata)
            subs[m.member_id] = MemberSubscription(m.member_id, tuple(s.topics), tuple(flat(s.owned_partitions)),
                                                   s.generation_id, m.group_instance_id, s.user_data or b"")
        topics = sorted({t for s in subs.values() for t in s.topics})
        counts: dict[str, int] = {}
        if topics:
            try:
                await self.metadata.refresh(topics)
            except errors.GregorError as err:
                log.warning("group %s: metadata refresh for assignment failed: %s", self.group_id, err)
            counts = self._partition_counts(topics)
        self._assignment_snapshot = (topics, counts)
        plan = assignor.assign(counts, subs)
        log.info("group %s generation %d: %s assigned %s", self.group_id, self.generation, assignor.name,
                 {m: len(v) for m, v in plan.items()})
        return plan

    async def _on_join_complete(self, assigned: list[TopicPartition]) -> None:
        if self.protocol == COOPERATIVE:
            change = diff(self.owned, assigned)
            if change.revoked:
                # As Kafka: the listener runs while the partitions are still assigned, then they go.
                await self._commit_before_revoke(change.revoked)
                await self._call_listener("on_partitions_revoked", change.revoked)
                self.subscriptions.remove(change.revoked)
                self.owned = [tp for tp in self.owned if tp not in set(change.revoked)]
                self.need_rejoin = True  # the follow-up rebalance hands them to their new owner
            added = change.added
        else:
            added = list(assigned)
        positions = await self._committed_positions(added)
        self.subscriptions.add_assigned(added, positions)
        self.owned = sorted(set(self.owned) | set(added))
        await self._call_listener("on_partitions_assigned", added)

    async def _revoke_all(self, leaving: bool) -> None:
        """Eager protocol (and close/unsubscribe): commit, on_partitions_revoked(everything), stop fetching.

        As Kafka's: an eager rebalance of a member that has a generation always calls
        on_partitions_revoked, even with nothing to revoke; leaving only when it owns something.
        """
        if not self.owned:
            if not leaving and self.generation >= 0:
                await self._call_listener("on_partitions_revoked", [])
            return
        owned = list(self.owned)
        await self._commit_before_revoke(owned)
        # As Kafka's onJoinPrepare: the listener runs while the partitions are still assigned (it may
        # commit their positions, read position()), then the assignment is cleared.
        await self._call_listener("on_partitions_revoked", owned)
        self.subscriptions.remove(owned)
        self.previous, self.owned = owned, []

    async def _lose_all(self) -> None:
        """The generation is gone: on_partitions_lost(everything), without committing."""
        self.lost_pending = False
        if not self.owned:
            return
        owned = list(self.owned)
        await self._call_listener("on_partitions_lost", owned)
        self.subscriptions.remove(owned)
        self.previous, self.owned = [], []

    async def _call_listener(self, name: str, partitions: list[TopicPartition]) -> None:
        """One listener call, as its own task: cancelling the rebalance never cuts it in half."""
        async def run() -> None:
            try:
                result = getattr(self.listener, name)(list(partitions))
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # Kafka: the rebalance completes, poll() then raises the listener's error
                log.error("group %s: rebalance listener %s failed", self.group_id, name, exc_info=exc)
                self._listener_error = exc
        task = self._listener_task = asyncio.ensure_future(run())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait({task})  # finish the call, then let the cancellation through
            raise

    def _reset_generation(self, forget_member_id: bool) -> None:
        if self.owned:
            self.lost_pending = True
        self.generation = -1
        if forget_member_id:
            self.member_id = ""
        self.need_rejoin = True

    # ------------------------------------------------------------ heartbeat
    async def _heartbeat_loop(self) -> None:
        """Heartbeat every heartbeat.interval.ms while in a generation; leave after max.poll.interval.ms idle."""
        last_ok = time.monotonic()
        while not self._closed:
            await asyncio.sleep(self.heartbeat_interval_s)
            if self._closed or not self.subscribed:
                continue
            if self.generation >= 0 and (time.monotonic() - self._last_poll) * 1000 > self.max_poll_interval_ms:
                log.warning("group %s: poll() not called for %d ms (max.poll.interval.ms): leaving the group",
                            self.group_id, self.max_poll_interval_ms)
                await self.leave_group("consumer poll timeout has expired")
                self._reset_generation(True)
                continue
            if self.generation < 0 or self._join_task is not None:
                last_ok = time.monotonic()
                continue
            try:
                await self.call("Heartbeat", coordinator_pb2.HeartbeatRequest(
                    group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
                    group_instance_id=self.instance_id),
                    deadline=time.monotonic() + self.heartbeat_interval_s)
                last_ok = time.monotonic()
            except errors.GregorError as err:
                self._on_heartbeat_error(err, time.monotonic() - last_ok)
            except Exception as exc:  # never let the heartbeat task die silently
                log.error("group %s: heartbeat failed", self.group_id, exc_info=exc)

    def _on_heartbeat_error(self, err: errors.GregorError, silent_s: float) -> None:
        if err.code == Code.REBALANCE_IN_PROGRESS:
            self.need_rejoin = True
        elif err.code in GENERATION_GONE:
            log.info("group %s: heartbeat answered %s: partitions are lost, rejoining", self.group_id, err.name)
            self._reset_generation(err.code != Code.ILLEGAL_GENERATION)
        elif err.code in COORDINATOR_GONE:
            self.coordinator_dead(err.name)
        else:
            log.warning("group %s: heartbeat failed: %s", self.group_id, err)
        if silent_s * 1000 > self.session_timeout_ms:
            self.coordinator_dead("session timeout passed without a heartbeat")
        self.subscriptions.notify()

    # ------------------------------------------------------------ pattern subscription
    async def _refresh_pattern(self) -> None:
        """Match the pattern against every topic (Kafka rechecks every metadata.max.age.ms)."""
        assert self.pattern is not None
        self._next_pattern_check = time.monotonic() + self.pattern_refresh_s
        stub = broker_pb2_grpc.BrokerServiceStub(self.metadata.channel(self.metadata.any_address()))
        try:
            resp = await stub.Metadata(broker_pb2.MetadataRequest(), timeout=self.request_timeout_s)
        except (grpc.RpcError, asyncio.TimeoutError) as exc:
            log.warning("group %s: topic list for pattern failed: %s", self.group_id, call_error(exc))
            return
        if not resp.brokers:  # a broker not reached by the controller yet: its empty topic list says nothing
            self._next_pattern_check = time.monotonic() + self.metadata.retry_backoff_s
            return
        matched = {t.name for t in resp.topics if not t.is_internal and not t.error and self.pattern.fullmatch(t.name)}
        if matched != self.topics:
            self.topics = matched
            self.metadata.add_topics(*matched)
            self.need_rejoin = True

    # ------------------------------------------------------------ offsets
    def maybe_auto_commit(self) -> None:
        """enable.auto.commit: every auto.commit.interval.ms, commit the positions of records poll() returned."""
        if not self.auto_commit or time.monotonic() < self._next_auto_commit:
            return
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_s
        if self._commit_task is not None and not self._commit_task.done():
            return
        offsets = self.subscriptions.consumed_positions()
        offsets = {tp: o for tp, o in offsets.items() if self._last_committed.get(tp) != o}
        if offsets and not self.rebalancing:
            self._commit_task = asyncio.ensure_future(self._auto_commit(offsets))

    async def _auto_commit(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            await self.commit_in_order(offsets)
        except errors.GregorError as err:
            log.warning("group %s: auto-commit of %s failed: %s", self.group_id, offsets, err)

    async def _commit_before_revoke(self, tps: Sequence[TopicPartition]) -> None:
        if not self.auto_commit or self.generation < 0:
            return
        wanted = set(tps)
        offsets = {tp: o for tp, o in self.subscriptions.consumed_positions().items() if tp in wanted}
        if offsets:
            try:
                await self.commit(offsets)
            except errors.GregorError as err:
                log.warning("group %s: commit before revocation failed: %s", self.group_id, err)

    def commit_in_order(self, offsets: Mapping[TopicPartition, int], metadata: str = "",
                        on_done: Optional[Callable[[Optional[BaseException]], None]] = None) -> "asyncio.Future[None]":
        """Queue one OffsetCommit behind every commit queued before it (call order = send order = completion
        order, as Kafka's): the returned future is its outcome; on_done(exception or None) runs in that order too."""
        prev, snapshot = self._commit_tail, dict(offsets)

        async def run() -> None:
            if prev is not None:
                await asyncio.wait({prev})
            exc: Optional[BaseException] = None
            try:
                await self._commit_now(snapshot, metadata)
            except BaseException as err:
                exc = err
            if on_done is not None:
                on_done(exc)
            if exc is not None:
                raise exc
        task = asyncio.ensure_future(run())
        task.add_done_callback(_consume_exception)
        self._commit_tail = task
        return task

    async def commits_drained(self) -> None:
        """Every commit queued so far has completed (succeeded or failed)."""
        tail = self._commit_tail
        if tail is not None and not tail.done():
            await asyncio.wait({tail})

    async def commit(self, offsets: Mapping[TopicPartition, int], metadata: str = "") -> None:
        """OffsetCommit in order after every earlier one; raises its error."""
        await asyncio.shield(self.commit_in_order(offsets, metadata))

    async def _commit_now(self, offsets: Mapping[TopicPartition, int], metadata: str = "") -> None:
        """OffsetCommit in this member's generation (-1 without a subscription: a standalone commit)."""
        if not offsets:
            return
        in_group = self.subscribed and self.generation >= 0
        req = coordinator_pb2.OffsetCommitRequest(
            group_id=self.group_id, generation_id=self.generation if in_group else -1,
            member_id=self.member_id if in_group else "", group_instance_id=self.instance_id if in_group else "",
            partitions=[coordinator_pb2.OffsetCommitPartition(topic=t, partition=p, offset=int(o), leader_epoch=-1,
                                                              metadata=metadata)
                        for (t, p), o in sorted(offsets.items())])
        if self.subscribed and not in_group:
            raise errors.RebalanceInProgressError(  # type: ignore[attr-defined]
                "commit cannot be completed: the consumer is not part of an active generation (rebalancing); "
                "poll() again and retry")
        resp = await self.call("OffsetCommit", req)
        for r in resp.results:
            if r.HasField("error") and r.error.code != 0:
                err = errors.from_detail(r.error)
                if err.code in GENERATION_GONE:
                    self._reset_generation(err.code != Code.ILLEGAL_GENERATION)
                elif err.code == Code.REBALANCE_IN_PROGRESS:
                    self.need_rejoin = True
                raise err
        for tp, o in offsets.items():
            self._last_committed[tp] = int(o)

    async def committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, Optional[int]]:
        """OffsetFetch: the committed offset of each partition, None when nothing is committed."""
        wanted = [(str(t), int(p)) for t, p in tps]
        resp = await self.call("OffsetFetch", coordinator_pb2.OffsetFetchRequest(
            group_id=self.group_id, partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in wanted]))
        for p in resp.partitions:  # Kafka's committed() throws TopicAuthorizationException for such a partition
            if p.HasField("error") and p.error.code != 0:
                raise errors.from_detail(p.error)
        got = {(p.topic, p.partition): (int(p.offset) if p.offset >= 0 else None) for p in resp.partitions}
        return {tp: got.get(tp) for tp in wanted}

    async def _committed_positions(self, tps: Sequence[TopicPartition]) -> Optional[dict[TopicPartition, Optional[int]]]:
        """The committed offsets of newly assigned partitions; None when the OffsetFetch failed: each partition's
        fetch task then asks again with retries (Kafka never falls back to auto.offset.reset on a failed
        OffsetFetch: that would skip or repeat what the group committed)."""
        if not tps:
            return {}
        try:
            return await self.committed(tps)
        except errors.GregorError as err:
            log.warning("group %s: OffsetFetch failed (%s): the fetch tasks ask for the committed offsets again",
                        self.group_id, err)
            return None

    # ------------------------------------------------------------ leave / close
    async def leave_group(self, reason: str) -> None:
        """LeaveGroup (dynamic members only: a static member's leave waits for its session timeout, as in Kafka)."""
        if self.instance_id or not self.member_id or self.coordinator is None and self.generation < 0:
            return
        try:
            await self.call("LeaveGroup", coordinator_pb2.LeaveGroupRequest(
                group_id=self.group_id, member_ids=[self.member_id]),
                deadline=time.monotonic() + self.request_timeout_s)
            log.info("group %s: member %s left (%s)", self.group_id, self.member_id, reason)
        except errors.GregorError as err:
            log.info("group %s: LeaveGroup failed: %s", self.group_id, err)

    async def close(self) -> None:
        """Commit (auto-commit), on_partitions_revoked (or _lost), LeaveGroup; stop the heartbeat."""
        if self._closed:
            return
        await self._cancel_join()
        await self.commits_drained()  # Kafka's close waits for pending async commits (their callbacks run)
        self._closed = True
        try:
            if self.subscribed:
                if self.generation < 0:
                    await self._lose_all()
                else:
                    await self._revoke_all(leaving=True)
                    await self.leave_group("the consumer is being closed")
            elif self.auto_commit:
                offsets = self.subscriptions.consumed_positions()
                offsets = {tp: o for tp, o in offsets.items() if self._last_committed.get(tp) != o}
                if offsets:
                    await self.commit(offsets)
            await self.commits_drained()
        except errors.GregorError as err:
            log.warning("group %s: close: %s", self.group_id, err)
        finally:
            if self._hb_task is not None:
                self._hb_task.cancel()
                await asyncio.gather(self._hb_task, return_exceptions=True)


Callback = Callable[[Mapping[TopicPartition, int], Optional[BaseException]], Any]


def _consume_exception(fut: "asyncio.Future[None]") -> None:
    """A commit's error is its caller's to raise; one nobody awaits (auto-commit) is not 'never retrieved'."""
    if not fut.cancelled():
        fut.exception()
