"""OffsetFetch v8 (KIP-709: several groups in one request) on the Kafka listener: the wire form through kio and
the per-group fan-out, with the coordinator relay (group_call) and the open transactions replaced by fakes, since
what is tested is how the answers of several groups are put together (tests/e2e/test_kafka_java_tools.py sends
v8 from Kafka's AdminClient to a real cluster)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from kio.schema.offset_fetch.v8 import request as rq, response as rs
from kio.schema.types import GroupId, TopicName
from kio.serial import entity_reader
from kio.static.constants import EntityType
from kio.static.primitive import i32

from gregor.common import errors
from gregor.kafka import codec
from gregor.kafka.handlers import SUPPORTED, KafkaHandlers
from gregor.rpc.v1 import common_pb2, coordinator_pb2

OFFSET_FETCH = 9


class FakeTxn:
    def __init__(self, pending: set[tuple[str, tuple[str, int]]]) -> None:
        self.pending = pending
        self.calls = 0

    async def unstable_offsets_of(self, group_ids: set[str]) -> set[tuple[str, tuple[str, int]]]:
        self.calls += 1
        return {p for p in self.pending if p[0] in group_ids}


def handlers(committed: dict[str, dict[tuple[str, int], int]], failing: dict[str, errors.GregorError],
             txn: FakeTxn) -> tuple[KafkaHandlers, list[str]]:
    h = object.__new__(KafkaHandlers)
    called: list[str] = []

    async def group_call(group_id: str, method: str, request: Any, timeout_s: float = 30.0) -> Any:
        assert method == "OffsetFetch" and request.group_id == group_id
        called.append(group_id)
        if group_id in failing:
            raise failing[group_id]
        stored = committed.get(group_id, {})
        asked = [(tp.topic, tp.partition) for tp in request.partitions] or sorted(stored)
        return coordinator_pb2.OffsetFetchResponse(partitions=[
            coordinator_pb2.OffsetFetchPartition(topic=t, partition=p, offset=stored.get((t, p), -1), leader_epoch=-1)
            for t, p in asked])

    h.group_call = group_call  # type: ignore[method-assign]
    h.txn = txn  # type: ignore[assignment]
    return h, called


def v8_frame(req: Any) -> bytes:
    head = struct.pack(">hhih", OFFSET_FETCH, 8, 7, 1) + b"c" + bytes([0])  # request header v2
    return head + codec.encode_entity(req)


def test_v8_is_advertised() -> None:
    assert SUPPORTED[OFFSET_FETCH] == (1, 8)


def test_v8_answers_each_group_with_its_own_error_code_and_offsets() -> None:
    req = rq.OffsetFetchRequest(require_stable=True, groups=(
        rq.OffsetFetchRequestGroup(group_id=GroupId("a"), topics=(
            rq.OffsetFetchRequestTopics(name=TopicName("t"), partition_indexes=(i32(0), i32(1))),)),
        rq.OffsetFetchRequestGroup(group_id=GroupId("b"), topics=None),  # null topics: all the group has
        rq.OffsetFetchRequestGroup(group_id=GroupId("denied"), topics=None),
        rq.OffsetFetchRequestGroup(group_id=GroupId("moved"), topics=None)))
    frame = v8_frame(req)
    header, pos = codec.read_header(frame)
    parsed = codec.parse_body(frame, pos, header)
    assert [str(g.group_id) for g in parsed.groups] == ["a", "b", "denied", "moved"]
    txn = FakeTxn({("a", ("t", 1)), ("b", ("t", 0))})
    h, called = handlers({"a": {("t", 0): 5, ("t", 1): 9}, "b": {("t", 0): 3, ("u", 2): 4}},
                         {"denied": errors.error_for(errors.Code.GROUP_AUTHORIZATION_FAILED, "no"),
                          "moved": errors.error_for(errors.Code.NOT_COORDINATOR, "elsewhere")}, txn)
    mod = codec.module(OFFSET_FETCH, 8, EntityType.response)
    resp = asyncio.run(h.offset_fetch(header, parsed, mod))
    assert sorted(called) == ["a", "b", "denied", "moved"] and txn.calls == 1  # one transactions read for all

    data = codec.encode_response(header, resp)  # the bytes a client reads back
    back, _ = entity_reader(rs.OffsetFetchResponse)(memoryview(data), 8 + 1)  # size, correlation id, tags
    got = {str(g.group_id): (int(g.error_code.value), {
        (str(t.name), int(p.partition_index)): (int(p.committed_offset), int(p.error_code.value))
        for t in g.topics for p in t.partitions}) for g in back.groups}
    assert got == {
        "a": (0, {("t", 0): (5, 0), ("t", 1): (9, 88)}),  # t-1 held by an open transaction: UNSTABLE_OFFSET_COMMIT
        "b": (0, {("t", 0): (3, 88), ("u", 2): (4, 0)}),
        "denied": (30, {}),  # GROUP_AUTHORIZATION_FAILED in the group's error code, not the request's
        "moved": (16, {}),  # NOT_COORDINATOR: the client looks the group's coordinator up again
    }


def test_v7_still_answers_one_group_at_the_top_level() -> None:
    from kio.schema.offset_fetch.v7 import request as rq7

    req = rq7.OffsetFetchRequest(group_id=GroupId("a"), require_stable=False, topics=None)
    h, _ = handlers({"a": {("t", 0): 5}}, {}, FakeTxn(set()))
    resp = asyncio.run(h.offset_fetch(codec.RequestHeader(OFFSET_FETCH, 7, 1, None), req,
                                      codec.module(OFFSET_FETCH, 7, EntityType.response)))
    assert int(resp.error_code.value) == 0
    assert [(str(t.name), int(p.partition_index), int(p.committed_offset)) for t in resp.topics
            for p in t.partitions] == [("t", 0, 5)]
    h, _ = handlers({}, {"a": errors.error_for(errors.Code.COORDINATOR_NOT_AVAILABLE, "x")}, FakeTxn(set()))
    resp = asyncio.run(h.offset_fetch(codec.RequestHeader(OFFSET_FETCH, 7, 1, None), req,
                                      codec.module(OFFSET_FETCH, 7, EntityType.response)))
    assert int(resp.error_code.value) == 15 and resp.topics == ()
