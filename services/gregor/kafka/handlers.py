"""Kafka APIs mapped onto Gregor: partition APIs on the broker's own ReplicaManager and metadata,
admin APIs through the broker's controller link, group APIs relayed to the group coordinator
process that owns the group (over its gRPC GroupCoordinatorService).

Every handler takes the kio request and returns the kio response of the same version (or None
for Produce acks=0). Per-partition failures are Kafka error codes in the response, as Kafka does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import Counter, Gauge
from kio.static.constants import EntityType

from gregor.common import authz as az, broker_configs as bc, errors
from gregor.common.acl import Operation, ResourceType
from gregor.common.etcd_layout import BrokerIdsZNode
from gregor.common.quotas import RELAYED_METADATA
from gregor.common.rpc import channel
from gregor.kafka import acl_handlers, codec, zero_copy
from gregor.kafka.admin_handlers import ADMIN_SUPPORTED, AdminApis
from gregor.kafka.txn_handlers import TXN_SUPPORTED, UNSTABLE_OFFSET_COMMIT, TxnApis
from gregor.broker.consumer_fetch import ConsumerFetch
from gregor.broker.fetch_session import (
    FINAL_EPOCH, CachedPartition, FetchSessionError,
)
from gregor.broker.replica_manager import collect_produce
from gregor.rpc.v1 import controller_pb2, coordinator_pb2, coordinator_pb2_grpc

if TYPE_CHECKING:
    from gregor.broker.broker import Broker
    from gregor.kafka.server import KafkaListener

log = logging.getLogger(__name__)

Code = errors.Code
NONE = 0
UNSUPPORTED_VERSION = 35
ZERO_UUID = uuid.UUID(int=0)


def kafka_uuid(topic_id: bytes) -> uuid.UUID:
    """A Gregor topic id (16 bytes, KIP-516) as the protocol's uuid; the zero uuid when there is none."""
    return uuid.UUID(bytes=topic_id) if len(topic_id) == 16 else ZERO_UUID

# api key -> (min, max) version implemented and tested through real clients (docs/kafka-protocol.md).
SUPPORTED: dict[int, tuple[int, int]] = {
    0: (3, 9),    # Produce
    1: (4, 12),   # Fetch
    2: (1, 7),    # ListOffsets
    3: (0, 12),   # Metadata
    8: (2, 8),    # OffsetCommit
    9: (1, 8),    # OffsetFetch (v8: several groups, KIP-709)
    10: (0, 4),   # FindCoordinator
    11: (0, 7),   # JoinGroup
    12: (0, 4),   # Heartbeat
    13: (0, 4),   # LeaveGroup
    14: (0, 5),   # SyncGroup
    18: (0, 4),   # ApiVersions
    19: (2, 7),   # CreateTopics
    20: (1, 6),   # DeleteTopics
    22: (0, 4),   # InitProducerId
    15: (0, 5),   # DescribeGroups
    16: (0, 4),   # ListGroups
    23: (2, 4),   # OffsetForLeaderEpoch
    32: (1, 4),   # DescribeConfigs
    60: (0, 1),   # DescribeCluster
    37: (0, 3),   # CreatePartitions
    42: (0, 2),   # DeleteGroups
    29: (1, 3),   # DescribeAcls (kafka/acl_handlers.py)
    30: (1, 3),   # CreateAcls
    31: (1, 3),   # DeleteAcls
    **TXN_SUPPORTED,  # the transaction APIs (kafka/txn_handlers.py)
    **ADMIN_SUPPORTED,  # DeleteRecords, ElectLeaders, IncrementalAlterConfigs (kafka/admin_handlers.py)
}
RESOURCE_TOPIC = 2  # DescribeConfigs resource types
RESOURCE_BROKER = 4

BROKERS_REFRESH_S = 1.0

FETCH_SESSIONS = Gauge("gregor_kafka_fetch_sessions",
                       "Open incremental fetch sessions (KIP-227) in the broker's cache, Kafka and gRPC consumers'")
INCREMENTAL_FETCHES = Counter("gregor_kafka_incremental_fetches_total",
                              "Fetch requests served from an incremental fetch session (KIP-227)")


def _code(exc: BaseException) -> int:
    if isinstance(exc, errors.GregorError):
        return int(exc.code)
    if isinstance(exc, grpc.RpcError):
        return int(errors.from_rpc_error(exc).code)
    return int(Code.UNKNOWN_SERVER_ERROR)


