"""The data curve with Kafka beside it (issue 24, point 1, "data"): one topic grown from 1 to N GB.

`make bench-scaling` runs it (`QUICK=1`: 0.5 and 2 GB, one round). Full form: 1, 5, 10 and 20 GB,
--repeat rounds (3), medians and spread; it needs ~1.2x the largest size free on the disk of the
temporary directory and stops before starting if it is not there (every cell's data is removed after it).

Topologies: Gregor as `gregor cluster up --controllers 1` (etcd, a controller, one broker: admin requests on
the Kafka listener need the controller); Apache Kafka 4.4 as one combined KRaft node (bench/kafka_dist.py). Both driven by the SAME client, confluent-kafka
(librdkafka) against each system's Kafka bootstrap. One topic of --partitions (1) partitions, RF 1, with
segments rolled at the default (segment.bytes unset: 1 GiB on both) and at 64 MiB: each a separate cell
on a fresh cluster, the systems alternating (round r starts with Gregor when r is even).

A cell appends 1 KiB records (acks=all, librdkafka defaults) until the topic holds the first size,
measures, appends to the next size, measures, ... Per point:

- append CPU s/GiB: CPU seconds of every server process (Gregor: broker, controller and etcd; Kafka: its one JVM)
  during this step's appends, per GiB of record values appended in the step; append MB/s alongside;
- ListOffsets by time ms: median latency of --lookups offsets_for_times() calls (ListOffsets with a
  timestamp, the time index) at timestamps spread over everything appended so far;
- fetch middle ms: a fresh consumer (connected first) assigned at offset N/2 of partition 0 until its
  first record (the offset index);
- read CPU s/GiB: the same consumer goes on reading --read-mib MiB from the middle (less if the second half
  holds less); server CPU per GiB read (the data was just written, so mostly from the page cache: what a caught-up consumer costs);
- clean stop s / startup s: SIGTERM until the process exited; relaunch until one record is written
  (acks=all) again;
- recovery s: SIGKILL (no clean shutdown: the log is recovered from its last checkpoint), relaunch until
  one record is written again.

Writes bench/results/data_scaling[_quick].json and .md; with --chart docs/data_scaling.png.
bench_data_curve.py (Gregor alone, CPU per 300,000-record chunk) is the measurement of the page-cache
bend at ~1.5-2.5 GB and stays as it is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.bench_clients import KafkaSide as SingleBrokerKafkaSide  # noqa: E402
from bench.common import RESULTS_DIR, write_results  # noqa: E402
from bench.curves_report import Metric, chart, chart_path, side_by_side, spread  # noqa: E402
from bench.kafka_dist import ensure_kafka, proc_cpu_seconds, proc_system_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FULL_GB = (1.0, 5.0, 10.0, 20.0)
QUICK_GB = (0.5, 2.0)
SEGMENTS = (0, 64)  # MiB; 0 = the default (1 GiB on both systems)
RECORD_BYTES = 1024
TOPIC = "data"
STEP_TIMEOUT_S = 900.0

METRICS: list[Metric] = [
    ("append CPU s/GiB", "CPU s/GiB", "lower"),
    ("append system CPU s/GiB", "CPU s/GiB", "lower"),  # the kernel's part of the line above: page cache
    ("append MB/s", "MB/s", "higher"),
    ("read CPU s/GiB", "CPU s/GiB", "lower"),
    ("ListOffsets by time ms", "ms", "lower"),
    ("fetch middle ms", "ms", "lower"),
    ("clean stop s", "s", "lower"),
    ("startup s", "s", "lower"),
    ("recovery s", "s", "lower"),
]


class StepFailed(RuntimeError):
    """A measured step did not complete: the cell stops there and says which step and why."""


# ---------------------------------------------------------------- librdkafka, both systems
def create_topic(bootstrap: str, partitions: int, segment_mib: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    config = {"segment.bytes": str(segment_mib << 20)} if segment_mib else {}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1, config=config)], operation_timeout=60)[TOPIC].result(120)


def append(bootstrap: str, partitions: int, records: int) -> int:
    """`records` values of 1 KiB round-robin over the partitions, acks=all; raises if any is not delivered.
    Returns the wall clock (ms) of the last produce() call: the last record's timestamp (CreateTime)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "queue.buffering.max.messages": 500_000,
                         "queue.buffering.max.kbytes": 1 << 20, "message.timeout.ms": 300_000})
    value = os.urandom(RECORD_BYTES)
    failed = [0]

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, value, partition=i % partitions, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
    last_ms = int(time.time() * 1000)
    left = producer.flush(STEP_TIMEOUT_S)
    if left or failed[0]:
        raise StepFailed(f"append: {left} undelivered, {failed[0]} failed of {records}")
    return last_ms


