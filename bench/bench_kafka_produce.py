"""The Kafka listener's per-request Produce cost, this tree against a baseline tree, in the same run.

Two standalone brokers side by side, one running the `gregor` package of --baseline (a directory holding
`gregor/`, e.g. an older commit's `services/` from `git archive`), one running this tree's. librdkafka
(confluent-kafka) sends the same load to each in alternating rounds: --records records of 200 bytes,
idempotent, acks=all (an ISR of one), `linger.ms=0` and at most 10 records a batch, so the listener's
per-request work (parse, dispatch, answer) dominates rather than the bytes. Reports per side the records/s
and the broker's CPU microseconds per Produce request (utime + stime of the broker process, /proc, over the
round, divided by the round's `gregor_kafka_requests_total{api="Produce"}`), medians over the rounds, and
the ratios this tree / baseline. Then the listener's own work alone, in a subprocess per tree: parse a
Produce v9 request, build and encode its answer, 3,000 times (CPU microseconds per request, best of 5). The
machine is shared with other work: the CPU per request is the steadier figure.

    git archive HEAD~1 services | tar -x -C /tmp/base
    python bench/bench_kafka_produce.py --baseline /tmp/base/services --quick    # 20,000 records, 2 rounds

Writes bench/results/kafka_produce[_quick].json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import write_results  # noqa: E402
from gregor.cli.local_cluster import LocalCluster  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
THIS_TREE = str(Path(__file__).resolve().parent.parent / "services")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def produce_requests(metrics_url: str) -> float:
    """gregor_kafka_requests_total{api="Produce"}, summed over the request versions (a baseline tree's counter
    may have no version label)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        return sum(float(line.split()[-1]) for line in r.read().decode().splitlines()
                   if line.startswith('gregor_kafka_requests_total{api="Produce"'))


def start(base: Path, name: str, services: str) -> LocalCluster:
    """A standalone broker whose Python path starts with `services` (its `gregor` package)."""
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([services, *[p for p in env_path.split(os.pathsep) if p]])
    try:
        c = LocalCluster.up(str(base / name), brokers=1)
    finally:
        os.environ["PYTHONPATH"] = env_path
    subprocess.run([sys.executable, "-m", "gregor.cli.main", "topics", "create", "bench", "--partitions", "1",
                    "--replication-factor", "1"], check=True, capture_output=True,
                   env={**os.environ, "GREGOR_DATA_DIR": c.data_dir})
    return c


def produce(c: LocalCluster, records: int) -> dict[str, float]:
    from confluent_kafka import Producer

    broker = c.by_role("broker")[0]
    p = Producer({"bootstrap.servers": str(c.to_json()["kafka_bootstrap"]), "enable.idempotence": True,
                  "acks": "all", "linger.ms": 0, "batch.num.messages": 10})
    p.produce("bench", value=b"w")  # connect and get a producer id outside the measured part
    assert p.flush(60) == 0
    value = b"x" * 200
    cpu0, req0, t0 = cpu_s(broker.pid), produce_requests(broker.metrics), time.perf_counter()
    for _ in range(records):
        while True:
            try:
                p.produce("bench", value=value)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(300) == 0
    elapsed = time.perf_counter() - t0
    cpu, requests = cpu_s(broker.pid) - cpu0, produce_requests(broker.metrics) - req0
    return {"records_per_s": records / elapsed, "requests": requests,
            "broker_cpu_us_per_request": cpu / max(requests, 1) * 1e6}


