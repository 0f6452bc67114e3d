"""Consumer-group administration (Kafka's Admin listConsumerGroups / describeConsumerGroups /
listConsumerGroupOffsets / alterConsumerGroupOffsets / deleteConsumerGroups), behind `gregor groups`.

Groups are sharded across coordinator instances (each owns some __consumer_offsets
partitions), so listing asks every coordinator it can reach and merges; everything
else goes to the group's coordinator, found with FindCoordinator.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

import grpc

from gregor.client.config import consumer_config, parse_bootstrap
from gregor.client.metadata import ClusterMetadata, call_error
from gregor.common import consumer_protocol as cp
from gregor.common import errors
from gregor.rpc.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

TopicPartition = tuple[str, int]


@dataclass
class MemberDescription:
    member_id: str
    group_instance_id: str
    client_id: str
    host: str
    assignment: list[TopicPartition] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)


@dataclass
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    generation_id: int
    leader: str
    coordinator: str
    members: list[MemberDescription] = field(default_factory=list)


@dataclass
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


class GroupAdmin:
    """Event-loop owned; one ClusterMetadata for broker/coordinator channels."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        cfg = consumer_config({k: v for k, v in config.items() if k != "group.id"})
        self.metadata = ClusterMetadata(parse_bootstrap(cfg["bootstrap.servers"]),
                                        request_timeout_ms=cfg["request.timeout.ms"])
        self.coordinators = [a.strip() for a in cfg["coordinator.bootstrap.servers"].split(",") if a.strip()]
        self.timeout_s = cfg["request.timeout.ms"] / 1000
        self.api_timeout_s = cfg["default.api.timeout.ms"] / 1000
        self.backoff_s = cfg["retry.backoff.ms"] / 1000
        self._owner: dict[str, str] = {}

    async def __aenter__(self) -> "GroupAdmin":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.metadata.close()

    def _stub(self, address: str) -> coordinator_pb2_grpc.GroupCoordinatorServiceStub:
        return coordinator_pb2_grpc.GroupCoordinatorServiceStub(self.metadata.channel(address))

    def _candidates(self) -> list[str]:
        return list(dict.fromkeys(self.coordinators + [b.address for b in self.metadata.brokers.values()]
                                  + self.metadata.bootstrap))

    async def find_coordinator(self, group_id: str) -> str:
        if group_id in self._owner:
            return self._owner[group_id]
        last: Optional[errors.GregorError] = None
        for address in self._candidates():
            try:
                resp = await self._stub(address).FindCoordinator(
                    coordinator_pb2.FindCoordinatorRequest(group_id=group_id), timeout=self.timeout_s)
            except (grpc.RpcError, asyncio.TimeoutError) as exc:
                last = call_error(exc)
                if last.code == errors.Code.INVALID_GROUP_ID:
                    raise last from None
                continue
            self._owner[group_id] = f"{resp.host}:{resp.port}"
            return self._owner[group_id]
        raise errors.CoordinatorNotAvailableError(  # type: ignore[attr-defined]
            f"no group coordinator answered FindCoordinator for {group_id!r}"
            f"{': ' + last.message if last else ''}")

    async def _call(self, group_id: str, method: str, request: Any) -> Any:
        """RPC to the group's coordinator, refinding it on NOT_COORDINATOR and friends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.api_timeout_s
        while True:
            address = await self.find_coordinator(group_id)
            try:
                return await getattr(self._stub(address), method)(request, timeout=self.timeout_s)
            except (grpc.RpcError, asyncio.TimeoutError) as exc:
                err = call_error(exc)
            if not err.retriable or loop.time() >= deadline:
                raise err
            self._owner.pop(group_id, None)
            await asyncio.sleep(self.backoff_s)

    # ------------------------------------------------------------ operations
    async def list_groups(self) -> list[GroupListing]:
        """Every group every reachable coordinator owns (merged; Kafka asks every broker)."""
        found: dict[str, GroupListing] = {}
        answered = 0
        last: Optional[errors.GregorError] = None
        for address in self._candidates():
            try:
                resp = await self._stub(address).ListGroups(coordinator_pb2.ListGroupsRequest(), timeout=self.timeout_s)
            except (grpc.RpcError, asyncio.TimeoutError) as exc:
                last = call_error(exc)
                continue
            answered += 1
            for g in resp.groups:
                found.setdefault(g.group_id, GroupListing(g.group_id, g.protocol_type, g.state))
        if not answered:
            raise errors.CoordinatorNotAvailableError(  # type: ignore[attr-defined]
                f"no group coordinator answered ListGroups{': ' + last.message if last else ''}")
        return sorted(found.values(), key=lambda g: g.group_id)

    async def describe_group(self, group_id: str) -> GroupDescription:
        resp = await self._call(group_id, "DescribeGroups", coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]))
        if not resp.groups:
            raise errors.GroupIdNotFoundError(f"group {group_id} not found")  # type: ignore[attr-defined]
        g = resp.groups[0]
        if g.HasField("error") and g.error.code != 0:
            raise errors.from_detail(g.error)
        members = []
        for m in g.members:
            assigned: list[TopicPartition] = []
            topics: list[str] = []
            if g.protocol_type == cp.PROTOCOL_TYPE:
                try:
                    assigned = sorted((t, p) for t, ps in cp.decode_assignment(m.assignment).partitions for p in ps)
                    topics = sorted(cp.decode_subscription(m.metadata).topics) if m.metadata else []
                except errors.GregorError:
                    pass
            members.append(MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                             assigned, topics))
        return GroupDescription(g.group_id, g.state, g.protocol_type, g.protocol, g.generation_id, g.leader,
                                self._owner.get(group_id, ""), members)

    async def committed_offsets(self, group_id: str,
                                tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Committed offsets of the group (all of them when tps is None); partitions without one are left out."""
        req = coordinator_pb2.OffsetFetchRequest(
            group_id=group_id, partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in tps or []])
        resp = await self._call(group_id, "OffsetFetch", req)
        return {(p.topic, p.partition): int(p.offset) for p in resp.partitions if p.offset >= 0}

    async def alter_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit offsets outside any generation (generation -1): the group must have no active members."""
        req = coordinator_pb2.OffsetCommitRequest(
            group_id=group_id, generation_id=-1,
            partitions=[coordinator_pb2.OffsetCommitPartition(topic=t, partition=p, offset=o, leader_epoch=-1)
                        for (t, p), o in sorted(offsets.items())])
        resp = await self._call(group_id, "OffsetCommit", req)
        for r in resp.results:
            if r.HasField("error") and r.error.code != 0:
                raise errors.from_detail(r.error)

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, Optional[errors.GregorError]]:
        out: dict[str, Optional[errors.GregorError]] = {}
        for gid in group_ids:
            try:
                resp = await self._call(gid, "DeleteGroups", coordinator_pb2.DeleteGroupsRequest(group_ids=[gid]))
            except errors.GregorError as err:
                out[gid] = err
                continue
            detail = resp.errors.get(gid)
            out[gid] = errors.from_detail(detail) if detail is not None and detail.code != 0 else None
        return out