def writable(bootstrap: str, timeout_s: float) -> float:
    """Seconds until one record is written to partition 0 (acks=all); a fresh producer per attempt with short
    reconnect backoffs, so the figure is the server's, not librdkafka's backoff."""
    from confluent_kafka import Producer

    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 5000,
                             "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200,
                             "topic.metadata.refresh.interval.ms": 500, "retry.backoff.ms": 50,
                             "retry.backoff.max.ms": 200})
        ok: list[bool] = []
        producer.produce(TOPIC, b"probe", partition=0, on_delivery=lambda err, _m: ok.append(err is None))
        producer.flush(6)
        if ok and ok[0]:
            return time.monotonic() - start
        time.sleep(0.05)
    raise StepFailed(f"not writable within {timeout_s:.0f} s")


def consumer(bootstrap: str) -> Any:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"data-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.list_topics(TOPIC, timeout=30)  # connected before anything is timed
    return c


def lookups_by_time(bootstrap: str, t_first_ms: int, t_last_ms: int, n: int) -> list[float]:
    """Latency (ms) of n offsets_for_times() calls at timestamps spread evenly over [t_first, t_last]."""
    from confluent_kafka import TopicPartition

    c = consumer(bootstrap)
    try:
        out = []
        for i in range(n):
            ts = t_first_ms + (t_last_ms - t_first_ms) * (i + 1) // (n + 1)
            start = time.monotonic()
            found = c.offsets_for_times([TopicPartition(TOPIC, 0, ts)], timeout=30)
            out.append((time.monotonic() - start) * 1000)
            if found[0].error is not None or found[0].offset < 0:
                raise StepFailed(f"ListOffsets by time {ts} (records appended from {t_first_ms} to {t_last_ms}): "
                                 f"{found[0].error or found[0].offset}")
        return out
    finally:
        c.close()


