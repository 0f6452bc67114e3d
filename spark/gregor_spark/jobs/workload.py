"""The generated workload of `make analytics`: keyed, skewed traffic on two topics, a consumer group that
commits as it goes (so lag rises and falls), and a broker bounce half-way (so the health charts move).

    python -m gregor_spark.jobs.workload --data-dir .gregor-analytics --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import time
from typing import Any

from gregor.cli.local_cluster import LocalCluster, start_broker, stop_process
from gregor.client import AdminClient, Consumer, Producer

TOPICS = {"orders": 6, "clicks": 3}  # name -> partitions (replication factor 3 on the 3 brokers)
KEYS = 50  # distinct keys; key k is drawn with weight 1/(k+1) (Zipf-like: a few hot keys)
RATE = 400  # records per second produced, all topics together


async def produce(bootstrap: str, seconds: float, rng: random.Random) -> int:
    weights = [1 / (k + 1) for k in range(KEYS)]
    sent = 0
    async with Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                         "delivery.timeout.ms": 120000}) as p:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tick = time.monotonic()
            handles = []
            for _ in range(RATE // 10):
                topic = "orders" if rng.random() < 0.7 else "clicks"
                key = f"user-{rng.choices(range(KEYS), weights)[0]}".encode()
                value = rng.randbytes(int(rng.lognormvariate(5.5, 0.8)) + 1)  # ~250 B median, long tail
                handles.append(await p.send(topic, value, key))
            for h in handles:
                try:
                    await h
                    sent += 1
                except Exception:  # noqa: BLE001 - a record lost to the bounce is part of the picture
                    pass
            await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
    return sent


async def consume(bootstrap: str, seconds: float) -> None:
    """A group that falls behind (slow polls) and commits every second."""
    async with Consumer({"bootstrap.servers": bootstrap, "group.id": "analytics-demo",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "max.poll.records": 150}) as c:
        c.subscribe(list(TOPICS))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await c.poll(timeout_ms=500)
            try:
                await c.commit_sync()
            except Exception:  # noqa: BLE001 - a rebalance during the bounce
                pass
            await asyncio.sleep(1.0)


def bounce(data_dir: str, delay: float) -> None:
    """Kill broker 2 after `delay` seconds and start it again 15 s later (same id and data)."""
    time.sleep(delay)
    cluster = LocalCluster.load(data_dir)
    victim = [p for p in cluster.processes if p.role == "broker" and p.id == 2][0]
    stop_process(victim, signal.SIGKILL)
    time.sleep(15)
    etcd = ",".join(p.grpc for p in cluster.processes if p.role == "etcd")
    back = start_broker(data_dir, 2, etcd_endpoint=etcd)
    cluster.processes = [p for p in cluster.processes if p.pid != victim.pid] + [back]
    cluster.save()


async def main_async(a: Any) -> None:
    cluster = LocalCluster.load(a.data_dir)
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        for name, parts in TOPICS.items():
            try:
                await admin.create_topic(name, parts, 3)
            except Exception as exc:  # noqa: BLE001
                print(f"topic {name}: {exc}")
    loop = asyncio.get_running_loop()
    bouncer = loop.run_in_executor(None, bounce, a.data_dir, a.seconds / 2)
    sent, _ = await asyncio.gather(produce(cluster.bootstrap, a.seconds, random.Random(13)),
                                   consume(cluster.bootstrap, a.seconds + 10))
    await bouncer
    print(f"workload: {sent} records acknowledged in {a.seconds:.0f} s, broker 2 bounced")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--seconds", type=float, default=60.0)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
