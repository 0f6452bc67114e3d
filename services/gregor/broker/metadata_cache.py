"""The broker's MetadataCache: live brokers and partition leadership as the controller's UpdateMetadata said.

In cluster mode BrokerService.Metadata answers from here, so every broker tells
clients the same leaders, replicas and ISR. Concurrency: event-loop owned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gregor.common import errors
from gregor.rpc.v1 import broker_pb2, common_pb2


@dataclass(frozen=True)
class CachedPartition:
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    # Replicas on live brokers whose log dir is offline, as the controller said.
    offline_replicas: tuple[int, ...] = ()


class MetadataCache:
    """Live brokers and partition states from the latest UpdateMetadata (Kafka's MetadataCache)."""

    def __init__(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self.controller_id = -1
        self.live_brokers: dict[int, common_pb2.BrokerEndpoint] = {}
        self.partitions: dict[str, dict[int, CachedPartition]] = {}
        # Topic ids (KIP-516) as the controller sent them; a topic sent before ids has none.
        self.topic_ids: dict[str, bytes] = {}
        # Each topic's Metadata answer, built once per change (issue 24: building it for a 10,000-partition
        # topic took ~0.1 s of the loop per request, and clients poll it while a creation is under way).
        self._answers: dict[str, broker_pb2.TopicMetadata] = {}

    def update_metadata(self, controller_id: int, live_brokers: Iterable[common_pb2.BrokerEndpoint],
                        states: Iterable[broker_pb2.LeaderAndIsrPartitionState],
                        deleted_topics: Iterable[str]) -> None:
        """Replace the live brokers, upsert the listed partitions, forget deleted topics."""
        self.controller_id = controller_id
        live = {b.broker_id: b for b in live_brokers}
        if live.keys() != self.live_brokers.keys():
            self._answers.clear()  # leaders and offline replicas depend on who is live
        self.live_brokers = live
        for s in states:
            self._answers.pop(s.topic, None)
            topic_id = bytes(s.topic_id)
            if topic_id and self.topic_ids.get(s.topic, topic_id) != topic_id:
                # Another topic under the same name: the old one's partitions are gone with it.
                self.partitions.pop(s.topic, None)
            if topic_id:
                self.topic_ids[s.topic] = topic_id
            self.partitions.setdefault(s.topic, {})[s.partition] = CachedPartition(
                s.leader, s.leader_epoch, tuple(s.replicas), tuple(s.isr), tuple(s.offline_replicas))
        for topic in deleted_topics:
            self.partitions.pop(topic, None)
            self.topic_ids.pop(topic, None)
            self._answers.pop(topic, None)

    def contains(self, topic: str) -> bool:
        return topic in self.partitions

    def metadata_response(self, topics: list[str]) -> broker_pb2.MetadataResponse:
        """BrokerService.Metadata: every known topic when none is asked."""
        return broker_pb2.MetadataResponse(
            brokers=[self.live_brokers[b] for b in sorted(self.live_brokers)], cluster_id=self.cluster_id,
            controller_id=self.controller_id, topics=[answer for answer, _ in self.topic_answers(topics)])

    def topic_answers(self, topics: list[str]) -> list[tuple[broker_pb2.TopicMetadata, bool]]:
        """Each named topic's answer (every known topic when none is named) and whether it is the cached one:
        a cached answer is the same object until the topic or the live brokers change (the Kafka listener
        keys its encoded topics on it). Callers must not change the answers."""
        out = []
        for name in topics or sorted(self.partitions):
            answer = self._answers.get(name)
            if answer is None:
                parts = self.partitions.get(name)
                if parts is None:
                    out.append((broker_pb2.TopicMetadata(name=name, error=errors.Code.UNKNOWN_TOPIC_OR_PARTITION),
                                False))
                    continue
                answer = self._answers[name] = broker_pb2.TopicMetadata(
                    name=name, is_internal=name.startswith("__"), topic_id=self.topic_ids.get(name, b""),
                    partitions=[self._partition(p, parts[p]) for p in sorted(parts)])
            out.append((answer, True))
        return out

    def _partition(self, partition: int, p: CachedPartition) -> broker_pb2.PartitionMetadata:
        offline = [r for r in p.replicas if r not in self.live_brokers or r in p.offline_replicas]
        leader_alive = p.leader >= 0 and p.leader in self.live_brokers
        return broker_pb2.PartitionMetadata(
            partition=partition, leader=p.leader if leader_alive else -1, leader_epoch=p.leader_epoch,
            replicas=list(p.replicas), isr=list(p.isr), offline_replicas=offline,
            error=errors.Code.NONE if leader_alive else errors.Code.LEADER_NOT_AVAILABLE)
