"""A raw gRPC group member for coordinator tests: JoinGroup/SyncGroup/Heartbeat exactly as a client sends them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from gregor.common import consumer_protocol as cp
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import common_pb2, coordinator_pb2 as pb, coordinator_pb2_grpc


def stub(target: str) -> tuple[grpc.aio.Channel, coordinator_pb2_grpc.GroupCoordinatorServiceStub]:
    ch = channel(target)
    return ch, coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch)


async def call(coro: object) -> object:
    """Await an RPC, turning a failed status into its GregorError."""
    try:
        return await coro  # type: ignore[misc]
    except grpc.RpcError as exc:
        raise errors.from_rpc_error(exc) from None


def range_assign(members: list[tuple[str, list[str]]], partitions: dict[str, int]) -> dict[str, bytes]:
    """Kafka's RangeAssignor (seed 003 6.4.1): members sorted, per topic n = P / M, first P % M get one more."""
    out: dict[str, list[tuple[str, list[int]]]] = {m: [] for m, _ in members}
    for topic, count in sorted(partitions.items()):
        subs = sorted(m for m, topics in members if topic in topics)
        if not subs:
            continue
        n, extra = divmod(count, len(subs))
        start = 0
        for i, m in enumerate(subs):
            k = n + (1 if i < extra else 0)
            out[m].append((topic, list(range(start, start + k))))
            start += k
    return {m: cp.encode_assignment(cp.Assignment(tps)) for m, tps in out.items()}


@dataclass
class Member:
    """One consumer-group member speaking raw gRPC."""

    stub: coordinator_pb2_grpc.GroupCoordinatorServiceStub
    group: str
    topics: list[str]
    instance_id: str = ""
    session_timeout_ms: int = 6000
    rebalance_timeout_ms: int = 10000
    member_id: str = ""
    generation: int = -1
    leader: str = ""
    members: list[pb.JoinGroupMember] = field(default_factory=list)
    assignment: cp.Assignment | None = None

    async def join(self, timeout: float = 30) -> pb.JoinGroupResponse:
        """JoinGroup, rejoining once with the id a MEMBER_ID_REQUIRED answer hands out."""
        while True:
            meta = cp.encode_subscription(cp.Subscription(self.topics))
            resp = await call(self.stub.JoinGroup(pb.JoinGroupRequest(
                group_id=self.group, session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=self.member_id,
                group_instance_id=self.instance_id, protocol_type="consumer", client_id=f"c-{self.instance_id}",
                protocols=[pb.GroupProtocol(name="range", metadata=meta)]), timeout=timeout))
            self.member_id = resp.member_id
            if resp.error.code == common_pb2.MEMBER_ID_REQUIRED:
                continue
            self.generation, self.leader, self.members = resp.generation_id, resp.leader, list(resp.members)
            return resp  # type: ignore[no-any-return]

    async def sync(self, partitions: dict[str, int] | None = None, timeout: float = 30) -> cp.Assignment:
        assignments = []
        if self.member_id == self.leader and self.members:
            subs = [(m.member_id, cp.decode_subscription(m.metadata).topics) for m in self.members]
            assignments = [pb.SyncGroupAssignment(member_id=k, assignment=v)
                           for k, v in range_assign(subs, partitions or {}).items()]
        resp = await call(self.stub.SyncGroup(pb.SyncGroupRequest(
            group_id=self.group, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id, assignments=assignments), timeout=timeout))
        self.assignment = cp.decode_assignment(resp.assignment)
        return self.assignment

    async def heartbeat(self) -> None:
        await call(self.stub.Heartbeat(pb.HeartbeatRequest(
            group_id=self.group, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id), timeout=10))

    async def leave(self) -> None:
        await call(self.stub.LeaveGroup(pb.LeaveGroupRequest(group_id=self.group, member_ids=[self.member_id]),
                                        timeout=10))

    async def commit(self, offsets: dict[tuple[str, int], int], generation: int | None = None) -> pb.OffsetCommitResponse:
        return await call(self.stub.OffsetCommit(pb.OffsetCommitRequest(  # type: ignore[no-any-return]
            group_id=self.group, generation_id=self.generation if generation is None else generation,
            member_id=self.member_id, group_instance_id=self.instance_id,
            partitions=[pb.OffsetCommitPartition(topic=t, partition=p, offset=o) for (t, p), o in offsets.items()]),
            timeout=30))


async def join_and_sync(members: list[Member], partitions: dict[str, int], timeout_s: float = 30) -> list[cp.Assignment]:
    """Every member joins and syncs like a real client until all hold the same generation.

    A member whose sync or heartbeat says REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION rejoins;
    one that synced keeps heartbeating until the others are in its generation.
    """
    retry = (errors.Code.REBALANCE_IN_PROGRESS, errors.Code.ILLEGAL_GENERATION)
    synced: dict[int, int] = {}

    async def one(m: Member) -> cp.Assignment:
        while True:
            await m.join()
            try:
                assignment = await m.sync(partitions)
            except errors.GregorError as exc:
                if exc.code not in retry:
                    raise
                continue
            synced[id(m)] = m.generation
            while not all(synced.get(id(x)) == m.generation for x in members):
                await asyncio.sleep(0.05)
                try:
                    await m.heartbeat()
                except errors.GregorError as exc:
                    if exc.code not in retry:
                        raise
                    synced.pop(id(m), None)
                    break
            else:
                return assignment

    return list(await asyncio.wait_for(asyncio.gather(*(one(m) for m in members)), timeout_s))
