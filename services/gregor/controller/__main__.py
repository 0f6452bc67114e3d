"""`python -m gregor.controller`: parse flags, run a Controller with its gRPC server and metrics, stop cleanly on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from gregor.controller.controller import (AUTO_LEADER_REBALANCE_ENABLE_DEFAULT, CONTROLLER_FAST_FAILOVER_ENABLE_DEFAULT,
                                         CONTROLLER_QUORUM_FETCH_TIMEOUT_MS_DEFAULT,
                                         LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS_DEFAULT,
                                         LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT, NEW_PARTITIONS_PER_EVENT_DEFAULT,
                                         LeaderBalanceConfig)
from gregor.common.metrics_reporter import METRICS_TOPIC_KEYS, MetricsTopicConfig
from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]
from gregor.common.authz import SETTLE_KEYS as AUTHORIZER_KEYS, AuthorizerConfig, config_from_namespace
from gregor.common.properties import load_properties, parse_bool, settle
from gregor.common.tls import TlsConfig, split_properties

log = logging.getLogger("gregor.controller")


@dataclass(frozen=True)
class ControllerArgs:
    controller_id: int
    etcd: str
    cluster: str
    host: str
    port: int
    metrics_port: int
    ready_file: str | None
    lease_ttl_ms: int
    delete_topic_enable: bool = True
    leader_balance: LeaderBalanceConfig = LeaderBalanceConfig()
    metrics_topic: MetricsTopicConfig = MetricsTopicConfig()
    tls: TlsConfig = TlsConfig()  # security.protocol / ssl.*: its gRPC port, etcd and the channels to brokers
    authorizer: AuthorizerConfig = AuthorizerConfig()
    new_partitions_per_event: int = NEW_PARTITIONS_PER_EVENT_DEFAULT
    fast_failover_enable: bool = CONTROLLER_FAST_FAILOVER_ENABLE_DEFAULT


# Properties-file keys (Kafka's names where Kafka has one): key -> (argparse dest, parser, default).
CONTROLLER_KEYS: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "etcd.endpoints": ("etcd", str, None),
    "cluster.id": ("cluster", str, "gregor"),
    # KRaft's name for how long a silent active controller keeps the role; here the TTL of the etcd lease
    # the `controller` key is bound to (--lease-ttl-ms is its flag). Not broker.session.timeout.ms.
    "controller.quorum.fetch.timeout.ms": ("lease_ttl_ms", int, CONTROLLER_QUORUM_FETCH_TIMEOUT_MS_DEFAULT),
    # Gregor's own: a standby revokes that lease at once when the active's process is provably gone (its
    # endpoint refuses connects after the standby's connection to it broke); false: the lease alone.
    "controller.fast.failover.enable": ("fast_failover_enable", parse_bool, CONTROLLER_FAST_FAILOVER_ENABLE_DEFAULT),
    "delete.topic.enable": ("delete_topic_enable", parse_bool, True),
    "auto.leader.rebalance.enable": ("auto_leader_rebalance_enable", parse_bool, AUTO_LEADER_REBALANCE_ENABLE_DEFAULT),
    "leader.imbalance.per.broker.percentage": ("leader_imbalance_per_broker_percentage", int,
                                               LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT),
    "leader.imbalance.check.interval.seconds": ("leader_imbalance_check_interval_seconds", float,
                                                LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS_DEFAULT),
    # Gregor's own: new partitions one controller event brings online (the rest wait for later events).
    "new.partitions.per.event": ("new_partitions_per_event", int, NEW_PARTITIONS_PER_EVENT_DEFAULT),
    **METRICS_TOPIC_KEYS,  # metrics.topic.*: publish our samples to __gregor_metrics (docs/metrics.md)
    **AUTHORIZER_KEYS,  # authorizer.class.name, super.users, allow.everyone.if.no.acl.found (docs/security.md)
}


def parse_args(argv: list[str]) -> ControllerArgs:
    """Flags over --override over the --config file over the defaults (Kafka's order)."""
    ap = argparse.ArgumentParser(prog="python -m gregor.controller", description="Run a Gregor controller.")
    ap.add_argument("--controller-id", type=int, required=True, help="unique id of this controller instance")
    ap.add_argument("--config", help="server.properties-style file of key=value lines: " + ", ".join(CONTROLLER_KEYS))
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a --config key over the file, e.g. delete.topic.enable=false (repeatable)")
    ap.add_argument("--etcd", help="etcd.endpoints, e.g. http://127.0.0.1:2379[,http://...] (required here or in --config)")
    ap.add_argument("--cluster", help="cluster.id: keys live under /gregor/<cluster>/ (default gregor)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    ap.add_argument("--port", type=int, default=0, help="gRPC port (0 picks a free one)")
    ap.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 picks, -1 disables)")
    ap.add_argument("--ready-file", help="write endpoints as JSON here once serving")
    ap.add_argument("--lease-ttl-ms", type=int,
                    help="controller.quorum.fetch.timeout.ms: TTL of the etcd lease the controller registration "
                         "is bound to (rounded up to whole seconds, at least etcd's minimum of 2 s); a dead "
                         f"controller is replaced within it (default {CONTROLLER_QUORUM_FETCH_TIMEOUT_MS_DEFAULT})")
    ap.add_argument("--fast-failover-enable", type=parse_bool, metavar="{true,false}",
                    help="controller.fast.failover.enable: as a standby, revoke the active controller's lease as "
                         "soon as its process is provably gone (its connection broke and its endpoint refuses "
                         "connects) instead of waiting for the lease to expire (default true)")
    ap.add_argument("--delete-topic-enable", type=parse_bool, metavar="{true,false}",
                    help="delete.topic.enable: whether DeleteTopics deletes (Kafka's default: true)")
    ap.add_argument("--auto-leader-rebalance-enable", type=parse_bool, metavar="{true,false}",
                    help="auto.leader.rebalance.enable: periodically move leadership back to preferred replicas")
    ap.add_argument("--leader-imbalance-per-broker-percentage", type=int,
                    help="leader.imbalance.per.broker.percentage: rebalance a broker above this share of "
                         "partitions it should lead but does not")
    ap.add_argument("--leader-imbalance-check-interval-seconds", type=float,
                    help="leader.imbalance.check.interval.seconds: how often the imbalance is checked")
    ap.add_argument("--new-partitions-per-event", type=int,
                    help="new.partitions.per.event: partitions one controller event creates; a larger creation "
                         "is split so other requests are answered between its batches (default 1000)")
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(argv)
    try:
        security, props = split_properties(load_properties(a.config, a.override))
        settle(a, props, CONTROLLER_KEYS, "controller")
        metrics_topic = MetricsTopicConfig.from_namespace(a)
        authorizer = config_from_namespace(a)
    except InvalidConfigError as exc:
        ap.error(str(exc))
    if not a.etcd:
        ap.error("etcd.endpoints is required: --etcd or etcd.endpoints in --config")
    if a.lease_ttl_ms <= 0:
        ap.error("controller.quorum.fetch.timeout.ms (--lease-ttl-ms) must be positive")
    if not 0 <= a.leader_imbalance_per_broker_percentage <= 100:
        ap.error("leader.imbalance.per.broker.percentage must be between 0 and 100")
    if a.leader_imbalance_check_interval_seconds <= 0:
        ap.error("leader.imbalance.check.interval.seconds must be positive")
    if a.new_partitions_per_event < 1:
        ap.error("new.partitions.per.event must be at least 1")
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return ControllerArgs(a.controller_id, a.etcd, a.cluster, a.host, a.port, a.metrics_port, a.ready_file,
                          a.lease_ttl_ms, a.delete_topic_enable,
                          LeaderBalanceConfig(a.auto_leader_rebalance_enable, a.leader_imbalance_per_broker_percentage,
                                              a.leader_imbalance_check_interval_seconds), metrics_topic, security,
                          authorizer, a.new_partitions_per_event, a.fast_failover_enable)


def write_ready_file(path: str, info: dict[str, object]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


async def run(args: ControllerArgs) -> int:
    from gregor.common.metrics_reporter import MetricsReporter, etcd_bootstrap
    from gregor.common.authz import Authz
    from gregor.common.etcd import EtcdClient
    from gregor.common.metrics import register_build_info, serve_metrics
    from gregor.common.rpc import add_health_and_reflection, make_server, wait_for_shutdown
    from gregor.controller.controller import Controller
    from gregor.controller.server import ControllerAdminServicer, ControllerServicer
    from gregor.common.tls import add_port, configure
    from gregor.rpc.v1 import controller_pb2_grpc

    configure(args.tls)  # etcd and the channels to the brokers
    etcd = EtcdClient(args.etcd, cluster=args.cluster)
    server = make_server()
    port = add_port(server, f"{args.host}:{args.port}")
    if port == 0:
        raise OSError(f"cannot bind gRPC port {args.host}:{args.port}")
    # The endpoint goes into the `controller` key, where brokers look it up to forward AdminService calls.
    controller = Controller(args.controller_id, etcd, lease_ttl_ms=args.lease_ttl_ms, endpoint=f"{args.host}:{port}",
                            delete_topic_enable=args.delete_topic_enable, leader_balance=args.leader_balance,
                            new_partitions_per_event=args.new_partitions_per_event,
                            fast_failover_enable=args.fast_failover_enable)
    authz = Authz.create(args.authorizer, etcd)
    authz.start()
    if not await authz.wait_synced(10.0):
        log.warning("the ACLs are not read from etcd yet; only super users are allowed until then")
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(ControllerServicer(controller, authz), server)
    controller_pb2_grpc.add_AdminServiceServicer_to_server(ControllerAdminServicer(controller, authz), server)
    add_health_and_reflection(server, ["gregor.rpc.v1.ControllerService", "gregor.rpc.v1.AdminService"])
    await server.start()
    register_build_info("controller")
    metrics_port = serve_metrics(args.host, args.metrics_port, tls=args.tls) if args.metrics_port >= 0 else -1
    await controller.start()
    # Through the brokers registered in etcd: the controller has no broker list of its own.
    reporter = MetricsReporter.started(args.metrics_topic, lambda: etcd_bootstrap(etcd), "controller",
                                       args.controller_id)
    if args.ready_file:
        write_ready_file(args.ready_file, {
            "controller_id": args.controller_id, "grpc": f"{args.host}:{port}",
            "metrics": f"{args.tls.metrics_scheme}://{args.host}:{metrics_port}/metrics" if metrics_port >= 0 else "",
            "pid": os.getpid()})
    log.info("controller %d serving gRPC on %s:%d, metrics %d, etcd %s", args.controller_id, args.host, port,
             metrics_port, args.etcd)
    code = await wait_for_shutdown("controller", controller.stopped)
    if reporter is not None:
        await reporter.stop()
    # Revoke the lease first: the standby takes over while we finish shutting down.
    await controller.stop()
    await server.stop(1.0)
    await authz.stop()
    await etcd.close()
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(run(args))
    except OSError as exc:
        print(f"gregor.controller: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