class KafkaHandlers:
    def __init__(self, broker: "Broker", listener: "KafkaListener") -> None:
        self.broker = broker
        self.listener = listener
        self._kafka_brokers: dict[int, tuple[str, int, str | None]] = {}
        self._brokers_read = 0.0
        # (Metadata version, topic) -> (the metadata cache's answer it was encoded from, the encoded topic):
        # a topic's part of a Metadata answer is encoded once per change and version, not per partition per
        # request (issue 24: clients poll Metadata while a 10,000-partition topic is created).
        self._encoded_topics: dict[tuple[int, str], tuple[Any, bytes]] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.sessions = broker.replica_manager.fetch_sessions  # KIP-227: the broker's one cache, shared with gRPC
        sessions = self.sessions.sessions
        FETCH_SESSIONS.set_function(lambda: len(sessions))
        self._table: dict[int, Callable[[codec.RequestHeader, Any, Any], Awaitable[Any]]] = {
            0: self.produce, 1: self.fetch, 2: self.list_offsets, 3: self.metadata, 8: self.offset_commit,
            9: self.offset_fetch, 10: self.find_coordinator, 11: self.join_group, 12: self.heartbeat,
            13: self.leave_group, 14: self.sync_group, 18: self.api_versions, 19: self.create_topics,
            20: self.delete_topics, 22: self.init_producer_id, 15: self.describe_groups, 16: self.list_groups,
            23: self.offset_for_leader_epoch, 32: self.describe_configs, 60: self.describe_cluster,
            37: self.create_partitions, 42: self.delete_groups,
            29: functools.partial(acl_handlers.describe_acls, self), 30: functools.partial(acl_handlers.create_acls, self),
            31: functools.partial(acl_handlers.delete_acls, self),
        }
        self.txn = TxnApis(self)
        self._table.update(self.txn.table())
        self._table.update(AdminApis(self).table())

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()

    async def handle(self, header: codec.RequestHeader, request: Any) -> Any:
        mod = codec.module(header.api_key, header.api_version, EntityType.response)
        return await self._table[header.api_key](header, request, mod)

    # ---- ApiVersions ---------------------------------------------------------------------------

    def _api_keys(self, mod: Any) -> list[Any]:
        return [codec.build(mod.ApiVersion, api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in sorted(SUPPORTED.items())]

    def api_versions_unsupported(self) -> Any:
        mod = codec.module(18, 0, EntityType.response)
        return codec.build(mod.ApiVersionsResponse, error_code=UNSUPPORTED_VERSION, api_keys=self._api_keys(mod))

    async def api_versions(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        return codec.build(mod.ApiVersionsResponse, error_code=NONE, api_keys=self._api_keys(mod))

    # ---- Metadata --------------------------------------------------------------------------------

    async def kafka_brokers(self) -> dict[int, tuple[str, int, str | None]]:
        """broker id -> (host, Kafka port, rack), from the registrations in etcd (cluster mode)."""
        b = self.broker
        etcd = b.etcd
        if not b.cluster_mode or etcd is None:
            return {b.config.broker_id: (self.listener.advertised_host, self.listener.advertised_port,
                                         b.config.broker_rack or None)}
        now = time.monotonic()
        if now - self._brokers_read > BROKERS_REFRESH_S:
            res = await etcd.get_prefix(BrokerIdsZNode.prefix(etcd))
            out: dict[int, tuple[str, int, str | None]] = {}
            for kv in res.kvs:
                broker_id = BrokerIdsZNode.broker_id(etcd, kv.key)
                try:
                    if broker_id is None:
                        continue
                    info = BrokerIdsZNode.decode(kv.value)
                    host, _, port = str(info["kafka"]).rpartition(":")
                    out[broker_id] = (host, int(port), info.get("rack"))
                except (KeyError, ValueError):
                    continue  # a broker without a Kafka listener is not a Kafka node
            self._kafka_brokers, self._brokers_read = out, now
        return self._kafka_brokers

    async def metadata(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        if req.topics is None or (header.api_version == 0 and not req.topics):
            names: list[str] = []  # all topics
        elif not req.topics:
            names = []
        else:
            names = [str(t.name) for t in req.topics if t.name is not None]
        want_none = req.topics is not None and not req.topics and header.api_version > 0
        cache = self.broker.metadata_cache if self.broker.cluster_mode else None
        if cache is not None and not self.broker.authz.enabled:
            return await self._cached_metadata(header, mod, cache, names, want_none)
        md = self.broker.metadata_response(names)
        if self.broker.authz.enabled:  # unauthorized topics hidden (all topics) or TOPIC_AUTHORIZATION_FAILED
            self.broker_servicer().filter_metadata(md, bool(names), az.connection_caller())
        nodes = await self.kafka_brokers()
        brokers = [codec.build(mod.MetadataResponseBroker, node_id=i, host=h, port=p, rack=r)
                   for i, (h, p, r) in sorted(nodes.items())]
        topics = [] if want_none else [self._metadata_topic(mod, t) for t in md.topics]
        return codec.build(mod.MetadataResponse, brokers=brokers, cluster_id=md.cluster_id,
                           controller_id=md.controller_id if md.controller_id >= 0 else self.broker.config.broker_id,
                           topics=topics, cluster_authorized_operations=-2147483648)

    @staticmethod
    def _metadata_topic(mod: Any, t: Any) -> Any:
        parts = [codec.build(mod.MetadataResponsePartition, error_code=int(pm.error), partition_index=pm.partition,
                             leader_id=pm.leader, leader_epoch=pm.leader_epoch,
                             replica_nodes=list(pm.replicas), isr_nodes=list(pm.isr),
                             offline_replicas=list(pm.offline_replicas))
                 for pm in t.partitions]
        return codec.build(mod.MetadataResponseTopic, error_code=int(t.error), name=t.name,
                           topic_id=kafka_uuid(t.topic_id), is_internal=t.is_internal, partitions=parts,
                           topic_authorized_operations=-2147483648)

    async def _cached_metadata(self, header: codec.RequestHeader, mod: Any, cache: Any, names: list[str],
                               want_none: bool) -> Any:
        """Metadata in cluster mode without an authorizer: each topic's encoded part reused while the metadata
        cache's answer for it is the same (the same bytes the uncached path writes)."""
        pieces: list[bytes] = []
        if not want_none:
            encoded = self._encoded_topics
            if len(encoded) > 2 * len(cache.partitions) + 64:  # versions of deleted topics: start over
                encoded.clear()
            for answer, cached in cache.topic_answers(names):
                key = (header.api_version, answer.name)
                hit = encoded.get(key)
                if hit is not None and hit[0] is answer:
                    pieces.append(hit[1])
                    continue
                piece = codec.encode_entity(self._metadata_topic(mod, answer))
                if cached:
                    encoded[key] = (answer, piece)
                pieces.append(piece)
        nodes = await self.kafka_brokers()
        brokers = [codec.build(mod.MetadataResponseBroker, node_id=i, host=h, port=p, rack=r)
                   for i, (h, p, r) in sorted(nodes.items())]
        body = codec.build(mod.MetadataResponse, brokers=brokers, cluster_id=cache.cluster_id,
                           controller_id=cache.controller_id if cache.controller_id >= 0 else self.broker.config.broker_id,
                           topics=[], cluster_authorized_operations=-2147483648)
        return dataclasses.replace(body, topics=codec.EncodedTopics(pieces))

    # ---- Produce / Fetch / ListOffsets / InitProducerId ---------------------------------------

    async def produce(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        return await self.start_produce(header, req, mod)

    def start_produce(self, header: codec.RequestHeader, req: Any, mod: Any) -> Awaitable[Any]:
        """Append every partition now, synchronously and in the order requests arrive; the awaitable waits for
        the acks (acks=-1: the ISR) and builds the response. The listener reads a connection's next Produce
        while this one's acks are pending, and answers in order (pipelining, as a client's max.in.flight)."""
        parts = [(str(t.name), int(p.index), bytes(p.records or b"")) for t in req.topic_data
                 for p in t.partition_data]
        acks, timeout_ms = int(req.acks), codec.to_ms(req.timeout)
        started: list[Any]
        try:
            if self.broker.authz.enabled:  # Kafka: Write on the transactional id, then on each topic
                denied = az.produce_denials(self.broker.authz, az.connection_caller(),
                                            str(getattr(req, "transactional_id", None) or ""), [t for t, _, _ in parts])
                rm = self.broker.replica_manager
                started = az.with_denials(parts, denied, lambda ps: rm.start_produce_partitions(ps, acks, timeout_ms))
            else:
                started = self.broker.replica_manager.start_produce_partitions(parts, acks, timeout_ms)
        except errors.GregorError as err:  # wrong as a whole (bad acks): every partition gets the error
            started = [err] * len(parts)
        return self._produce_response(parts, acks, started, mod)

    async def _produce_response(self, parts: list[tuple[str, int, bytes]], acks: int, started: list[Any],
                                mod: Any) -> Any:
        from gregor.broker.replica_manager import collect_produce

        results = await collect_produce(started)
        if acks == 0:
            return None
        by_topic: dict[str, list[Any]] = {}
        for (topic, index, _), r in zip(parts, results):
            if isinstance(r, BaseException):
                pr = codec.build(mod.PartitionProduceResponse, index=index, error_code=_code(r), base_offset=-1,
                                 log_append_time=-1, log_start_offset=-1, error_message=str(r))
            else:
                pr = codec.build(mod.PartitionProduceResponse, index=index, error_code=NONE,
                                 base_offset=r.base_offset, log_append_time=-1, log_start_offset=r.log_start_offset,
                                 error_message=None)
            by_topic.setdefault(topic, []).append(pr)
        return codec.build(mod.ProduceResponse, responses=[
            codec.build(mod.TopicProduceResponse, name=t, partition_responses=ps) for t, ps in by_topic.items()])

    def _fetch_authorize(self, topic: str) -> errors.GregorError | None:
        try:
            self._require_topic(Operation.READ, topic, "Fetch")
        except errors.GregorError as err:
            return err
        return None

    async def fetch(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """Fetch, with fetch sessions (KIP-227) from v7 and leader epochs (KIP-320) from v9: the consumer fetch
        path gRPC FetchPartitions takes (broker/consumer_fetch.py), on the broker's one session cache."""
        wanted = [((str(t.topic), int(p.partition)),
                   CachedPartition(int(p.fetch_offset), int(p.partition_max_bytes),
                                   int(getattr(p, "current_leader_epoch", -1))))
                  for t in req.topics for p in t.partitions]
        forgotten = [(str(t.topic), int(i)) for t in getattr(req, "forgotten_topics_data", ()) or ()
                     for i in t.partitions]
        rm = self.broker.replica_manager
        try:
            ctx = rm.fetch_sessions.resolve(int(getattr(req, "session_id", 0)),
                                            int(getattr(req, "session_epoch", FINAL_EPOCH)), wanted, forgotten)
        except FetchSessionError as exc:
            return codec.build(mod.FetchResponse, error_code=exc.code, session_id=0, responses=[])
        if ctx.incremental:
            INCREMENTAL_FETCHES.inc()
        isolation = int(getattr(req, "isolation_level", 0))
        max_bytes = int(getattr(req, "max_bytes", 0) or 0)  # v3+; before: the broker's fetch.max.bytes
        fetch = ConsumerFetch(rm, ctx, isolation, max(0, int(req.min_bytes)), max(0, codec.to_ms(req.max_wait)),
                              max_bytes if max_bytes > 0 else rm.config.fetch_max_bytes,
                              self._fetch_authorize if self.broker.authz.enabled else None)
        answered = await fetch.run()
        fetch.sent(answered)
        by_topic: dict[str, list[Any]] = {}
        for a in answered:
            o = a.outcome
            if isinstance(o, errors.GregorError):
                pd = codec.build(mod.PartitionData, partition_index=a.tp[1], error_code=_code(o),
                                 high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
                                 aborted_transactions=None, preferred_read_replica=-1, records=None)
            else:
                zc = zero_copy.current()  # plain text: a marker now, the slice goes by sendfile (kafka/zero_copy.py)
                records = zc.marker(o.slice) if zc is not None and o.slice.length else o.slice.read()
                pd = codec.build(mod.PartitionData, partition_index=a.tp[1], error_code=NONE,
                                 high_watermark=o.high_watermark, last_stable_offset=o.last_stable_offset,
                                 log_start_offset=o.log_start_offset,
                                 aborted_transactions=[codec.build(mod.AbortedTransaction, producer_id=pid,
                                                                   first_offset=first)
                                                       for pid, first in o.aborted_transactions]
                                 if isolation else None,
                                 preferred_read_replica=-1, records=records)
            by_topic.setdefault(a.tp[0], []).append(pd)
        return codec.build(mod.FetchResponse, error_code=NONE,
                           session_id=ctx.session.session_id if ctx.session else 0, responses=[
                               codec.build(mod.FetchableTopicResponse, topic=t, partitions=ps)
                               for t, ps in by_topic.items()])

    async def list_offsets(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        isolation = int(getattr(req, "isolation_level", 0))
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                try:
                    self._require_topic(Operation.DESCRIBE, str(t.name), "ListOffsets")
                    offset, ts, epoch = self.broker.replica_manager.list_offsets(
                        str(t.name), int(p.partition_index), codec.to_ms(p.timestamp),
                        int(getattr(p, "current_leader_epoch", -1)), isolation)
                    parts.append(codec.build(mod.ListOffsetsPartitionResponse, partition_index=p.partition_index,
                                             error_code=NONE, timestamp=ts, offset=offset, leader_epoch=epoch))
                except errors.GregorError as err:
                    parts.append(codec.build(mod.ListOffsetsPartitionResponse, partition_index=p.partition_index,
                                             error_code=int(err.code), timestamp=-1, offset=-1, leader_epoch=-1))
            topics.append(codec.build(mod.ListOffsetsTopicResponse, name=t.name, partitions=parts))
        return codec.build(mod.ListOffsetsResponse, topics=topics)

    async def init_producer_id(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        if req.transactional_id:
            return await self.txn.init_producer_id(header, req, mod)
        try:
            authz = self.broker.authz
            if authz.enabled and not authz.can_write_idempotently(
                    az.connection_caller(), list(self.broker.metadata_cache.partitions), "InitProducerId"):
                authz.require_cluster(az.connection_caller(), Operation.IDEMPOTENT_WRITE, "InitProducerId")
            pid = await self.broker_servicer().producer_id_manager().generate_producer_id()
        except errors.GregorError as err:
            return codec.build(mod.InitProducerIdResponse, error_code=int(err.code), producer_id=-1,
                               producer_epoch=-1)
        return codec.build(mod.InitProducerIdResponse, error_code=NONE, producer_id=pid, producer_epoch=0)

    _servicer: Any = None

    def _require_topic(self, operation: Operation, topic: str, api: str) -> None:
        if self.broker.authz.enabled:
            self.broker.authz.require(az.connection_caller(), operation, ResourceType.TOPIC, topic, api, topic=topic)

    def broker_servicer(self) -> Any:
        if self._servicer is None:
            from gregor.broker.server import BrokerServicer

            self._servicer = BrokerServicer(self.broker)
        return self._servicer

    # ---- Admin -------------------------------------------------------------------------------

    async def admin(self, api: str, request: Any) -> Any:
        from gregor.broker.controller_link import forward_to_controller

        if not self.broker.cluster_mode:
            raise errors.error_for(Code.INVALID_REQUEST, "admin APIs over Kafka need a cluster (controller)")
        return await forward_to_controller(self.broker, api, request, None,
                                           az.forwarded_metadata(self.broker.authz, az.connection_caller()))

    async def create_topics(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        topics = [controller_pb2.CreatableTopic(
            name=str(t.name), num_partitions=int(t.num_partitions), replication_factor=int(t.replication_factor),
            assignments={int(a.partition_index): controller_pb2.ReplicaList(broker_ids=list(a.broker_ids))
                         for a in t.assignments},
            configs={str(c.name): str(c.value) for c in t.configs if c.value is not None}) for t in req.topics]
        results: dict[str, tuple[int, str | None, int, int, bytes]] = {}
        try:
            resp = await self.admin("CreateTopics", controller_pb2.CreateTopicsRequest(
                topics=topics, validate_only=bool(getattr(req, "validate_only", False))))
            for r in resp.results:
                code = int(r.error.code) if r.HasField("error") else NONE
                results[r.name] = (code, r.error.message if code else None, r.num_partitions, r.replication_factor,
                                   r.topic_id)
        except errors.GregorError as err:
            for t in topics:
                results[t.name] = (int(err.code), err.message, -1, -1, b"")
        # v5+: a created topic's result carries its configs (Kafka's Java admin client reads them and fails
        # on a null list when num_partitions is known); created topics' configs come from the controller.
        configs: dict[str, list[Any]] = {}
        created = [t.name for t in topics if results[t.name][0] == NONE and results[t.name][4]]
        if header.api_version >= 5 and created:
            try:
                described = await self.admin("DescribeConfigs",
                                              controller_pb2.DescribeConfigsRequest(topics=created))
                for tc in described.results:
                    if not tc.HasField("error"):
                        configs[tc.topic] = [codec.build(mod.CreatableTopicConfigs, name=e.name, value=e.value,
                                                         read_only=False, config_source=5 if e.is_default else 1,
                                                         is_sensitive=False) for e in tc.entries]
            except errors.GregorError as err:
                log.warning("kafka: CreateTopics could not describe the new topics' configs: %s", err)

        def result(t: Any) -> Any:
            code, message, partitions, rf, topic_id = results[t.name]
            ok = code == NONE
            return codec.build(mod.CreatableTopicResult, name=t.name, topic_id=kafka_uuid(topic_id),
                               error_code=code, error_message=message,
                               num_partitions=partitions if ok and partitions else -1,
                               replication_factor=rf if ok and rf else -1,
                               configs=configs.get(t.name, []) if ok else None)

        return codec.build(mod.CreateTopicsResponse, topics=[result(t) for t in topics])

    async def delete_topics(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        names = ([str(t.name) for t in req.topics] if header.api_version >= 6 else [str(n) for n in req.topic_names])
        results: dict[str, tuple[int, str | None]] = {}
        try:
            resp = await self.admin("DeleteTopics", controller_pb2.DeleteTopicsRequest(topics=names))
            for r in resp.results:
                code = int(r.error.code) if r.HasField("error") else NONE
                results[r.name] = (code, r.error.message if code else None)
        except errors.GregorError as err:
            results = {n: (int(err.code), err.message) for n in names}
        return codec.build(mod.DeleteTopicsResponse, responses=[
            codec.build(mod.DeletableTopicResult, name=n, topic_id=ZERO_UUID,
                        error_code=results.get(n, (NONE, None))[0], error_message=results.get(n, (NONE, None))[1])
            for n in names])

    # ---- Groups: relayed to the owning coordinator process --------------------------------------

    async def find_coordinator(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """This broker is every group's Kafka-side coordinator: it relays to the owning process."""
        key_type = int(getattr(req, "key_type", 0))
        keys = list(req.coordinator_keys) if header.api_version >= 4 else [req.key]
        host, port, me = self.listener.advertised_host, self.listener.advertised_port, self.broker.config.broker_id

        authz = self.broker.authz

        async def answer(key: str) -> tuple[int, str | None]:
            if authz.enabled and key_type in (0, 1):  # Kafka: Describe on the group / transactional id
                resource = ResourceType.GROUP if key_type == 0 else ResourceType.TRANSACTIONAL_ID
                try:
                    authz.require(az.connection_caller(), Operation.DESCRIBE, resource, str(key), "FindCoordinator")
                except errors.GregorError as err:
                    return int(err.code), str(err)
            if key_type == 0:
                return NONE, None
            if key_type == 1:  # TRANSACTION: this broker too, relaying to the id's transaction coordinator
                return await self.txn.find_coordinator_code(str(key))
            return int(Code.INVALID_REQUEST), f"key type {key_type} is not served"

        if header.api_version >= 4:
            coordinators = []
            for k in keys:
                code, message = await answer(k)
                coordinators.append(codec.build(mod.Coordinator, key=k, node_id=me if not code else -1,
                                                host=host if not code else "", port=port if not code else -1,
                                                error_code=code, error_message=message))
            return codec.build(mod.FindCoordinatorResponse, coordinators=coordinators)
        code, message = await answer(keys[0])
        return codec.build(mod.FindCoordinatorResponse, error_code=code, error_message=message,
                           node_id=me if not code else -1, host=host if not code else "",
                           port=port if not code else -1)

    def channel_to(self, addr: str) -> grpc.aio.Channel:
        """The listener's one channel to a coordinator or controller at addr (made on first use, closed with it)."""
        ch = self._channels.get(addr)
        if ch is None:
            ch = self._channels[addr] = channel(addr)
        return ch

    async def _group_stub(self, group_id: str) -> coordinator_pb2_grpc.GroupCoordinatorServiceStub:
        lookup = self.broker.coordinator_lookup
        if lookup is None:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE, "no group coordinators (standalone broker)")
        _, host, port, _ = await lookup.find(group_id)
        addr = f"{host}:{port}"
        return coordinator_pb2_grpc.GroupCoordinatorServiceStub(self.channel_to(addr))

    async def group_call(self, group_id: str, method: str, request: Any, timeout_s: float = 30.0) -> Any:
        stub = await self._group_stub(group_id)
        try:
            return await getattr(stub, method)(request, timeout=timeout_s, metadata=(
                *(az.forwarded_metadata(self.broker.authz, az.connection_caller()) or ()), RELAYED_METADATA))
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    async def join_group(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        session_ms = codec.to_ms(req.session_timeout)
        rebalance_ms = codec.to_ms(getattr(req, "rebalance_timeout", req.session_timeout))
        member_id = str(req.member_id)
        for _ in range(2):
            grpc_req = coordinator_pb2.JoinGroupRequest(
                group_id=str(req.group_id), session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                member_id=member_id, group_instance_id=str(getattr(req, "group_instance_id", None) or ""),
                protocol_type=str(req.protocol_type), client_id=header.client_id or "",
                protocols=[coordinator_pb2.GroupProtocol(name=str(p.name), metadata=bytes(p.metadata))
                           for p in req.protocols])
            try:
                resp = await self.group_call(str(req.group_id), "JoinGroup", grpc_req, rebalance_ms / 1000 + 30)
            except errors.GregorError as err:
                return codec.build(mod.JoinGroupResponse, error_code=int(err.code), generation_id=-1,
                                   protocol_name=None, leader="", member_id=member_id, members=[])
            code = int(resp.error.code) if resp.HasField("error") else NONE
            if code == Code.MEMBER_ID_REQUIRED and header.api_version < 4:
                member_id = resp.member_id  # KIP-394 is v4+: older clients join in one round trip
                continue
            break
        members = [codec.build(mod.JoinGroupResponseMember, member_id=m.member_id,
                               group_instance_id=m.group_instance_id or None, metadata=m.metadata)
                   for m in resp.members]
        return codec.build(mod.JoinGroupResponse, error_code=code, generation_id=resp.generation_id if not code else -1,
                           protocol_type=str(req.protocol_type), protocol_name=resp.protocol_name or None,
                           leader=resp.leader, member_id=resp.member_id or member_id, members=members)

    async def sync_group(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        grpc_req = coordinator_pb2.SyncGroupRequest(
            group_id=str(req.group_id), generation_id=int(req.generation_id), member_id=str(req.member_id),
            group_instance_id=str(getattr(req, "group_instance_id", None) or ""),
            assignments=[coordinator_pb2.SyncGroupAssignment(member_id=str(a.member_id),
                                                             assignment=bytes(a.assignment))
                         for a in req.assignments])
        try:
            resp = await self.group_call(str(req.group_id), "SyncGroup", grpc_req, 330.0)
        except errors.GregorError as err:
            return codec.build(mod.SyncGroupResponse, error_code=int(err.code), assignment=b"")
        return codec.build(mod.SyncGroupResponse, error_code=NONE, assignment=resp.assignment,
                           protocol_type=getattr(req, "protocol_type", None),
                           protocol_name=getattr(req, "protocol_name", None))

    async def heartbeat(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        try:
            await self.group_call(str(req.group_id), "Heartbeat", coordinator_pb2.HeartbeatRequest(
                group_id=str(req.group_id), generation_id=int(req.generation_id), member_id=str(req.member_id),
                group_instance_id=str(getattr(req, "group_instance_id", None) or "")))
        except errors.GregorError as err:
            return codec.build(mod.HeartbeatResponse, error_code=int(err.code))
        return codec.build(mod.HeartbeatResponse, error_code=NONE)

    async def leave_group(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        if header.api_version >= 3:
            ids = [(str(m.member_id), str(m.group_instance_id or "")) for m in req.members]
        else:
            ids = [(str(req.member_id), "")]
        try:
            resp = await self.group_call(str(req.group_id), "LeaveGroup", coordinator_pb2.LeaveGroupRequest(
                group_id=str(req.group_id), member_ids=[m for m, _ in ids],
                group_instance_ids=[g for _, g in ids if g]))
        except errors.GregorError as err:
            return codec.build(mod.LeaveGroupResponse, error_code=int(err.code), members=[])
        members = [codec.build(mod.MemberResponse, member_id=m.member_id, group_instance_id=m.group_instance_id or None,
                               error_code=int(m.error.code) if m.HasField("error") else NONE)
                   for m in resp.members] if header.api_version >= 3 else []
        top = NONE
        if header.api_version < 3 and resp.members and resp.members[0].HasField("error"):
            top = int(resp.members[0].error.code)
        return codec.build(mod.LeaveGroupResponse, error_code=top, members=members)

    async def offset_commit(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        generation = int(getattr(req, "generation_id_or_member_epoch", getattr(req, "generation_id", -1)))
        parts = [coordinator_pb2.OffsetCommitPartition(
            topic=str(t.name), partition=int(p.partition_index), offset=int(p.committed_offset),
            leader_epoch=int(getattr(p, "committed_leader_epoch", -1)), metadata=p.committed_metadata or "")
            for t in req.topics for p in t.partitions]
        codes: dict[tuple[str, int], int] = {}
        try:
            resp = await self.group_call(str(req.group_id), "OffsetCommit", coordinator_pb2.OffsetCommitRequest(
                group_id=str(req.group_id), generation_id=generation, member_id=str(req.member_id),
                group_instance_id=str(getattr(req, "group_instance_id", None) or ""), partitions=parts))
            for r in resp.results:
                codes[(r.topic, r.partition)] = int(r.error.code) if r.HasField("error") else NONE
        except errors.GregorError as err:
            codes = {(p.topic, p.partition): int(err.code) for p in parts}
        return codec.build(mod.OffsetCommitResponse, topics=[
            codec.build(mod.OffsetCommitResponseTopic, name=t.name, partitions=[
                codec.build(mod.OffsetCommitResponsePartition, partition_index=p.partition_index,
                            error_code=codes.get((str(t.name), int(p.partition_index)), NONE))
                for p in t.partitions]) for t in req.topics])

    async def offset_fetch(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """v1-7 ask for one group; v8 (KIP-709) for several, each answered with its own error code. Each group is
        read from its own coordinator process (groups are sharded across them), concurrently."""
        stable = bool(getattr(req, "require_stable", False))
        if header.api_version < 8:
            code, topics = await self._group_offsets(mod, str(req.group_id), req.topics, stable, single=True)
            return codec.build(mod.OffsetFetchResponse, error_code=code, topics=topics)
        unstable: set[tuple[str, tuple[str, int]]] | int | None = None
        if stable and req.groups:  # one ListTransactions round for every group of the request, not one each
            try:
                unstable = await self.txn.unstable_offsets_of({str(g.group_id) for g in req.groups})
            except errors.GregorError as err:
                unstable = int(err.code)
        answers = await asyncio.gather(*(self._group_offsets(mod, str(g.group_id), g.topics, stable, single=False,
                                                             unstable=unstable) for g in req.groups))
        return codec.build(mod.OffsetFetchResponse, groups=[
            codec.build(mod.OffsetFetchResponseGroup, group_id=g.group_id, error_code=code, topics=topics)
            for g, (code, topics) in zip(req.groups, answers)])

    async def _group_offsets(self, mod: Any, group_id: str, topics: Any, stable: bool, single: bool,
                             unstable: set[tuple[str, tuple[str, int]]] | int | None = None) -> tuple[int, list[Any]]:
        """One group's committed offsets as (group error code, the response's topics) of this version's classes
        (v8 names them OffsetFetchResponseTopics / ...Partitions). `topics` None asks for every partition the
        group has an offset of. A failure of the group as a whole (GROUP_AUTHORIZATION_FAILED, NOT_COORDINATOR,
        COORDINATOR_NOT_AVAILABLE...) is the group's error code and no topics, as Kafka answers."""
        from gregor.rpc.v1 import common_pb2

        topic_cls = mod.OffsetFetchResponseTopic if single else mod.OffsetFetchResponseTopics
        part_cls = mod.OffsetFetchResponsePartition if single else mod.OffsetFetchResponsePartitions
        asked = None if topics is None else [(str(t.name), int(i)) for t in topics for i in t.partition_indexes]
        try:
            resp = await self.group_call(group_id, "OffsetFetch", coordinator_pb2.OffsetFetchRequest(
                group_id=group_id,
                partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in asked or []]))
        except errors.GregorError as err:
            return int(err.code), []
        got = {(p.topic, p.partition): p for p in resp.partitions}
        keys = asked if asked is not None else sorted(got)
        held: dict[tuple[str, int], int] = {}
        if stable and unstable is None:  # KIP-447: not while a transaction holds offsets of the group
            try:
                unstable = await self.txn.unstable_offsets_of({group_id})
            except errors.GregorError as err:
                unstable = int(err.code)
        if isinstance(unstable, int):  # the open transactions could not be read: every partition is unknown
            held = dict.fromkeys(keys, unstable)
        elif unstable:
            held = dict.fromkeys((tp for g, tp in unstable if g == group_id), UNSTABLE_OFFSET_COMMIT)
        by_topic: dict[str, list[Any]] = {}
        for t, i in keys:
            p = got.get((t, i))
            by_topic.setdefault(t, []).append(codec.build(
                part_cls, partition_index=i,
                committed_offset=p.offset if p is not None else -1,
                committed_leader_epoch=p.leader_epoch if p is not None and p.leader_epoch >= 0 else -1,
                metadata=(p.metadata if p is not None else ""),
                error_code=(p.error.code if p is not None and p.HasField("error") and p.error.code  # per partition
                            else held.get((t, i), NONE))))
        return NONE, [codec.build(topic_cls, name=t, partitions=ps) for t, ps in by_topic.items()]

    async def list_groups(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """Every coordinator process's groups (groups are sharded across them), merged."""
        lookup = self.broker.coordinator_lookup
        if lookup is None:
            return codec.build(mod.ListGroupsResponse, error_code=int(Code.COORDINATOR_NOT_AVAILABLE), groups=[])
        states = {str(s).lower() for s in getattr(req, "states_filter", ()) or ()}
        listed: dict[str, Any] = {}
        code = NONE
        for info in list(lookup.live.values()):
            addr = f"{info['host']}:{info['port']}"
            ch = self.channel_to(addr)
            try:
                resp = await coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch).ListGroups(
                    coordinator_pb2.ListGroupsRequest(), timeout=10)
            except grpc.RpcError as exc:
                code = _code(exc)
                continue
            for g in resp.groups:
                if not states or g.state.lower() in states:
                    listed[g.group_id] = codec.build(mod.ListedGroup, group_id=g.group_id,
                                                     protocol_type=g.protocol_type, group_state=g.state)
        return codec.build(mod.ListGroupsResponse, error_code=code, groups=[listed[k] for k in sorted(listed)])

    async def describe_groups(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        out = []
        for gid in req.groups:
            try:
                resp = await self.group_call(str(gid), "DescribeGroups",
                                              coordinator_pb2.DescribeGroupsRequest(group_ids=[str(gid)]))
                g = resp.groups[0]
                code = int(g.error.code) if g.HasField("error") else NONE
                out.append(codec.build(
                    mod.DescribedGroup, error_code=code, group_id=str(gid), group_state=g.state,
                    protocol_type=g.protocol_type, protocol_data=g.protocol, authorized_operations=-2147483648,
                    members=[codec.build(mod.DescribedGroupMember, member_id=m.member_id,
                                         group_instance_id=m.group_instance_id or None, client_id=m.client_id,
                                         client_host=m.client_host, member_metadata=m.metadata,
                                         member_assignment=m.assignment) for m in g.members]))
            except (errors.GregorError, IndexError) as err:
                out.append(codec.build(mod.DescribedGroup, error_code=_code(err), group_id=str(gid),
                                       group_state="", protocol_type="", protocol_data="", members=[],
                                       authorized_operations=-2147483648))
        return codec.build(mod.DescribeGroupsResponse, groups=out)

    # ---- Partition and cluster metadata -------------------------------------------------------------

    async def offset_for_leader_epoch(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                current = int(getattr(p, "current_leader_epoch", -1))
                try:
                    epoch, end = self.broker.replica_manager.offset_for_leader_epoch(
                        str(t.topic), int(p.partition), int(p.leader_epoch), current if current >= 0 else None)
                    parts.append(codec.build(mod.EpochEndOffset, error_code=NONE, partition=p.partition,
                                             leader_epoch=epoch, end_offset=end))
                except errors.GregorError as err:
                    parts.append(codec.build(mod.EpochEndOffset, error_code=int(err.code), partition=p.partition,
                                             leader_epoch=-1, end_offset=-1))
            topics.append(codec.build(mod.OffsetForLeaderTopicResult, topic=t.topic, partitions=parts))
        return codec.build(mod.OffsetForLeaderEpochResponse, topics=topics)

    async def describe_cluster(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        nodes = await self.kafka_brokers()
        md = self.broker.metadata_response([])
        return codec.build(mod.DescribeClusterResponse, error_code=NONE, error_message=None, endpoint_type=1,
                           cluster_id=md.cluster_id,
                           controller_id=md.controller_id if md.controller_id >= 0 else self.broker.config.broker_id,
                           cluster_authorized_operations=-2147483648,
                           brokers=[codec.build(mod.DescribeClusterBroker, broker_id=i, host=h, port=p, rack=r)
                                    for i, (h, p, r) in sorted(nodes.items())])

    async def describe_configs(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """TOPIC resources from the controller (overrides), a config without an override taking this broker's
        value and source (dynamic per-broker, dynamic default, static or Kafka's default); BROKER resources from
        this broker (broker/dynamic_config.py): our id every config with its source, "" the dynamic defaults.
        Synonyms when include_synonyms is set, as Kafka answers."""
        results = []
        synonyms = bool(getattr(req, "include_synonyms", False))
        dyn = self.broker.dynamic_config
        for res in req.resources:
            rtype, name = int(res.resource_type), str(res.resource_name)
            keys = set(res.configuration_keys) if res.configuration_keys else None
            entries: list[bc.Entry] = []
            code, message = NONE, None
            if rtype == RESOURCE_TOPIC:
                try:
                    resp = await self.admin("DescribeConfigs", controller_pb2.DescribeConfigsRequest(topics=[name]))
                    tc = resp.results[0]
                    if tc.HasField("error"):
                        code, message = int(tc.error.code), tc.error.message
                    entries = dyn.topic_entries(tc.entries)
                except errors.GregorError as err:
                    code, message = int(err.code), err.message
            elif rtype == RESOURCE_BROKER and self.broker.authz.enabled and not self.broker.authz.check(
                    az.connection_caller(), Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, "kafka-cluster",
                    "DescribeConfigs"):  # Kafka: a broker's configs need DescribeConfigs on the Cluster
                code = int(Code.CLUSTER_AUTHORIZATION_FAILED)
            elif rtype == RESOURCE_BROKER and name in ("", str(self.broker.config.broker_id)):
                entries = dyn.describe(name)
            elif rtype == RESOURCE_BROKER:
                code, message = int(Code.INVALID_REQUEST), (f"Unexpected broker id, expected "
                                                             f"{self.broker.config.broker_id} or empty string, "
                                                             f"but received {name}")
            else:
                code, message = int(Code.INVALID_REQUEST), f"resource type {rtype} {name!r} is not described here"
            configs = [codec.build(mod.DescribeConfigsResourceResult, name=e.name, value=e.value,
                                   read_only=e.read_only, config_source=e.source, is_sensitive=e.sensitive,
                                   synonyms=[codec.build(mod.DescribeConfigsSynonym, name=n, value=v, source=src)
                                             for n, v, src in e.synonyms] if synonyms else [],
                                   config_type=0, documentation=e.documentation or None, is_default=e.is_default)
                       for e in entries if keys is None or e.name in keys]
            results.append(codec.build(mod.DescribeConfigsResult, error_code=code, error_message=message,
                                       resource_type=rtype, resource_name=name, configs=configs))
        return codec.build(mod.DescribeConfigsResponse, results=results)

    async def create_partitions(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """One controller CreatePartitions per topic (explicit assignments are not taken: INVALID_REQUEST)."""
        results = []
        for t in req.topics:
            code, message = NONE, None
            if t.assignments:
                code, message = int(Code.INVALID_REPLICA_ASSIGNMENT), "explicit assignments are not supported here"
            else:
                try:
                    await self.admin("CreatePartitions", controller_pb2.CreatePartitionsRequest(
                        topic=str(t.name), count=int(t.count), validate_only=bool(req.validate_only)))
                except errors.GregorError as err:
                    code, message = int(err.code), err.message
            results.append(codec.build(mod.CreatePartitionsTopicResult, name=t.name, error_code=code,
                                       error_message=message))
        return codec.build(mod.CreatePartitionsResponse, results=results)

    async def delete_groups(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        results = []
        for gid in req.groups_names:
            try:
                resp = await self.group_call(str(gid), "DeleteGroups",
                                              coordinator_pb2.DeleteGroupsRequest(group_ids=[str(gid)]))
                detail = resp.errors.get(str(gid))
                code = int(detail.code) if detail is not None else NONE
            except errors.GregorError as err:
                code = int(err.code)
            results.append(codec.build(mod.DeletableGroupResult, group_id=gid, error_code=code))
        return codec.build(mod.DeleteGroupsResponse, results=results)
