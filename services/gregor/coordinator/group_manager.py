"""Group membership and rebalance logic (Kafka's GroupCoordinator handle* methods, seed 003).

Concurrency: event-loop owned, single owner — the gRPC handlers of one
coordinator process call into it on the loop and never await inside a
decision, so no lock is needed. It does no I/O and reads no clock: every call
takes `now_ms` and the driver calls `tick(now_ms)` periodically, so tests drive
session timeouts and rebalance deadlines with a fake clock. JoinGroup and
SyncGroup park the caller on an asyncio future that a later call (another
member's join, the leader's sync, a tick) resolves — Kafka's DelayedJoin.

Rebalance triggers (seed 003): a member joins, a member leaves (LeaveGroup),
a member misses its heartbeats for session.timeout.ms, a member's subscription
(protocol metadata) changes, a subscribed topic's partition count changes (or it
is deleted, or created after the members subscribed to it), a member that joined
a generation does not send SyncGroup within the rebalance timeout (Kafka's
pending-sync expiry, KAFKA-13134).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from gregor.common import errors
from gregor.coordinator.group import Group, GroupState, JoinResult, Member

log = logging.getLogger(__name__)
Code = errors.Code
S = GroupState


@dataclass(frozen=True)
class GroupConfig:
    """Broker-side group settings with Kafka's names and defaults."""

    # group.min.session.timeout.ms / group.max.session.timeout.ms: bounds for a member's session.timeout.ms.
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000
    # group.initial.rebalance.delay.ms: wait for more members before the first rebalance of an empty group.
    initial_rebalance_delay_ms: int = 3000
    # group.max.size: members per group (Kafka's default is unbounded; GROUP_MAX_SIZE_REACHED beyond).
    max_size: int = 2147483647


def _err(code: int, message: str) -> errors.GregorError:
    return errors.error_for(code, message)


def _fail(waiter: "asyncio.Future[Any]", err: BaseException) -> None:
    """Answer a parked JoinGroup/SyncGroup with an error. Its handler may be gone (the client cancelled
    the call, then sent LeaveGroup): the error is marked retrieved so that collecting the future does
    not log asyncio's "Future exception was never retrieved"; a handler still awaiting gets it raised."""
    waiter.set_exception(err)
    waiter.exception()


