"""The clients curve and one consumer over 1,000 partitions, Gregor and Apache Kafka side by side in the same
run (issue 24, point 1, "clients" and "consumers over many partitions").

`make bench-scaling` runs it (`QUICK=1`: 1 and 10 producers and consumers, the 100-member rebalance and the
1,000-partition reader, one round). Full form: 1, 10, 50 and 100 producers and consumers, --repeat rounds (3),
medians and spread.

Topologies: Gregor as `gregor cluster up --controllers 1 --coordinators 1` (etcd, a controller, one broker, a
group coordinator: Kafka's single node is also its own controller and group coordinator); Apache Kafka 4.4 as
one combined KRaft node (bench/kafka_dist.py). A fresh cluster per system and round; the systems alternate
(round r starts with Gregor when r is even). Both sides driven by the SAME client, confluent-kafka
(librdkafka), all clients in this one process: every producer and consumer is its own librdkafka instance
(its own connections and threads), driven by its own Python thread.

On a topic of 100 partitions (RF 1):

- N producers (`producers N`): --records records of 1 KiB in all, split evenly, each producer as fast as it
  can (acks=all, librdkafka defaults). produce MB/s = all values / wall time from the first produce() to the
  last delivery report; p99 ms = 99th percentile of produce()-to-delivery-report latency over every record;
  CPU s/MB = CPU seconds of every server process (Gregor: etcd, controller, broker, coordinator; Kafka: its
  JVM) during the run per MB of values;
- N consumers in one new group (`consumers N`): subscribe, read everything in the topic (what the producer
  points wrote). consume MB/s = all values / wall time from the first subscribe to the last record (group
  formation included: that is what a group of N costs to start); first record s alongside; CPU s/MB as above;
- rebalance of a 100-member group (`rebalance 100`): 99 members (range assignor, eager) consuming while a
  background producer writes a record to every partition every 100 ms; once every member has an assignment
  and a record under it, member 100 subscribes; the time from its subscribe until every member holds a new
  assignment, the 100 assignments cover the 100 partitions once, and every member has consumed a record under
  its new assignment (bench/curves_report.py's rebalance_time, read off the clients' callbacks only), split
  at the first existing member's on_revoke into "first member told s" (mostly the phase of the members'
  heartbeat.interval.ms cycle: they learn of a rebalance from their next Heartbeat) and "rejoined after told s"
  (the JoinGroup and SyncGroup rounds and the first fetch under the new assignments);
- one consumer over 1,000 partitions (`1000-partition reader`): a second topic of 1,000 partitions holding
  --records-1000p records of 1 KiB written round-robin; one consumer assign()s all 1,000 at the beginning
  and reads them all: read s (assign to last record), MB/s and server CPU s/MB.

Writes bench/results/clients[_quick].json and .md; with --chart docs/clients.png.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import RESULTS_DIR, write_results  # noqa: E402
from bench.curves_report import MemberTimeline, Metric, chart, chart_path, first_told, percentile, rebalance_time, side_by_side  # noqa: E402
from bench.kafka_dist import GROUP_SETTINGS, KafkaCluster, KafkaDist, ensure_kafka, proc_cpu_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FULL_COUNTS = (1, 10, 50, 100)
QUICK_COUNTS = (1, 10)
GROUP_SIZE = 100  # the rebalance cell's group
PARTITIONS = 100
WIDE_PARTITIONS = 1_000
RECORD_BYTES = 1024
TOPIC, WIDE_TOPIC = "clients", "wide"
STEP_TIMEOUT_S = 600.0

PRODUCER_METRICS: list[Metric] = [("produce MB/s", "MB/s", "higher"), ("p99 ms", "ms", "lower"),
                                  ("CPU s/MB", "CPU s/MB", "lower")]
CONSUMER_METRICS: list[Metric] = [("consume MB/s", "MB/s", "higher"), ("first record s", "s", "lower"),
                                  ("CPU s/MB", "CPU s/MB", "lower")]
REBALANCE_METRICS: list[Metric] = [("rebalance s", "s", "lower"), ("first member told s", "s", "lower"),
                                   ("rejoined after told s", "s", "lower"), ("group of 99 formed s", "s", "lower")]
WIDE_METRICS: list[Metric] = [("read s", "s", "lower"), ("consume MB/s", "MB/s", "higher"),
                              ("CPU s/MB", "CPU s/MB", "lower")]


def metrics_of(point: str) -> list[Metric]:
    """The metrics a point measures (several share a name, e.g. CPU s/MB)."""
    for prefix, metrics in (("producers", PRODUCER_METRICS), ("consumers", CONSUMER_METRICS),
                            ("rebalance", REBALANCE_METRICS)):
        if point.startswith(prefix):
            return metrics
    return WIDE_METRICS


class StepFailed(RuntimeError):
    """A measured step did not complete: the cell stops there and says which step and why."""


def cpu(pids: list[int]) -> float:
    return sum(proc_cpu_seconds(p) for p in pids)


# ---------------------------------------------------------------- librdkafka, both systems
def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=120)[name].result(180)
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:  # every partition led before anything is timed
        md = admin.list_topics(name, timeout=30).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise StepFailed(f"{name}: not every partition led within {STEP_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def producers(bootstrap: str, n: int, records: int, pids: list[int]) -> dict[str, float]:
    """n producers, each its own librdkafka instance and thread, writing records // n values each."""
    from confluent_kafka import Producer

    each = records // n
    latencies: list[list[float]] = [[] for _ in range(n)]
    failed = [0]
    clients = [Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 120_000})
               for _ in range(n)]
    for p in clients:  # connected (metadata in) before the clock starts
        p.list_topics(TOPIC, timeout=30)
    value = os.urandom(RECORD_BYTES)
    go = threading.Barrier(n + 1)

    def run(i: int) -> None:
        producer, lat = clients[i], latencies[i]

        def report(err: Any, _msg: Any, sent: float) -> None:
            if err is None:
                lat.append(time.monotonic() - sent)
            else:
                failed[0] += 1

        go.wait()
        for _ in range(each):
            sent = time.monotonic()
            while True:
                try:
                    producer.produce(TOPIC, value, on_delivery=functools.partial(report, sent=sent))
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        producer.flush(STEP_TIMEOUT_S)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    cpu0 = cpu(pids)
    go.wait()
    start = time.monotonic()
    for t in threads:
        t.join(STEP_TIMEOUT_S)
    elapsed = time.monotonic() - start
    used = cpu(pids) - cpu0
    done = sum(len(x) for x in latencies)
    if failed[0] or done != each * n:
        raise StepFailed(f"{n} producers: {done} of {each * n} delivered, {failed[0]} failed")
    mb = done * RECORD_BYTES / 1e6
    return {"produce MB/s": mb / elapsed, "p99 ms": percentile([x for lat in latencies for x in lat], 99) * 1000,
            "CPU s/MB": used / mb}


