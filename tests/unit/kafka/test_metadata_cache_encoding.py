"""The Kafka listener's Metadata answer reuses each topic's encoded part while the broker's metadata cache
holds the same answer for it, and encodes it again once an UpdateMetadata changed the topic (issue 24)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kio.serial import entity_reader
from kio.static.constants import EntityType

from gregor.broker.metadata_cache import MetadataCache
from gregor.kafka import codec
from gregor.kafka.handlers import KafkaHandlers
from gregor.rpc.v1 import broker_pb2, common_pb2


def _state(topic: str, partition: int, leader: int, epoch: int) -> broker_pb2.LeaderAndIsrPartitionState:
    return broker_pb2.LeaderAndIsrPartitionState(topic=topic, partition=partition, leader=leader, leader_epoch=epoch,
                                                 isr=[0, 1], replicas=[0, 1], topic_id=b"\x01" * 16)


def _handlers(cache: MetadataCache) -> Any:
    handlers: Any = object.__new__(KafkaHandlers)  # only what Metadata uses: no listener, no sessions
    handlers.broker = SimpleNamespace(cluster_mode=True, metadata_cache=cache, authz=SimpleNamespace(enabled=False),
                                      config=SimpleNamespace(broker_id=0))
    handlers._encoded_topics = {}

    async def kafka_brokers() -> dict[int, tuple[str, int, str | None]]:
        return {0: ("h", 9092, None), 1: ("h", 9093, None)}

    handlers.kafka_brokers = kafka_brokers
    return handlers


async def _answer(handlers: Any, version: int, names: list[str]) -> Any:
    header = codec.RequestHeader(3, version, 1, "c")
    mod = codec.module(3, version, EntityType.response)
    req = SimpleNamespace(topics=[SimpleNamespace(name=n) for n in names])
    body = await handlers.metadata(header, req, mod)
    data = codec.encode_response(header, body)
    parsed, _ = entity_reader(type(body))(memoryview(data), 8 + (1 if type(body).__flexible__ else 0))
    return body, parsed


async def test_encoded_topics_are_reused_until_the_topic_changes() -> None:
    cache = MetadataCache("cid")
    live = [common_pb2.BrokerEndpoint(broker_id=0), common_pb2.BrokerEndpoint(broker_id=1)]
    cache.update_metadata(0, live, [_state("t", p, p % 2, 0) for p in range(4)], [])
    handlers = _handlers(cache)

    first, parsed = await _answer(handlers, 12, ["t", "missing"])
    assert [t.name for t in parsed.topics] == ["t", "missing"]
    assert [p.leader_id for p in parsed.topics[0].partitions] == [0, 1, 0, 1]
    assert int(parsed.topics[1].error_code) == 3  # UNKNOWN_TOPIC_OR_PARTITION, not cached
    again, _ = await _answer(handlers, 12, ["t"])
    assert again.topics[0] is first.topics[0], "the unchanged topic was encoded again"
    older, parsed_v1 = await _answer(handlers, 1, ["t"])  # another version: its own encoding
    assert older.topics[0] != first.topics[0] and len(parsed_v1.topics[0].partitions) == 4

    cache.update_metadata(0, live, [_state("t", 2, 1, 5)], [])  # partition 2's leader moved
    moved, parsed = await _answer(handlers, 12, ["t"])
    assert moved.topics[0] is not first.topics[0]
    assert [p.leader_id for p in parsed.topics[0].partitions] == [0, 1, 1, 1]
    assert parsed.topics[0].partitions[2].leader_epoch == 5
