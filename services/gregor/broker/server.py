"""gRPC servicers of the broker: proto <-> domain, nothing else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import grpc

from gregor.broker.controller_link import allocate_producer_ids, forward_to_controller
from gregor.broker.consumer_fetch import Answer, ConsumerFetch, check_fetch_bounds
from gregor.broker.fetch_api import fetch_response, handle_fetch_request
from gregor.broker.fetch_session import CachedPartition, FetchSessionError
from gregor.broker.producer_id_manager import LocalProducerIdManager, RpcProducerIdManager
from gregor.broker.txn_markers import MarkerRequest, describe_producers, write_marker
from gregor.broker.replica_fetch_server import ReplicaFetchSession, answer_replica_fetch
from gregor.broker.produce_api import ProduceStreamHandler, produce_partitions_response, produce_result_fields
from gregor.broker.replica_manager import collect_produce
from gregor.common import broker_configs as bc, errors, uuid
from gregor.common.acl import Operation, ResourceType
from gregor.common.authz import FORWARDED_HOST_HEADER, FORWARDED_PRINCIPAL_HEADER, produce_denials, with_denials
from gregor.common.config import TOPIC_CONFIGS, effective_topic_configs
from gregor.common.quota_admin import altered, entity_of, entry_pb, number
from gregor.common.rpc import RequestRecorder, rpc_method, rpc_stream
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc
from gregor.rpc.v1 import coordinator_pb2

if TYPE_CHECKING:
    from gregor.broker.broker import Broker

Ctx: TypeAlias = grpc.aio.ServicerContext
T = TypeVar("T")


def _serialize_replica_fetch_response(message: "bytes | broker_pb2.ReplicaFetchResponse") -> bytes:
    """ReplicaFetch's response serializer: bytes from replica_fetch_server.encode_replica_fetch_response pass as
    they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def add_broker_service(servicer: "BrokerServicer", server: grpc.aio.Server) -> None:
    """add_BrokerServiceServicer_to_server, with ReplicaFetch's responses serialized by
    _serialize_replica_fetch_response (the generated registration takes the message class's serializer)."""

    class _Capture:
        def __init__(self) -> None:
            self.name = ""
            self.handlers: dict[str, Any] = {}

        def add_generic_rpc_handlers(self, _handlers: Any) -> None:
            pass

        def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
            self.name, self.handlers = name, handlers

    capture = _Capture()
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(servicer, capture)
    handlers = dict(capture.handlers)
    fetch = handlers["ReplicaFetch"]  # a stream-stream method: the same behaviour, our serializer
    handlers["ReplicaFetch"] = grpc.stream_stream_rpc_method_handler(
        fetch.stream_stream, request_deserializer=fetch.request_deserializer,
        response_serializer=_serialize_replica_fetch_response)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.name, handlers),))
    server.add_registered_method_handlers(capture.name, handlers)


def fetch_partition_data(a: Answer) -> broker_pb2.FetchPartitionData:
    """One partition of a FetchPartitionsResponse: its error, or what was read (records as bytes)."""
    o = a.outcome
    if isinstance(o, errors.GregorError):
        return broker_pb2.FetchPartitionData(topic=a.tp[0], partition=a.tp[1], error=o.to_detail())
    return broker_pb2.FetchPartitionData(
        topic=a.tp[0], partition=a.tp[1], high_watermark=o.high_watermark, last_stable_offset=o.last_stable_offset,
        log_start_offset=o.log_start_offset, records=o.slice.read(), leader_epoch=o.leader_epoch,
        aborted_transactions=[broker_pb2.AbortedTransaction(producer_id=pid, first_offset=first)
                              for pid, first in o.aborted_transactions])


