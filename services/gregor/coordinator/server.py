"""gRPC servicer of the group coordinator: proto <-> domain, status codes, nothing else."""

from __future__ import annotations

import asyncio
from typing import TypeAlias

import grpc

from gregor.common import authz as az, errors
from gregor.common.acl import CLUSTER_NAME, Operation, ResourceType
from gregor.common.clock import monotonic_ms
from gregor.common.rpc import RequestQuota, rpc_method
from gregor.coordinator.coordinator import GroupCoordinator
from gregor.coordinator.group import Group, GroupState
from gregor.rpc.v1 import common_pb2, coordinator_pb2 as pb, coordinator_pb2_grpc

Ctx: TypeAlias = grpc.aio.ServicerContext
Code = errors.Code
LIST_SCOPE_HEADER = "gregor-list-scope"


def _peer_host(context: Ctx) -> str:
    """'ipv4:127.0.0.1:5555' -> '/127.0.0.1' (Kafka prints client hosts with a leading slash)."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        host = rest.rsplit(":", 1)[0].strip("[]")
    else:
        host = rest.rsplit(":", 1)[0]
    return f"/{host}" if host else ""


def _ok() -> common_pb2.ErrorDetail:
    return common_pb2.ErrorDetail(code=Code.NONE)


class GroupCoordinatorServicer(coordinator_pb2_grpc.GroupCoordinatorServiceServicer):
    """GroupCoordinatorService over one GroupCoordinator instance."""

    def __init__(self, coordinator: GroupCoordinator, authz: az.Authz | None = None,
                 request_quota: RequestQuota | None = None) -> None:
        self.c = coordinator
        self.m = coordinator.manager
        self.authz = authz or az.Authz()
        self.request_quota = request_quota  # request_percentage: rpc_method meters every call (quotas.py)

    def _group(self, context: Ctx, operation: Operation, group_id: str, api: str) -> None:
        """Kafka's group checks: Read on the group to join, sync, heartbeat, leave and commit."""
        if self.authz.enabled:
            self.authz.require(self.authz.caller_of(context), operation, ResourceType.GROUP, group_id, api)

    def _may(self, context: Ctx, operation: Operation, rtype: ResourceType, name: str, api: str) -> bool:
        return self.authz.check(self.authz.caller_of(context), operation, rtype, name, api)

    @rpc_method("GroupCoordinatorService")
    async def FindCoordinator(self, request: pb.FindCoordinatorRequest, context: Ctx) -> pb.FindCoordinatorResponse:
        self._group(context, Operation.DESCRIBE, request.group_id, "FindCoordinator")
        cid, host, port, p = self.c.find_coordinator(request.group_id)
        return pb.FindCoordinatorResponse(coordinator_id=cid, host=host, port=port, partition=p)

    @rpc_method("GroupCoordinatorService")
    async def JoinGroup(self, request: pb.JoinGroupRequest, context: Ctx) -> pb.JoinGroupResponse:
        self._group(context, Operation.READ, request.group_id, "JoinGroup")
        self.c.check_owner(request.group_id)
        fut = self.m.join_group(
            request.group_id, request.member_id, request.group_instance_id, request.client_id, _peer_host(context),
            request.session_timeout_ms, request.rebalance_timeout_ms, request.protocol_type,
            [(p.name, p.metadata) for p in request.protocols], monotonic_ms())
        result = await fut
        await self.c.persist_dirty()
        if result.member_id_required:
            err = errors.error_for(Code.MEMBER_ID_REQUIRED,
                                   f"rejoin group {request.group_id} with member id {result.member_id}")
            return pb.JoinGroupResponse(generation_id=-1, member_id=result.member_id, error=err.to_detail())
        return pb.JoinGroupResponse(
            generation_id=result.generation_id, protocol_name=result.protocol_name, leader=result.leader,
            member_id=result.member_id,
            members=[pb.JoinGroupMember(member_id=mid, group_instance_id=iid, metadata=meta)
                     for mid, iid, meta in result.members])

    @rpc_method("GroupCoordinatorService")
    async def SyncGroup(self, request: pb.SyncGroupRequest, context: Ctx) -> pb.SyncGroupResponse:
        self._group(context, Operation.READ, request.group_id, "SyncGroup")
        self.c.check_owner(request.group_id)
        fut = self.m.sync_group(request.group_id, request.generation_id, request.member_id,
                                request.group_instance_id, {a.member_id: a.assignment for a in request.assignments},
                                monotonic_ms())
        group = self.m.groups.get(request.group_id)
        if group is not None and group.awaiting_store and request.member_id == group.leader_id:
            # The leader's sync made the group Stable: store the generation, then answer everyone.
            # Shielded: a leader that gives up waiting must not leave the other members parked.
            await asyncio.shield(asyncio.ensure_future(self._store_and_release(group)))
        return pb.SyncGroupResponse(assignment=await fut)

    async def _store_and_release(self, group: Group) -> None:
        generation = group.generation_id
        try:
            await self.c.store_group(group)
        except errors.GregorError as exc:
            self.m.on_store_failed(group.group_id, generation, exc, monotonic_ms())
            raise
        self.m.release_syncs(group.group_id, generation)

    @rpc_method("GroupCoordinatorService")
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Ctx) -> pb.HeartbeatResponse:
        self._group(context, Operation.READ, request.group_id, "Heartbeat")
        self.c.check_owner(request.group_id)
        self.m.heartbeat(request.group_id, request.generation_id, request.member_id, request.group_instance_id,
                         monotonic_ms())
        return pb.HeartbeatResponse()

    @rpc_method("GroupCoordinatorService")
    async def LeaveGroup(self, request: pb.LeaveGroupRequest, context: Ctx) -> pb.LeaveGroupResponse:
        """Every listed member id and instance id leaves; a single failing member fails the call."""
        self._group(context, Operation.READ, request.group_id, "LeaveGroup")
        self.c.check_owner(request.group_id)
        who = [(mid, "") for mid in request.member_ids] + [("", iid) for iid in request.group_instance_ids]
        if not who:
            raise errors.error_for(Code.INVALID_REQUEST, "LeaveGroup names no member id or group.instance.id")
        results = []
        for mid, iid in who:
            try:
                self.m.leave_group(request.group_id, mid, iid, monotonic_ms())
                detail = _ok()
            except errors.GregorError as exc:
                if len(who) == 1:
                    raise
                detail = exc.to_detail()
            results.append(pb.LeaveGroupMemberResult(member_id=mid, group_instance_id=iid, error=detail))
        await self.c.persist_dirty()
        return pb.LeaveGroupResponse(members=results)

    @rpc_method("GroupCoordinatorService")
    async def OffsetCommit(self, request: pb.OffsetCommitRequest, context: Ctx) -> pb.OffsetCommitResponse:
        self._group(context, Operation.READ, request.group_id, "OffsetCommit")
        p = self.c.check_owner(request.group_id)
        group = (self.m.transactional_commit_group(request.group_id, monotonic_ms()) if request.transactional
                 else self.m.validate_offset_commit(request.group_id, request.generation_id, request.member_id,
                                                    request.group_instance_id, monotonic_ms()))
        results, commits = [], []
        for part in request.partitions:
            if not part.topic or part.partition < 0 or part.offset < 0:
                err = errors.error_for(Code.INVALID_COMMIT_OFFSET_SIZE if part.offset < 0 else Code.INVALID_REQUEST,
                                       f"cannot commit offset {part.offset} for {part.topic}-{part.partition}")
                results.append(pb.OffsetCommitPartitionResult(topic=part.topic, partition=part.partition,
                                                              error=err.to_detail()))
                continue
            if self.authz.enabled and not self._may(context, Operation.READ, ResourceType.TOPIC, part.topic,
                                                    "OffsetCommit"):
                err = az.denial(self.authz.caller_of(context), Operation.READ, ResourceType.TOPIC, part.topic,
                                topic=part.topic)
                results.append(pb.OffsetCommitPartitionResult(topic=part.topic, partition=part.partition,
                                                              error=err.to_detail()))
                continue
            commits.append((part.topic, part.partition, part.offset, part.leader_epoch, part.metadata))
        if commits:
            await self.c.commit_offsets(group, p, commits)
        results += [pb.OffsetCommitPartitionResult(topic=t, partition=q, error=_ok()) for t, q, *_ in commits]
        return pb.OffsetCommitResponse(results=results)

    @rpc_method("GroupCoordinatorService")
    async def ValidateTxnOffsetCommit(self, request: pb.ValidateTxnOffsetCommitRequest,
                                      context: Ctx) -> pb.ValidateTxnOffsetCommitResponse:
        """KIP-447: the transaction coordinator asks before it keeps a transaction's offsets of this group."""
        self.c.check_owner(request.group_id)
        self.m.validate_txn_offset_commit(request.group_id, request.generation_id, request.member_id,
                                          request.group_instance_id)
        return pb.ValidateTxnOffsetCommitResponse()

    @rpc_method("GroupCoordinatorService")
    async def OffsetFetch(self, request: pb.OffsetFetchRequest, context: Ctx) -> pb.OffsetFetchResponse:
        self._group(context, Operation.DESCRIBE, request.group_id, "OffsetFetch")
        self.c.check_owner(request.group_id)
        group = self.m.groups.get(request.group_id)
        stored = group.offsets if group is not None else {}
        asked = [(tp.topic, tp.partition) for tp in request.partitions]
        wanted = asked or sorted(stored)
        denied: dict[str, errors.GregorError] = {}
        if self.authz.enabled:
            # Kafka: a requested partition of a topic the caller may not Describe is answered
            # TOPIC_AUTHORIZATION_FAILED (offset -1); asked for all, such topics are left out silently.
            caller = self.authz.caller_of(context)
            if asked:
                for topic in dict.fromkeys(t for t, _ in asked):
                    if not self.authz.check(caller, Operation.DESCRIBE, ResourceType.TOPIC, topic, "OffsetFetch"):
                        denied[topic] = az.denial(caller, Operation.DESCRIBE, ResourceType.TOPIC, topic, topic=topic)
            else:
                wanted = [tp for tp in wanted if self.authz.check(caller, Operation.DESCRIBE, ResourceType.TOPIC,
                                                                  tp[0], "OffsetFetch", audit=False)]
        out = []
        for tp in wanted:
            err = denied.get(tp[0])
            if err is not None:
                out.append(pb.OffsetFetchPartition(topic=tp[0], partition=tp[1], offset=-1, leader_epoch=-1,
                                                   error=errors.error_for(err.code, err.message, topic=tp[0],
                                                                          partition=tp[1]).to_detail()))
                continue
            off, epoch, meta, _ts = stored.get(tp, (-1, -1, "", 0))
            out.append(pb.OffsetFetchPartition(topic=tp[0], partition=tp[1], offset=off, leader_epoch=epoch,
                                               metadata=meta))
        return pb.OffsetFetchResponse(partitions=out)

    @rpc_method("GroupCoordinatorService")
    async def ListGroups(self, request: pb.ListGroupsRequest, context: Ctx) -> pb.ListGroupsResponse:
        """Every group of the cluster: this instance's own plus those of every other live instance
        (fan-out with the `gregor-list-scope: local` header, which asks one instance for its own only)."""
        if dict(context.invocation_metadata() or ()).get(LIST_SCOPE_HEADER) == "local":
            if self.authz.enabled:  # another coordinator's fan-out
                self.authz.require_cluster(self.authz.caller_of(context), Operation.CLUSTER_ACTION, "ListGroups")
            return pb.ListGroupsResponse(groups=self.c.list_local_groups())
        listings = await self.c.list_all_groups()
        if self.authz.enabled and not self._may(context, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME,
                                                "ListGroups"):  # Kafka: else the groups one may Describe
            caller = self.authz.caller_of(context)
            listings = [g for g in listings if self.authz.check(caller, Operation.DESCRIBE, ResourceType.GROUP,
                                                                g.group_id, "ListGroups", audit=False)]
        return pb.ListGroupsResponse(groups=listings)

    @rpc_method("GroupCoordinatorService")
    async def DescribeGroups(self, request: pb.DescribeGroupsRequest, context: Ctx) -> pb.DescribeGroupsResponse:
        out = []
        for gid in request.group_ids:
            try:
                self._group(context, Operation.DESCRIBE, gid, "DescribeGroups")
                self.c.check_owner(gid)
            except errors.GregorError as exc:
                out.append(pb.GroupDescription(group_id=gid, error=exc.to_detail()))
                continue
            g = self.m.groups.get(gid)
            if g is None:
                out.append(pb.GroupDescription(group_id=gid, state=GroupState.DEAD.value, error=_ok()))
                continue
            stable = g.is_(GroupState.STABLE)
            out.append(pb.GroupDescription(
                group_id=gid, state=g.state.value, protocol_type=g.protocol_type, protocol=g.protocol_name,
                generation_id=g.generation_id, leader=g.leader_id, error=_ok(),
                members=[pb.GroupMemberDescription(
                    member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                    client_host=m.client_host, metadata=m.metadata_for(g.protocol_name),
                    assignment=m.assignment if stable else b"") for m in g.members.values()]))
        return pb.DescribeGroupsResponse(groups=out)

    @rpc_method("GroupCoordinatorService")
    async def OffsetDelete(self, request: pb.OffsetDeleteRequest, context: Ctx) -> pb.OffsetDeleteResponse:
        p = self.c.check_owner(request.group_id)
        tps = [(tp.topic, tp.partition) for tp in request.partitions]
        group, kept = self.m.validate_offset_delete(request.group_id, tps)
        await self.c.delete_offsets(group, p, [tp for tp in tps if tp[0] not in kept])
        subscribed = errors.error_for(errors.Code.GROUP_SUBSCRIBED_TO_TOPIC,
                                      f"group {request.group_id} subscribes to the topic: its offsets stay")
        return pb.OffsetDeleteResponse(results=[
            pb.OffsetDeleteResult(partition=tp, error=subscribed.to_detail() if tp.topic in kept else _ok())
            for tp in request.partitions])

    @rpc_method("GroupCoordinatorService")
    async def DeleteGroups(self, request: pb.DeleteGroupsRequest, context: Ctx) -> pb.DeleteGroupsResponse:
        out: dict[str, common_pb2.ErrorDetail] = {}
        for gid in request.group_ids:
            try:
                self._group(context, Operation.DELETE, gid, "DeleteGroups")
                p = self.c.check_owner(gid)
                group = self.m.validate_delete(gid)
                await self.c.delete_group(group, p)
                out[gid] = _ok()
            except errors.GregorError as exc:
                out[gid] = exc.to_detail()
        return pb.DeleteGroupsResponse(errors=out)
