"""gRPC servicers of the controller: proto <-> domain, nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import grpc

from gregor.common import authz as az, broker_configs as bc, errors
from gregor.common.acl import Operation, ResourceType
from gregor.common.config import TOPIC_CONFIGS, effective_topic_configs
from gregor.common.quota_admin import altered, entity_of, entry_pb
from gregor.common.rpc import rpc_method
from gregor.controller import broker_configs, client_quotas
from gregor.controller.event_manager import RECENT_EVENTS_MAX
from gregor.controller.leader_balance import ElectionType
from gregor.controller.state import ControllerState, TopicPartition
from gregor.controller.topic_admin import NewTopic, TopicAdmin, TopicOutcome
from gregor.rpc.v1 import common_pb2, controller_pb2, controller_pb2_grpc

if TYPE_CHECKING:
    from gregor.controller.controller import Controller

Ctx: TypeAlias = grpc.aio.ServicerContext


class ControllerServicer(controller_pb2_grpc.ControllerServiceServicer):
    """ControllerService: broker-facing requests, answered NOT_CONTROLLER by standbys."""

    def __init__(self, controller: "Controller", authz: az.Authz | None = None) -> None:
        self.controller = controller
        self.authz = authz or az.Authz()

    def _cluster(self, context: Ctx, operation: Operation, api: str) -> None:
        if self.authz.enabled:
            self.authz.require_cluster(self.authz.caller_of(context), operation, api)

    def _require_active(self) -> None:
        if not self.controller.is_active:
            raise errors.error_for(errors.Code.NOT_CONTROLLER,
                                   f"controller {self.controller.controller_id} is not the active controller "
                                   f"(active: {self.controller.active_controller_id})")

    @rpc_method("ControllerService")
    async def ControlledShutdown(self, request: controller_pb2.ControlledShutdownRequest,
                                 context: Ctx) -> controller_pb2.ControlledShutdownResponse:
        self._cluster(context, Operation.CLUSTER_ACTION, "ControlledShutdown")
        self._require_active()
        remaining = await self.controller.controlled_shutdown(request.broker_id, request.broker_epoch)
        return controller_pb2.ControlledShutdownResponse(remaining_partitions=[
            common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in sorted(remaining)])

    @rpc_method("ControllerService")
    async def AllocateProducerIds(self, request: controller_pb2.AllocateProducerIdsRequest,
                                  context: Ctx) -> controller_pb2.AllocateProducerIdsResponse:
        self._cluster(context, Operation.CLUSTER_ACTION, "AllocateProducerIds")
        self._require_active()
        start, length = await self.controller.allocate_producer_ids(request.broker_id, request.broker_epoch)
        return controller_pb2.AllocateProducerIdsResponse(producer_id_start=start, producer_id_len=length)

    @rpc_method("ControllerService")
    async def DescribeControllerEvents(self, request: controller_pb2.DescribeControllerEventsRequest,
                                       context: Ctx) -> controller_pb2.DescribeControllerEventsResponse:
        self._cluster(context, Operation.DESCRIBE, "DescribeControllerEvents")
        if request.max_processed < 0:
            raise errors.error_for(errors.Code.INVALID_REQUEST, "max_processed must be >= 0")
        c = self.controller
        snap = c.events.snapshot(request.max_processed or RECENT_EVENTS_MAX)
        return controller_pb2.DescribeControllerEventsResponse(
            controller_id=c.controller_id, active=c.is_active, controller_epoch=c.ctx.epoch if c.is_active else 0,
            state=snap.state.kafka_name,
            queued=[controller_pb2.QueuedControllerEvent(name=name, state=state.kafka_name, enqueue_age_seconds=age)
                    for name, state, age in snap.queued],
            processed=[controller_pb2.ProcessedControllerEvent(
                name=e.name, state=e.state.kafka_name, queue_time_seconds=e.queue_time_s,
                processing_time_seconds=e.processing_time_s,
                age_seconds=max(0.0, snap.now_s - e.enqueue_time_s - e.queue_time_s - e.processing_time_s),
                error=e.error) for e in snap.processed])


def _result(outcome: TopicOutcome) -> controller_pb2.TopicResult:
    return controller_pb2.TopicResult(
        name=outcome.name, num_partitions=outcome.num_partitions, replication_factor=outcome.replication_factor,
        topic_id=outcome.topic_id, error=outcome.error.to_detail() if outcome.error is not None else None)


def _config_str(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _topic_configs(name: str, overrides: dict[str, str], err: errors.GregorError | None) -> controller_pb2.TopicConfigs:
    if err is not None:
        return controller_pb2.TopicConfigs(topic=name, error=err.to_detail())
    entries = [controller_pb2.ConfigEntry(name=k, value=_config_str(v), is_default=k not in overrides,
                                          documentation=TOPIC_CONFIGS[k].doc,
                                          source=bc.DEFAULT_CONFIG if k not in overrides else bc.TOPIC_CONFIG)
               for k, v in sorted(effective_topic_configs(overrides).items())]
    return controller_pb2.TopicConfigs(topic=name, entries=entries)


class ControllerAdminServicer(controller_pb2_grpc.AdminServiceServicer):
    """AdminService on a controller: topic operations on the active one (NOT_CONTROLLER elsewhere), DescribeCluster anywhere."""

    def __init__(self, controller: "Controller", authz: az.Authz | None = None) -> None:
        self.controller = controller
        self.topics = TopicAdmin(controller)
        self.authz = authz or az.Authz()

    def _topic_denied(self, caller: az.Caller, operation: Operation, topic: str, api: str) -> TopicOutcome | None:
        """The per-topic TOPIC_AUTHORIZATION_FAILED outcome when caller may not act on topic, else None."""
        if self.authz.check(caller, operation, ResourceType.TOPIC, topic, api):
            return None
        return TopicOutcome(topic, error=az.denial(caller, operation, ResourceType.TOPIC, topic, topic=topic))

    def _cluster(self, context: Ctx, operation: Operation, api: str) -> None:
        if self.authz.enabled:
            self.authz.require_cluster(self.authz.caller_of(context), operation, api)

    @rpc_method("AdminService")
    async def CreateTopics(self, request: controller_pb2.CreateTopicsRequest,
                           context: Ctx) -> controller_pb2.CreateTopicsResponse:
        results = []
        caller = self.authz.caller_of(context)
        # Kafka: Create on the Cluster covers every topic, else Create on each topic.
        on_cluster = self.authz.check(caller, Operation.CREATE, ResourceType.CLUSTER, "kafka-cluster",
                                      "CreateTopics", audit=False)
        for t in request.topics:
            denied = None if on_cluster else self._topic_denied(caller, Operation.CREATE, t.name, "CreateTopics")
            if denied is not None:
                results.append(_result(denied))
                continue
            new = NewTopic(t.name, t.num_partitions, t.replication_factor,
                           {p: list(r.broker_ids) for p, r in t.assignments.items()}, dict(t.configs))
            outcome = await self.controller.run_request(
                "CreateTopics", ControllerState.TOPIC_CHANGE,
                lambda new=new: self.topics.create_topic(new, request.validate_only))  # type: ignore[misc]
            # Answered once the topic's assignment is written and its first new.partitions.per.event partitions
            # are online, as Kafka answers once the topic is in the metadata: the rest of a large creation follows
            # in NewPartitionCreation events (a 10,000-partition creation used to outlive the 30 s forward timeout).
            results.append(_result(outcome))
        return controller_pb2.CreateTopicsResponse(results=results)

    @rpc_method("AdminService")
    async def DeleteTopics(self, request: controller_pb2.DeleteTopicsRequest,
                           context: Ctx) -> controller_pb2.DeleteTopicsResponse:
        results = []
        caller = self.authz.caller_of(context)
        for name in request.topics:
            denied = self._topic_denied(caller, Operation.DELETE, name, "DeleteTopics")
            if denied is not None:
                results.append(_result(denied))
                continue
            outcome = await self.controller.run_request(
                "DeleteTopics", ControllerState.TOPIC_DELETION,
                lambda name=name: self.topics.delete_topic(name))  # type: ignore[misc]
            results.append(_result(outcome))
        return controller_pb2.DeleteTopicsResponse(results=results)

    @rpc_method("AdminService")
    async def CreatePartitions(self, request: controller_pb2.CreatePartitionsRequest,
                               context: Ctx) -> controller_pb2.CreatePartitionsResponse:
        if self.authz.enabled:
            self.authz.require(self.authz.caller_of(context), Operation.ALTER, ResourceType.TOPIC, request.topic,
                               "CreatePartitions", topic=request.topic)
        outcome = await self.controller.run_request(
            "CreatePartitions", ControllerState.TOPIC_CHANGE,
            lambda: self.topics.create_partitions(request.topic, request.count, request.validate_only))
        return controller_pb2.CreatePartitionsResponse(result=_result(outcome))

    @rpc_method("AdminService")
    async def DescribeConfigs(self, request: controller_pb2.DescribeConfigsRequest,
                              context: Ctx) -> controller_pb2.DescribeConfigsResponse:
        async def describe() -> list[tuple[str, dict[str, str], errors.GregorError | None]]:
            return self.topics.describe_configs(list(request.topics))

        found = await self.controller.run_request("DescribeConfigs", ControllerState.IDLE, describe)
        if self.authz.enabled:  # Kafka: DescribeConfigs on each topic; all topics: the authorized ones
            caller = self.authz.caller_of(context)
            kept = []
            for f in found:
                if self.authz.check(caller, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, f[0], "DescribeConfigs",
                                    audit=bool(request.topics)):
                    kept.append(f)
                elif request.topics:
                    kept.append((f[0], {}, az.denial(caller, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, f[0],
                                                     topic=f[0])))
            found = kept
        return controller_pb2.DescribeConfigsResponse(results=[_topic_configs(*f) for f in found])

    @rpc_method("AdminService")
    async def AlterConfigs(self, request: controller_pb2.AlterConfigsRequest,
                           context: Ctx) -> controller_pb2.AlterConfigsResponse:
        if self.authz.enabled:
            self.authz.require(self.authz.caller_of(context), Operation.ALTER_CONFIGS, ResourceType.TOPIC,
                               request.topic, "AlterConfigs", topic=request.topic)
        configs = await self.controller.run_request(
            "AlterConfigs", ControllerState.IDLE,
            lambda: self.topics.alter_configs(request.topic, dict(request.set), list(request.delete),
                                              request.validate_only))
        return controller_pb2.AlterConfigsResponse(result=_topic_configs(request.topic, configs, None))

    @rpc_method("AdminService")
    async def ElectLeaders(self, request: controller_pb2.ElectLeadersRequest,
                           context: Ctx) -> controller_pb2.ElectLeadersResponse:
        self._cluster(context, Operation.ALTER, "ElectLeaders")
        unclean = request.unclean or request.election_type == controller_pb2.UNCLEAN
        partitions = [TopicPartition(p.topic, p.partition) for p in request.partitions] or None
        outcomes = await self.controller.elect_leaders(
            partitions, ElectionType.UNCLEAN if unclean else ElectionType.PREFERRED)
        return controller_pb2.ElectLeadersResponse(results=[
            controller_pb2.ElectionResult(
                partition=common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition), leader=o.leader,
                error=o.error.to_detail() if o.error is not None else None)
            for tp, o in sorted(outcomes.items())])

    @rpc_method("AdminService")
    async def DescribeCluster(self, request: controller_pb2.DescribeClusterRequest,
                              context: Ctx) -> controller_pb2.DescribeClusterResponse:
        desc = await self.controller.describe_cluster()
        return controller_pb2.DescribeClusterResponse(
            cluster_id=self.controller.etcd.cluster, controller_id=desc.controller_id,
            controller_epoch=desc.controller_epoch, brokers=[b.endpoint() for b in desc.brokers])

    @rpc_method("AdminService")
    async def DescribeClientQuotas(self, request: controller_pb2.DescribeClientQuotasRequest,
                                   context: Ctx) -> controller_pb2.DescribeClientQuotasResponse:
        entity = entity_of(request.entity) if request.HasField("entity") else None
        found = await self.controller.run_request("DescribeClientQuotas", ControllerState.IDLE,
                                                  lambda: client_quotas.describe(self.controller, entity))
        return controller_pb2.DescribeClientQuotasResponse(entries=[entry_pb(e, c) for e, c in found])

    @rpc_method("AdminService")
    async def AlterClientQuotas(self, request: controller_pb2.AlterClientQuotasRequest,
                                context: Ctx) -> controller_pb2.AlterClientQuotasResponse:
        entity = entity_of(request.entity)

        async def alter() -> dict[str, float]:
            configs = altered(await client_quotas.read_entity(self.controller, entity), request)
            if not request.validate_only:
                await client_quotas.write(self.controller, entity, configs)
            return configs

        configs = await self.controller.run_request("AlterClientQuotas", ControllerState.IDLE, alter)
        return controller_pb2.AlterClientQuotasResponse(result=entry_pb(entity, configs))
    @rpc_method("AdminService")
    async def AlterBrokerConfigs(self, request: controller_pb2.AlterBrokerConfigsRequest,
                                 context: Ctx) -> controller_pb2.AlterBrokerConfigsResponse:
        self._cluster(context, Operation.ALTER_CONFIGS, "AlterConfigs")  # Kafka: AlterConfigs on the Cluster
        configs = await self.controller.run_request(
            "AlterBrokerConfigs", ControllerState.IDLE,
            lambda: broker_configs.alter(self.controller, request.broker, dict(request.set), list(request.delete),
                                         request.validate_only, request.replace))
        return controller_pb2.AlterBrokerConfigsResponse(configs=configs)

    # -- ACLs (Kafka's CreateAcls / DescribeAcls / DeleteAcls): any controller instance, straight to etcd ----

    @rpc_method("AdminService")
    async def CreateAcls(self, request: controller_pb2.CreateAclsRequest,
                         context: Ctx) -> controller_pb2.CreateAclsResponse:
        self._cluster(context, Operation.ALTER, "CreateAcls")
        await az.create_acls(self.controller.etcd, [az.binding_from_pb(a) for a in request.acls])
        return controller_pb2.CreateAclsResponse()

    @rpc_method("AdminService")
    async def DescribeAcls(self, request: controller_pb2.AclFilter,
                           context: Ctx) -> controller_pb2.DescribeAclsResponse:
        self._cluster(context, Operation.DESCRIBE, "DescribeAcls")
        found = await az.describe_acls(self.controller.etcd, az.filter_from_pb(request))
        return controller_pb2.DescribeAclsResponse(acls=[az.binding_to_pb(a) for a in found])

    @rpc_method("AdminService")
    async def DeleteAcls(self, request: controller_pb2.DeleteAclsRequest,
                         context: Ctx) -> controller_pb2.DeleteAclsResponse:
        self._cluster(context, Operation.ALTER, "DeleteAcls")
        if not request.filters:
            raise errors.error_for(errors.Code.INVALID_REQUEST, "DeleteAcls needs at least one filter")
        deleted = await az.delete_acls(self.controller.etcd, [az.filter_from_pb(f) for f in request.filters])
        return controller_pb2.DeleteAclsResponse(deleted=[az.binding_to_pb(a) for a in deleted])