# The listener's own per-request work on a Produce, without the broker: parse a librdkafka-like v9 request
# (one partition, one 10-record batch's bytes), build and encode its answer, as kafka/server.py and
# kafka/handlers.py do. Run in a subprocess per tree; prints CPU microseconds per request (the best of 5).
MICRO = r"""
import struct, time, io
from kio.schema.produce.v9.request import ProduceRequest, TopicProduceData, PartitionProduceData
from kio.serial import entity_writer
from kio.static.constants import EntityType
from gregor.kafka import codec
req = ProduceRequest(transactional_id=None, acks=-1, timeout=__import__("datetime").timedelta(seconds=30),
                     topic_data=(TopicProduceData(name="bench", partition_data=(
                         PartitionProduceData(index=0, records=b"r" * 2300),)),))
out = io.BytesIO()
out.write(struct.pack(">hhih", 0, 9, 7, 7) + b"rdkafka" + b"\0")
entity_writer(ProduceRequest)(out, req)
frame = out.getvalue()
best = None
for _ in range(5):
    n = 3000
    t = time.thread_time()
    for _ in range(n):
        header, pos = codec.read_header(frame)
        request = codec.parse_body(frame, pos, header)
        mod = codec.module(header.api_key, header.api_version, EntityType.response)
        parts = [(str(t.name), int(p.index), bytes(p.records or b"")) for t in request.topic_data
                 for p in t.partition_data]
        pr = [codec.build(mod.PartitionProduceResponse, index=i, error_code=0, base_offset=100,
                          log_append_time=-1, log_start_offset=0, error_message=None) for _, i, _ in parts]
        body = codec.build(mod.ProduceResponse, responses=[
            codec.build(mod.TopicProduceResponse, name=parts[0][0], partition_responses=pr)])
        codec.encode_response(header, body)
    us = (time.thread_time() - t) / n * 1e6
    best = us if best is None else min(best, us)
print(best)
"""


def micro(services: str) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([services, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", MICRO], env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="a directory holding the baseline's gregor package")
    ap.add_argument("--quick", action="store_true", help="20,000 records, 2 rounds")
    ap.add_argument("--records", type=int, help="records per round and side (default 100,000)")
    ap.add_argument("--repeat", type=int, help="rounds (default 3; 2 with --quick)")
    args = ap.parse_args()
    records = args.records or (20_000 if args.quick else 100_000)
    rounds = args.repeat or (2 if args.quick else 3)
    trees = {"baseline": os.path.abspath(args.baseline), "this_tree": THIS_TREE}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="bench-kafka-produce-") as tmp:
        sides: dict[str, LocalCluster] = {}
        try:
            for name, services in trees.items():
                sides[name] = start(Path(tmp), name, services)
            for r in range(rounds):
                for name in (["baseline", "this_tree"] if r % 2 == 0 else ["this_tree", "baseline"]):
                    runs[name].append(produce(sides[name], records))
                    print(name, runs[name][-1], flush=True)
        finally:
            for c in sides.values():
                c.down()
    listener_us = {name: statistics.median(micro(services) for _ in range(3)) for name, services in trees.items()}
    for name in trees:
        runs[name][0]["listener_cpu_us_per_request"] = listener_us[name]  # reported below, not per round
    keys = ("records_per_s", "broker_cpu_us_per_request")
    med = {name: {k: statistics.median(run[k] for run in rs) for k in keys} for name, rs in runs.items()}
    ratios = {k: med["this_tree"][k] / med["baseline"][k] for k in keys}
    print(f"{'side':<10} {'records/s':>10} {'broker CPU us/request':>22}")
    for name in trees:
        print(f"{name:<10} {med[name]['records_per_s']:>10.0f} {med[name]['broker_cpu_us_per_request']:>22.0f}")
    print(f"{'ratio':<10} {ratios['records_per_s']:>10.2f} {ratios['broker_cpu_us_per_request']:>22.2f}  "
          f"(this tree / baseline)")
    print("listener alone (parse a Produce v9, build and encode its answer), CPU us/request: " +
          ", ".join(f"{name} {us:.1f}" for name, us in listener_us.items()) +
          f"; ratio {listener_us['this_tree'] / listener_us['baseline']:.2f}")
    ratios["listener_cpu_us_per_request"] = listener_us["this_tree"] / listener_us["baseline"]
    out: dict[str, Any] = {"records": records, "rounds": rounds, "baseline": trees["baseline"], "runs": runs,
                           "listener_cpu_us_per_request": listener_us,
                           "median": med, "ratio_this_tree_over_baseline": ratios, "loadavg": os.getloadavg()}
    write_results(f"kafka_produce{'_quick' if args.quick else ''}", {"records": records, "rounds": rounds}, out)


if __name__ == "__main__":
    main()
