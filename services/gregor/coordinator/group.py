"""A consumer group's in-memory metadata and its state machine (Kafka's GroupMetadata, seed 003).

States and the only transitions allowed between them (Kafka's validPreviousStates):

    Empty               <- PreparingRebalance
    PreparingRebalance  <- Empty, Stable, CompletingRebalance
    CompletingRebalance <- PreparingRebalance
    Stable              <- CompletingRebalance
    Dead                <- Empty, PreparingRebalance, CompletingRebalance, Stable

Plain data plus checks: no I/O, no clock (callers pass `now_ms`).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from gregor.common import consumer_protocol, errors


class GroupState(str, enum.Enum):
    """Kafka's group states, named as Kafka's tools print them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset({GroupState.EMPTY, GroupState.PREPARING_REBALANCE,
                                GroupState.COMPLETING_REBALANCE, GroupState.STABLE}),
}


@dataclass
class JoinResult:
    """What one member's JoinGroup answers once the join phase completes."""

    generation_id: int
    protocol_name: str
    leader: str
    member_id: str
    # (member_id, group_instance_id, metadata) — only for the leader.
    members: list[tuple[str, str, bytes]] = field(default_factory=list)
    member_id_required: bool = False


@dataclass
class Member:
    """One member of a group (Kafka's MemberMetadata)."""

    member_id: str
    group_instance_id: str
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    heartbeat_deadline_ms: int = 0
    awaiting_join: asyncio.Future[JoinResult] | None = None
    awaiting_sync: asyncio.Future[bytes] | None = None
    # A JoinGroup is answered within the current rebalance (Kafka's isNew/joined flags).
    joined_this_round: bool = False

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def should_keep_alive(self, now_ms: int) -> bool:
        """A member parked in JoinGroup or SyncGroup is alive; otherwise its heartbeat must be recent."""
        if self.awaiting_join is not None and not self.awaiting_join.done():
            return True
        if self.awaiting_sync is not None and not self.awaiting_sync.done():
            return True
        return now_ms < self.heartbeat_deadline_ms

    @property
    def is_static(self) -> bool:
        return bool(self.group_instance_id)


@dataclass
class Group:
    """One group: members, generation, protocol, leader and committed offsets (GroupMetadata)."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    state_timestamp_ms: int = 0
    generation_id: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader_id: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    # Member ids handed out with MEMBER_ID_REQUIRED, not yet joined: id -> expiry (ms).
    pending_members: dict[str, int] = field(default_factory=dict)
    # (topic, partition) -> (offset, leader_epoch, metadata, commit_timestamp_ms)
    offsets: dict[tuple[str, int], tuple[int, int, str, int]] = field(default_factory=dict)
    # Join phase deadline (rebalance timeout or initial delay), and the initial-delay cap.
    join_deadline_ms: int = 0
    initial_delay_cap_ms: int = 0
    # Stable, but the generation's metadata is not stored yet: SyncGroup answers wait for it.
    awaiting_store: bool = False
    # Kafka's pendingSyncMembers: members of the current generation that have not sent SyncGroup
    # yet, and the deadline (join completion + rebalance timeout) after which they are removed.
    pending_sync: set[str] = field(default_factory=set)
    sync_deadline_ms: int = 0

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        """Move to target or raise: an illegal transition is a coordinator bug, never silent."""
        if self.state not in _VALID_PREVIOUS[target]:
            raise errors.GregorError(
                f"group {self.group_id}: illegal state transition {self.state.value} -> {target.value}")
        self.state = target
        self.state_timestamp_ms = now_ms

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if not self.leader_id:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        if member.is_static:
            self.static_members[member.group_instance_id] = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.is_static and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), "")
        return member

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """A joining member must share the protocol type and at least one protocol with the group."""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        names = {n for n, _ in protocols}
        return bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        sets = [{n for n, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Kafka's vote: every member votes for its most preferred candidate; most votes wins (ties by name)."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise errors.error_for(errors.Code.INCONSISTENT_GROUP_PROTOCOL,
                                   f"group {self.group_id}: members share no protocol")
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(n for n, _ in m.protocols if n in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(sorted(votes), key=lambda n: votes[n])

    def all_members_joined(self) -> bool:
        """Join phase may complete: every member has rejoined and no MEMBER_ID_REQUIRED join is outstanding."""
        return not self.pending_members and all(m.joined_this_round for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def subscribed_topics(self) -> set[str]:
        """Topics the members subscribe to (consumer groups only), from their protocol metadata."""
        if self.protocol_type != consumer_protocol.PROTOCOL_TYPE:
            return set()
        topics: set[str] = set()
        for m in self.members.values():
            meta = m.metadata_for(self.protocol_name) if self.protocol_name else (
                m.protocols[0][1] if m.protocols else b"")
            topics |= consumer_protocol.subscribed_topics(meta)
        return topics