class GroupManager:
    """Every group this coordinator owns, keyed by group id (single-owner, see module docstring)."""

    def __init__(self, config: GroupConfig | None = None,
                 on_rebalance: Callable[[Group], None] | None = None) -> None:
        self.config = config or GroupConfig()
        self.groups: dict[str, Group] = {}
        self.rebalances_total = 0
        # Groups whose metadata changed (new generation, Stable, static replacement) and must be persisted.
        self.dirty: set[str] = set()
        self._on_rebalance = on_rebalance

    # ------------------------------------------------------------------ join
    def join_group(self, group_id: str, member_id: str, group_instance_id: str, client_id: str, client_host: str,
                   session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]], now_ms: int) -> asyncio.Future[JoinResult]:
        """JoinGroup: a future resolved when the join phase completes (at once for MEMBER_ID_REQUIRED)."""
        if not group_id:
            raise _err(Code.INVALID_GROUP_ID, "group id must not be empty")
        if not (self.config.min_session_timeout_ms <= session_timeout_ms <= self.config.max_session_timeout_ms):
            raise _err(Code.INVALID_SESSION_TIMEOUT,
                       f"session.timeout.ms {session_timeout_ms} is outside [group.min.session.timeout.ms "
                       f"{self.config.min_session_timeout_ms}, group.max.session.timeout.ms "
                       f"{self.config.max_session_timeout_ms}]")
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms  # JoinGroup v0 semantics
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                raise _err(Code.UNKNOWN_MEMBER_ID, f"group {group_id} has no member {member_id}")
            group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
        if group.is_(S.DEAD):
            raise _err(Code.COORDINATOR_NOT_AVAILABLE, f"group {group_id} is being deleted or moved")
        if not group.supports(protocol_type, protocols):
            raise _err(Code.INCONSISTENT_GROUP_PROTOCOL,
                       f"protocol type {protocol_type!r} / protocols {[n for n, _ in protocols]} do not match "
                       f"group {group_id} ({group.protocol_type!r}, {sorted(group.candidate_protocols())})")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[JoinResult] = loop.create_future()
        args = (client_id, client_host, session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols)
        if not member_id:
            if group_instance_id and group_instance_id in group.static_members:
                self._replace_static_member(group, group_instance_id, fut, args, now_ms)
                return fut
            if len(group.members) + len(group.pending_members) >= self.config.max_size:
                raise _err(Code.GROUP_MAX_SIZE_REACHED, f"group {group_id} has reached group.max.size")
            new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if group_instance_id:
                # A static member joins straight away (it is identified by its instance id).
                self._add_member_and_rebalance(group, new_id, group_instance_id, fut, args, now_ms)
                return fut
            # KIP-394: hand out the id first; the member must come back with it.
            group.pending_members[new_id] = now_ms + session_timeout_ms
            fut.set_result(JoinResult(-1, "", "", new_id, member_id_required=True))
            return fut
        if member_id in group.pending_members:
            del group.pending_members[member_id]
            self._add_member_and_rebalance(group, member_id, group_instance_id, fut, args, now_ms)
            return fut
        member = self._known_member(group, member_id, group_instance_id)
        self._update_member_and_maybe_rebalance(group, member, fut, args, now_ms)
        return fut

    def _known_member(self, group: Group, member_id: str, group_instance_id: str) -> Member:
        if group_instance_id:
            current = group.static_members.get(group_instance_id)
            if current is not None and current != member_id:
                raise _err(Code.FENCED_INSTANCE_ID,
                           f"group.instance.id {group_instance_id} now belongs to member {current}, not {member_id}")
        member = group.members.get(member_id)
        if member is None:
            raise _err(Code.UNKNOWN_MEMBER_ID, f"group {group.group_id} has no member {member_id}")
        return member

    def _add_member_and_rebalance(self, group: Group, member_id: str, instance_id: str,
                                  fut: asyncio.Future[JoinResult], args: tuple, now_ms: int) -> None:  # type: ignore[type-arg]
        client_id, host, session_ms, rebalance_ms, ptype, protocols = args
        member = Member(member_id, instance_id, client_id, host, rebalance_ms, session_ms, ptype, list(protocols),
                        heartbeat_deadline_ms=now_ms + session_ms, awaiting_join=fut, joined_this_round=True)
        group.add(member)
        self._prepare_or_maybe_complete(group, f"member {member_id} joined", now_ms)

    def _update_member_and_maybe_rebalance(self, group: Group, member: Member, fut: asyncio.Future[JoinResult],
                                           args: tuple, now_ms: int) -> None:  # type: ignore[type-arg]
        client_id, host, session_ms, rebalance_ms, _ptype, protocols = args
        changed = not member.matches(protocols)
        member.client_id, member.client_host = client_id, host
        member.session_timeout_ms, member.rebalance_timeout_ms = session_ms, rebalance_ms
        member.protocols = list(protocols)
        member.heartbeat_deadline_ms = now_ms + session_ms
        if group.is_(S.PREPARING_REBALANCE):
            self._park_join(member, fut)
            self._maybe_complete_join(group, now_ms)
        elif group.is_(S.COMPLETING_REBALANCE) or group.is_(S.STABLE):
            if changed or (group.is_(S.STABLE) and member.member_id == group.leader_id):
                # Subscription change (or the leader rejoining, e.g. after a metadata change): rebalance.
                self._park_join(member, fut)
                self._prepare_rebalance(group, f"member {member.member_id} rejoined"
                                        + (" with new metadata" if changed else " (leader)"), now_ms)
            else:
                # Same metadata: answer with the current generation, no rebalance (Kafka does the same).
                fut.set_result(self._join_result(group, member.member_id))
        else:  # Empty with a known member cannot happen; treat as a fresh rebalance.
            self._park_join(member, fut)
            self._prepare_rebalance(group, f"member {member.member_id} joined", now_ms)

    def _replace_static_member(self, group: Group, instance_id: str, fut: asyncio.Future[JoinResult],
                               args: tuple, now_ms: int) -> None:  # type: ignore[type-arg]
        """KIP-345: a known group.instance.id rejoining with no member id takes over the old member's slot.

        The old member id is fenced (FENCED_INSTANCE_ID from then on). In a Stable group
        there is no rebalance: the new member keeps the old assignment; if the
        subscription changed, a rebalance follows as for any member.
        """
        client_id, host, session_ms, rebalance_ms, ptype, protocols = args
        old_id = group.static_members[instance_id]
        was_leader = group.leader_id == old_id
        old = group.remove(old_id)
        if old is None:
            raise errors.GregorError(f"group {group.group_id}: static member {instance_id} maps to no member")
        new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        member = Member(new_id, instance_id, client_id, host, rebalance_ms, session_ms, ptype, list(protocols),
                        assignment=old.assignment, heartbeat_deadline_ms=now_ms + session_ms,
                        joined_this_round=old.joined_this_round)
        group.add(member)
        if was_leader:
            group.leader_id = new_id
        if old_id in group.pending_sync:  # the replacement inherits the obligation to sync
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        fenced = _err(Code.FENCED_INSTANCE_ID, f"group.instance.id {instance_id} rejoined as member {new_id}")
        for pending in (old.awaiting_join, old.awaiting_sync):
            if pending is not None and not pending.done():
                _fail(pending, fenced)
        log.info("group %s: static member %s replaced %s by %s", group.group_id, instance_id, old_id, new_id)
        changed = not old.matches(list(protocols))
        if group.is_(S.PREPARING_REBALANCE) or changed:
            self._park_join(member, fut)
            member.joined_this_round = True
            self._prepare_or_maybe_complete(group, f"static member {instance_id} rejoined", now_ms)
        else:
            self.dirty.add(group.group_id)
            fut.set_result(self._join_result(group, new_id))

    @staticmethod
    def _park_join(member: Member, fut: asyncio.Future[JoinResult]) -> None:
        if member.awaiting_join is not None and not member.awaiting_join.done():
            # A duplicate JoinGroup replaces the earlier one; that one is told to rejoin.
            _fail(member.awaiting_join, _err(Code.REBALANCE_IN_PROGRESS, "superseded by a newer JoinGroup"))
        member.awaiting_join = fut
        member.joined_this_round = True

    def _join_result(self, group: Group, member_id: str) -> JoinResult:
        members = []
        if member_id == group.leader_id:
            members = [(m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
                       for m in group.members.values()]
        return JoinResult(group.generation_id, group.protocol_name, group.leader_id, member_id, members)

    # ------------------------------------------------------------------ rebalance
    def _prepare_or_maybe_complete(self, group: Group, reason: str, now_ms: int) -> None:
        if group.is_(S.PREPARING_REBALANCE):
            if group.initial_delay_cap_ms:
                # InitialDelayedJoin: each new member extends the delay, up to the rebalance timeout.
                group.join_deadline_ms = min(now_ms + self.config.initial_rebalance_delay_ms,
                                             group.initial_delay_cap_ms)
            self._maybe_complete_join(group, now_ms)
        else:
            self._prepare_rebalance(group, reason, now_ms)

    def _prepare_rebalance(self, group: Group, reason: str, now_ms: int) -> None:
        """Move to PreparingRebalance: members must rejoin within the rebalance timeout."""
        if group.is_(S.COMPLETING_REBALANCE) or group.awaiting_store:
            # Assignments of the aborted generation (not yet handed out) are void; members parked in
            # SyncGroup rejoin.
            group.awaiting_store = False
            for m in group.members.values():
                m.assignment = b""
                if m.awaiting_sync is not None and not m.awaiting_sync.done():
                    _fail(m.awaiting_sync, _err(Code.REBALANCE_IN_PROGRESS,
                                                       f"group {group.group_id} is rebalancing: {reason}"))
        was_empty = group.is_(S.EMPTY)
        group.pending_sync = set()
        group.transition_to(S.PREPARING_REBALANCE, now_ms)
        for m in group.members.values():
            if m.awaiting_join is None or m.awaiting_join.done():
                m.joined_this_round = False
        if was_empty and self.config.initial_rebalance_delay_ms > 0:
            group.initial_delay_cap_ms = now_ms + max(group.rebalance_timeout_ms(), 1)
            group.join_deadline_ms = min(now_ms + self.config.initial_rebalance_delay_ms, group.initial_delay_cap_ms)
        else:
            group.initial_delay_cap_ms = 0
            group.join_deadline_ms = now_ms + group.rebalance_timeout_ms()
        self.rebalances_total += 1
        log.info("group %s: preparing rebalance (generation %d): %s", group.group_id, group.generation_id, reason)
        if self._on_rebalance is not None:
            self._on_rebalance(group)
        self._maybe_complete_join(group, now_ms)

    def _maybe_complete_join(self, group: Group, now_ms: int) -> bool:
        """Complete the join phase once everyone rejoined (after any initial delay) or the deadline passed."""
        if not group.is_(S.PREPARING_REBALANCE):
            return False
        if group.initial_delay_cap_ms and now_ms < group.join_deadline_ms:
            return False
        if not group.all_members_joined() and now_ms < group.join_deadline_ms:
            return False
        self._complete_join(group, now_ms)
        return True

    def _complete_join(self, group: Group, now_ms: int) -> None:
        """Kafka's onCompleteJoin: drop dynamic members that did not rejoin, bump the generation, answer joins."""
        for m in list(group.members.values()):
            if not m.joined_this_round and not m.is_static:
                group.remove(m.member_id)
        group.pending_members.clear()
        group.initial_delay_cap_ms = 0
        group.pending_sync = set()
        group.generation_id += 1
        if not group.members:
            group.protocol_name, group.leader_id = "", ""
            group.transition_to(S.EMPTY, now_ms)
            self.dirty.add(group.group_id)
            log.info("group %s: empty at generation %d", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.transition_to(S.COMPLETING_REBALANCE, now_ms)
        group.pending_sync = set(group.members)
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms()
        for m in group.members.values():
            m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
            m.joined_this_round = False
            if m.awaiting_join is not None and not m.awaiting_join.done():
                m.awaiting_join.set_result(self._join_result(group, m.member_id))
            m.awaiting_join = None
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", group.group_id,
                 group.generation_id, len(group.members), group.protocol_name, group.leader_id)

    # ------------------------------------------------------------------ sync / heartbeat / leave
    def _member_of(self, group_id: str, member_id: str, instance_id: str) -> tuple[Group, Member]:
        group = self.groups.get(group_id)
        if group is None or group.is_(S.EMPTY):
            raise _err(Code.UNKNOWN_MEMBER_ID, f"group {group_id} has no member {member_id}")
        if group.is_(S.DEAD):
            raise _err(Code.COORDINATOR_NOT_AVAILABLE, f"group {group_id} is being deleted or moved")
        return group, self._known_member(group, member_id, instance_id)

    def sync_group(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str,
                   assignments: dict[str, bytes], now_ms: int) -> asyncio.Future[bytes]:
        """SyncGroup: the member's assignment, once the leader has sent the generation's assignments."""
        group, member = self._member_of(group_id, member_id, group_instance_id)
        if generation_id != group.generation_id:
            raise _err(Code.ILLEGAL_GENERATION,
                       f"generation {generation_id} is not group {group_id}'s current {group.generation_id}")
        if group.is_(S.PREPARING_REBALANCE):
            raise _err(Code.REBALANCE_IN_PROGRESS, f"group {group_id} is rebalancing: rejoin")
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        group.pending_sync.discard(member_id)
        if group.is_(S.STABLE) and not group.awaiting_store:
            fut.set_result(member.assignment)
            return fut
        if group.is_(S.STABLE):
            member.awaiting_sync = fut  # the leader's assignments are being stored
            return fut
        # CompletingRebalance: park until the leader's assignments arrive and are stored.
        member.awaiting_sync = fut
        if member_id == group.leader_id:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.transition_to(S.STABLE, now_ms)
            group.awaiting_store = True
            log.info("group %s: stable at generation %d", group_id, group.generation_id)
        return fut

    def release_syncs(self, group_id: str, generation_id: int) -> None:
        """The new generation's metadata is stored: answer every member parked in SyncGroup (Kafka's
        storeGroup callback). Does nothing if the group moved on meanwhile."""
        group = self.groups.get(group_id)
        if group is None or group.generation_id != generation_id or not group.is_(S.STABLE):
            return
        group.awaiting_store = False
        for m in group.members.values():
            if m.awaiting_sync is not None and not m.awaiting_sync.done():
                m.awaiting_sync.set_result(m.assignment)
            m.awaiting_sync = None

    def on_store_failed(self, group_id: str, generation_id: int, err: errors.GregorError, now_ms: int) -> None:
        """Storing the new generation failed: void the assignments, fail parked syncs, rebalance (as Kafka)."""
        group = self.groups.get(group_id)
        if group is None or group.generation_id != generation_id or not group.is_(S.STABLE):
            return
        group.awaiting_store = False
        for m in group.members.values():
            m.assignment = b""
            if m.awaiting_sync is not None and not m.awaiting_sync.done():
                _fail(m.awaiting_sync, err)
            m.awaiting_sync = None
        self._prepare_rebalance(group, f"storing generation {generation_id} failed: {err.name}", now_ms)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str,
                  now_ms: int) -> None:
        """Heartbeat: extend the session; REBALANCE_IN_PROGRESS tells the member to rejoin."""
        group, member = self._member_of(group_id, member_id, group_instance_id)
        if generation_id != group.generation_id:
            raise _err(Code.ILLEGAL_GENERATION,
                       f"generation {generation_id} is not group {group_id}'s current {group.generation_id}")
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.is_(S.PREPARING_REBALANCE):
            raise _err(Code.REBALANCE_IN_PROGRESS, f"group {group_id} is rebalancing: rejoin")

    def leave_group(self, group_id: str, member_id: str, group_instance_id: str, now_ms: int) -> None:
        """LeaveGroup for one member (by member id, or by group.instance.id for static members, KIP-345)."""
        group = self.groups.get(group_id)
        if group is None or group.is_(S.DEAD):
            raise _err(Code.UNKNOWN_MEMBER_ID, f"group {group_id} has no member {member_id or group_instance_id}")
        if group_instance_id:
            current = group.static_members.get(group_instance_id)
            if current is None:
                raise _err(Code.UNKNOWN_MEMBER_ID, f"group {group_id} has no instance {group_instance_id}")
            if member_id and member_id != current:
                raise _err(Code.FENCED_INSTANCE_ID,
                           f"group.instance.id {group_instance_id} belongs to {current}, not {member_id}")
            member_id = current
        if member_id in group.pending_members:
            del group.pending_members[member_id]
            self._maybe_complete_join(group, now_ms)
            return
        if member_id not in group.members:
            raise _err(Code.UNKNOWN_MEMBER_ID, f"group {group_id} has no member {member_id}")
        self._remove_member_and_update(group, member_id, "left the group (LeaveGroup)", now_ms)

    def _remove_member_and_update(self, group: Group, member_id: str, reason: str, now_ms: int) -> None:
        member = group.remove(member_id)
        if member is None:
            return
        gone = _err(Code.UNKNOWN_MEMBER_ID, f"member {member_id} {reason}")
        for pending in (member.awaiting_join, member.awaiting_sync):
            if pending is not None and not pending.done():
                _fail(pending, gone)
        if group.is_(S.STABLE) or group.is_(S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {member_id} {reason}", now_ms)
        elif group.is_(S.PREPARING_REBALANCE):
            self._maybe_complete_join(group, now_ms)

    # ------------------------------------------------------------------ timers and triggers
    def tick(self, now_ms: int) -> None:
        """Expire sessions (DelayedHeartbeat), pending member ids and join deadlines (DelayedJoin)."""
        for group in list(self.groups.values()):
            if group.is_(S.DEAD):
                continue
            for pid, expiry in list(group.pending_members.items()):
                if now_ms >= expiry:
                    del group.pending_members[pid]
            for m in list(group.members.values()):
                if not m.should_keep_alive(now_ms):
                    log.info("group %s: member %s session timed out (session.timeout.ms %d)",
                             group.group_id, m.member_id, m.session_timeout_ms)
                    self._remove_member_and_update(group, m.member_id,
                                                   f"missed heartbeats for {m.session_timeout_ms} ms", now_ms)
            self._expire_pending_syncs(group, now_ms)
            self._maybe_complete_join(group, now_ms)

    def _expire_pending_syncs(self, group: Group, now_ms: int) -> None:
        """Kafka's DelayedSync: members that joined the generation but sent no SyncGroup within the
        rebalance timeout are removed (heartbeats do not keep them), and the group rebalances."""
        if not group.pending_sync or now_ms < group.sync_deadline_ms:
            return
        if not (group.is_(S.COMPLETING_REBALANCE) or group.is_(S.STABLE)):
            group.pending_sync = set()
            return
        late, group.pending_sync = sorted(group.pending_sync), set()
        for mid in late:
            if mid in group.members:
                log.info("group %s: member %s sent no SyncGroup for generation %d within the rebalance timeout",
                         group.group_id, mid, group.generation_id)
                self._remove_member_and_update(group, mid, "did not sync within the rebalance timeout", now_ms)

    def on_topic_partitions_changed(self, topic: str, now_ms: int,
                                    change: str = "changed its partition count") -> list[str]:
        """A subscribed topic's partition count changed — including a deletion (to 0) or the creation of a
        topic that was subscribed but missing: rebalance every group reading it (seed 003)."""
        hit = []
        for group in self.groups.values():
            if (group.is_(S.STABLE) or group.is_(S.COMPLETING_REBALANCE)) and topic in group.subscribed_topics():
                self._prepare_rebalance(group, f"subscribed topic {topic} {change}", now_ms)
                hit.append(group.group_id)
        return hit

    # ------------------------------------------------------------------ offsets (validation only)
    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str,
                               now_ms: int) -> Group:
        """Kafka's doCommitOffsets checks; creates an Empty group for a commit outside any generation."""
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0 or member_id:
                raise _err(Code.ILLEGAL_GENERATION if generation_id >= 0 else Code.UNKNOWN_MEMBER_ID,
                           f"group {group_id} has no generation {generation_id}")
            group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
            return group
        if group.is_(S.DEAD):
            raise _err(Code.COORDINATOR_NOT_AVAILABLE, f"group {group_id} is being deleted or moved")
        if generation_id < 0 and group.is_(S.EMPTY):
            if not group.protocol_type:
                # A standalone (simple) consumer: Kafka expires its offsets by their commit timestamps,
                # so a commit keeps the group from expiring (here: the group's retention clock restarts).
                group.state_timestamp_ms = now_ms
            return group  # admin / simple consumer commit
        if group.is_(S.COMPLETING_REBALANCE):
            raise _err(Code.REBALANCE_IN_PROGRESS, f"group {group_id} is rebalancing: rejoin before committing")
        member = self._known_member(group, member_id, group_instance_id)
        if generation_id != group.generation_id:
            raise _err(Code.ILLEGAL_GENERATION,
                       f"generation {generation_id} is not group {group_id}'s current {group.generation_id}")
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        return group

    def validate_txn_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                                   group_instance_id: str) -> None:
        """KIP-447, Kafka's doTxnCommitOffsets checks: is the sender of a transaction's offsets the group's
        current member? A zombie (it missed a rebalance, left, or was replaced by its group.instance.id) is
        refused, so a transaction of a consumer that lost its partitions cannot commit their offsets.
        Generation -1 with no member id is the pre-KIP-447 form (a group id only): accepted, as Kafka's.
        Unlike OffsetCommit, no REBALANCE_IN_PROGRESS: member and generation decide, nothing is written."""
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0 or member_id:
                raise _err(Code.ILLEGAL_GENERATION if generation_id >= 0 else Code.UNKNOWN_MEMBER_ID,
                           f"group {group_id} has no generation {generation_id} and no member {member_id or '-'}")
            return
        if group.is_(S.DEAD):
            raise _err(Code.COORDINATOR_NOT_AVAILABLE, f"group {group_id} is being deleted or moved")
        if group_instance_id:
            current = group.static_members.get(group_instance_id)
            if current is not None and current != member_id:
                raise _err(Code.FENCED_INSTANCE_ID,
                           f"group.instance.id {group_instance_id} now belongs to member {current}, not {member_id}")
        if member_id and member_id not in group.members:
            raise _err(Code.UNKNOWN_MEMBER_ID, f"group {group_id} has no member {member_id}: it left or was removed "
                                               f"from the group")
        if generation_id >= 0 and generation_id != group.generation_id:
            raise _err(Code.ILLEGAL_GENERATION,
                       f"generation {generation_id} is not group {group_id}'s current {group.generation_id}: the "
                       f"member missed a rebalance")

    def transactional_commit_group(self, group_id: str, now_ms: int) -> Group:
        """The group a committed transaction's offsets go to, whatever its generation (Kafka writes them when
        the commit marker lands); an unknown group is created Empty, as a simple consumer's commit does."""
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
        elif group.is_(S.DEAD):
            raise _err(Code.COORDINATOR_NOT_AVAILABLE, f"group {group_id} is being deleted or moved")
        return group

    def validate_delete(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None or group.is_(S.DEAD):
            raise _err(Code.GROUP_ID_NOT_FOUND, f"group {group_id} does not exist")
        if not group.is_(S.EMPTY):
            raise _err(Code.NON_EMPTY_GROUP, f"group {group_id} is {group.state.value}, not Empty: members remain")
        return group

    def validate_offset_delete(self, group_id: str, partitions: list[tuple[str, int]]) -> tuple[Group, set[str]]:
        """Kafka's OffsetDelete checks: the group, and the topics whose offsets it must keep (a consumer group
        with members keeps those of the topics it subscribes to)."""
        group = self.groups.get(group_id)
        if group is None or group.is_(S.DEAD):
            raise _err(Code.GROUP_ID_NOT_FOUND, f"group {group_id} does not exist")
        if group.is_(S.EMPTY):
            return group, set()
        if group.protocol_type != "consumer":
            raise _err(Code.NON_EMPTY_GROUP, f"group {group_id} is {group.state.value} and not a consumer group: "
                                             f"its offsets can only be deleted once it is Empty")
        return group, group.subscribed_topics() & {t for t, _ in partitions}

    def mark_dead(self, group_id: str, now_ms: int) -> None:
        group = self.groups.pop(group_id, None)
        if group is not None and not group.is_(S.DEAD):
            group.transition_to(S.DEAD, now_ms)

    def expired_groups(self, now_ms: int, retention_ms: int) -> list[Group]:
        """Empty groups whose offsets expired: empty for offsets.retention.minutes (Kafka >= 2.1, KIP-211)."""
        return [g for g in self.groups.values()
                if g.is_(S.EMPTY) and now_ms - g.state_timestamp_ms >= retention_ms]

    def drop_all(self, group_ids: list[str], reason: errors.GregorError) -> None:
        """Forget groups (partition moved away): parked joins and syncs get `reason` (NOT_COORDINATOR)."""
        for gid in group_ids:
            group = self.groups.pop(gid, None)
            if group is None:
                continue
            for m in group.members.values():
                for pending in (m.awaiting_join, m.awaiting_sync):
                    if pending is not None and not pending.done():
                        _fail(pending, reason)
