"""`python -m gregor.gateway`: parse flags, run a ProducerGateway with its gRPC server and metrics, stop cleanly on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from gregor.common.authz import SETTLE_KEYS as AUTHORIZER_KEYS, AuthorizerConfig
from gregor.common.metrics_reporter import MetricsTopicConfig
from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]
from gregor.common.properties import load_properties
from gregor.common.tls import TlsConfig

log = logging.getLogger("gregor.gateway")

SHUTDOWN_GRACE_S = 5.0  # in-flight RPCs get this long to be answered on SIGTERM


@dataclass(frozen=True)
class GatewayArgs:
    gateway_id: int
    bootstrap: str
    host: str
    port: int
    metrics_port: int
    ready_file: str | None
    props: dict[str, str] = field(default_factory=dict)
    metrics_topic: MetricsTopicConfig = MetricsTopicConfig()
    tls: TlsConfig = TlsConfig()  # security.protocol / ssl.*: its gRPC port and its producer's channels
    # Per-caller authorization (authorizer.class.name, super.users, ...) and quotas: the ACLs and the quota
    # configs come from etcd (etcd.endpoints / cluster.id), as on every other service (gateway/callers.py).
    authorizer: AuthorizerConfig = AuthorizerConfig()
    etcd: str = ""
    cluster: str = "gregor"


def parse_args(argv: list[str]) -> GatewayArgs:
    ap = argparse.ArgumentParser(prog="python -m gregor.gateway", description="Run a Gregor producer gateway.")
    ap.add_argument("--gateway-id", type=int, default=0, help="a number naming this instance in logs and cluster.json")
    ap.add_argument("--config", help="producer.properties-style file of key=value lines: bootstrap.servers and "
                                     "the gateway's producer config")
    ap.add_argument("--bootstrap", help="bootstrap.servers: host:port[,host:port...] of any brokers "
                                        "(required here or in --config)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    ap.add_argument("--port", type=int, default=0, help="gRPC port (0 picks a free one)")
    ap.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 picks, -1 disables)")
    ap.add_argument("--ready-file", help="write endpoints as JSON here once serving")
    ap.add_argument("--producer-property", "--property", dest="props", action="append", default=[],
                    metavar="KEY=VALUE", help="producer config of the gateway, e.g. compression.type=lz4, and the "
                         "gateway's metrics.topic.enable / metrics.topic.interval.ms (repeatable)")
    ap.add_argument("--etcd", help="etcd.endpoints: with it the gateway follows the ACLs (authorizer.class.name set) "
                                   "and client quotas in etcd and applies them to its callers")
    ap.add_argument("--cluster", help="cluster.id: the etcd key namespace (default gregor)")
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(argv)
    from gregor.client.config import ConfigError
    from gregor.gateway.gateway import gateway_producer_config

    try:  # the file, then each --producer-property on top; --bootstrap over both
        props = load_properties(a.config, a.props, "--producer-property")
        # metrics.topic.* are the gateway's own settings, not its producer's: taken out before the producer check.
        metrics_topic = MetricsTopicConfig.from_properties(props)
        # security.protocol / ssl.* serve both the gateway's port and its producer; ssl.client.auth is the port's.
        security = TlsConfig.from_properties(props)
        props.pop("ssl.client.auth", None)
        for key in ("metrics.security.protocol", "metrics.ssl.client.auth"):  # its /metrics port's
            props.pop(key, None)
        # The authorizer's keys and etcd's are the gateway's, not its producer's.
        authorizer = AuthorizerConfig.from_properties(
            {key: props.pop(key) for key in list(AUTHORIZER_KEYS) if key in props})
        etcd = a.etcd or props.pop("etcd.endpoints", "")
        props.pop("etcd.endpoints", None)
        cluster = a.cluster or props.pop("cluster.id", "") or "gregor"
        props.pop("cluster.id", None)
    except (InvalidConfigError, ValueError) as exc:
        ap.error(str(exc))
    if authorizer.enabled and not etcd:
        ap.error("authorizer.class.name needs etcd.endpoints (--etcd): the ACLs live in etcd")
    bootstrap = a.bootstrap or props.get("bootstrap.servers", "")
    props.pop("bootstrap.servers", None)
    if not bootstrap:
        ap.error("bootstrap.servers is required: --bootstrap or bootstrap.servers in --config")
    try:  # unknown keys and bad values stop here, before anything is started
        gateway_producer_config(props, bootstrap)
    except ConfigError as exc:
        ap.error(str(exc))
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return GatewayArgs(a.gateway_id, bootstrap, a.host, a.port, a.metrics_port, a.ready_file, props, metrics_topic,
                       security, authorizer, etcd, cluster)


def write_ready_file(path: str, info: dict[str, object]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


async def run(args: GatewayArgs) -> int:
    from gregor.common.metrics_reporter import MetricsReporter
    from gregor.common.memory import tune_allocator
    from gregor.common.metrics import register_build_info, serve_metrics
    from gregor.common.rpc import add_health_and_reflection, make_server, wait_for_shutdown
    from gregor.gateway.gateway import ProducerGateway
    from gregor.gateway.server import ProducerGatewayServicer
    from gregor.rpc.v1 import gateway_pb2_grpc

    from gregor.common.tls import add_port, configure

    tune_allocator()
    configure(args.tls)
    gateway = ProducerGateway(args.bootstrap, args.props)
    callers, stop_callers = await start_callers(args)
    server = make_server()
    port = add_port(server, f"{args.host}:{args.port}")
    if port == 0:
        raise OSError(f"cannot bind gRPC port {args.host}:{args.port}")
    gateway_pb2_grpc.add_ProducerGatewayServiceServicer_to_server(ProducerGatewayServicer(gateway, callers), server)
    add_health_and_reflection(server, ["gregor.rpc.v1.ProducerGatewayService"])
    await gateway.start()
    await server.start()
    register_build_info("gateway")
    metrics_port = serve_metrics(args.host, args.metrics_port, tls=args.tls) if args.metrics_port >= 0 else -1
    reporter = MetricsReporter.started(args.metrics_topic, args.bootstrap, "gateway", args.gateway_id)
    if args.ready_file:
        write_ready_file(args.ready_file, {
            "gateway_id": args.gateway_id, "grpc": f"{args.host}:{port}",
            "metrics": f"{args.tls.metrics_scheme}://{args.host}:{metrics_port}/metrics" if metrics_port >= 0 else "",
            "pid": os.getpid(), "idempotence": bool(gateway.config.get("enable.idempotence"))})
    log.info("gateway %d serving gRPC on %s:%d, metrics %d, bootstrap %s, idempotence %s, compression %s",
             args.gateway_id, args.host, port, metrics_port, args.bootstrap,
             gateway.config.get("enable.idempotence"), gateway.config["compression.type"])
    await wait_for_shutdown("gateway")
    if reporter is not None:
        await reporter.stop()
    # Stop taking RPCs, let in-flight ones be answered, then flush what is still buffered.
    await server.stop(SHUTDOWN_GRACE_S)
    await gateway.close(SHUTDOWN_GRACE_S)
    await stop_callers()
    return 0


async def start_callers(args: GatewayArgs) -> "tuple[Any, Callable[[], Awaitable[None]]]":
    """The per-caller checks (gateway/callers.py): the ACL cache and the quota watch on etcd when --etcd is
    given; nothing to check (everyone allowed, no quota) without it. Returns them and their stop."""
    from gregor.common.authz import Authz, user_name
    from gregor.gateway.callers import GatewayCallers

    if not args.etcd:
        async def nothing() -> None:
            return None
        return GatewayCallers(), nothing
    from gregor.broker.quota_manager import BrokerQuotas, unwatch_quotas, watch_quotas
    from gregor.common.etcd import EtcdClient

    etcd = EtcdClient(args.etcd, cluster=args.cluster)
    authz = Authz.create(args.authorizer, etcd)
    authz.start()
    if authz.enabled and not await authz.wait_synced(10.0):
        log.warning("the ACLs are not read from etcd yet; only super users are allowed until then")
    quotas = BrokerQuotas()
    rules = args.authorizer.principal_mapping_rules
    quotas.principal_of = lambda conn: user_name(conn, rules)  # the caller's certificate, or ANONYMOUS
    quotas.start(etcd)
    watch_quotas(quotas)

    async def stop() -> None:
        unwatch_quotas(quotas)
        await quotas.stop()
        await authz.stop()
        await etcd.close()
    return GatewayCallers(authz, quotas), stop


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from gregor.client.config import ConfigError

    try:
        return asyncio.run(run(args))
    except ConfigError as exc:
        print(f"gregor.gateway: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gregor.gateway: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
