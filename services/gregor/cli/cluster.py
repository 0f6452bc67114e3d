"""`gregor cluster up/down/describe`: a local cluster of background processes on loopback."""

from __future__ import annotations

import json
import os

import click

from gregor.cli.local_cluster import ClusterError, LocalCluster


def _data_dir(ctx: click.Context, value: str | None) -> str:
    if value:
        return value
    root = ctx.find_root().params if ctx.find_root() else {}
    return str(root.get("data_dir") or os.environ.get("GREGOR_DATA_DIR") or "./.gregor")


@click.group()
def cluster() -> None:
    """Run a local cluster (etcd + services) as background processes."""


@cluster.command()
@click.option("--data-dir", help="where logs, data and cluster.json go (default ./.gregor)")
@click.option("--standalone", is_flag=True,
              help="one standalone broker and nothing else (same as --brokers 1 --controllers 0)")
@click.option("--brokers", type=int, default=None, help="[default: 3; 1 with --standalone]")
@click.option("--controllers", type=int, default=None,
              help="1 or more run the brokers in cluster mode under an elected controller (the others stand by); "
                   "0 runs one standalone broker (--brokers 1 --controllers 0)  [default: 2; 0 with --standalone]")
@click.option("--lease-ttl-ms", type=int, default=None,
              help="one lease TTL for the controllers (controller.quorum.fetch.timeout.ms, default 2000), the "
                   "coordinators and the brokers (broker.session.timeout.ms, default 10000); left out, each keeps "
                   "its own default")
@click.option("--coordinators", type=int, default=None,
              help="group coordinators (need --controllers >= 1); groups are sharded over them  "
                   "[default: 1 with controllers, else 0]")
@click.option("--coordinator-property", "coordinator_prop_items", multiple=True, metavar="KEY=VALUE",
              help="group/offsets setting of every coordinator, e.g. offsets.topic.num.partitions=8 (repeatable)")
@click.option("--gateways", type=int, default=None, help="producer gateways  [default: 1 with controllers, else 0]")
@click.option("--gateway-property", "gateway_prop_items", multiple=True, metavar="KEY=VALUE",
              help="producer config of every gateway, e.g. compression.type=lz4 (repeatable)")
@click.option("--etcd-members", type=int, default=1, show_default=True,
              help="etcd cluster size on loopback (3 survives the loss of one member); services get every endpoint")
@click.option("--broker-property", "broker_props", multiple=True, metavar="KEY=VALUE",
              help="server.properties override for every broker (repeatable)")
@click.option("--prometheus", is_flag=True,
              help="also start a real Prometheus scraping every process (role prometheus; `make prometheus` builds it)")
@click.option("--scrape-interval", "scrape_interval_s", type=click.FloatRange(min=0.1), default=None,
              help="with --prometheus: scrape and rule evaluation interval in seconds (default 5)")
@click.option("--authorizer", is_flag=True,
              help="turn on Kafka's ACL authorizer on every service, with this CLI's principal as super user "
                   "(docs/security.md)")
@click.option("--super-user", "super_users", multiple=True, metavar="User:NAME",
              help="with --authorizer: another super user (repeatable)")
@click.option("--tls", is_flag=True,
              help="mTLS everywhere: certificates made in DIR/certs (or taken from --certs), etcd with client-"
                   "certificate auth, every port TLS-only; client settings in DIR/client.properties")
@click.option("--certs", "certs_dir", type=click.Path(file_okay=False), default=None,
              help="with --tls: use (and complete) the certificates of this directory (gregor certs create)")