def topic_records(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        md = c.list_topics(topic, timeout=30).topics[topic]
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] - 
                   c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[0] for p in md.partitions)
    finally:
        c.close()


def new_consumer(bootstrap: str, group: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": True, "partition.assignment.strategy": "range", **extra})


def consumers(bootstrap: str, n: int, total: int, pids: list[int]) -> dict[str, float]:
    """n members of one new group read the topic's `total` records."""
    group = f"readers-{n}-{time.monotonic_ns()}"
    clients = [new_consumer(bootstrap, group) for _ in range(n)]
    got = [0]
    first: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()

    def run(c: Any) -> None:
        c.subscribe([TOPIC])
        while not stop.is_set():
            msgs = [m for m in c.consume(1000, 0.2) if m.error() is None]
            if msgs:
                with lock:
                    if not first:
                        first.append(time.monotonic())
                    got[0] += len(msgs)
                    if got[0] >= total:
                        stop.set()

    cpu0, start = cpu(pids), time.monotonic()
    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    finished = stop.wait(STEP_TIMEOUT_S)
    elapsed = time.monotonic() - start
    used = cpu(pids) - cpu0
    stop.set()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for c in clients:
        c.close()
    if not finished:
        raise StepFailed(f"{n} consumers: {got[0]} of {total} records within {STEP_TIMEOUT_S:.0f} s")
    mb = total * RECORD_BYTES / 1e6
    return {"consume MB/s": mb / elapsed, "first record s": first[0] - start, "CPU s/MB": used / mb}


def rebalance(bootstrap: str, members: int) -> dict[str, float]:
    """members - 1 consumers form a stable group; then the last one subscribes: rebalance_time()."""
    from confluent_kafka import Producer

    group = f"rebalance-{time.monotonic_ns()}"
    timelines = [MemberTimeline() for _ in range(members)]
    stop = threading.Event()
    errors: list[str] = []
    trickle_skipped = [0]

    def state() -> str:
        assigned = sum(1 for tl in timelines if tl.assigns and tl.assigns[-1][1])
        reading = sum(1 for tl in timelines if tl.records)
        return (f"{assigned} members with partitions, {reading} with records, trickle records skipped "
                f"{trickle_skipped[0]}, errors {errors[:3]}")

    def member(i: int, subscribed: list[float]) -> None:
        tl = timelines[i]
        try:
            c = new_consumer(bootstrap, group, **{"auto.offset.reset": "latest"})

            def on_assign(_c: Any, parts: list[Any]) -> None:
                tl.assigns.append((time.monotonic(), tuple(sorted(p.partition for p in parts))))

            def on_revoke(_c: Any, _parts: list[Any]) -> None:
                tl.revokes.append(time.monotonic())

            subscribed.append(time.monotonic())
            c.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke)
            while not stop.is_set():
                msgs = c.consume(100, 0.05)
                if any(m.error() is None for m in msgs):
                    tl.records.append(time.monotonic())
            c.close()
        except Exception as exc:  # noqa: BLE001 - reported as the cell's failure
            errors.append(f"member {i}: {exc}")

    def trickle() -> None:  # a record to every partition every 100 ms: "consumption resumes" is observable
        p = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5})
        while not stop.is_set():
            for part in range(PARTITIONS):
                try:
                    p.produce(TOPIC, b"t", partition=part)
                except BufferError:  # deliveries behind: the queue is full, skip this tick's record
                    trickle_skipped[0] += 1
            p.poll(0)
            time.sleep(0.1)
        p.flush(10)

    threads = [threading.Thread(target=trickle, daemon=True)]
    first_subs: list[float] = []
    try:
        threads[0].start()
        start = time.monotonic()
        for i in range(members - 1):
            threads.append(threading.Thread(target=member, args=(i, first_subs), daemon=True))
            threads[-1].start()
        formed: Optional[float] = None
        while formed is None:  # the 99 hold the 100 partitions and each has a record under its assignment
            formed = rebalance_time(start, timelines[:members - 1], PARTITIONS)
            if formed is None:
                if time.monotonic() - start > STEP_TIMEOUT_S or errors:
                    raise StepFailed(f"group of {members - 1} not formed within {STEP_TIMEOUT_S:.0f} s: {state()}")
                time.sleep(0.05)
        while True:  # and stays so for 2 s (no member mid-rebalance)
            last = max(t for tl in timelines[:members - 1] for t, _ in tl.assigns)
            if time.monotonic() - last > 2.0:
                break
            time.sleep(0.1)
        formed_s = time.monotonic() - start
        last_subs: list[float] = []
        threads.append(threading.Thread(target=member, args=(members - 1, last_subs), daemon=True))
        threads[-1].start()
        while not last_subs:
            time.sleep(0.001)
        t0 = last_subs[0]
        while True:
            took = rebalance_time(t0, timelines, PARTITIONS)
            if took is not None:
                told = first_told(t0, timelines[:members - 1])
                out = {"rebalance s": took, "group of 99 formed s": formed_s}
                if told is not None:  # the phase of the heartbeat that told the group, then the rejoin itself
                    out.update({"first member told s": told, "rejoined after told s": took - told})
                return out
            if time.monotonic() - t0 > STEP_TIMEOUT_S or errors:
                raise StepFailed(f"rebalance of {members}: not complete within {STEP_TIMEOUT_S:.0f} s: {state()}")
            time.sleep(0.02)
    finally:
        stop.set()
        deadline = time.monotonic() + 60  # closing members leave the group; a stuck one is left behind (daemon)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


