"""The broker process: log manager, replica manager, gRPC server, data port and metrics, started and stopped together."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from gregor.broker.broker_metrics import open_file_descriptors, unwatch_broker, watch_broker
from gregor.broker.cluster_membership import ClusterMembership
from gregor.broker.log_dir_lock import LogDirLock
from gregor.broker.coordinator_lookup import CoordinatorLookup
from gregor.broker.data_port import DataPortServer
from gregor.broker.local_admin import LocalTopicStore
from gregor.broker.log_dir_events import LogDirEventNotifier
from gregor.broker.log_manager import LogManager
from gregor.broker.metadata_cache import MetadataCache
from gregor.broker.produce_api import ProduceStreamHandler
from gregor.broker.quota_manager import BrokerQuotas, unwatch_quotas, watch_quotas
from gregor.broker.replica_manager import ReplicaManager
from gregor.broker.dynamic_config import DynamicBrokerConfig
from gregor.broker.server import (BrokerControlServicer, BrokerServicer, ForwardingAdminServicer, LocalAdminServicer,
                                  add_broker_service)
from gregor.common import errors, uuid
from gregor.common.aio import wait_for
from gregor.common.authz import Authz, AuthorizerConfig, user_name
from gregor.common.config import BrokerConfig
from gregor.common.metrics import register_build_info, serve_metrics
from gregor.common.phase_clock import PhaseClock
from gregor.common.rpc import add_health_and_reflection, make_server
from gregor.common.tls import add_port
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2, controller_pb2_grpc

log = logging.getLogger(__name__)
AUTHORIZER_SYNC_WAIT_S = 10.0  # how long start() waits for the first read of the ACLs
DYNAMIC_CONFIG_SYNC_WAIT_S = 5.0  # how long registration waits for the first read of config/brokers/


class Broker:
    """One broker process. Concurrency: everything on one asyncio loop; disk I/O in native code.

    Standalone (no `etcd_endpoints`): leads every partition of its LocalTopicStore.
    Cluster mode: registers in etcd, takes LeaderAndIsr / StopReplica / UpdateMetadata
    from the active controller, answers Metadata from its MetadataCache and forwards
    AdminService calls to the controller.
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        # Kafka's .lock in every log dir, before anything reads or writes them: a second process on the same
        # dirs stops here (LogDirLockedError, an OSError: exit 1 naming the dir), and holding it proves the
        # previous process on them gone, which lets registration revoke that process's lease (log_dir_lock.py).
        self.log_dir_lock = LogDirLock(config.log_dir_list)
        self.log_manager = LogManager(config)
        self.replica_manager = ReplicaManager(config, self.log_manager)
        self.produce_streams: set[ProduceStreamHandler] = set()  # open ProduceStreams, closed first on stop
        self.dynamic_config = DynamicBrokerConfig(self)  # KIP-226: config/brokers/<id>, <default> (etcd)
        self.quotas = BrokerQuotas()  # client quotas (broker/quota_manager.py), configs from etcd
        rules = self.config.ssl_principal_mapping_rules
        self.quotas.principal_of = lambda conn: user_name(conn, rules)  # the TLS principal's user, or ANONYMOUS
        watch_quotas(self.quotas)
        watch_broker(self.replica_manager, self.log_manager.log_dirs, config.metrics_partition_level_enable)
        register_build_info("broker")
        self.cluster_mode = bool(config.etcd_endpoints)
        self.topic_store = LocalTopicStore(self.log_manager.log_dirs[0])
        self.metadata_cache = MetadataCache(config.cluster_id)
        self.membership: ClusterMembership | None = None
        self.coordinator_lookup: CoordinatorLookup | None = None  # FindCoordinator's etcd view (cluster mode)
        self._etcd: Any = None
        # Cluster mode: log dir event notifications to the controller (broker/log_dir_events.py).
        self.log_dir_events: LogDirEventNotifier | None = None
        self._authz_etcd: Any = None  # the ACL cache's own etcd client (the authorizer is up before we register)
        self.authz = Authz()  # off until start() reads authorizer.class.name
        self.grpc_port = config.port
        self.data_port: DataPortServer | None = None
        self.metrics_port = -1
        self.kafka: Any = None  # gregor.kafka.server.KafkaListener when `listeners` names one
        self.metrics_reporter: Any = None  # cluster mode with metrics.topic.enable=true
        self._server = make_server()
        self._stopped = asyncio.Event()

    def open_topic(self, name: str, entry: dict[str, Any]) -> None:
        """Open (or create) every partition log of a topic and lead it (standalone mode)."""
        for partition in range(entry["partitions"]):
            p = self.replica_manager.create_partition(name, partition, entry["configs"],
                                                      uuid.from_string(entry["topic_id"]))
            p.make_standalone_leader()

    def endpoint(self) -> common_pb2.BrokerEndpoint:
        return common_pb2.BrokerEndpoint(
            broker_id=self.config.broker_id, host=self.config.host, grpc_port=self.grpc_port,
            data_port=self.data_port.port if self.data_port else 0,
            broker_epoch=self.membership.broker_epoch if self.membership else -1, rack=self.config.broker_rack)

    async def check_control_request(self, controller_epoch: int, broker_epoch: int) -> None:
        """Fencing (seed 001): STALE_CONTROLLER_EPOCH for an older controller, STALE_BROKER_EPOCH for another incarnation."""
        if self.membership is None:
            raise errors.error_for(errors.Code.INVALID_REQUEST, "a standalone broker takes no control requests")
        current = await self.membership.wait_registered()
        self.replica_manager.control_fence.check(controller_epoch, broker_epoch, current)

    def metadata_response(self, topics: list[str]) -> broker_pb2.MetadataResponse:
        if self.cluster_mode:
            return self.metadata_cache.metadata_response(topics)
        names = topics or sorted(self.topic_store.topics)
        out = []
        for name in names:
            entry = self.topic_store.topics.get(name)
            if entry is None:
                out.append(broker_pb2.TopicMetadata(name=name, error=errors.Code.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            parts = []
            for i in range(entry["partitions"]):
                p = self.replica_manager.partitions.get((name, i))
                if p is None:
                    parts.append(broker_pb2.PartitionMetadata(partition=i, leader=-1,
                                                              error=errors.Code.LEADER_NOT_AVAILABLE))
                    continue
                parts.append(broker_pb2.PartitionMetadata(
                    partition=i, leader=p.leader_id, leader_epoch=p.leader_epoch, replicas=p.replicas,
                    isr=sorted(p.isr)))
            out.append(broker_pb2.TopicMetadata(name=name, partitions=parts, is_internal=name.startswith("__"),
                                                topic_id=self.topic_store.topic_id(name)))
        return broker_pb2.MetadataResponse(brokers=[self.endpoint()], cluster_id=self.config.cluster_id,
                                           controller_id=-1, topics=out)

    @property
    def etcd(self) -> Any:
        """The broker's etcd client in cluster mode (None standalone or before start)."""
        return self._etcd

    async def start(self) -> None:
        if not self.cluster_mode:
            for name, entry in sorted(self.topic_store.topics.items()):
                self.open_topic(name, entry)
            loaded = self.log_manager.loaded
            if loaded:  # Kafka's "Skipping recovery of N logs ... since clean shutdown file was found"
                log.info("loaded %d existing logs: recovery skipped for %d shut down cleanly, %d recovered "
                         "(no clean-shutdown marker)", sum(loaded.values()), loaded["skipped"], loaded["performed"])
        self.log_manager.start()
        await self._start_authorizer()
        add_broker_service(BrokerServicer(self), self._server)
        services = [broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].full_name, "gregor.rpc.v1.AdminService"]
        if self.cluster_mode:
            broker_pb2_grpc.add_BrokerControlServiceServicer_to_server(BrokerControlServicer(self), self._server)
            controller_pb2_grpc.add_AdminServiceServicer_to_server(ForwardingAdminServicer(self), self._server)
            services.append(broker_pb2.DESCRIPTOR.services_by_name["BrokerControlService"].full_name)
        else:
            controller_pb2_grpc.add_AdminServiceServicer_to_server(LocalAdminServicer(self), self._server)
        add_health_and_reflection(self._server, services)
        self.grpc_port = add_port(self._server, f"{self.config.host}:{self.config.port}", self.config.tls)
        if self.grpc_port == 0:
            raise OSError(f"cannot bind gRPC port {self.config.host}:{self.config.port}")
        await self._server.start()
        if self.config.data_port >= 0:  # with the authorizer on, each fetch is authorized (data_port.py)
            self.data_port = DataPortServer(self.replica_manager, self.config.host, self.config.data_port,
                                            threads=self.config.num_network_threads,
                                            send_timeout_ms=self.config.data_port_send_timeout_ms,
                                            quotas=self.quotas,
                                            ssl_context=self.config.tls.server_ssl_context()
                                            if self.config.tls.enabled else None, authz=self.authz)
            await self.data_port.start()
        if self.config.listeners:
            from gregor.kafka.server import start_listener

            self.kafka = await start_listener(self)
        if self.config.metrics_port >= 0:
            self.metrics_port = serve_metrics(self.config.host, self.config.metrics_port, tls=self.config.tls)
        if self.cluster_mode:
            await self._register()
        log.info("broker %d serving gRPC on %s:%d, data port %s, metrics %d", self.config.broker_id,
                 self.config.host, self.grpc_port, self.data_port.port if self.data_port else "off",
                 self.metrics_port)

    async def _start_authorizer(self) -> None:
        """authorizer.class.name set: follow the ACLs in etcd; serve once they are read (fail closed till then)."""
        config = AuthorizerConfig.from_properties({
            "authorizer.class.name": self.config.authorizer_class_name, "super.users": self.config.super_users,
            "allow.everyone.if.no.acl.found": str(self.config.allow_everyone_if_no_acl_found).lower(),
            "ssl.principal.mapping.rules": self.config.ssl_principal_mapping_rules})
        if not config.enabled:
            return
        if self.cluster_mode:
            from gregor.common.etcd import EtcdClient

            self._authz_etcd = EtcdClient(self.config.etcd_endpoints, cluster=self.config.cluster_id)
        self.authz = Authz.create(config, self._authz_etcd)
        self.authz.start()
        if not await self.authz.wait_synced(AUTHORIZER_SYNC_WAIT_S):
            log.warning("broker %d: the ACLs are not read from etcd yet; only super users are allowed until then",
                        self.config.broker_id)

    async def _register(self) -> None:
        """Register in etcd once serving, so the controller's first requests find us listening."""
        from gregor.common.etcd import EtcdClient

        self._etcd = EtcdClient(self.config.etcd_endpoints, cluster=self.config.cluster_id,
                                security=self.config.tls)
        info = {"host": self.config.host, "grpc_port": self.grpc_port,
                "data_port": self.data_port.port if self.data_port else 0, "rack": self.config.broker_rack or None,
                "endpoints": [f"GRPC://{self.config.host}:{self.grpc_port}"],
                # The controller refuses a creation that would take us past it (issue 24).
                "max_open_files": open_file_descriptors()[1]}
        if self.kafka is not None:  # the Kafka listener: other brokers' Metadata answers read it from here
            info["kafka"] = self.kafka.advertised
            info["endpoints"] = [f"GRPC://{self.config.host}:{self.grpc_port}", f"{self.kafka.security_protocol}://{self.kafka.advertised}"]
        bid = self.config.broker_id
        self.membership = ClusterMembership(
            self._etcd, bid, info, self.config.broker_session_timeout_ms,
            previous_lease=self.log_dir_lock.previous_registration_lease(bid),
            on_lease=lambda lease_id: self.log_dir_lock.record_registration_lease(bid, lease_id))
        # Before registering: the controller's first LeaderAndIsr may arrive as soon as we are in etcd.
        self._start_replication()
        self.coordinator_lookup = CoordinatorLookup(self._etcd)
        self.coordinator_lookup.start()
        self.quotas.start(self._etcd)
        self.dynamic_config.start(self._etcd)
        try:  # the dynamic topic defaults before the first LeaderAndIsr opens logs (one etcd read)
            await wait_for(self.dynamic_config.synced.wait(), DYNAMIC_CONFIG_SYNC_WAIT_S)
        except asyncio.TimeoutError:
            log.warning("broker %d: dynamic broker configs not read from etcd yet; applied once they are",
                        self.config.broker_id)
        await self.membership.start()
        if self.config.metrics_topic_enable:  # metrics.topic.enable: our samples into __gregor_metrics
            from gregor.common.metrics_reporter import MetricsReporter

            self.metrics_reporter = MetricsReporter(
                f"{self.config.host}:{self.grpc_port}", "broker", self.config.broker_id,
                self.config.metrics_topic_interval_ms, self.config.metrics_topic_replication_factor)
            self.metrics_reporter.start()

    def _start_replication(self) -> None:
        """Cluster mode: replica fetchers, leader-side ISR maintenance and HW checkpoints (seeds 000, 002, 004)."""
        from gregor.broker.isr_manager import IsrManager
        from gregor.broker.replica_fetcher import ReplicaFetcherManager

        rm = self.replica_manager
        membership = self.membership
        assert membership is not None
        fetchers = ReplicaFetcherManager(
            rm, rm.endpoint_of, lambda: membership.broker_epoch,
            rm.data_endpoint_of if self.config.replica_fetch_transport == "data" else None)
        isr = IsrManager(rm, self._etcd, self.config.broker_id, self.config.replica_lag_time_max_ms)
        rm.metadata_cache = self.metadata_cache  # live broker epochs for follower fetches (KIP-380/903)
        rm.attach_replication(fetchers, isr)
        # A dir going offline or coming back: the controller moves leadership and ISR membership of its replicas.
        self.log_dir_events = LogDirEventNotifier(self._etcd, self.config.broker_id)
        self.log_manager.health.on_change = self.log_dir_events.notify

    def ready_info(self) -> dict[str, Any]:
        return {
            "broker_id": self.config.broker_id,
            "grpc": f"{self.config.host}:{self.grpc_port}",
            "data": f"{self.config.host}:{self.data_port.port}" if self.data_port else "",
            "metrics": f"{self.config.tls.metrics_scheme}://{self.config.host}:{self.metrics_port}/metrics"
            if self.metrics_port >= 0 else "",
            "pid": os.getpid(),
            "kafka": self.kafka.advertised if self.kafka is not None else "",
            "broker_epoch": self.membership.broker_epoch if self.membership else -1,
        }

    def write_ready_file(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.ready_info(), f)
        os.replace(tmp, path)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Shut down in Kafka's order (KafkaServer.shutdown): controlled shutdown, fetchers, deregistration,
        the request handlers, then the logs. Each phase logs how long it took as it ends, and the last line
        sums them up, so a slow exit says where its time went (issue 24)."""
        bid = self.config.broker_id
        log.info("[Broker id=%d] shutting down", bid)
        phases = PhaseClock(log, f"[Broker id={bid}] {{phase}} shut down in {{seconds:.3f}} s")
        if self.metrics_reporter is not None:
            await self.metrics_reporter.stop()
            phases.lap("metrics reporter")
        if self.membership is not None:
            if self.config.controlled_shutdown_enable and self.membership.broker_epoch >= 0:
                # Still serving: the controller moves our leaderships to other ISR members first.
                await self.membership.controlled_shutdown(self.config.controlled_shutdown_max_retries,
                                                          self.config.controlled_shutdown_retry_backoff_ms)
                phases.lap("controlled shutdown")
        # Stop fetching before deregistering: a follower still fetching could be taken back into an ISR
        # after the controller removed it, and acks=all would wait for it until replica.lag.time.max.ms.
        await self.replica_manager.stop_replication()
        phases.lap("replication (fetchers, ISR tasks, HW checkpoint)")
        if self.membership is not None:
            await self.membership.close()  # deregister: the controller runs onBrokerFailure for what is left
            phases.lap("registration (lease revoked)")
        if self.coordinator_lookup is not None:
            await self.coordinator_lookup.stop()
        await self.quotas.stop()
        await self.dynamic_config.stop()
        if self.log_dir_events is not None:
            self.log_manager.health.on_change = lambda _dir, _online: None
            await self.log_dir_events.stop()
        unwatch_quotas(self.quotas)
        if self._etcd is not None:
            await self._etcd.close()
        await self.authz.stop()
        if self._authz_etcd is not None:
            await self._authz_etcd.close()
        phases.lap("etcd watches")
        self.replica_manager.shutdown()  # requests waiting for acks are answered NOT_LEADER_OR_FOLLOWER
        phases.lap("purgatories")
        for stream in list(self.produce_streams):
            stream.close()
        unwatch_broker(self.replica_manager)
        if self.data_port is not None:
            await self.data_port.stop()
        if self.kafka is not None:
            await self.kafka.stop()
        phases.lap("data port and Kafka listener")
        await self._server.stop(grace_s)
        phases.lap("gRPC server")
        await self.replica_manager.close_control()
        phases.lap("control requests")
        self.log_manager.close()  # producer snapshots and log closes, on num.recovery.threads.per.data.dir threads
        phases.lap("log manager (producer snapshots, logs)")
        self.log_dir_lock.release()
        log.info("[Broker id=%d] shut down completed in %s", bid, phases)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