class BrokerServicer(broker_pb2_grpc.BrokerServiceServicer):
    """BrokerService over the ReplicaManager."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.request_quota = broker.quotas  # request_percentage: rpc_method meters every call's handler time
        self.replicas = broker.replica_manager
        self.authz = broker.authz
        self._producer_ids: "RpcProducerIdManager | LocalProducerIdManager | None" = None
        self._replica_fetches = RequestRecorder("BrokerService", "ReplicaFetch")  # each request of the streams

    def producer_id_manager(self) -> "RpcProducerIdManager | LocalProducerIdManager":
        """Blocks from the controller in cluster mode, a local persistent block file when standalone."""
        if self._producer_ids is None:
            if self.broker.cluster_mode:
                self._producer_ids = RpcProducerIdManager(lambda: allocate_producer_ids(self.broker))
            else:
                self._producer_ids = LocalProducerIdManager(self.broker.log_manager.log_dirs[0])
        return self._producer_ids

    @rpc_method("BrokerService")
    async def InitProducerId(self, request: broker_pb2.InitProducerIdRequest,
                             context: Ctx) -> broker_pb2.InitProducerIdResponse:
        """Kafka's InitProducerId without a transactional id: a fresh producer id at epoch 0."""
        if request.transactional_id:
            raise errors.error_for(errors.Code.INVALID_REQUEST,
                                   "a transactional InitProducerId goes to the transaction coordinator "
                                   "(FindCoordinator key_type TRANSACTION), not to a broker")
        if self.authz.enabled and not self.authz.can_write_idempotently(
                self.authz.caller_of(context), list(self.broker.metadata_cache.partitions), "InitProducerId"):
            self.authz.require_cluster(self.authz.caller_of(context), Operation.IDEMPOTENT_WRITE, "InitProducerId")
        pid = await self.producer_id_manager().generate_producer_id()
        return broker_pb2.InitProducerIdResponse(producer_id=pid, producer_epoch=0)

    @rpc_method("BrokerService")
    async def FindCoordinator(self, request: coordinator_pb2.FindCoordinatorRequest,
                              context: Ctx) -> coordinator_pb2.FindCoordinatorResponse:
        """Kafka's FindCoordinator (key_type GROUP), answered from etcd (broker/coordinator_lookup.py)."""
        if self.authz.enabled:  # Kafka: Describe on the group or the transactional id
            rtype = ResourceType.TRANSACTIONAL_ID if request.key_type == 1 else ResourceType.GROUP
            self.authz.require(self.authz.caller_of(context), Operation.DESCRIBE, rtype, request.group_id,
                               "FindCoordinator")
        lookup = self.broker.coordinator_lookup
        if lookup is None:
            why = ("this broker is still starting" if self.broker.cluster_mode else
                   "a standalone broker has none: consumer groups need a cluster with coordinators")
            raise errors.error_for(errors.Code.COORDINATOR_NOT_AVAILABLE,
                                   f"no group coordinator for group {request.group_id}: {why}")
        cid, host, port, p = await lookup.find(request.group_id, request.key_type)
        return coordinator_pb2.FindCoordinatorResponse(coordinator_id=cid, host=host, port=port, partition=p)

    @rpc_method("BrokerService")
    async def Produce(self, request: broker_pb2.ProduceRequest, context: Ctx) -> broker_pb2.ProduceResponse:
        if self.authz.enabled:
            denied = produce_denials(self.authz, self.authz.caller_of(context), request.transactional_id,
                                     [request.topic])
            if denied:
                raise denied[request.topic]
        quota = await self.broker.quotas.unary(context)
        result = await self.replicas.handle_produce(request.topic, request.partition, request.records,
                                                    request.acks, request.timeout_ms)
        return broker_pb2.ProduceResponse(**produce_result_fields(result, request.acks),
                                          throttle_time_ms=quota.record_produce(len(request.records)) if quota else 0)

    @rpc_method("BrokerService")
    async def ProducePartitions(self, request: broker_pb2.ProducePartitionsRequest,
                                context: Ctx) -> broker_pb2.ProducePartitionsResponse:
        parts = [(d.topic, d.partition, d.records) for d in request.partitions]
        if self.authz.enabled:
            denied = produce_denials(self.authz, self.authz.caller_of(context), request.transactional_id,
                                     [t for t, _, _ in parts])
        quota = await self.broker.quotas.unary(context)
        if self.authz.enabled:
            results = await collect_produce(with_denials(parts, denied, lambda ps: self.replicas.start_produce_partitions(
                ps, request.acks, request.timeout_ms)))
        else:
            results = await self.replicas.handle_produce_partitions(parts, request.acks, request.timeout_ms)
        response = produce_partitions_response(request, results)
        if quota is not None:
            response.throttle_time_ms = quota.record_produce(sum(len(d.records) for d in request.partitions))
        return response

    @rpc_stream("BrokerService")
    async def ProduceStream(self, request_iterator: Any, context: Ctx) -> Any:
        """A producer's pipelined produce stream: appends in arrival order, answers as each is done."""
        caller = self.authz.caller_of(context) if self.authz.enabled else None
        stream = ProduceStreamHandler(self.replicas, self.broker.produce_streams, self.broker.quotas.stream(context),
                                      (lambda r: produce_denials(self.authz, caller, r.transactional_id,
                                                                 [d.topic for d in r.partitions]))
                                      if caller is not None else None)
        async for response in stream.serve(request_iterator):
            yield response

    @rpc_method("BrokerService")
    async def Fetch(self, request: broker_pb2.FetchRequest, context: Ctx) -> broker_pb2.FetchResponse:
        if self.authz.enabled:
            self.authz.require(self.authz.caller_of(context), Operation.READ, ResourceType.TOPIC, request.topic,
                               "Fetch", topic=request.topic)
        quota = None if request.HasField("replica_id") else await self.broker.quotas.unary(context)
        if quota is not None:
            request.max_bytes = quota.fetch_max_bytes(request.max_bytes)
        result = await handle_fetch_request(self.replicas, request)
        throttle = quota.record_fetch(result.slice.length) if quota is not None else 0
        if throttle:  # Kafka answers a throttled fetch without records
            return fetch_response(result, throttle_time_ms=throttle)
        return fetch_response(result, records=result.slice.read())

    @rpc_method("BrokerService")
    async def FetchPartitions(self, request: broker_pb2.FetchPartitionsRequest,
                              context: Ctx) -> broker_pb2.FetchPartitionsResponse:
        """A consumer's fetch of many partitions with a KIP-227 session (broker/consumer_fetch.py). Read on
        each partition's topic when the authorizer is on (a denial is that partition's error); the fetch
        quota caps max_bytes and a throttled answer carries no partitions, as the single Fetch."""
        check_fetch_bounds(request.min_bytes, request.max_wait_ms, request.max_bytes)
        authorize = None
        if self.authz.enabled:
            caller, authz = self.authz.caller_of(context), self.authz

            def authorize(topic: str) -> "errors.GregorError | None":
                try:
                    authz.require(caller, Operation.READ, ResourceType.TOPIC, topic, "Fetch", topic=topic)
                except errors.GregorError as err:
                    return err
                return None
        quota = await self.broker.quotas.unary(context)
        max_bytes = quota.fetch_max_bytes(request.max_bytes) if quota is not None else request.max_bytes
        wanted = [((q.topic, q.partition), CachedPartition(q.fetch_offset, q.partition_max_bytes,
                                                           q.current_leader_epoch, q.topic_id))
                  for q in request.partitions]
        try:
            ctx = self.replicas.fetch_sessions.resolve(request.session_id, request.session_epoch, wanted,
                                                       [(f.topic, f.partition) for f in request.forgotten])
        except FetchSessionError as exc:
            return broker_pb2.FetchPartitionsResponse(error=errors.error_for(exc.code, str(exc)).to_detail())
        fetch = ConsumerFetch(self.replicas, ctx, int(request.isolation_level), request.min_bytes,
                              request.max_wait_ms, max_bytes, authorize)
        answered = await fetch.run()
        session_id = ctx.session.session_id if ctx.session is not None else 0
        if quota is not None:
            throttle = quota.record_fetch(sum(a.outcome.slice.length for a in answered
                                              if not isinstance(a.outcome, errors.GregorError)))
            if throttle:  # Kafka answers a throttled fetch without partitions; the session keeps its state
                return broker_pb2.FetchPartitionsResponse(session_id=session_id, throttle_time_ms=throttle)
        fetch.sent(answered)
        return broker_pb2.FetchPartitionsResponse(session_id=session_id,
                                                  partitions=[fetch_partition_data(a) for a in answered])

    @rpc_stream("BrokerService")
    async def ReplicaFetch(self, request_iterator: Any, context: Ctx) -> Any:
        """A follower's fetch stream, which is also its fetch session: one response per request, in order.
        Each request is timed and counted like a unary call (api="ReplicaFetch"); an error for the whole
        request ends the stream with its status."""
        requests = self._replica_fetches
        if self.authz.enabled:  # a follower's fetch: ClusterAction on the Cluster (Kafka)
            try:
                self.authz.require_cluster(self.authz.caller_of(context), Operation.CLUSTER_ACTION, "ReplicaFetch")
            except errors.GregorError as err:
                await errors.abort_with(context, err)
                return
        # The session learns of its partitions' changes from the fetch purgatory (O(moved) per fetch).
        session = ReplicaFetchSession(self.replicas.fetch_purgatory)
        try:
            async for request in request_iterator:
                start = time.perf_counter()
                try:
                    answer = await answer_replica_fetch(self.replicas, request, session)
                except errors.GregorError as err:
                    requests.record(start, err.name)
                    raise  # rpc_stream: the stream ends with the error's status
                requests.record(start, "NONE")
                yield answer
        finally:
            session.close()

    @rpc_method("BrokerService")
    async def ListOffsets(self, request: broker_pb2.ListOffsetsRequest,
                          context: Ctx) -> broker_pb2.ListOffsetsResponse:
        if self.authz.enabled:
            self.authz.require(self.authz.caller_of(context), Operation.DESCRIBE, ResourceType.TOPIC, request.topic,
                               "ListOffsets", topic=request.topic)
        offset, ts, epoch = self.replicas.list_offsets(
            request.topic, request.partition, request.timestamp_ms,
            request.current_leader_epoch if request.HasField("current_leader_epoch") else -1,
            int(request.isolation_level))
        return broker_pb2.ListOffsetsResponse(offset=offset, timestamp_ms=ts, leader_epoch=epoch)

    @rpc_method("BrokerService")
    async def WriteTxnMarkers(self, request: broker_pb2.WriteTxnMarkersRequest,
                              context: Ctx) -> broker_pb2.WriteTxnMarkersResponse:
        """Kafka's WriteTxnMarkers: every (marker, partition) written concurrently, errors per partition."""
        if self.authz.enabled:
            self.authz.require_cluster(self.authz.caller_of(context), Operation.CLUSTER_ACTION, "WriteTxnMarkers")
        jobs = [(m, tp) for m in request.markers for tp in m.partitions]
        outcomes = await asyncio.gather(*(write_marker(
            self.replicas, tp.topic, tp.partition,
            MarkerRequest(m.producer_id, m.producer_epoch, m.coordinator_epoch, m.committed), request.timeout_ms)
            for m, tp in jobs), return_exceptions=True)
        results = []
        for (m, tp), out in zip(jobs, outcomes):
            if isinstance(out, errors.GregorError):
                results.append(broker_pb2.TxnMarkerPartitionResult(
                    producer_id=m.producer_id, topic=tp.topic, partition=tp.partition, error=out.to_detail(),
                    offset=-1))
            elif isinstance(out, BaseException):
                raise out
            else:
                results.append(broker_pb2.TxnMarkerPartitionResult(
                    producer_id=m.producer_id, topic=tp.topic, partition=tp.partition, offset=out))
        return broker_pb2.WriteTxnMarkersResponse(results=results)

    @rpc_method("BrokerService")
    async def DescribeProducers(self, request: broker_pb2.DescribeProducersRequest,
                                context: Ctx) -> broker_pb2.DescribeProducersResponse:
        if self.authz.enabled:
            self.authz.require(self.authz.caller_of(context), Operation.READ, ResourceType.TOPIC, request.topic,
                               "DescribeProducers", topic=request.topic)
        rows = describe_producers(self.replicas.get_partition(request.topic, request.partition))
        return broker_pb2.DescribeProducersResponse(producers=[broker_pb2.ProducerStateDescription(
            producer_id=pid, producer_epoch=epoch, last_sequence=seq, last_timestamp=ts, coordinator_epoch=ce,
            current_txn_start_offset=start) for pid, epoch, seq, ts, ce, start in rows])

    @rpc_method("BrokerService")
    async def Metadata(self, request: broker_pb2.MetadataRequest, context: Ctx) -> broker_pb2.MetadataResponse:
        response = self.broker.metadata_response(list(request.topics))
        if self.authz.enabled:
            self.filter_metadata(response, bool(request.topics), self.authz.caller_of(context))
        return response

    def filter_metadata(self, response: broker_pb2.MetadataResponse, named: bool, caller: Any) -> None:
        """Kafka's Metadata: a topic without Describe is left out of an all-topics answer and answered
        TOPIC_AUTHORIZATION_FAILED (no partitions, no id) when asked for by name."""
        keep = []
        for t in response.topics:
            if self.authz.check(caller, Operation.DESCRIBE, ResourceType.TOPIC, t.name, "Metadata", audit=named):
                keep.append(t)
            elif named:
                keep.append(broker_pb2.TopicMetadata(name=t.name, error=errors.Code.TOPIC_AUTHORIZATION_FAILED))
        del response.topics[:]
        response.topics.extend(keep)

    @rpc_method("BrokerService")
    async def OffsetForLeaderEpoch(self, request: broker_pb2.OffsetForLeaderEpochRequest,
                                   context: Ctx) -> broker_pb2.OffsetForLeaderEpochResponse:
        if self.authz.enabled:  # Kafka: Describe on the topic for a consumer, ClusterAction for a follower
            caller = self.authz.caller_of(context)
            if not self.authz.check(caller, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, "kafka-cluster",
                                    "OffsetForLeaderEpoch", audit=False):
                self.authz.require(caller, Operation.DESCRIBE, ResourceType.TOPIC, request.topic,
                                   "OffsetForLeaderEpoch", topic=request.topic)
        epoch, end_offset = self.replicas.offset_for_leader_epoch(
            request.topic, request.partition, request.leader_epoch,
            request.current_leader_epoch if request.HasField("current_leader_epoch") else None)
        return broker_pb2.OffsetForLeaderEpochResponse(leader_epoch=epoch, end_offset=end_offset)


