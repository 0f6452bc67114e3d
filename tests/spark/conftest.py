"""Spark tests: one real local Gregor cluster (etcd, a controller, a broker, a group coordinator) and one
SparkSession in local[2] mode for the whole Spark suite (starting either costs seconds; data stays small)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Iterator

import pytest

from tests.helpers.cluster import LocalCluster, running_cluster


@pytest.fixture(scope="session")
def gregor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("spark-cluster")), brokers=1, controllers=1,
                         coordinators=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark(gregor: LocalCluster) -> Iterator[Any]:
    # The JVM, and the Python workers it starts, take these from the environment at launch: set them only
    # for the launch, so later test modules in the same pytest process see the environment they expect.
    launch_env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                  "GREGOR_BOOTSTRAP": gregor.bootstrap}  # the source's default bootstrap in the workers
    saved = {k: os.environ.get(k) for k in launch_env}
    os.environ.update(launch_env)
    import pyspark
    from pyspark.sql import SparkSession

    from bench.kafka_dist import spark_kafka_jars
    from gregor_spark import GregorDataSource

    # Spark's own `kafka` source and sink (spark-sql-kafka-0-10, cached by `make kafka-jars`) on the classpath:
    # tests/spark/test_spark_kafka_format.py reads and writes Gregor's Kafka listener with it.
    jars = ",".join(spark_kafka_jars(pyspark.__version__))
    try:
        session = (SparkSession.builder.master("local[2]").appName("gregor-tests").config("spark.jars", jars)
                   .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                   .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(GregorDataSource)
    yield session
    session.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str] | None = None,
                       replication_factor: int = 1) -> None:
    from gregor.client import AdminClient

    async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        await admin.create_topic(name, partitions, replication_factor, configs=config or {})


async def produce(bootstrap: str, topic: str, records: list[dict[str, Any]], **props: Any) -> list[dict[str, Any]]:
    """Send records ({key, value, headers, partition, timestamp}); returns them with partition and offset."""
    from gregor.client import Producer

    out = []
    async with Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **props}) as p:
        handles = [await p.send(topic, r["value"], r.get("key"), headers=r.get("headers"),
                                partition=r.get("partition"), timestamp_ms=r.get("timestamp")) for r in records]
        for r, h in zip(records, handles):
            md = await h
            out.append({**r, "partition": md.partition, "offset": md.offset})
    return out
