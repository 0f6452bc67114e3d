"""AdminClient: topics, partitions, configs and cluster description (Kafka's Admin API over AdminService).

Every method raises a GregorError subclass on failure, never a raw RpcError.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, TypeVar

import grpc

from gregor.common.tls import from_client_config
from gregor.client.config import admin_config, client_id_for, parse_bootstrap
from gregor.client.loop_thread import LoopThread
from gregor.client.metadata import BrokerInfo, ClusterMetadata, TopicInfo, call_error
from gregor.common import errors
from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc

T = TypeVar("T")


@dataclass
class NewTopic:
    name: str
    num_partitions: int = -1  # -1: the broker's num.partitions
    replication_factor: int = -1  # -1: default.replication.factor
    configs: dict[str, str] = field(default_factory=dict)


@dataclass
class ConfigEntry:
    """One config of a topic: source is Kafka's ConfigSource id (1 DYNAMIC_TOPIC_CONFIG, the topic's override;
    else where the answering broker took the value: 2 DYNAMIC_BROKER_CONFIG, 3 DYNAMIC_DEFAULT_BROKER_CONFIG,
    4 STATIC_BROKER_CONFIG, 5 DEFAULT_CONFIG)."""
    name: str
    value: str
    is_default: bool
    documentation: str = ""
    source: int = 5


@dataclass
class BrokerConfigEntry:
    """One config of a broker: Kafka's ConfigSource id in source (2 DYNAMIC_BROKER_CONFIG, 3
    DYNAMIC_DEFAULT_BROKER_CONFIG, 4 STATIC_BROKER_CONFIG, 5 DEFAULT_CONFIG) and synonyms as (name, value, source)."""
    name: str
    value: Optional[str]
    source: int
    read_only: bool
    sensitive: bool
    synonyms: list[tuple[str, Optional[str], int]] = field(default_factory=list)


@dataclass
class ClusterDescription:
    cluster_id: str
    controller_id: int
    controller_epoch: int
    brokers: list[BrokerInfo]


def _check(detail: Any, topic: str = "") -> None:
    """Raise the GregorError an ErrorDetail field carries (code NONE means success)."""
    if detail is not None and detail.code != 0:
        err = errors.from_detail(detail)
        if not err.topic:
            err.topic = topic
        raise err


class AdminClient:
    """Asyncio admin client (event-loop owned; stateless apart from the metadata cache)."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = cfg = admin_config(config, **kwargs)
        self.metadata = ClusterMetadata(parse_bootstrap(cfg["bootstrap.servers"]),
                                        request_timeout_ms=cfg["request.timeout.ms"], security=from_client_config(cfg),
                                        retry_backoff_ms=cfg["retry.backoff.ms"],
                                        client_id=client_id_for(cfg, "adminclient"))
        self.timeout_s = cfg["request.timeout.ms"] / 1000

    async def __aenter__(self) -> "AdminClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.metadata.close()

    async def _call(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run fn on the AdminService of one broker, moving on to the next known broker (then the
        bootstrap servers) while the one asked cannot be reached: a broker that just died is still in
        the metadata until the controller notices, and any live broker forwards to the controller."""
        known = [b.address for b in self.metadata.brokers.values()]
        random.shuffle(known)
        addresses = list(dict.fromkeys(known + self.metadata.bootstrap))
        for i, address in enumerate(addresses):
            stub = controller_pb2_grpc.AdminServiceStub(self.metadata.channel(address))
            try:
                return await fn(stub)
            except grpc.RpcError as exc:
                err = call_error(exc)
                # UNAVAILABLE with no typed detail: the request never reached a server.
                unreachable = exc.code() == grpc.StatusCode.UNAVAILABLE and err.code == errors.Code.NETWORK_EXCEPTION
                if not unreachable or i == len(addresses) - 1:
                    raise err from None
            except asyncio.TimeoutError as exc:
                raise call_error(exc) from None
        raise AssertionError("unreachable: the address list is never empty")

    # ------------------------------------------------------------ topics
    async def create_topics(self, topics: Iterable[NewTopic], validate_only: bool = False) -> dict[
            str, Optional[errors.GregorError]]:
        """Create topics; per topic None on success or the error it got."""
        req = controller_pb2.CreateTopicsRequest(validate_only=validate_only, topics=[
            controller_pb2.CreatableTopic(name=t.name, num_partitions=t.num_partitions,
                                          replication_factor=t.replication_factor,
                                          configs={k: str(v) for k, v in t.configs.items()})
            for t in topics])
        resp = await self._call(lambda s: s.CreateTopics(req, timeout=self.timeout_s))
        return {r.name: (errors.from_detail(r.error) if r.error.code else None) for r in resp.results}

    async def create_topic(self, name: str, num_partitions: int = -1, replication_factor: int = -1,
                           configs: Mapping[str, str] | None = None, validate_only: bool = False) -> None:
        """Create one topic or raise its error (e.g. TopicAlreadyExistsError)."""
        result = await self.create_topics([NewTopic(name, num_partitions, replication_factor, dict(configs or {}))],
                                          validate_only)
        err = result.get(name)
        if err is not None:
            raise err

    async def delete_topics(self, names: Iterable[str]) -> dict[str, Optional[errors.GregorError]]:
        req = controller_pb2.DeleteTopicsRequest(topics=list(names))
        resp = await self._call(lambda s: s.DeleteTopics(req, timeout=self.timeout_s))
        return {r.name: (errors.from_detail(r.error) if r.error.code else None) for r in resp.results}

    async def delete_topic(self, name: str) -> None:
        err = (await self.delete_topics([name])).get(name)
        if err is not None:
            raise err

    async def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicInfo]:
        """Partitions, leaders, replicas and ISR per topic (all topics when names is None).

        A named topic that does not exist raises UnknownTopicOrPartitionError.
        """
        wanted = list(names or [])
        self.metadata.topics.clear()
        await self.metadata.refresh(wanted or None)
        if not wanted:
            return dict(sorted(self.metadata.topics.items()))
        out: dict[str, TopicInfo] = {}
        for name in wanted:
            info = self.metadata.topics.get(name)
            if info is None or info.error == errors.Code.UNKNOWN_TOPIC_OR_PARTITION:
                raise errors.UnknownTopicOrPartitionError(  # type: ignore[attr-defined]
                    f"topic {name!r} does not exist")
            if info.error:
                raise errors.error_for(info.error, f"topic {name!r}")
            out[name] = info
        return out

    async def list_topics(self, include_internal: bool = False) -> list[str]:
        topics = await self.describe_topics()
        return sorted(n for n, t in topics.items() if include_internal or not t.is_internal)

    async def create_partitions(self, topic: str, new_total: int, validate_only: bool = False) -> None:
        req = controller_pb2.CreatePartitionsRequest(topic=topic, count=new_total, validate_only=validate_only)
        resp = await self._call(lambda s: s.CreatePartitions(req, timeout=self.timeout_s))
        _check(resp.result.error, topic)

    # ------------------------------------------------------------ leadership
    async def elect_leaders(self, request: controller_pb2.ElectLeadersRequest
                            ) -> controller_pb2.ElectLeadersResponse:
        """Kafka's Admin.electLeaders: preferred or unclean elections; the per-partition results as answered."""
        return await self._call(lambda s: s.ElectLeaders(request, timeout=self.timeout_s))

    # ------------------------------------------------------------ configs
    async def describe_configs(self, topics: Iterable[str] | None = None) -> dict[str, list[ConfigEntry]]:
        req = controller_pb2.DescribeConfigsRequest(topics=list(topics or []))
        resp = await self._call(lambda s: s.DescribeConfigs(req, timeout=self.timeout_s))
        out: dict[str, list[ConfigEntry]] = {}
        for r in resp.results:
            _check(r.error, r.topic)
            out[r.topic] = [ConfigEntry(e.name, e.value, e.is_default, e.documentation, e.source) for e in r.entries]
        return out

    async def alter_configs(self, topic: str, set_: Mapping[str, str] | None = None,
                            delete: Iterable[str] = (), validate_only: bool = False) -> list[ConfigEntry]:
        """Set and/or reset topic configs (incremental); returns the topic's configs afterwards."""
        req = controller_pb2.AlterConfigsRequest(topic=topic, set={k: str(v) for k, v in (set_ or {}).items()},
                                                 delete=list(delete), validate_only=validate_only)
        resp = await self._call(lambda s: s.AlterConfigs(req, timeout=self.timeout_s))
        _check(resp.result.error, topic)
        return [ConfigEntry(e.name, e.value, e.is_default, e.documentation, e.source) for e in resp.result.entries]

    # ------------------------------------------------------------ dynamic broker configs (KIP-226)
    async def describe_broker_configs(self, broker: Optional[int] = None) -> list[BrokerConfigEntry]:
        """Kafka's describeConfigs of a BROKER resource: broker None is the cluster-wide default (its dynamic
        configs, answered by any broker), else every config of that broker with its source and synonyms,
        answered by that broker itself (as Kafka's AdminClient routes it)."""
        req = controller_pb2.DescribeBrokerConfigsRequest(broker="" if broker is None else str(broker))
        if broker is None:
            resp = await self._call(lambda s: s.DescribeBrokerConfigs(req, timeout=self.timeout_s))
        else:
            await self.metadata.refresh(None)
            info = self.metadata.brokers.get(broker)
            if info is None:
                raise errors.error_for(errors.Code.INVALID_REQUEST, f"broker {broker} is not registered")
            stub = controller_pb2_grpc.AdminServiceStub(self.metadata.channel(info.address))
            try:
                resp = await stub.DescribeBrokerConfigs(req, timeout=self.timeout_s)
            except (grpc.RpcError, asyncio.TimeoutError) as exc:
                raise call_error(exc) from None
        return [BrokerConfigEntry(e.name, e.value if e.HasField("value") else None, e.source, e.read_only,
                                  e.sensitive, [(s.name, s.value if s.HasField("value") else None, s.source)
                                                for s in e.synonyms])
                for e in resp.entries]

    async def alter_broker_configs(self, broker: Optional[int], set_: Mapping[str, str] | None = None,
                                   delete: Iterable[str] = (), validate_only: bool = False) -> dict[str, str]:
        """Set and/or remove dynamic configs of a broker (None: the cluster-wide default); returns the entity's
        dynamic configs afterwards. INVALID_REQUEST for a read-only key, INVALID_CONFIG for an unknown key or a
        bad value (nothing is written then)."""
        req = controller_pb2.AlterBrokerConfigsRequest(
            broker="" if broker is None else str(broker), set={k: str(v) for k, v in (set_ or {}).items()},
            delete=list(delete), validate_only=validate_only)
        resp = await self._call(lambda s: s.AlterBrokerConfigs(req, timeout=self.timeout_s))
        return dict(resp.configs)

    # ------------------------------------------------------------ client quotas (KIP-546)
    async def describe_client_quotas(self, user: Optional[str] = None, client_id: Optional[str] = None
                                     ) -> list[tuple[Optional[str], Optional[str], dict[str, str]]]:
        """(user, client id, configs) of every quota entity, or of the one named (None: not part of it;
        "<default>": the default entity)."""
        req = controller_pb2.DescribeClientQuotasRequest()
        if user is not None or client_id is not None:
            req.entity.CopyFrom(_quota_entity(user, client_id))
        resp = await self._call(lambda s: s.DescribeClientQuotas(req, timeout=self.timeout_s))
        return [(e.entity.user if e.entity.HasField("user") else None,
                 e.entity.client_id if e.entity.HasField("client_id") else None, dict(e.configs))
                for e in resp.entries]

    async def alter_client_quotas(self, user: Optional[str], client_id: Optional[str],
                                  set_: Mapping[str, str] | None = None, delete: Iterable[str] = (),
                                  validate_only: bool = False) -> dict[str, str]:
        """Set and/or remove an entity's quota configs; returns its configs afterwards."""
        req = controller_pb2.AlterClientQuotasRequest(
            entity=_quota_entity(user, client_id), set={k: str(v) for k, v in (set_ or {}).items()},
            delete=list(delete), validate_only=validate_only)
        resp = await self._call(lambda s: s.AlterClientQuotas(req, timeout=self.timeout_s))
        return dict(resp.result.configs)

    async def describe_cluster(self) -> ClusterDescription:
        resp = await self._call(lambda s: s.DescribeCluster(controller_pb2.DescribeClusterRequest(),
                                                            timeout=self.timeout_s))
        return ClusterDescription(resp.cluster_id, resp.controller_id, resp.controller_epoch,
                                  [BrokerInfo(b.broker_id, b.host, b.grpc_port, b.data_port, b.rack)
                                   for b in resp.brokers])

    # ------------------------------------------------------------ ACLs (Kafka's Admin createAcls/describeAcls/deleteAcls)
    async def create_acls(self, acls: Iterable[Any]) -> None:
        """Store acl.AclBinding values (idempotent)."""
        from gregor.common.authz import binding_to_pb

        req = controller_pb2.CreateAclsRequest(acls=[binding_to_pb(a) for a in acls])
        await self._call(lambda s: s.CreateAcls(req, timeout=self.timeout_s))

    async def describe_acls(self, acl_filter: Any) -> list[Any]:
        """The acl.AclBinding values an authz.AclFilter matches."""
        from gregor.common.authz import binding_from_pb, filter_to_pb

        resp = await self._call(lambda s: s.DescribeAcls(filter_to_pb(acl_filter), timeout=self.timeout_s))
        return [binding_from_pb(a) for a in resp.acls]

    async def delete_acls(self, filters: Iterable[Any]) -> list[Any]:
        """Delete what any authz.AclFilter matches; the acl.AclBinding values deleted."""
        from gregor.common.authz import binding_from_pb, filter_to_pb

        req = controller_pb2.DeleteAclsRequest(filters=[filter_to_pb(f) for f in filters])
        resp = await self._call(lambda s: s.DeleteAcls(req, timeout=self.timeout_s))
        return [binding_from_pb(a) for a in resp.deleted]


def _quota_entity(user: Optional[str], client_id: Optional[str]) -> controller_pb2.QuotaEntity:
    entity = controller_pb2.QuotaEntity()
    if user is not None:
        entity.user = user
    if client_id is not None:
        entity.client_id = client_id
    return entity


class SyncAdminClient:
    """Blocking facade over AdminClient: every method of AdminClient, run on a private loop thread."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._loop = LoopThread("gregor-admin")

        async def make() -> AdminClient:
            return AdminClient(config, **kwargs)

        try:
            self._admin = self._loop.run(make())
        except BaseException:
            self._loop.stop()
            raise

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._admin, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(method(*args, **kwargs))

        return call

    def close(self) -> None:
        try:
            self._loop.run(self._admin.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> "SyncAdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
