"""`helm test` for Gregor: produce through the gateway and through a broker, consume both back.

Runs in the chart's test Pod (the Gregor image) and, in CI, against a local cluster
(tests/deploy/test_helm_test_script.py), so what the hook checks is itself tested.
Exit 0 when every record written both ways is read back from the topic; else 1 with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time


def gregor(bootstrap: str, *args: str, stdin: str | None = None, timeout_s: float = 60.0) -> str:
    """Run the `gregor` CLI against the brokers; a non-zero exit raises with its stderr."""
    cmd = [os.environ.get("GREGOR_CLI", "gregor"), "--bootstrap", bootstrap, *args]
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


async def produce_via_gateway(gateway: str, topic: str, values: list[str]) -> None:
    from gregor.gateway.client import GatewayClient, record

    async with GatewayClient(gateway) as client:
        results = await client.produce(topic, [record(v.encode(), key=v.encode()) for v in values])
    failed = [r for r in results if r.offset < 0]
    if failed or len(results) != len(values):
        raise RuntimeError(f"gateway answered {len(results)} results for {len(values)} records, "
                           f"{len(failed)} failed: {failed[:3]}")


def run(bootstrap: str, gateway: str, records: int, replication_factor: int, timeout_s: float) -> None:
    topic = f"helm-test-{int(time.time() * 1000)}"
    gregor(bootstrap, "topics", "create", topic, "--partitions", "3", "--replication-factor", str(replication_factor))
    try:
        via_gateway = [f"gateway-{i}" for i in range(records)]
        via_broker = [f"broker-{i}" for i in range(records)]
        asyncio.run(produce_via_gateway(gateway, topic, via_gateway))
        print(f"produced {records} records through the gateway {gateway}")
        gregor(bootstrap, "produce", topic, "--acks", "all", stdin="".join(v + "\n" for v in via_broker))
        print(f"produced {records} records through the brokers {bootstrap}")
        out = gregor(bootstrap, "consume", topic, "--from-beginning", "--max-messages", str(2 * records),
                     "--timeout-ms", str(int(timeout_s * 1000)), "--output", "json", timeout_s=timeout_s + 30)
        seen = sorted(json.loads(line)["value"] for line in out.splitlines() if line.strip())
        expected = sorted(via_gateway + via_broker)
        if seen != expected:
            missing = sorted(set(expected) - set(seen))
            raise RuntimeError(f"consumed {len(seen)} of {len(expected)} records; missing {missing[:10]}")
        print(f"consumed all {len(seen)} records back from {topic}")
    finally:
        try:
            gregor(bootstrap, "topics", "delete", topic)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"could not delete {topic}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True, help="brokers host:port[,...]")
    ap.add_argument("--gateway", required=True, help="gateway host:port[,...]")
    ap.add_argument("--records", type=int, default=10, help="records produced each way")
    ap.add_argument("--replication-factor", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=120.0, help="how long the consumer waits for the records")
    a = ap.parse_args(argv)
    try:
        run(a.bootstrap, a.gateway, a.records, a.replication_factor, a.timeout_s)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"helm test failed: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a GregorError from the gateway client, with its Kafka error name
        print(f"helm test failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
