"""Gregor's client SDK: producer, consumer and admin client (asyncio, with blocking Sync* facades)."""

from gregor.client.accumulator import FutureRecordMetadata, RecordMetadata
from gregor.client.admin import AdminClient, ClusterDescription, ConfigEntry, NewTopic, SyncAdminClient
from gregor.client.config import ConfigError
from gregor.client.consumer import Consumer, ConsumerRecord, SyncConsumer
from gregor.client.partitioner import DefaultPartitioner, Partitioner, RoundRobinPartitioner, murmur2
from gregor.client.producer import Producer, SyncProducer

__all__ = [
    "AdminClient", "ClusterDescription", "ConfigEntry", "ConfigError", "Consumer", "ConsumerRecord",
    "DefaultPartitioner", "FutureRecordMetadata", "NewTopic", "Partitioner", "Producer", "RecordMetadata",
    "RoundRobinPartitioner", "SyncAdminClient", "SyncConsumer", "SyncProducer", "murmur2",
]