def _topic_error(name: str, err: errors.GregorError | None) -> controller_pb2.TopicResult:
    return controller_pb2.TopicResult(name=name, error=err.to_detail() if err else None)


class LocalAdminServicer(controller_pb2_grpc.AdminServiceServicer):
    """AdminService of a standalone broker (no controller yet): topics live in LocalTopicStore."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.request_quota = broker.quotas
        self.store = broker.topic_store

    @rpc_method("AdminService")
    async def CreateTopics(self, request: controller_pb2.CreateTopicsRequest,
                           context: Ctx) -> controller_pb2.CreateTopicsResponse:
        results = []
        cfg = self.broker.config
        for t in request.topics:
            try:
                if t.assignments:
                    n = len(t.assignments)
                    rf = len(next(iter(t.assignments.values())).broker_ids)
                else:
                    n = t.num_partitions if t.num_partitions > 0 else (
                        cfg.num_partitions if t.num_partitions == -1 else t.num_partitions)
                    rf = t.replication_factor if t.replication_factor > 0 else (
                        cfg.default_replication_factor if t.replication_factor == -1 else t.replication_factor)
                entry = self.store.create(t.name, n, rf, dict(t.configs), request.validate_only)
                if not request.validate_only:
                    self.broker.open_topic(t.name, entry)
                results.append(controller_pb2.TopicResult(
                    name=t.name, num_partitions=n, replication_factor=rf,
                    topic_id=uuid.from_string(entry["topic_id"]) if not request.validate_only else b""))
            except errors.GregorError as err:
                results.append(_topic_error(t.name, err))
        return controller_pb2.CreateTopicsResponse(results=results)

    @rpc_method("AdminService")
    async def DeleteTopics(self, request: controller_pb2.DeleteTopicsRequest,
                           context: Ctx) -> controller_pb2.DeleteTopicsResponse:
        results = []
        for name in request.topics:
            try:
                if not self.broker.config.delete_topic_enable:
                    raise errors.error_for(errors.Code.TOPIC_DELETION_DISABLED,
                                           "Topic deletion is disabled (delete.topic.enable=false).", topic=name)
                self.store.delete(name)
                self.broker.replica_manager.delete_partitions(name)
                results.append(_topic_error(name, None))
            except errors.GregorError as err:
                results.append(_topic_error(name, err))
        return controller_pb2.DeleteTopicsResponse(results=results)

    @rpc_method("AdminService")
    async def CreatePartitions(self, request: controller_pb2.CreatePartitionsRequest,
                               context: Ctx) -> controller_pb2.CreatePartitionsResponse:
        entry = self.store.add_partitions(request.topic, request.count, request.validate_only)
        if not request.validate_only:
            self.broker.open_topic(request.topic, entry)
        return controller_pb2.CreatePartitionsResponse(
            result=controller_pb2.TopicResult(name=request.topic, num_partitions=entry["partitions"],
                                              replication_factor=entry["replication_factor"]))

    def _describe(self, name: str) -> controller_pb2.TopicConfigs:
        try:
            overrides = self.store.get(name)["configs"]
        except errors.GregorError as err:
            return controller_pb2.TopicConfigs(topic=name, error=err.to_detail())
        effective = effective_topic_configs(overrides, self.broker.config.topic_defaults)
        entries = [
            controller_pb2.ConfigEntry(name=k, value=_config_str(v), is_default=k not in overrides,
                                       documentation=TOPIC_CONFIGS[k].doc)
            for k, v in sorted(effective.items())
        ]
        return controller_pb2.TopicConfigs(topic=name, entries=entries)

    @rpc_method("AdminService")
    async def DescribeConfigs(self, request: controller_pb2.DescribeConfigsRequest,
                              context: Ctx) -> controller_pb2.DescribeConfigsResponse:
        names = list(request.topics) or sorted(self.store.topics)
        return controller_pb2.DescribeConfigsResponse(results=[self._describe(n) for n in names])

    @rpc_method("AdminService")
    async def AlterConfigs(self, request: controller_pb2.AlterConfigsRequest,
                           context: Ctx) -> controller_pb2.AlterConfigsResponse:
        entry = self.store.alter_configs(request.topic, dict(request.set), list(request.delete),
                                         request.validate_only)
        if not request.validate_only:
            self.broker.replica_manager.update_topic_configs(request.topic, entry["configs"])
        return controller_pb2.AlterConfigsResponse(result=self._describe(request.topic))

    @rpc_method("AdminService")
    async def ElectLeaders(self, request: controller_pb2.ElectLeadersRequest,
                           context: Ctx) -> controller_pb2.ElectLeadersResponse:
        results = []
        for p in self.broker.replica_manager.partitions.values():
            err = errors.error_for(errors.Code.ELECTION_NOT_NEEDED, "a standalone broker always leads")
            results.append(controller_pb2.ElectionResult(
                partition=common_pb2.TopicPartition(topic=p.topic, partition=p.partition),
                error=err.to_detail(), leader=p.leader_id))
        return controller_pb2.ElectLeadersResponse(results=results)

    @rpc_method("AdminService")
    async def DescribeCluster(self, request: controller_pb2.DescribeClusterRequest,
                              context: Ctx) -> controller_pb2.DescribeClusterResponse:
        return controller_pb2.DescribeClusterResponse(
            cluster_id=self.broker.config.cluster_id, controller_id=-1, controller_epoch=-1,
            brokers=[self.broker.endpoint()])

    @rpc_method("AdminService")
    async def DescribeBrokerConfigs(self, request: controller_pb2.DescribeBrokerConfigsRequest,
                                    context: Ctx) -> controller_pb2.DescribeBrokerConfigsResponse:
        return describe_broker_configs(self.broker, request.broker, context)

    @rpc_method("AdminService")
    async def DescribeClientQuotas(self, request: controller_pb2.DescribeClientQuotasRequest,
                                   context: Ctx) -> controller_pb2.DescribeClientQuotasResponse:
        return _local_quotas_describe(self.broker, request)

    @rpc_method("AdminService")
    async def AlterClientQuotas(self, request: controller_pb2.AlterClientQuotasRequest,
                                context: Ctx) -> controller_pb2.AlterClientQuotasResponse:
        return _local_quotas_alter(self.broker, request)


def _local_quotas_describe(broker: "Broker", request: controller_pb2.DescribeClientQuotasRequest
                           ) -> controller_pb2.DescribeClientQuotasResponse:
    """A standalone broker's quotas live in its memory only (no etcd): they last until it stops."""
    configs = broker.quotas.configs
    if request.HasField("entity"):
        e = entity_of(request.entity)
        found = configs.describe(e.user, e.client_id)
    else:
        found = configs.describe()
    return controller_pb2.DescribeClientQuotasResponse(entries=[entry_pb(e, c) for e, c in found])