def fetch_middle(bootstrap: str, pids: list[int], read_bytes: int) -> tuple[float, float]:
    """(ms until the first record at offset N/2 of partition 0, server CPU seconds per GiB of read_bytes read
    from there on)."""
    from confluent_kafka import TopicPartition

    c = consumer(bootstrap)
    try:
        _low, high = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
        cpu0 = sum(proc_cpu_seconds(p) for p in pids)
        start = time.monotonic()
        c.assign([TopicPartition(TOPIC, 0, high // 2)])
        first: Optional[float] = None
        got, last = 0, high // 2 - 1
        while got < read_bytes and last < high - 1:  # up to read_bytes, or the end of what was there
            if time.monotonic() - start > STEP_TIMEOUT_S:
                raise StepFailed(f"read from the middle: {got} of {read_bytes} bytes within {STEP_TIMEOUT_S:.0f} s")
            for m in c.consume(10_000, 1.0):
                if m.error() is not None:
                    continue
                if first is None:
                    first = time.monotonic() - start
                    if m.offset() != high // 2:
                        raise StepFailed(f"first record at {m.offset()}, asked for {high // 2}")
                got += len(m.value() or b"")
                last = m.offset()
        cpu = sum(proc_cpu_seconds(p) for p in pids) - cpu0
        assert first is not None
        return first * 1000, cpu / (got / (1 << 30))
    finally:
        c.close()


# ---------------------------------------------------------------- the two systems
class GregorSide:
    name = "gregor"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cluster: Any = None

    def start(self) -> None:
        from gregor.cli.local_cluster import LocalCluster

        self.cluster = LocalCluster.up(str(self.base / f"gregor-{time.monotonic_ns()}"), brokers=1, controllers=1)

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

    def _broker(self) -> Any:
        return self.cluster.by_role("broker")[0]

    def kill(self, sig: int) -> None:
        from gregor.cli.local_cluster import stop_process

        stop_process(self._broker(), sig)

    def relaunch(self) -> None:
        from gregor.cli.local_cluster import start_broker

        old = self._broker()
        port = int(old.kafka.rsplit(":", 1)[1])  # the same Kafka listener: clients know it
        etcd = ",".join(p.grpc for p in self.cluster.by_role("etcd"))
        new = start_broker(self.cluster.data_dir, old.id, overrides={"listeners": f"PLAINTEXT://127.0.0.1:{port}"},
                           etcd_endpoint=etcd)
        self.cluster.processes[self.cluster.processes.index(old)] = new
        self.cluster.save()


class KafkaSide(SingleBrokerKafkaSide):
    """bench_clients' one combined KRaft node, plus the kill and relaunch the recovery cells need."""

    def kill(self, sig: int) -> None:
        assert self.cluster is not None
        self.cluster.stop_node(self.cluster.nodes[0], sig)

    def relaunch(self) -> None:
        assert self.cluster is not None
        self.cluster.start_node(self.cluster.nodes[0])


# ---------------------------------------------------------------- one cell: one system, one segment size
def run_cell(side: Any, segment_mib: int, sizes_gb: tuple[float, ...], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The points of one growing topic; a point that fails carries `broken` (values before it kept) and ends
    the cell."""
    out: list[dict[str, Any]] = []
    side.start()
    try:
        bootstrap = side.bootstrap
        create_topic(bootstrap, args.partitions, segment_mib)
        appended = 0  # records
        t_first_ms = int(time.time() * 1000)
        for gb in sizes_gb:
            values: dict[str, float] = {}
            cell: dict[str, Any] = {"system": side.name, "point": (segment_mib, gb), "values": values}
            out.append(cell)
            step = "append"
            try:
                target = int(gb * 1e9 / RECORD_BYTES)
                pids = side.server_pids()
                sys0 = sum(proc_system_seconds(p) for p in pids)
                cpu0, start = sum(proc_cpu_seconds(p) for p in pids), time.monotonic()
                t_last_ms = append(bootstrap, args.partitions, target - appended)
                elapsed = time.monotonic() - start
                cpu = sum(proc_cpu_seconds(p) for p in pids) - cpu0
                system = sum(proc_system_seconds(p) for p in pids) - sys0
                step_bytes = (target - appended) * RECORD_BYTES
                appended = target
                values["append CPU s/GiB"] = cpu / (step_bytes / (1 << 30))
                values["append system CPU s/GiB"] = system / (step_bytes / (1 << 30))
                values["append MB/s"] = step_bytes / elapsed / 1e6
                step = "ListOffsets by time"
                lat = lookups_by_time(bootstrap, t_first_ms, t_last_ms, args.lookups)
                values["ListOffsets by time ms"] = spread(lat)[0]
                step = "fetch middle"
                values["fetch middle ms"], values["read CPU s/GiB"] = fetch_middle(
                    bootstrap, side.server_pids(), args.read_mib << 20)
                step = "clean stop"
                start = time.monotonic()
                side.kill(signal.SIGTERM)
                values["clean stop s"] = time.monotonic() - start
                step = "startup"
                start = time.monotonic()
                side.relaunch()
                writable(bootstrap, STEP_TIMEOUT_S)
                values["startup s"] = time.monotonic() - start
                step = "recovery"
                side.kill(signal.SIGKILL)
                start = time.monotonic()
                side.relaunch()
                writable(bootstrap, STEP_TIMEOUT_S)
                values["recovery s"] = time.monotonic() - start
            except Exception as exc:
                cell["broken"] = f"{step}: {exc}"[:2000]
                print(f"  {side.name} seg {segment_mib or 'default'} {gb} GB: broken at {step}: {str(exc)[:300]}",
                      flush=True)
                return out
            finally:
                for k, v in values.items():
                    print(f"  {side.name:<6} seg {segment_mib or 'dflt':>4} {gb:5g} GB  {k:<24} {v:10.3f}  "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        side.stop()
    return out


def label(point: Any) -> str:
    segment_mib, gb = point
    return f"{gb:g} GB, {'default' if not segment_mib else f'{segment_mib} MiB'} segments"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="0.5 and 2 GB, one round")
    ap.add_argument("--gb", type=float, nargs="*", help="sizes in GB (default: by --quick)")
    ap.add_argument("--segment-mib", type=int, nargs="*", help="segment sizes in MiB, 0 = default (default: 0 64)")
    ap.add_argument("--repeat", type=int, help="rounds (default 3, quick 1)")
    ap.add_argument("--partitions", type=int, default=1, help="partitions of the topic (default 1)")
    ap.add_argument("--lookups", type=int, default=5, help="ListOffsets-by-time calls per point (default 5)")
    ap.add_argument("--read-mib", type=int, help="MiB read from the middle per point (default 1024, quick 256)")
    ap.add_argument("--systems", nargs="*", default=["gregor", "kafka"], choices=["gregor", "kafka"])
    ap.add_argument("--dir", help="where the clusters' data goes (default: a temporary directory)")
    ap.add_argument("--chart", action="store_true", help="draw docs/data_scaling.png")
    args = ap.parse_args()
    sizes = tuple(sorted(args.gb or (QUICK_GB if args.quick else FULL_GB)))
    segments = tuple(args.segment_mib if args.segment_mib is not None else SEGMENTS)
    repeat = args.repeat or (1 if args.quick else 3)
    args.read_mib = args.read_mib or (256 if args.quick else 1024)
    base_parent = Path(args.dir or tempfile.gettempdir())
    free = shutil.disk_usage(base_parent).free
    need = max(sizes) * 1e9 * 1.2 + 2e9
    if free < need:
        sys.exit(f"bench_data_scaling: {free / 1e9:.1f} GB free under {base_parent}, need {need / 1e9:.1f} GB "
                 f"(the largest size x 1.2 + 2 GB); pass smaller --gb or another --dir")
    dist = ensure_kafka() if "kafka" in args.systems else None
    cells: list[dict[str, Any]] = []
    t_start = time.monotonic()
    name = "data_scaling_quick" if args.quick else "data_scaling"
    if args.gb or args.segment_mib is not None or args.systems != ["gregor", "kafka"]:
        name += "_partial"

    def save() -> None:
        write_results(name, {"gb": list(sizes), "segment_mib": list(segments), "rounds": repeat,
                             "partitions": args.partitions, "record_bytes": RECORD_BYTES, "read_mib": args.read_mib,
                             "lookups": args.lookups, "wall_s": time.monotonic() - t_start,
                             "client": "confluent-kafka (librdkafka) on both"},
                      [{**c, "point": list(c["point"])} for c in cells], data_dir=base_parent)

    with tempfile.TemporaryDirectory(prefix="bench-data-scaling-", dir=base_parent) as tmp:
        for r in range(repeat):
            for seg in segments:
                sides: list[Any] = []
                if "gregor" in args.systems:
                    sides.append(GregorSide(Path(tmp)))
                if dist is not None:
                    sides.append(KafkaSide(dist, Path(tmp)))
                if r % 2:
                    sides.reverse()
                for side in sides:
                    print(f"round {r + 1}/{repeat}: {side.name}, segments {seg or 'default'} MiB, "
                          f"{' -> '.join(f'{g:g}' for g in sizes)} GB", flush=True)
                    for cell in run_cell(side, seg, sizes, args):
                        cell["round"] = r
                        cell["load"] = os.getloadavg()[0]
                        cells.append(cell)
                        save()  # after every point: a run stopped hours in keeps what it measured
    save()
    points = [(seg, gb) for seg in segments for gb in sizes]
    md = side_by_side(cells, points, METRICS, "size, segments", label)
    (RESULTS_DIR / f"{name}.md").write_text(md)
    print(md)
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    if args.chart:
        path = chart_path(ROOT, RESULTS_DIR, name, "data_scaling")
        series = [(f"{'default' if not seg else f'{seg} MiB'} seg", [(seg, gb) for gb in sizes], list(sizes))
                  for seg in segments]
        chart(cells, series, METRICS, path, "One topic growing: Gregor vs Apache Kafka (same machine, same "
              "librdkafka client)", "GB in the topic")
        print(f"chart: {path}")


if __name__ == "__main__":
    main()
