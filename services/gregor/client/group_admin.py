"""Consumer-group administration (Kafka's Admin listConsumerGroups / describeConsumerGroups /
listConsumerGroupOffsets / alterConsumerGroupOffsets / deleteConsumerGroups), behind `gregor groups`.

Groups are sharded across coordinator instances (each owns some __consumer_offsets
partitions). Everything goes to a coordinator found with FindCoordinator, asked of any
broker (bootstrap.servers; `coordinator.bootstrap.servers` is only a fallback): a group's
own coordinator for describe/offsets/delete, and for ListGroups any live coordinator,
which fans the listing out to every live instance (a partial list is an error, never
passed off as the whole).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

import grpc

from gregor.common.tls import from_client_config
from gregor.client.config import client_id_for, consumer_config, parse_bootstrap
from gregor.client.group_membership import find_coordinator
from gregor.client.metadata import ClusterMetadata, call_error
from gregor.client.throttles import Throttles
from gregor.common import consumer_protocol as cp
from gregor.common import errors
from gregor.rpc.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

TopicPartition = tuple[str, int]
LIST_GROUPS_KEY = "__gregor_list_groups"  # the FindCoordinator key ListGroups uses to reach some live coordinator


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
                                        request_timeout_ms=cfg["request.timeout.ms"], security=from_client_config(cfg),
                                        client_id=client_id_for(cfg, "adminclient"))
        self.coordinators = [a.strip() for a in cfg["coordinator.bootstrap.servers"].split(",") if a.strip()]
        self.timeout_s = cfg["request.timeout.ms"] / 1000
        self.api_timeout_s = cfg["default.api.timeout.ms"] / 1000
        self.backoff_s = cfg["retry.backoff.ms"] / 1000
        self._owner: dict[str, str] = {}
        self.throttles = Throttles()  # coordinators that answered with throttle_time_ms (KIP-219)

    async def __aenter__(self) -> "GroupAdmin":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.metadata.close()

    def _stub(self, address: str) -> coordinator_pb2_grpc.GroupCoordinatorServiceStub:
        return coordinator_pb2_grpc.GroupCoordinatorServiceStub(self.metadata.channel(address))

    async def find_coordinator(self, group_id: str) -> str:
        """host:port of group_id's coordinator (cached until a call to it fails retriably)."""
        if group_id not in self._owner:
            self._owner[group_id], _ = await find_coordinator(self.metadata, group_id, self.coordinators,
                                                              self.timeout_s)
        return self._owner[group_id]

    async def _call(self, group_id: str, method: str, request: Any,
                    body_error: Optional[Callable[[Any], Any]] = None) -> Any:
        """RPC to the group's coordinator, finding it again on NOT_COORDINATOR, UNAVAILABLE and friends.

        body_error(resp) returns the ErrorDetail a response carries for the group (DescribeGroups,
        DeleteGroups answer per group): a retriable one (the group moved) is retried like a status."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.api_timeout_s
        while True:
            try:
                address = await self.find_coordinator(group_id)
                await self.throttles.wait(address)  # KIP-219: a throttled coordinator gets nothing before its time
                resp = await getattr(self._stub(address), method)(request, timeout=self.timeout_s)
                self.throttles.record(address, resp.throttle_time_ms)
                detail = body_error(resp) if body_error is not None else None
                if detail is None or detail.code == 0 or not errors.from_detail(detail).retriable:
                    return resp
                err = errors.from_detail(detail)
            except (grpc.RpcError, asyncio.TimeoutError, errors.GregorError) as exc:
                err = call_error(exc)
            if not err.retriable or loop.time() >= deadline:
                raise err
            self._owner.pop(group_id, None)
            await asyncio.sleep(max(self.backoff_s, 0.1))

    # ------------------------------------------------------------ operations
    async def list_groups(self) -> list[GroupListing]:
        """Every group of the cluster: ListGroups to one live coordinator, which asks all of them.

        Kafka's admin asks every broker (each is a coordinator); here any broker names a live
        coordinator (FindCoordinator of a fixed key: any key's owner will do) and that coordinator
        fans ListGroups out to every live instance. Retried while a partition is loading or moving.
        """
        resp = await self._call(LIST_GROUPS_KEY, "ListGroups", coordinator_pb2.ListGroupsRequest())
        return sorted((GroupListing(g.group_id, g.protocol_type, g.state) for g in resp.groups),
                      key=lambda g: g.group_id)

    async def describe_group(self, group_id: str) -> GroupDescription:
        resp = await self._call(group_id, "DescribeGroups", coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]),
                                lambda r: r.groups[0].error if r.groups and r.groups[0].HasField("error") else None)
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
        """Committed offsets of the group (all of them when tps is None); partitions without one are left out.
        A requested partition the broker answers with an error (TOPIC_AUTHORIZATION_FAILED: no Describe on its
        topic) raises that error, as Kafka's listConsumerGroupOffsets fails for it."""
        req = coordinator_pb2.OffsetFetchRequest(
            group_id=group_id, partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in tps or []])
        resp = await self._call(group_id, "OffsetFetch", req)
        for p in resp.partitions:
            if p.HasField("error") and p.error.code != 0:
                raise errors.from_detail(p.error)
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
                resp = await self._call(gid, "DeleteGroups", coordinator_pb2.DeleteGroupsRequest(group_ids=[gid]),
                                        _group_error(gid))
            except errors.GregorError as err:
                out[gid] = err
                continue
            detail = resp.errors.get(gid)
            out[gid] = errors.from_detail(detail) if detail is not None and detail.code != 0 else None
        return out


def _group_error(group_id: str) -> Callable[[Any], Any]:
    """The ErrorDetail a DeleteGroupsResponse holds for group_id (None when it has none)."""
    return lambda resp: resp.errors.get(group_id)
