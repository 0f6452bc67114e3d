"""Client quotas (issue 23, point 4) against real processes: etcd, a controller and a broker.

Quotas are set with `gregor configs` (AlterClientQuotas through the broker to the controller, into etcd,
back to the broker through its watch) and enforced by the broker; the producers and consumers are
Gregor's own clients (gRPC, client.id as metadata) and librdkafka over the Kafka listener. Plain text,
so the user principal is ANONYMOUS: client-id quotas and `<default>` user quotas are what is tested.

The quota tests compare byte counts against the quota over the window they ran (within 10 %), and the
unquota'd tenant against the throttled one in the same run: no absolute speed is assumed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer
from gregor.client.fetcher import fetch_throttles
from gregor.client.producer import Producer
from gregor.common.quotas import DEFAULT
from tests.helpers.cluster import LocalCluster, running_cluster
from tests.helpers.wait import until

GREGOR = [sys.executable, "-m", "gregor.cli.main"]
VALUE = b"q" * 1000
# Small requests, so one request is a small part of a second's quota (Kafka's rate is per request).
PRODUCER_CFG = {"acks": "1", "linger.ms": 5, "batch.size": 8192, "max.request.size": 16384,
                "enable.idempotence": False}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # One group/transaction coordinator (one offsets partition: every group is its own) for the coordinator test.
    with running_cluster(str(tmp_path_factory.mktemp("quotas")), brokers=1, controllers=1, coordinators=1,
                         coordinator_overrides={"offsets.topic.num.partitions": "1",
                                                "transaction.state.log.num.partitions": "1"}) as c:
        yield c


def boot(c: LocalCluster) -> str:
    return str(c.to_json()["bootstrap"])


def cli(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GREGOR_DATA_DIR": c.data_dir}
    return subprocess.run([*GREGOR, *args], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


def configs(c: LocalCluster, *args: str) -> str:
    out = cli(c, "configs", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def set_quota(c: LocalCluster, user: str | None, client_id: str | None, **configs: float) -> None:
    """AlterClientQuotas in process (the CLI's path without a process start: ~5 s each here)."""

    async def go() -> None:
        async with AdminClient({"bootstrap.servers": boot(c)}) as a:
            await a.alter_client_quotas(user, client_id, {k: str(int(v)) for k, v in configs.items() if v},
                                        [k for k, v in configs.items() if not v])

    asyncio.run(go())


def new_topic(c: LocalCluster) -> str:
    name = f"quota-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with AdminClient({"bootstrap.servers": boot(c)}) as a:
            await a.create_topic(name, 1, 1)

    asyncio.run(go())
    return name


def broker_samples(c: LocalCluster, name: str, role: str = "broker") -> list[Any]:
    with urllib.request.urlopen(c.by_role(role)[0].metrics, timeout=10) as resp:
        text = resp.read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


class Tenant:
    """A greedy producer: sends as fast as the producer lets it, records when each record was acked."""

    def __init__(self, c: LocalCluster, client_id: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": boot(c), "client.id": client_id, **PRODUCER_CFG})
        self.topic = topic
        self.acked: list[float] = []
        self.start = 0.0

    async def run(self, stop: asyncio.Event, max_records: int | None = None) -> None:
        await self.producer.start()
        self.start = time.monotonic()
        pending: set[asyncio.Future[Any]] = set()
        sent = 0
        while not stop.is_set() and (max_records is None or sent < max_records):
            fut = asyncio.ensure_future(await self.producer.send(self.topic, VALUE))
            fut.add_done_callback(lambda f: self.acked.append(time.monotonic()) if not f.exception() else None)
            pending.add(fut)
            fut.add_done_callback(pending.discard)
            sent += 1
            if len(pending) >= 64:  # a small backlog: close() waits for it at the quota's pace
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await self.producer.close()

    def rate(self, lo: float, hi: float) -> float:
        """Acknowledged value bytes per second between lo and hi (monotonic seconds)."""
        return len(VALUE) * sum(1 for t in self.acked if lo <= t < hi) / (hi - lo)


def wire_rate(quota: float) -> tuple[float, float]:
    """The value-bytes rate a producer may reach under a wire-bytes quota, within 10 %: the records'
    framing (a few bytes per 1000-byte record, 61 per batch) counts against the quota."""
    return 0.9 * quota * 0.97, 1.1 * quota


def test_configs_cli_alters_and_describes_like_kafka_configs(cluster: LocalCluster) -> None:
    configs(cluster, "--alter", "--entity-type", "clients", "--entity-name", "cli-a",
            "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048")
    configs(cluster, "--alter", "--user", "alice", "--client", "cli-a", "--add-config", "request_percentage=12.5")
    assert configs(cluster, "--describe", "--entity-type", "clients", "--entity-name", "cli-a").strip() == (
        "Quota configs for client-id 'cli-a' are consumer_byte_rate=2048, producer_byte_rate=1024")
    configs(cluster, "--alter", "--entity-type", "clients", "--entity-name", "cli-a", "--delete-config",
            "consumer_byte_rate")
    assert configs(cluster, "--describe", "--entity-type", "users", "--entity-type", "clients").strip() == (
        "Quota configs for user-principal 'alice', client-id 'cli-a' are request_percentage=12.5")
    bad = cli(cluster, "configs", "--alter", "--entity-type", "users", "--entity-default", "--add-config",
              "producer_byte_rat=5")
    assert bad.returncode == 1 and "Invalid config(s): producer_byte_rat" in bad.stderr

    async def describe() -> list[tuple[str | None, str | None, dict[str, str]]]:
        async with AdminClient({"bootstrap.servers": boot(cluster)}) as a:
            return await a.describe_client_quotas()

    assert asyncio.run(describe()) == [(None, "cli-a", {"producer_byte_rate": "1024"}),
                                       ("alice", "cli-a", {"request_percentage": "12.5"})]
    set_quota(cluster, None, "cli-a", producer_byte_rate=0)
    set_quota(cluster, "alice", "cli-a", request_percentage=0)
    assert asyncio.run(describe()) == []


def test_client_id_quota_holds_for_30s_and_an_unquotad_tenant_keeps_its_throughput(cluster: LocalCluster) -> None:
    """tenant-a (50 kB/s) produces greedily for 30 s: within 10 % of its quota over the window; tenant-b,
    with no quota, runs in the same window and is never throttled, and moves far more."""
    quota = 50_000.0
    set_quota(cluster, None, "tenant-a", producer_byte_rate=quota)
    topic = new_topic(cluster)

    async def go() -> tuple[Tenant, Tenant, float, float]:
        a, b = Tenant(cluster, "tenant-a", topic), Tenant(cluster, "tenant-b", topic)
        stop = asyncio.Event()
        runs = [asyncio.ensure_future(a.run(stop)), asyncio.ensure_future(b.run(stop, max_records=6000))]
        await until(lambda: a.acked, 30, "tenant-a's first ack")
        lo = a.start
        await asyncio.sleep(30.0)
        hi = time.monotonic()
        stop.set()
        await asyncio.gather(*runs)
        return a, b, lo, hi

    a, b, lo, hi = asyncio.run(go())
    low, high = wire_rate(quota)
    assert low <= a.rate(lo, hi) <= high, a.rate(lo, hi)
    assert a.producer.metrics()["produce-throttle-time-max"] > 0
    assert b.producer.metrics()["produce-throttle-time-max"] == 0
    assert len(b.acked) == 6000
    # Same run, same broker: the unquota'd tenant moved its 6 MB at several times tenant-a's quota.
    b_rate = len(VALUE) * len(b.acked) / (max(b.acked) - b.start)
    assert b_rate > 3 * quota, b_rate
    seen = {(s.labels["type"], s.labels["client_id"]): s.value
            for s in broker_samples(cluster, "gregor_client_quota_throttle_time_seconds_total")}
    assert seen[("Produce", "tenant-a")] > 0 and ("Produce", "tenant-b") not in seen


def test_a_quota_change_applies_within_a_second(cluster: LocalCluster) -> None:
    set_quota(cluster, None, "tenant-c", producer_byte_rate=20000)
    topic = new_topic(cluster)

    def limit() -> float | None:
        for s in broker_samples(cluster, "gregor_client_quota_limit"):
            if s.labels["client_id"] == "tenant-c" and s.labels["type"] == "Produce":
                return float(s.value)
        return None

    async def go() -> tuple[Tenant, float, float, float]:
        c = Tenant(cluster, "tenant-c", topic)
        stop = asyncio.Event()
        run = asyncio.ensure_future(c.run(stop))
        await until(lambda: limit() == 20000, 30, "tenant-c's sensor on the broker")
        await asyncio.sleep(3)
        async with AdminClient({"bootstrap.servers": boot(cluster)}) as admin:
            await admin.alter_client_quotas(None, "tenant-c", {"producer_byte_rate": "200000"})
        applied = time.monotonic()  # stored in etcd: the broker learns it through its watch
        took = await until(lambda: limit() == 200000, 1.0, "the broker applies the new quota within a second")
        await asyncio.sleep(4)
        stop.set()
        await run
        return c, applied + took, time.monotonic(), took

    c, changed, end, took_s = asyncio.run(go())
    before = c.rate(c.start, changed - 1)
    after = c.rate(changed + 1, end - 0.5)
    # A few seconds only, the first included (the in-flight requests sent before the first throttled
    # answer overshoot a little): the 30 s test above holds the 10 %; this one shows the change.
    assert before <= 1.5 * 20000 and after > 3 * before, (before, after, took_s)


def test_default_user_quota_applies_to_anonymous_clients(cluster: LocalCluster) -> None:
    """A `<default>` user quota covers every client of User:ANONYMOUS (plain text) without a more specific one."""
    quota = 30_000.0
    configs(cluster, "--alter", "--entity-type", "users", "--entity-default",
            "--add-config", f"producer_byte_rate={int(quota)}")
    assert "Quota configs for the default user-principal are producer_byte_rate=30000" in configs(
        cluster, "--describe", "--entity-type", "users")
    topic = new_topic(cluster)
    try:
        async def go() -> tuple[Tenant, float, float]:
            t = Tenant(cluster, f"anyone-{uuid.uuid4().hex[:6]}", topic)
            stop = asyncio.Event()
            run = asyncio.ensure_future(t.run(stop))
            await until(lambda: t.acked, 30, "the first ack")
            await asyncio.sleep(8)
            hi = time.monotonic()
            stop.set()
            await run
            return t, t.start, hi

        t, lo, hi = asyncio.run(go())
        low, high = wire_rate(quota)
        assert low <= t.rate(lo, hi) <= high, t.rate(lo, hi)
        users = {s.labels["user"] for s in broker_samples(cluster, "gregor_client_quota_byte_rate")
                 if s.labels["client_id"] == ""}
        assert "ANONYMOUS" in users  # a user-level quota: one sensor for the user, whatever its client ids
    finally:
        set_quota(cluster, DEFAULT, None, producer_byte_rate=0)


@pytest.mark.parametrize("transport", ["grpc", "data"])
def test_consumer_byte_rate_throttles_gregor_fetches(cluster: LocalCluster, transport: str) -> None:
    """consumer_byte_rate on gRPC Fetch and on the zero-copy data port (client id in the FetchRequest)."""
    quota = 100_000.0
    topic = new_topic(cluster)

    async def fill() -> None:
        t = Tenant(cluster, "filler", topic)
        await t.run(asyncio.Event(), max_records=1500)

    asyncio.run(fill())
    set_quota(cluster, None, f"reader-{transport}", consumer_byte_rate=quota)

    async def go() -> tuple[int, float, dict[str, float]]:
        async with Consumer({"bootstrap.servers": boot(cluster), "client.id": f"reader-{transport}",
                             "auto.offset.reset": "earliest", "max.partition.fetch.bytes": 65536,
                             "fetch.transport": transport}) as consumer:
            consumer.assign([(topic, 0)])
            got, start = 0, time.monotonic()
            while time.monotonic() - start < 8:
                got += sum(len(r.value or b"") for r in await consumer.poll(timeout_ms=200))
            elapsed = time.monotonic() - start
            return got, elapsed, fetch_throttles(consumer.metadata).metrics()

    got, elapsed, metrics = asyncio.run(go())
    low, high = wire_rate(quota)
    assert low <= got / elapsed <= high, got / elapsed
    assert metrics["fetch-throttle-time-max"] > 0


def test_librdkafka_sees_throttle_time_and_stays_within_its_quota(cluster: LocalCluster) -> None:
    from confluent_kafka import Producer as KafkaProducer

    quota = 50_000.0
    set_quota(cluster, None, "rdk", producer_byte_rate=quota)
    topic = new_topic(cluster)
    throttles: list[float] = []
    acked: list[float] = []
    p = KafkaProducer({"bootstrap.servers": str(cluster.to_json()["kafka_bootstrap"]), "client.id": "rdk",
                       "batch.size": 8192, "linger.ms": 5, "acks": 1,
                       # a small queue: flush() at the end waits for it at the quota's pace
                       "queue.buffering.max.kbytes": 64,
                       "throttle_cb": lambda ev: throttles.append(ev.throttle_time)})
    start = time.monotonic()
    while time.monotonic() - start < 10:
        try:
            p.produce(topic, VALUE, on_delivery=lambda err, msg: acked.append(time.monotonic()) if err is None
                      else None)
        except BufferError:
            p.poll(0.05)
        p.poll(0)
    hi = time.monotonic()
    p.flush(60)
    low, high = wire_rate(quota)
    rate = len(VALUE) * sum(1 for t in acked if t < hi) / (hi - start)
    assert throttles and max(throttles) > 0
    assert low <= rate <= high, rate


def quota_samples(c: LocalCluster, name: str, quota_type: str, role: str = "broker") -> dict[str, float]:
    """client_id -> value of a per-entity quota metric of one type (Produce, Fetch, Request) of the first
    process of a role (broker, coordinator)."""
    return {s.labels["client_id"]: s.value for s in broker_samples(c, name, role) if s.labels["type"] == quota_type}



def set_request_percentage(cluster: LocalCluster, value: str | None, client: str = DEFAULT) -> None:
    """Set (or with None remove) a client id's request_percentage quota, `<default>` unless named."""
    async def alter() -> None:
        async with AdminClient({"bootstrap.servers": boot(cluster)}) as a:
            await a.alter_client_quotas(None, client, {"request_percentage": value} if value else {},
                                        [] if value else ["request_percentage"])
    asyncio.run(alter())


def test_request_percentage_throttles_every_unary_call_of_the_greedy_client_only(cluster: LocalCluster) -> None:
    """request_percentage (KIP-124) counts the handler time of every request, not only ProduceStream's: a
    client calling Metadata and Fetch as fast as it can goes over a `<default>` client-id quota of 2 % and
    gets Fetch answers with throttle_time_ms (its connection muted); a client making a few of the same calls
    on its own connection, metered on its own, never does. The quiet client id has a quota of its own, 50 %
    (more specific than `<default>`, Kafka's precedence): the quota is measured on at least one 1 s window
    and the handler time is wall time on the loop, so on a loaded CI machine two of the broker's ~60 ms GC
    pauses landing in the quiet client's few calls came to 10 % of a second and throttled it (seen in a
    fresh-clone CI run). The greedy client's quota is 2 %: its flood, limited by its own Python gRPC client
    on two cores, keeps the broker's handlers busy only ~9 % of a second once the Metadata and Fetch handlers
    got faster (measured), so a 10 % default was never exceeded and the test failed in CI."""
    import grpc

    from gregor.common.quotas import CLIENT_ID_METADATA
    from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

    topic = new_topic(cluster)
    suffix = uuid.uuid4().hex[:6]
    greedy, quiet = f"greedy-{suffix}", f"quiet-{suffix}"

    set_request_percentage(cluster, "2")
    set_request_percentage(cluster, "50", quiet)
    try:
        async def go() -> tuple[list[int], list[int]]:
            # A channel of its own each (a local subchannel pool): the broker mutes a connection, as Kafka does.
            opts = [("grpc.use_local_subchannel_pool", 1)]
            async with grpc.aio.insecure_channel(boot(cluster), options=opts) as g, \
                    grpc.aio.insecure_channel(boot(cluster), options=opts) as q:
                gstub, qstub = broker_pb2_grpc.BrokerServiceStub(g), broker_pb2_grpc.BrokerServiceStub(q)
                fetch = broker_pb2.FetchRequest(topic=topic, partition=0, fetch_offset=0, max_bytes=1024)
                meta = broker_pb2.MetadataRequest(topics=[topic])
                greedy_throttles: list[int] = []

                async def one_round() -> bool:
                    md = ((CLIENT_ID_METADATA, greedy),)
                    calls = [gstub.Metadata(meta, metadata=md) for _ in range(20)]
                    answers = await asyncio.gather(*calls, *(gstub.Fetch(fetch, metadata=md) for _ in range(20)))
                    greedy_throttles.extend(a.throttle_time_ms for a in answers[20:])
                    return any(greedy_throttles)

                await until(one_round, 60, "a throttled Fetch answer for the greedy client", interval_s=0)
                quiet_throttles = []
                md = ((CLIENT_ID_METADATA, quiet),)
                for _ in range(4):
                    await qstub.Metadata(meta, metadata=md)
                    quiet_throttles.append((await qstub.Fetch(fetch, metadata=md)).throttle_time_ms)
                    await asyncio.sleep(0.3)
                return greedy_throttles, quiet_throttles

        greedy_throttles, quiet_throttles = asyncio.run(go())
        assert max(greedy_throttles) > 0
        assert quiet_throttles == [0, 0, 0, 0]
        throttled = quota_samples(cluster, "gregor_client_quota_throttled_requests_total", "Request")
        assert throttled[greedy] > 0 and throttled[quiet] == 0
        ratio = quota_samples(cluster, "gregor_client_quota_request_time_ratio", "Request")
        assert ratio[greedy] > ratio[quiet] > 0  # both measured (Metadata and Fetch time alike), greedy more
    finally:
        set_request_percentage(cluster, None)
        set_request_percentage(cluster, None, quiet)


def test_request_percentage_throttles_kafka_listener_requests(cluster: LocalCluster) -> None:
    """The Kafka listener meters the handler time of every request too: a librdkafka consumer fetching an
    empty partition without waiting, and asking for metadata meanwhile, goes over a 1 % request quota and its
    throttle callback fires (the responses carry throttle_time_ms, the connection is muted)."""
    from confluent_kafka import Consumer as KafkaConsumer, TopicPartition

    topic = new_topic(cluster)
    client_id = f"rdk-req-{uuid.uuid4().hex[:6]}"

    set_request_percentage(cluster, "1", client_id)
    throttles: list[float] = []
    c = KafkaConsumer({"bootstrap.servers": str(cluster.to_json()["kafka_bootstrap"]), "client.id": client_id,
                       "group.id": f"g-{client_id}", "fetch.wait.max.ms": 1, "fetch.error.backoff.ms": 1,
                       "throttle_cb": lambda ev: throttles.append(ev.throttle_time)})
    try:
        c.assign([TopicPartition(topic, 0, 0)])

        async def throttled() -> bool:
            c.poll(0.05)
            c.list_topics(topic, timeout=10)
            return bool(throttles)

        asyncio.run(until(throttled, 60, "a throttle callback", interval_s=0))
        assert max(throttles) > 0
        assert quota_samples(cluster, "gregor_client_quota_throttled_requests_total", "Request")[client_id] > 0
    finally:
        c.close()
        set_request_percentage(cluster, None, client_id)


def test_request_percentage_throttles_coordinator_calls_of_the_greedy_client_only(cluster: LocalCluster) -> None:
    """The group and transaction coordinators meter request_percentage too (in Kafka every broker is one, and
    OffsetFetch, DescribeGroups, Heartbeat, JoinGroup, EndTxn... all count): a client calling OffsetFetch and
    DescribeGroups on the coordinator as fast as it can goes over a `<default>` client-id quota of 2 % and
    gets answers with throttle_time_ms (its connection muted); a client making a few of the same calls on its
    own connection, under a quota of its own of 50 %, never does (the design of the broker's test above, and
    its reasons for 2 % and 50 %). The SDK's GroupAdmin sends its client.id to the coordinator and records the
    throttle it is handed (KIP-219: it waits before its next call). Each greedy request names 200 partitions
    or 50 groups, so the flood's handler time, not the Python client, is what the quota sees."""
    import grpc

    from gregor.client.group_admin import GroupAdmin
    from gregor.common.quotas import CLIENT_ID_METADATA
    from gregor.rpc.v1 import common_pb2, coordinator_pb2 as pb, coordinator_pb2_grpc

    suffix = uuid.uuid4().hex[:6]
    greedy, quiet, sdk = f"greedy-c-{suffix}", f"quiet-c-{suffix}", f"sdk-c-{suffix}"
    coordinator = cluster.by_role("coordinator")[0].grpc

    set_request_percentage(cluster, "2")
    set_request_percentage(cluster, "50", quiet)
    try:
        async def go() -> tuple[list[int], list[int], float]:
            opts = [("grpc.use_local_subchannel_pool", 1)]  # a connection each: the coordinator mutes one
            async with grpc.aio.insecure_channel(coordinator, options=opts) as g, \
                    grpc.aio.insecure_channel(coordinator, options=opts) as q:
                gstub = coordinator_pb2_grpc.GroupCoordinatorServiceStub(g)
                qstub = coordinator_pb2_grpc.GroupCoordinatorServiceStub(q)
                many = pb.OffsetFetchRequest(group_id=f"g-{suffix}", partitions=[
                    common_pb2.TopicPartition(topic=f"t-{i % 20}", partition=i) for i in range(200)])
                groups = pb.DescribeGroupsRequest(group_ids=[f"g-{suffix}-{i}" for i in range(50)])

                async def serving() -> bool:
                    try:
                        await qstub.OffsetFetch(pb.OffsetFetchRequest(group_id=f"g-{suffix}"), timeout=5)
                        return True
                    except grpc.RpcError:  # COORDINATOR_LOAD_IN_PROGRESS while it loads __consumer_offsets
                        return False

                await until(serving, 60, "the coordinator serving its offsets partition")
                greedy_throttles: list[int] = []

                async def one_round() -> bool:
                    md = ((CLIENT_ID_METADATA, greedy),)
                    answers = await asyncio.gather(*(gstub.OffsetFetch(many, metadata=md) for _ in range(20)),
                                                   *(gstub.DescribeGroups(groups, metadata=md) for _ in range(20)))
                    greedy_throttles.extend(a.throttle_time_ms for a in answers)
                    return any(greedy_throttles)

                await until(one_round, 60, "a throttled coordinator answer for the greedy client", interval_s=0)
                quiet_throttles = []
                md = ((CLIENT_ID_METADATA, quiet),)
                for _ in range(4):
                    quiet_throttles.append((await qstub.OffsetFetch(pb.OffsetFetchRequest(group_id=f"g-{suffix}"),
                                                                    metadata=md)).throttle_time_ms)
                    quiet_throttles.append((await qstub.DescribeGroups(pb.DescribeGroupsRequest(
                        group_ids=[f"g-{suffix}"]), metadata=md)).throttle_time_ms)
                    await asyncio.sleep(0.3)

            async with GroupAdmin({"bootstrap.servers": boot(cluster), "client.id": sdk}) as admin:
                async def sdk_throttled() -> bool:
                    await asyncio.gather(*(admin.committed_offsets(f"g-{suffix}", [(f"t-{i % 20}", i)
                                                                                  for i in range(200)])
                                           for _ in range(20)))
                    return admin.throttles.throttle_time_ms_max > 0

                await until(sdk_throttled, 60, "the SDK's GroupAdmin handed a throttle", interval_s=0)
                return greedy_throttles, quiet_throttles, admin.throttles.throttle_time_ms_max

        greedy_throttles, quiet_throttles, sdk_max = asyncio.run(go())
        assert max(greedy_throttles) > 0 and sdk_max > 0
        assert quiet_throttles == [0] * 8
        throttled = quota_samples(cluster, "gregor_client_quota_throttled_requests_total", "Request", "coordinator")
        assert throttled[greedy] > 0 and throttled[sdk] > 0 and throttled[quiet] == 0
        ratio = quota_samples(cluster, "gregor_client_quota_request_time_ratio", "Request", "coordinator")
        assert ratio[greedy] > ratio[quiet] > 0  # both measured, the greedy client more
    finally:
        set_request_percentage(cluster, None)
        set_request_percentage(cluster, None, quiet)


def test_every_sdk_call_to_a_broker_carries_the_client_id(cluster: LocalCluster) -> None:
    """Kafka puts client.id in every request header, and the brokers' client quotas and request logs key on it:
    each SDK client, async and blocking, makes its unary broker calls (Metadata, ListOffsets, FindCoordinator,
    DescribeCluster) under a client id of its own that has a request_percentage quota, and the broker meters
    them under that id (its Request sensor for the id exists; a call without the id would match no quota and
    be metered nowhere). None of them is a Fetch, a ProduceStream or a coordinator call, which carried the id
    before every call did. A probe's quota is set last and waited for: etcd's watch applies them in order."""
    import grpc

    from gregor.client.admin import SyncAdminClient
    from gregor.client.consumer import SyncConsumer
    from gregor.client.producer import SyncProducer
    from gregor.common.quotas import CLIENT_ID_METADATA
    from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

    topic = new_topic(cluster)
    suffix = uuid.uuid4().hex[:6]
    ids = {name: f"{name}-{suffix}" for name in ("admin", "offsets", "group", "sync-admin", "sync-consumer",
                                                 "sync-producer", "probe")}
    for client in ids.values():
        set_request_percentage(cluster, "1000", client)  # far above what these calls take: nothing is throttled

    def metered() -> dict[str, float]:
        return quota_samples(cluster, "gregor_client_quota_request_time_ratio", "Request")

    try:
        async def probe_metered() -> bool:
            async with grpc.aio.insecure_channel(boot(cluster)) as ch:
                await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(
                    broker_pb2.MetadataRequest(), metadata=((CLIENT_ID_METADATA, ids["probe"]),), timeout=10)
            return ids["probe"] in metered()

        asyncio.run(until(probe_metered, 30, "the broker metering the probe under its quota (set last)"))
        tp = (topic, 0)

        async def async_clients() -> None:
            async with AdminClient({"bootstrap.servers": boot(cluster), "client.id": ids["admin"]}) as admin:
                await admin.describe_cluster()  # AdminService.DescribeCluster
                await admin.list_topics()  # Metadata
            async with Consumer({"bootstrap.servers": boot(cluster), "client.id": ids["offsets"]}) as consumer:
                await consumer.partitions_for(topic)  # Metadata
                await consumer.end_offsets([tp])  # ListOffsets
                await consumer.offsets_for_times({tp: 0})
            async with Consumer({"bootstrap.servers": boot(cluster), "client.id": ids["group"],
                                 "group.id": f"g-{suffix}"}) as consumer:
                await consumer.committed([tp])  # FindCoordinator on a broker, OffsetFetch on the coordinator

        asyncio.run(async_clients())
        with SyncAdminClient({"bootstrap.servers": boot(cluster), "client.id": ids["sync-admin"]}) as admin:
            admin.list_topics()
        consumer = SyncConsumer({"bootstrap.servers": boot(cluster), "client.id": ids["sync-consumer"]})
        try:
            consumer.beginning_offsets([tp])
        finally:
            consumer.close()
        with SyncProducer({"bootstrap.servers": boot(cluster), "client.id": ids["sync-producer"]}) as producer:
            producer.partitions_for(topic)
        seen = metered()
        assert {name: client in seen for name, client in ids.items()} == {name: True for name in ids}
    finally:
        for client in ids.values():
            set_request_percentage(cluster, None, client)


@pytest.mark.parametrize("path", ["produce-stream", "data-port"])
def test_request_percentage_throttles_produce_streams_and_data_port_fetches(cluster: LocalCluster, path: str) -> None:
    """request_percentage on the two paths that record their own handler time outside rpc_method: a producer's
    ProduceStream (each request's synchronous append) and a consumer's fetches on the zero-copy data port.
    The client has only a request quota of 1 % (no byte rate), so the throttle it gets is the request
    quota's: its answers carry throttle_time_ms (the producer's produce-throttle-time, the consumer's
    fetch-throttle-time) and the broker counts Request throttles for its client id, none of Produce/Fetch."""
    topic = new_topic(cluster)
    client_id = f"req-{path}-{uuid.uuid4().hex[:6]}"
    if path == "data-port":
        asyncio.run(Tenant(cluster, "filler", topic).run(asyncio.Event(), max_records=1000))
    set_quota(cluster, None, client_id, request_percentage=1)
    try:
        async def produce() -> float:
            t = Tenant(cluster, client_id, topic)
            stop = asyncio.Event()
            run = asyncio.ensure_future(t.run(stop))
            await until(lambda: t.producer.metrics()["produce-throttle-time-max"] > 0, 60,
                        "a throttled ProduceStream answer")
            stop.set()
            await run
            return float(t.producer.metrics()["produce-throttle-time-max"])

        async def fetch() -> float:
            # Small fetches from the start again and again: many data-port requests, each a little handler time.
            async with Consumer({"bootstrap.servers": boot(cluster), "client.id": client_id,
                                 "auto.offset.reset": "earliest", "max.partition.fetch.bytes": 4096,
                                 "fetch.max.wait.ms": 0, "fetch.transport": "data"}) as consumer:
                consumer.assign([(topic, 0)])

                async def throttled() -> bool:
                    if not await consumer.poll(timeout_ms=100):
                        consumer.seek_to_beginning((topic, 0))
                    return fetch_throttles(consumer.metadata).metrics()["fetch-throttle-time-max"] > 0

                await until(throttled, 60, "a throttled data-port fetch answer", interval_s=0)
                return fetch_throttles(consumer.metadata).metrics()["fetch-throttle-time-max"]

        assert asyncio.run(produce() if path == "produce-stream" else fetch()) > 0
        byte_type = "Produce" if path == "produce-stream" else "Fetch"
        assert quota_samples(cluster, "gregor_client_quota_throttled_requests_total", "Request")[client_id] > 0
        assert client_id not in quota_samples(cluster, "gregor_client_quota_throttled_requests_total", byte_type)
    finally:
        set_quota(cluster, None, client_id, request_percentage=0)
