"""Kafka admin APIs of the first stage that were missing: IncrementalAlterConfigs and ElectLeaders (through the
controller), DeleteRecords (on this broker's leader partitions, through the native log's log-start-offset),
OffsetDelete (relayed to the group's coordinator, like the other group APIs).

IncrementalAlterConfigs and AlterConfigs: TOPIC resources become the controller's AlterConfigs (SET and DELETE as
they are; APPEND and SUBTRACT, Kafka's list operations, read the current value first and SET the new
comma-separated list). BROKER resources (KIP-226 dynamic broker configs: name "" the cluster-wide default, else a
broker id) become the controller's AlterBrokerConfigs, after Kafka's check of AlterConfigs on the Cluster
(CLUSTER_AUTHORIZATION_FAILED); only the dynamically updatable keys of common/broker_configs.py are accepted.
BROKER_LOGGER resources are refused with INVALID_REQUEST.

DeleteRecords: the leader moves its log start offset to the asked offset (-1: the high watermark) and the answer
waits, as Kafka's DelayedDeleteRecords, until every live replica's log start offset got there
(broker/delete_records.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from gregor.common import authz as az, broker_configs as bc, errors
from gregor.common.acl import Operation, ResourceType
from gregor.common.config import TOPIC_CONFIGS
from gregor.kafka import codec
from gregor.kafka.quota_handlers import QUOTA_API_NAMES, QUOTA_SUPPORTED, QuotaApis
from gregor.rpc.v1 import common_pb2, controller_pb2, coordinator_pb2

if TYPE_CHECKING:
    from gregor.kafka.handlers import KafkaHandlers

Code = errors.Code
NONE = 0
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

ADMIN_SUPPORTED: dict[int, tuple[int, int]] = {
    21: (0, 2),   # DeleteRecords
    33: (0, 2),   # AlterConfigs (legacy)
    43: (0, 2),   # ElectLeaders
    44: (0, 1),   # IncrementalAlterConfigs
    47: (0, 0),   # OffsetDelete
    **QUOTA_SUPPORTED,  # DescribeClientQuotas, AlterClientQuotas (kafka/quota_handlers.py)
}
ADMIN_API_NAMES = {21: "DeleteRecords", 33: "AlterConfigs", 43: "ElectLeaders", 44: "IncrementalAlterConfigs",
                   47: "OffsetDelete", **QUOTA_API_NAMES}


class AdminApis:
    def __init__(self, handlers: "KafkaHandlers") -> None:
        self.h = handlers

    def table(self) -> dict[int, Any]:
        return {21: self.delete_records, 33: self.alter_configs, 43: self.elect_leaders,
                44: self.incremental_alter_configs,
                47: self.offset_delete, **QuotaApis(self.h).table()}

    # ---- IncrementalAlterConfigs -----------------------------------------------------------------

    async def _alter_topic(self, topic: str, configs: Any, validate_only: bool) -> None:
        async def current() -> dict[str, str]:
            resp = await self.h.admin("DescribeConfigs", controller_pb2.DescribeConfigsRequest(topics=[topic]))
            tc = resp.results[0]
            if tc.HasField("error") and tc.error.code:
                raise errors.error_for(tc.error.code, tc.error.message)
            return {e.name: e.value for e in tc.entries}

        sets, deletes = await _incremental(configs, current, "topic")
        await self.h.admin("AlterConfigs", controller_pb2.AlterConfigsRequest(
            topic=topic, set=sets, delete=deletes, validate_only=validate_only))

    async def _alter_broker(self, name: str, configs: Any, validate_only: bool) -> None:
        async def current() -> dict[str, str]:  # APPEND / SUBTRACT: over the value this entity resolves to
            dyn = self.h.broker.dynamic_config
            if bc.entity_name(name) == bc.DEFAULT_ENTITY:
                return dict(dyn.default_layer)
            return {e.name: e.value or "" for e in dyn.describe(str(self.h.broker.config.broker_id))
                    if not e.read_only} | dyn.entities.get(name, {})

        sets, deletes = await _incremental(configs, current, "broker")
        await self._broker_admin(name, sets, deletes, validate_only, replace=False)

    async def _broker_admin(self, name: str, sets: dict[str, str], deletes: list[str], validate_only: bool,
                            replace: bool) -> None:
        authz = self.h.broker.authz
        if authz.enabled:  # Kafka: a broker's configs need AlterConfigs on the Cluster
            authz.require_cluster(az.connection_caller(), Operation.ALTER_CONFIGS, "AlterConfigs")
        await self.h.admin("AlterBrokerConfigs", controller_pb2.AlterBrokerConfigsRequest(
            broker=name, set=sets, delete=deletes, validate_only=validate_only, replace=replace))

    async def _alter_each(self, req: Any, mod: Any, alter: Callable[[str, Any], Awaitable[None]],
                          alter_broker: Callable[[str, Any], Awaitable[None]]) -> list[Any]:
        """Both AlterConfigs APIs: alter(name, resource) per TOPIC resource, alter_broker(name, resource) per BROKER
        resource, each one's error its own; other resource types INVALID_REQUEST."""
        out = []
        for res in req.resources:
            rtype, name = int(res.resource_type), str(res.resource_name)
            code, message = NONE, None
            try:
                if rtype == RESOURCE_TOPIC:
                    await alter(name, res)
                elif rtype == RESOURCE_BROKER:
                    await alter_broker(name, res)
                else:
                    code, message = int(Code.INVALID_REQUEST), (
                        f"resource type {rtype} ({name!r}) cannot be altered here: only TOPIC and BROKER configs")
            except errors.GregorError as err:
                code, message = int(err.code), err.message
            out.append(codec.build(mod.AlterConfigsResourceResponse, error_code=code, error_message=message,
                                   resource_type=rtype, resource_name=name))
        return out

    async def incremental_alter_configs(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        async def alter(name: str, res: Any) -> None:
            await self._alter_topic(name, res.configs, bool(req.validate_only))

        async def alter_broker(name: str, res: Any) -> None:
            await self._alter_broker(name, res.configs, bool(req.validate_only))
        return codec.build(mod.IncrementalAlterConfigsResponse,
                           responses=await self._alter_each(req, mod, alter, alter_broker))

    # ---- AlterConfigs (the legacy, non-incremental one) -------------------------------------------------

    async def alter_configs(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """Kafka's AlterConfigs (API 33): a resource's configs are replaced whole -- the given ones set, every other
        override back to its default (a null value counts as not given). One controller AlterConfigs per topic
        (AlterBrokerConfigs per broker entity), so the replacement is atomic there; validate_only only checks."""
        async def replace(name: str, res: Any) -> None:
            given = {str(c.name): str(c.value) for c in res.configs if c.value is not None}
            await self.h.admin("AlterConfigs", controller_pb2.AlterConfigsRequest(
                topic=name, set=given, delete=[k for k in TOPIC_CONFIGS if k not in given],
                validate_only=bool(req.validate_only)))

        async def replace_broker(name: str, res: Any) -> None:
            given = {str(c.name): str(c.value) for c in res.configs if c.value is not None}
            await self._broker_admin(name, given, [], bool(req.validate_only), replace=True)
        return codec.build(mod.AlterConfigsResponse, responses=await self._alter_each(req, mod, replace, replace_broker))

    # ---- ElectLeaders ------------------------------------------------------------------------------

    async def elect_leaders(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        unclean = int(getattr(req, "election_type", 0)) == 1
        asked = None if req.topic_partitions is None else [
            (str(t.topic), int(p)) for t in req.topic_partitions for p in t.partitions]
        try:
            resp = await self.h.admin("ElectLeaders", controller_pb2.ElectLeadersRequest(
                partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in asked or []],
                unclean=unclean, election_type=controller_pb2.UNCLEAN if unclean else controller_pb2.PREFERRED))
        except errors.GregorError as err:
            return codec.build(mod.ElectLeadersResponse, error_code=int(err.code), replica_election_results=[])
        by_topic: dict[str, list[Any]] = {}
        for r in resp.results:
            code = int(r.error.code) if r.HasField("error") else NONE
            by_topic.setdefault(r.partition.topic, []).append(codec.build(
                mod.PartitionResult, partition_id=r.partition.partition, error_code=code,
                error_message=r.error.message if code else None))
        return codec.build(mod.ElectLeadersResponse, error_code=NONE, replica_election_results=[
            codec.build(mod.ReplicaElectionResult, topic=t, partition_result=ps) for t, ps in by_topic.items()])

    # ---- DeleteRecords -----------------------------------------------------------------------------

    async def delete_records(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """Kafka's DeleteRecords: the leaders' log start offsets move now, the answer waits for the low watermarks
        (every live replica's log start offset) up to the request's timeout (broker/delete_records.py)."""
        authz = self.h.broker.authz
        asked: list[tuple[str, int, int]] = []
        denied: dict[tuple[str, int], errors.GregorError] = {}
        for t in req.topics:
            for p in t.partitions:
                key = (str(t.name), int(p.partition_index))
                try:
                    if authz.enabled:  # Kafka: Delete on the topic
                        authz.require(az.connection_caller(), Operation.DELETE, ResourceType.TOPIC, key[0],
                                      "DeleteRecords", topic=key[0])
                    asked.append((*key, int(p.offset)))
                except errors.GregorError as err:
                    denied[key] = err
        outcomes = await self.h.broker.replica_manager.delete_records(asked, codec.to_ms(req.timeout))
        results: dict[tuple[str, int], tuple[int, int]] = {  # low watermark, error code
            key: (-1, int(err.code)) for key, err in denied.items()}
        for (topic, index, _), o in zip(asked, outcomes):
            results[(topic, index)] = ((-1, int(o.code)) if isinstance(o, errors.GregorError)
                                       else (o.low_watermark, o.code))
        return codec.build(mod.DeleteRecordsResponse, topics=[
            codec.build(mod.DeleteRecordsTopicResult, name=t.name, partitions=[
                codec.build(mod.DeleteRecordsPartitionResult, partition_index=p.partition_index,
                            low_watermark=results[(str(t.name), int(p.partition_index))][0],
                            error_code=results[(str(t.name), int(p.partition_index))][1])
                for p in t.partitions]) for t in req.topics])

    # ---- OffsetDelete ------------------------------------------------------------------------------

    async def offset_delete(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        asked = [(str(t.name), int(p.partition_index)) for t in req.topics for p in t.partitions]
        codes: dict[tuple[str, int], int] = {}
        try:
            resp = await self.h.group_call(str(req.group_id), "OffsetDelete", coordinator_pb2.OffsetDeleteRequest(
                group_id=str(req.group_id),
                partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in asked]))
        except errors.GregorError as err:
            return codec.build(mod.OffsetDeleteResponse, error_code=int(err.code), topics=[])
        for r in resp.results:
            codes[(r.partition.topic, r.partition.partition)] = int(r.error.code) if r.HasField("error") else NONE
        return codec.build(mod.OffsetDeleteResponse, error_code=NONE, topics=[
            codec.build(mod.OffsetDeleteResponseTopic, name=t.name, partitions=[
                codec.build(mod.OffsetDeleteResponsePartition, partition_index=p.partition_index,
                            error_code=codes.get((str(t.name), int(p.partition_index)), NONE))
                for p in t.partitions]) for t in req.topics])


async def _incremental(configs: Any, read_current: Callable[[], Awaitable[dict[str, str]]],
                       kind: str) -> tuple[dict[str, str], list[str]]:
    """IncrementalAlterConfigs' operations as (sets, deletes): SET and DELETE as they are, APPEND and SUBTRACT
    over the current comma-separated value (read once, only when asked)."""
    sets: dict[str, str] = {}
    deletes: list[str] = []
    current: dict[str, str] = {}
    if any(int(c.config_operation) in (OP_APPEND, OP_SUBTRACT) for c in configs):
        current = await read_current()
    for c in configs:
        op, name = int(c.config_operation), str(c.name)
        if op == OP_SET:
            if c.value is None:
                raise errors.error_for(Code.INVALID_CONFIG, f"SET {name} needs a value")
            sets[name] = str(c.value)
        elif op == OP_DELETE:
            deletes.append(name)
        elif op in (OP_APPEND, OP_SUBTRACT):
            if name not in current:
                raise errors.error_for(Code.INVALID_CONFIG, f"unknown {kind} config {name}")
            items = [v for v in sets.get(name, current[name]).split(",") if v]
            given = [v for v in str(c.value or "").split(",") if v]
            items = ([*items, *(v for v in given if v not in items)] if op == OP_APPEND
                     else [v for v in items if v not in given])
            sets[name] = ",".join(items)
        else:
            raise errors.error_for(Code.INVALID_REQUEST, f"config operation {op} is not SET, DELETE, APPEND or "
                                                         f"SUBTRACT")
    return sets, deletes
