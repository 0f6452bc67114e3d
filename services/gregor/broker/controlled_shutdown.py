"""`gregor-broker-shutdown`: run a broker's controlled shutdown from outside its process (a Kubernetes preStop hook).

Kubernetes runs the preStop hook before it sends SIGTERM. Asking the controller to move the
broker's leaderships there, while the broker still serves every request, means a rolling
`helm upgrade` never waits for a lease to expire; the broker's own SIGTERM path then sends
ControlledShutdown again and finds nothing left to move. The broker's epoch is read from its
registration in etcd (the key's creation revision), exactly what the broker itself would send.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from gregor.common.properties import read_properties
from gregor.common import errors
from gregor.common.config import BrokerConfig

log = logging.getLogger("gregor.broker.controlled_shutdown")


async def run(config: BrokerConfig) -> bool:
    """True once the controller reports no partition led by this broker (or the broker is not registered)."""
    from gregor.broker.cluster_membership import ClusterMembership
    from gregor.common.etcd import EtcdClient

    etcd = EtcdClient(config.etcd_endpoints, cluster=config.cluster_id, security=config.tls)
    membership = ClusterMembership(etcd, config.broker_id, {}, config.broker_session_timeout_ms)
    try:
        kv = await etcd.get(membership.key)
        if kv is None:
            log.info("broker %d is not registered: no leadership to move", config.broker_id)
            return True
        membership.broker_epoch = kv.create_revision
        return await membership.controlled_shutdown(config.controlled_shutdown_max_retries,
                                                    config.controlled_shutdown_retry_backoff_ms)
    finally:
        await membership.close()  # closes the controller channel; this process holds no lease
        await etcd.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gregor-broker-shutdown", description=__doc__.splitlines()[0])
    ap.add_argument("--broker-id", type=int, required=True, help="broker.id of the broker to shut down")
    ap.add_argument("--config", required=True,
                    help="the broker's server.properties (etcd.endpoints, cluster.id, controlled.shutdown.*)")
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = BrokerConfig.from_properties(read_properties(a.config), broker_id=a.broker_id)
    except (errors.GregorError, OSError) as exc:
        print(f"gregor-broker-shutdown: {exc}", file=sys.stderr)
        return 2
    if not config.etcd_endpoints:
        print("gregor-broker-shutdown: etcd.endpoints is not set: a standalone broker has no controller",
              file=sys.stderr)
        return 2
    return 0 if asyncio.run(run(config)) else 1


if __name__ == "__main__":
    sys.exit(main())
