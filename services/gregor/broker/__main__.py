"""`python -m gregor.broker`: parse flags, start a Broker, stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from gregor.common import errors, tls
from gregor.common.config import BrokerConfig
from gregor.common.properties import load_properties


def parse_args(argv: list[str]) -> tuple[BrokerConfig, str | None]:
    ap = argparse.ArgumentParser(prog="python -m gregor.broker", description="Run a Gregor broker.")
    ap.add_argument("--broker-id", type=int, default=0, help="broker.id")
    ap.add_argument("--log-dirs", required=True, help="log.dirs: comma-separated data directories")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    ap.add_argument("--port", type=int, default=9092, help="gRPC port (0 picks a free one)")
    ap.add_argument("--data-port", type=int, default=0, help="zero-copy fetch port (0 picks, -1 disables)")
    ap.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 picks, -1 disables)")
    ap.add_argument("--config", help="server.properties-style file of key=value lines")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a server.properties key, e.g. log.retention.ms=60000 (repeatable)")
    ap.add_argument("--ready-file", help="write endpoints as JSON here once serving")
    ap.add_argument("--etcd", help="etcd endpoints (http://HOST:PORT[,...]): run in a cluster with a controller; "
                                   "without it the broker runs standalone")
    ap.add_argument("--cluster", help="cluster name: etcd keys live under /gregor/<cluster>/ (default gregor)")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    props = load_properties(args.config, args.override)  # file, then each --override on top
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = BrokerConfig.from_properties(props, broker_id=args.broker_id, log_dirs=args.log_dirs,
                                       host=args.host, port=args.port, data_port=args.data_port,
                                       metrics_port=args.metrics_port)
    if args.etcd:
        cfg.etcd_endpoints = args.etcd
    if args.cluster:
        cfg.cluster_id = args.cluster
    return cfg, args.ready_file


async def run(config: BrokerConfig, ready_file: str | None) -> None:
    from gregor.broker.broker import Broker
    from gregor.common.memory import tune_allocator
    from gregor.common.rpc import wait_for_shutdown
    from gregor.common.runtime_metrics import start_runtime_metrics, tune_gc

    tune_allocator()
    tls.configure(config.tls)  # every channel this process opens (fetchers, controller, coordinators, etcd)
    broker = Broker(config)
    await broker.start()
    tune_gc()  # startup's objects out of every collection; rare generation-2 walks (no 60-80 ms stalls under load)
    lag_watch = start_runtime_metrics()  # noqa: F841 (kept alive for the process's life)
    if ready_file:
        broker.write_ready_file(ready_file)
    await wait_for_shutdown("broker")
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    try:
        config, ready_file = parse_args(sys.argv[1:] if argv is None else argv)
    except errors.GregorError as err:
        print(f"gregor.broker: {err}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run(config, ready_file))
    except OSError as exc:
        print(f"gregor.broker: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
