"""`python -m gregor.coordinator`: parse flags, run a GroupCoordinator with its gRPC server and metrics, stop on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys

from gregor.common.errors import GregorError, InvalidConfigError  # type: ignore[attr-defined]
from gregor.common.metrics_reporter import METRICS_TOPIC_KEYS, MetricsTopicConfig
from gregor.common.authz import SETTLE_KEYS as AUTHORIZER_KEYS, config_from_namespace
from gregor.common.properties import load_properties, settle
from gregor.common.tls import split_properties
from gregor.coordinator.coordinator import CoordinatorConfig
from gregor.coordinator.group_manager import GroupConfig
from gregor.coordinator.txn_coordinator import TxnConfig

log = logging.getLogger("gregor.coordinator")


def parse_args(argv: list[str]) -> argparse.Namespace:
    d, g, t = CoordinatorConfig(), GroupConfig(), TxnConfig()
    ap = argparse.ArgumentParser(prog="python -m gregor.coordinator", description="Run a Gregor group coordinator.")
    ap.add_argument("--coordinator-id", type=int, required=True, help="unique id of this coordinator instance")
    ap.add_argument("--config", help="server.properties-style file of key=value lines: etcd.endpoints, cluster.id "
                                     "and the --override keys")
    ap.add_argument("--etcd", help="etcd.endpoints, e.g. http://127.0.0.1:2379[,http://...] (required here or in --config)")
    ap.add_argument("--cluster", help="cluster.id: keys live under /gregor/<cluster>/ (default gregor)")
    ap.add_argument("--bootstrap", default="", help="brokers host:port[,...] (default: discovered in etcd)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    ap.add_argument("--port", type=int, default=0, help="gRPC port (0 picks a free one)")
    ap.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 picks, -1 disables)")
    ap.add_argument("--ready-file", help="write endpoints as JSON here once serving")
    ap.add_argument("--lease-ttl-ms", type=int, default=d.lease_ttl_ms,
                    help="etcd lease TTL: a dead coordinator's groups move to the survivors within it")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a --config key over the file; Kafka group/offsets settings: offsets.topic.num.partitions, "
                         "offsets.topic.replication.factor, offsets.topic.segment.bytes, offsets.retention.minutes, "
                         "offsets.retention.check.interval.ms, offsets.commit.timeout.ms, "
                         "offsets.retention.ms (test-only, overrides offsets.retention.minutes), "
                         "group.min.session.timeout.ms, "
                         "group.max.session.timeout.ms, group.initial.rebalance.delay.ms, group.max.size; "
                         "transactions: transaction.state.log.num.partitions, "
                         "transaction.state.log.replication.factor, transaction.state.log.min.isr, "
                         "transaction.state.log.segment.bytes, transaction.max.timeout.ms, "
                         "transaction.abort.timed.out.transaction.cleanup.interval.ms; "
                         "metrics.topic.enable, metrics.topic.interval.ms, metrics.topic.replication.factor")
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(argv)
    keys = {"offsets.topic.num.partitions": d.offsets_topic_num_partitions,
            "offsets.topic.replication.factor": d.offsets_topic_replication_factor,
            "offsets.topic.segment.bytes": d.offsets_topic_segment_bytes,
            "offsets.retention.minutes": d.offsets_retention_ms // 60000,
            "offsets.retention.check.interval.ms": d.offsets_retention_check_interval_ms,
            "offsets.commit.timeout.ms": d.offsets_commit_timeout_ms,
            # Not a Kafka key: a finer retention for tests (Kafka's smallest is one minute).
            "offsets.retention.ms": 0,
            "group.min.session.timeout.ms": g.min_session_timeout_ms,
            "group.max.session.timeout.ms": g.max_session_timeout_ms,
            "group.initial.rebalance.delay.ms": g.initial_rebalance_delay_ms,
            "group.max.size": g.max_size,
            "transaction.state.log.num.partitions": t.num_partitions,
            "transaction.state.log.replication.factor": t.replication_factor,
            "transaction.state.log.min.isr": t.min_isr,
            "transaction.state.log.segment.bytes": t.segment_bytes,
            "transaction.max.timeout.ms": t.max_timeout_ms,
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": t.abort_timed_out_interval_ms}
    try:  # the file, then each --override on top; --etcd / --cluster over both
        a.tls, props = split_properties(load_properties(a.config, a.override))
        settle(a, props, {"etcd.endpoints": ("etcd", str, None), "cluster.id": ("cluster", str, "gregor"),
                          **{k: (k, int, None) for k in keys}, **METRICS_TOPIC_KEYS, **AUTHORIZER_KEYS}, "coordinator")
        a.metrics_topic = MetricsTopicConfig.from_namespace(a)
        a.authorizer = config_from_namespace(a)
    except InvalidConfigError as exc:
        ap.error(str(exc))
    if not a.etcd:
        ap.error("etcd.endpoints is required: --etcd or etcd.endpoints in --config")
    for k in keys:
        value = getattr(a, k)
        if value is not None:
            if value < (0 if k == "group.initial.rebalance.delay.ms" else 1):
                ap.error(f"{k}={value}: out of range")
            keys[k] = value
    if a.lease_ttl_ms <= 0:
        ap.error("--lease-ttl-ms must be positive")
    a.config = CoordinatorConfig(
        offsets_topic_num_partitions=keys["offsets.topic.num.partitions"],
        offsets_topic_replication_factor=keys["offsets.topic.replication.factor"],
        offsets_topic_segment_bytes=keys["offsets.topic.segment.bytes"],
        offsets_retention_ms=keys["offsets.retention.ms"] or keys["offsets.retention.minutes"] * 60000,
        offsets_retention_check_interval_ms=keys["offsets.retention.check.interval.ms"],
        offsets_commit_timeout_ms=keys["offsets.commit.timeout.ms"],
        lease_ttl_ms=a.lease_ttl_ms,
        group=GroupConfig(min_session_timeout_ms=keys["group.min.session.timeout.ms"],
                          max_session_timeout_ms=keys["group.max.session.timeout.ms"],
                          initial_rebalance_delay_ms=keys["group.initial.rebalance.delay.ms"],
                          max_size=keys["group.max.size"]))
    a.txn_config = TxnConfig(
        num_partitions=keys["transaction.state.log.num.partitions"],
        replication_factor=keys["transaction.state.log.replication.factor"],
        min_isr=keys["transaction.state.log.min.isr"], segment_bytes=keys["transaction.state.log.segment.bytes"],
        max_timeout_ms=keys["transaction.max.timeout.ms"],
        abort_timed_out_interval_ms=keys["transaction.abort.timed.out.transaction.cleanup.interval.ms"])
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return a


def write_ready_file(path: str, info: dict[str, object]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


async def run(a: argparse.Namespace) -> int:
    from gregor.common.metrics_reporter import MetricsReporter
    from gregor.broker.quota_manager import unwatch_quotas, watch_quotas
    from gregor.common.authz import Authz, user_name
    from gregor.common.etcd import EtcdClient
    from gregor.common.metrics import register_build_info, serve_metrics
    from gregor.common.rpc import add_health_and_reflection, make_server, wait_for_shutdown
    from gregor.coordinator.coordinator import GroupCoordinator
    from gregor.coordinator.quotas import CoordinatorQuotas
    from gregor.coordinator.server import GroupCoordinatorServicer
    from gregor.coordinator.txn_coordinator import TransactionCoordinator
    from gregor.coordinator.txn_server import TransactionCoordinatorServicer
    from gregor.common.tls import add_port, configure
    from gregor.rpc.v1 import coordinator_pb2_grpc, transaction_pb2_grpc

    configure(a.tls)  # etcd and the channels to the brokers
    etcd = EtcdClient(a.etcd, cluster=a.cluster)
    server = make_server()
    port = add_port(server, f"{a.host}:{a.port}")
    if port == 0:
        raise OSError(f"cannot bind gRPC port {a.host}:{a.port}")
    coordinator = GroupCoordinator(a.coordinator_id, etcd, a.host, port, a.config, bootstrap=a.bootstrap)
    authz = Authz.create(a.authorizer, etcd)
    authz.start()
    if not await authz.wait_synced(10.0):
        log.warning("the ACLs are not read from etcd yet; only super users are allowed until then")
    # Client quotas (request_percentage) on every call, from the brokers' etcd configs (coordinator/quotas.py).
    quotas = CoordinatorQuotas(authz)
    rules = a.authorizer.principal_mapping_rules
    quotas.principal_of = lambda conn: user_name(conn, rules)  # the TLS principal's user, or ANONYMOUS
    watch_quotas(quotas)
    quotas.start(etcd)
    coordinator_pb2_grpc.add_GroupCoordinatorServiceServicer_to_server(
        GroupCoordinatorServicer(coordinator, authz, quotas), server)
    # The transaction coordinator lives beside the group coordinator (txn_coordinator.py says why).
    transactions = TransactionCoordinator(coordinator, a.txn_config)
    transaction_pb2_grpc.add_TransactionCoordinatorServiceServicer_to_server(
        TransactionCoordinatorServicer(transactions, authz, quotas), server)
    add_health_and_reflection(server, ["gregor.rpc.v1.GroupCoordinatorService",
                                       "gregor.rpc.v1.TransactionCoordinatorService"])
    await server.start()
    register_build_info("coordinator")
    metrics_port = serve_metrics(a.host, a.metrics_port, tls=a.tls) if a.metrics_port >= 0 else -1
    await coordinator.start()
    await transactions.start()
    reporter = MetricsReporter.started(a.metrics_topic, coordinator.bootstrap, "coordinator", a.coordinator_id)
    if a.ready_file:
        write_ready_file(a.ready_file, {
            "coordinator_id": a.coordinator_id, "grpc": f"{a.host}:{port}",
            "metrics": f"{a.tls.metrics_scheme}://{a.host}:{metrics_port}/metrics" if metrics_port >= 0 else "", "pid": os.getpid()})
    log.info("coordinator %d serving gRPC on %s:%d, metrics %d, etcd %s, %s has %d partitions", a.coordinator_id,
             a.host, port, metrics_port, a.etcd, "__consumer_offsets", coordinator.num_partitions)
    code = await wait_for_shutdown("coordinator", coordinator.stopped)
    if reporter is not None:
        await reporter.stop()
    await transactions.stop()
    await coordinator.stop()
    await server.stop(1.0)
    await authz.stop()
    await quotas.stop()
    unwatch_quotas(quotas)
    await etcd.close()
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(run(args))
    except OSError as exc:
        print(f"gregor.coordinator: {exc}", file=sys.stderr)
        return 1
    except GregorError as exc:  # e.g. __consumer_offsets could not be created as required
        print(f"gregor.coordinator: {exc.name}: {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