def _local_quotas_alter(broker: "Broker", request: controller_pb2.AlterClientQuotasRequest
                        ) -> controller_pb2.AlterClientQuotasResponse:
    entity = entity_of(request.entity)
    configs = altered(broker.quotas.configs.entities.get(entity, {}), request)
    if not request.validate_only:
        broker.quotas.set_entity(entity, {k: number(v) for k, v in configs.items()})
    return controller_pb2.AlterClientQuotasResponse(result=entry_pb(entity, configs))


def _config_str(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# Control-request applies still running after their RPC went away, referenced until done.
_APPLYING: set["asyncio.Task[Any]"] = set()


async def _finish_even_if_cancelled(apply: Coroutine[Any, Any, T]) -> T:
    """Run a control request's apply to its end even if the controller's call is cancelled (its deadline
    passed while a large LeaderAndIsr was being applied): half a chunk must never be left behind, and
    the controller's resend then waits for it on the control lock and finds it applied."""
    task = asyncio.ensure_future(apply)
    _APPLYING.add(task)
    task.add_done_callback(_APPLYING.discard)
    return await asyncio.shield(task)


class BrokerControlServicer(broker_pb2_grpc.BrokerControlServiceServicer):
    """BrokerControlService (cluster mode): the active controller's LeaderAndIsr, StopReplica and UpdateMetadata.

    Each needs ClusterAction on the Cluster (Kafka's inter-broker requests).
    """

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.replicas = broker.replica_manager
        self.authz = broker.authz

    def _cluster_action(self, context: Ctx, api: str) -> None:
        if self.authz.enabled:
            self.authz.require_cluster(self.authz.caller_of(context), Operation.CLUSTER_ACTION, api)

    @rpc_method("BrokerControlService")
    async def LeaderAndIsr(self, request: broker_pb2.LeaderAndIsrRequest,
                           context: Ctx) -> broker_pb2.LeaderAndIsrResponse:
        self._cluster_action(context, "LeaderAndIsr")
        await self.broker.check_control_request(request.controller_epoch, request.broker_epoch)
        configs = {t: dict(c.entries) for t, c in request.topic_configs.items()}
        failed = await _finish_even_if_cancelled(
            self.replicas.apply_leader_and_isr(request.partition_states, configs, list(request.live_leaders)))
        return broker_pb2.LeaderAndIsrResponse(partition_errors=[
            broker_pb2.PartitionError(topic=t, partition=p, error=code)  # type: ignore[arg-type]
            for (t, p), code in sorted(failed.items())])

    @rpc_method("BrokerControlService")
    async def StopReplica(self, request: broker_pb2.StopReplicaRequest,
                          context: Ctx) -> broker_pb2.StopReplicaResponse:
        self._cluster_action(context, "StopReplica")
        await self.broker.check_control_request(request.controller_epoch, request.broker_epoch)
        await _finish_even_if_cancelled(self.replicas.apply_stop_replica(
            [(tp.topic, tp.partition) for tp in request.partitions], request.delete_partitions))
        return broker_pb2.StopReplicaResponse()

    @rpc_method("BrokerControlService")
    async def UpdateMetadata(self, request: broker_pb2.UpdateMetadataRequest,
                             context: Ctx) -> broker_pb2.UpdateMetadataResponse:
        self._cluster_action(context, "UpdateMetadata")
        await self.broker.check_control_request(request.controller_epoch, request.broker_epoch)
        rm = self.broker.replica_manager
        before = rm.live_broker_epochs()
        self.broker.metadata_cache.update_metadata(request.controller_id, request.live_brokers,
                                                   request.partition_states, request.deleted_topics)
        rm.on_live_brokers_changed(before)  # a restarted follower may join the ISRs it fetched for meanwhile
        return broker_pb2.UpdateMetadataResponse()


def _forwarded(api: str) -> Any:
    """An AdminService method that relays the request to the active controller and its answer back."""

    async def method(self: "ForwardingAdminServicer", request: Any, context: Ctx) -> Any:
        return await self.forward(api, request, context)

    method.__name__ = api
    return rpc_method("AdminService")(method)


def describe_broker_configs(broker: "Broker", name: str, context: Ctx) -> controller_pb2.DescribeBrokerConfigsResponse:
    """Kafka's DescribeConfigs of a BROKER resource, answered by that broker (the admin client routes it here):
    DescribeConfigs on the Cluster needed; "" the dynamic defaults, our id every config with its source."""
    if broker.authz.enabled:
        broker.authz.require_cluster(broker.authz.caller_of(context), Operation.DESCRIBE_CONFIGS, "DescribeConfigs")
    if name not in ("", "<default>", str(broker.config.broker_id)):
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"Unexpected broker id, expected "
                                                            f"{broker.config.broker_id} or empty string, but received {name}")
    return controller_pb2.DescribeBrokerConfigsResponse(entries=[
        controller_pb2.BrokerConfigEntry(
            name=e.name, value=e.value, source=e.source, read_only=e.read_only, sensitive=e.sensitive,
            documentation=e.documentation,
            synonyms=[controller_pb2.BrokerConfigSynonym(name=n, value=v, source=src) for n, v, src in e.synonyms])
        for e in broker.dynamic_config.describe(name)])