def wide_reader(bootstrap: str, records: int, pids: list[int]) -> dict[str, float]:
    """`records` values round-robin over WIDE_PARTITIONS partitions, then one consumer reads them all."""
    from confluent_kafka import Producer, TopicPartition

    create_topic(bootstrap, WIDE_TOPIC, WIDE_PARTITIONS)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 120_000})
    value = os.urandom(RECORD_BYTES)
    for i in range(records):
        while True:
            try:
                p.produce(WIDE_TOPIC, value, partition=i % WIDE_PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(STEP_TIMEOUT_S):
        raise StepFailed("1,000-partition topic: records not delivered")
    c = new_consumer(bootstrap, f"wide-{time.monotonic_ns()}")
    try:
        c.list_topics(WIDE_TOPIC, timeout=30)
        cpu0, start = cpu(pids), time.monotonic()
        c.assign([TopicPartition(WIDE_TOPIC, i, -2) for i in range(WIDE_PARTITIONS)])  # -2: OFFSET_BEGINNING
        got = 0
        while got < records:
            if time.monotonic() - start > STEP_TIMEOUT_S:
                raise StepFailed(f"1,000-partition reader: {got} of {records} within {STEP_TIMEOUT_S:.0f} s")
            got += sum(1 for m in c.consume(1000, 0.5) if m.error() is None)
        elapsed = time.monotonic() - start
        used = cpu(pids) - cpu0
    finally:
        c.close()
    mb = records * RECORD_BYTES / 1e6
    return {"read s": elapsed, "consume MB/s": mb / elapsed, "CPU s/MB": used / mb}


# ---------------------------------------------------------------- the two systems
class GregorSide:
    name = "gregor"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cluster: Any = None

    def start(self) -> None:
        from gregor.cli.local_cluster import LocalCluster

        self.cluster = LocalCluster.up(str(self.base / f"gregor-{time.monotonic_ns()}"), brokers=1, controllers=1,
                                       coordinators=1, coordinator_overrides=dict(GROUP_SETTINGS))

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.down()
            shutil.rmtree(self.cluster.data_dir, ignore_errors=True)
            self.cluster = None

    @property
    def bootstrap(self) -> str:
        return str(self.cluster.to_json()["kafka_bootstrap"])

    def server_pids(self) -> list[int]:
        return [p.pid for p in self.cluster.processes if p.alive()]


class KafkaSide:
    name = "kafka"

    def __init__(self, dist: KafkaDist, base: Path) -> None:
        self.dist, self.base = dist, base
        self.cluster: Optional[KafkaCluster] = None

    def start(self) -> None:
        self.cluster = KafkaCluster(self.dist, self.base / f"kafka-{time.monotonic_ns()}", brokers=1)
        self.cluster.start()

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            shutil.rmtree(self.cluster.base_dir, ignore_errors=True)
            self.cluster = None

    @property
    def bootstrap(self) -> str:
        assert self.cluster is not None
        return self.cluster.bootstrap

    def server_pids(self) -> list[int]:
        assert self.cluster is not None
        return self.cluster.pids


# ---------------------------------------------------------------- one system, one round
def run_round(side: Any, counts: tuple[int, ...], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every point on one fresh cluster; the point that fails carries `broken` and the others still run."""
    out: list[dict[str, Any]] = []

    def point(name: Any, fn: Any) -> None:
        cell: dict[str, Any] = {"system": side.name, "point": name, "values": {}}
        out.append(cell)
        try:
            cell["values"] = fn()
        except Exception as exc:  # noqa: BLE001 - reported in the table
            cell["broken"] = str(exc)[:2000]
            print(f"  {side.name} {name}: broken: {str(exc)[:300]}", flush=True)
        for k, v in cell["values"].items():
            print(f"  {side.name:<6} {name:<24} {k:<22} {v:10.3f}  (load {os.getloadavg()[0]:.1f})", flush=True)

    side.start()
    try:
        bootstrap, pids = side.bootstrap, side.server_pids()
        create_topic(bootstrap, TOPIC, PARTITIONS)
        if not args.rebalance_only:
            for n in counts:
                point(f"producers {n}", lambda n=n: producers(bootstrap, n, args.records, pids))
            total = topic_records(bootstrap, TOPIC)
            for n in counts:
                point(f"consumers {n}", lambda n=n: consumers(bootstrap, n, total, pids))
        point(f"rebalance {GROUP_SIZE}", lambda: rebalance(bootstrap, GROUP_SIZE))
        if not args.rebalance_only:
            point("1000-partition reader", lambda: wide_reader(bootstrap, args.records_1000p, pids))
    finally:
        side.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 and 10 clients (and the 100-member rebalance), one round")
    ap.add_argument("--clients", type=int, nargs="*", help="producer and consumer counts (default: by --quick)")
    ap.add_argument("--repeat", type=int, help="rounds (default 3, quick 1)")
    ap.add_argument("--records", type=int, help="records per producer point (default 100,000, quick 20,000)")
    ap.add_argument("--records-1000p", type=int, help="records over 1,000 partitions (default 100,000, quick 20,000)")
    ap.add_argument("--rebalance-only", action="store_true", help="only the 100-member rebalance")
    ap.add_argument("--systems", nargs="*", default=["gregor", "kafka"], choices=["gregor", "kafka"])
    ap.add_argument("--step-timeout", type=float,
                    help="seconds any one step may take before the point is reported broken (default 600, quick 240)")
    ap.add_argument("--chart", action="store_true", help="draw docs/clients.png")
    args = ap.parse_args()
    globals()["STEP_TIMEOUT_S"] = args.step_timeout or (240.0 if args.quick else STEP_TIMEOUT_S)
    counts = tuple(args.clients or (QUICK_COUNTS if args.quick else FULL_COUNTS))
    repeat = args.repeat or (1 if args.quick else 3)
    args.records = args.records or (20_000 if args.quick else 100_000)
    args.records_1000p = args.records_1000p or (20_000 if args.quick else 100_000)
    dist = ensure_kafka() if "kafka" in args.systems else None
    cells: list[dict[str, Any]] = []
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-clients-") as tmp:
        for r in range(repeat):
            sides: list[Any] = []
            if "gregor" in args.systems:
                sides.append(GregorSide(Path(tmp)))
            if dist is not None:
                sides.append(KafkaSide(dist, Path(tmp)))
            if r % 2:
                sides.reverse()
            for side in sides:
                print(f"round {r + 1}/{repeat}: {side.name}", flush=True)
                for cell in run_round(side, counts, args):
                    cell["round"] = r
                    cell["load"] = os.getloadavg()[0]
                    cells.append(cell)
    points = ([f"producers {n}" for n in counts] + [f"consumers {n}" for n in counts] + [f"rebalance {GROUP_SIZE}"]
              + ["1000-partition reader"])
    name = "clients_quick" if args.quick else "clients"
    if args.clients or args.rebalance_only or args.systems != ["gregor", "kafka"]:
        name += "_partial"
    write_results(name, {"clients": list(counts), "rounds": repeat, "records": args.records,
                         "records_1000p": args.records_1000p, "partitions": PARTITIONS, "group_size": GROUP_SIZE,
                         "record_bytes": RECORD_BYTES, "wall_s": time.monotonic() - t_start,
                         "client": "confluent-kafka (librdkafka) on both"}, cells)
    md = side_by_side(cells, points, metrics_of, "point")
    (RESULTS_DIR / f"{name}.md").write_text(md)
    print(md)
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    if args.chart:
        path = chart_path(ROOT, RESULTS_DIR, name, "clients")
        series = [("producers", [f"producers {n}" for n in counts], list(counts)),
                  ("consumers", [f"consumers {n}" for n in counts], list(counts))]
        metrics = [("produce MB/s", "MB/s", "higher"), ("p99 ms", "ms", "lower"),
                   ("consume MB/s", "MB/s", "higher"), ("CPU s/MB", "CPU s/MB", "lower")]
        chart(cells, series, metrics, path, "Clients: Gregor vs Apache Kafka (one broker, same librdkafka client; "
              "rebalance and the 1,000-partition reader in the table)", "clients", xlog=True)
        print(f"chart: {path}")


if __name__ == "__main__":
    main()