@click.pass_context
def up(ctx: click.Context, data_dir: str | None, standalone: bool, brokers: int | None, controllers: int | None,
       lease_ttl_ms: int | None, coordinators: int | None, gateways: int | None, broker_props: tuple[str, ...],
       gateway_prop_items: tuple[str, ...] = (), coordinator_prop_items: tuple[str, ...] = (),
       etcd_members: int = 1, prometheus: bool = False, scrape_interval_s: float | None = None,
       authorizer: bool = False, super_users: tuple[str, ...] = (),
       tls: bool = False, certs_dir: str | None = None) -> None:
    """Start etcd and the services, wait until healthy, write DIR/cluster.json and print it.

    The defaults are DESIGN.md's cluster: 3 brokers, 2 controllers, 1 group coordinator, 1 gateway.
    """
    if standalone:
        if (brokers not in (None, 1) or controllers not in (None, 0) or coordinators not in (None, 0)
                or gateways not in (None, 0)):
            raise click.UsageError("--standalone runs one broker alone: drop --brokers/--controllers/"
                                   "--coordinators/--gateways")
        brokers, controllers = 1, 0
    brokers = 3 if brokers is None else brokers
    controllers = 2 if controllers is None else controllers
    coordinators = (1 if controllers > 0 else 0) if coordinators is None else coordinators
    gateways = (1 if controllers > 0 else 0) if gateways is None else gateways
    if coordinators < 0:
        raise click.BadParameter("must be >= 0", param_hint="--coordinators")
    coordinator_props = {}
    for item in coordinator_prop_items:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--coordinator-property")
        coordinator_props[key] = value
    if gateways < 0:
        raise click.BadParameter("must be >= 0", param_hint="--gateways")
    gateway_props = {}
    for item in gateway_prop_items:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--gateway-property")
        gateway_props[key] = value
    overrides = {}
    for item in broker_props:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--broker-property")
        overrides[key] = value
    authorizer_props = None
    if authorizer:
        from gregor.cli.local_cluster import authorizer_properties
        from gregor.common.authz import cli_principal

        # Kafka bootstraps through super.users: the operator (this CLI's principal) may do everything,
        # including adding the first ACLs. Without TLS every connection is User:ANONYMOUS.
        authorizer_props = authorizer_properties([cli_principal(), *super_users])
    try:
        c = LocalCluster.up(_data_dir(ctx, data_dir), brokers=brokers, broker_overrides=overrides,
                            controllers=controllers, lease_ttl_ms=lease_ttl_ms, gateways=gateways,
                            gateway_props=gateway_props, coordinators=coordinators,
                            coordinator_overrides=coordinator_props, etcd_members=etcd_members,
                            prometheus=prometheus, scrape_interval_s=scrape_interval_s, tls=tls or bool(certs_dir),
                            certs_dir=certs_dir, authorizer=authorizer_props)
    except ClusterError as exc:
        raise click.ClickException(str(exc))
    click.echo(json.dumps(c.to_json(), indent=2))


@cluster.command()
@click.option("--data-dir", help="the cluster's directory (default ./.gregor)")
@click.pass_context
def down(ctx: click.Context, data_dir: str | None) -> None:
    """Stop every process of the local cluster (SIGTERM, then SIGKILL after a grace period)."""
    try:
        c = LocalCluster.load(_data_dir(ctx, data_dir))
    except ClusterError as exc:
        raise click.ClickException(str(exc))
    c.down()
    click.echo(f"stopped {len(c.processes)} processes")


@cluster.command()
@click.option("--data-dir", help="the local cluster whose cluster.json names the brokers (default ./.gregor); "
                                 "--bootstrap / GREGOR_BOOTSTRAP take precedence")
@click.pass_context
def describe(ctx: click.Context, data_dir: str | None) -> None:
    """Controller id and epoch, and brokers with id, epoch and endpoint (asked of any broker)."""
    import grpc

    from gregor.cli.common import CliContext, obj, run
    from gregor.common import errors
    from gregor.common.rpc import channel
    from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc

    # The connection rules of every command (--bootstrap, GREGOR_BOOTSTRAP, else cluster.json); this
    # command's own --data-dir only moves the cluster.json fallback.
    settings = obj(ctx)
    if data_dir:
        settings = CliContext(settings.bootstrap_flag, data_dir, settings.output)
    targets = [t.strip() for t in settings.bootstrap().split(",") if t.strip()]

    async def ask() -> controller_pb2.DescribeClusterResponse:
        last: errors.GregorError | None = None
        for target in targets:  # any broker answers (it forwards to the controller); try the next one
            async with channel(target) as ch:
                try:
                    return await controller_pb2_grpc.AdminServiceStub(ch).DescribeCluster(
                        controller_pb2.DescribeClusterRequest(), timeout=10)
                except grpc.RpcError as exc:
                    last = errors.from_rpc_error(exc)
        raise click.ClickException(f"cannot reach the cluster: no broker of {','.join(targets)} answered "
                                   f"DescribeCluster ({last})")

    resp = run(ask())
    brokers = [{"id": b.broker_id, "epoch": b.broker_epoch, "grpc": f"{b.host}:{b.grpc_port}",
                "data": f"{b.host}:{b.data_port}" if b.data_port else ""} for b in resp.brokers]
    if settings.json:
        click.echo(json.dumps({"cluster_id": resp.cluster_id, "controller_id": resp.controller_id,
                               "controller_epoch": resp.controller_epoch, "brokers": brokers}))
        return
    click.echo(f"ClusterId: {resp.cluster_id}\tController: {resp.controller_id}\t"
               f"ControllerEpoch: {resp.controller_epoch}")
    for b in brokers:
        click.echo(f"Broker: {b['id']}\tEpoch: {b['epoch']}\tEndpoint: {b['grpc']}\tDataPort: {b['data']}")