class ForwardingAdminServicer(controller_pb2_grpc.AdminServiceServicer):
    """AdminService of a cluster-mode broker: every call goes to the active controller (read from etcd).

    A NOT_CONTROLLER answer or an unreachable controller means it moved: look it up
    again and retry until the caller's deadline (controller_link.FORWARD_TIMEOUT_S at most).
    """

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.request_quota = broker.quotas  # Kafka meters forwarded requests on the broker that got them

    async def forward(self, api: str, request: Any, context: Ctx) -> Any:
        metadata = None
        if self.broker.authz.enabled:  # KIP-590's envelope: the controller authorizes our caller, not us
            caller = self.broker.authz.caller_of(context)
            metadata = ((FORWARDED_PRINCIPAL_HEADER, caller.principal), (FORWARDED_HOST_HEADER, caller.host))
        return await forward_to_controller(self.broker, api, request, context.time_remaining(), metadata)

    CreateTopics = _forwarded("CreateTopics")
    DeleteTopics = _forwarded("DeleteTopics")
    CreatePartitions = _forwarded("CreatePartitions")
    @rpc_method("AdminService")
    async def DescribeConfigs(self, request: controller_pb2.DescribeConfigsRequest,
                              context: Ctx) -> controller_pb2.DescribeConfigsResponse:
        resp = await self.forward("DescribeConfigs", request, context)
        for tc in resp.results:
            self._localize(tc)
        return resp

    @rpc_method("AdminService")
    async def AlterConfigs(self, request: controller_pb2.AlterConfigsRequest,
                           context: Ctx) -> controller_pb2.AlterConfigsResponse:
        resp = await self.forward("AlterConfigs", request, context)
        self._localize(resp.result)
        return resp

    def _localize(self, tc: controller_pb2.TopicConfigs) -> None:
        """A topic's configs as this broker has them, as Kafka's brokers answer (the controller knows the topic's
        overrides, not our static and dynamic defaults): the same entries the Kafka listener's DescribeConfigs gives."""
        entries = self.broker.dynamic_config.topic_entries(tc.entries)
        del tc.entries[:]
        tc.entries.extend(controller_pb2.ConfigEntry(name=e.name, value=e.value or "", is_default=e.source != bc.TOPIC_CONFIG,
                                                     documentation=e.documentation, source=e.source)
                          for e in entries)
    ElectLeaders = _forwarded("ElectLeaders")
    DescribeCluster = _forwarded("DescribeCluster")
    DescribeClientQuotas = _forwarded("DescribeClientQuotas")
    AlterClientQuotas = _forwarded("AlterClientQuotas")
    CreateAcls = _forwarded("CreateAcls")
    DescribeAcls = _forwarded("DescribeAcls")
    DeleteAcls = _forwarded("DeleteAcls")
    AlterBrokerConfigs = _forwarded("AlterBrokerConfigs")

    @rpc_method("AdminService")
    async def DescribeBrokerConfigs(self, request: controller_pb2.DescribeBrokerConfigsRequest,
                                    context: Ctx) -> controller_pb2.DescribeBrokerConfigsResponse:
        return describe_broker_configs(self.broker, request.broker, context)
