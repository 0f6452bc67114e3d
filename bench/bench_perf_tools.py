"""`gregor perf produce` and `gregor perf consume` against one broker on loopback, as a user runs them.

The perf tools (kafka-producer-perf-test / kafka-consumer-perf-test, seed 003's format) run as
`python -m gregor.cli.main` subprocesses through the client SDK: 300,000 records of 1 KiB,
acks=1, --throughput -1, a topic of 3 partitions; then perf consume of the same records over
gRPC and over the broker's zero-copy data port (fetch.transport=data).

Baselines, measured in the same run with bench_broker.py's code (nothing copied):
- null gRPC: a servicer that discards Produce requests and answers Fetch from memory, driven
  with pre-built 1 MiB requests (16 KiB batches of 1 KiB records, 5 in flight): the ceiling of
  gRPC on loopback in Python here;
- raw broker: the same pre-built requests to the real broker (partition 0 of another topic):
  what the broker takes when no client builds the batches.
Each round runs the baselines and then the perf tools back to back; a ratio is taken within its
round and the medians over --repeat rounds (default 3) are reported, since the machine is shared.
The ratio perf/null says how much of the transport ceiling the whole client path keeps;
perf/raw says what the SDK (accumulator, encoding, callbacks, fetch decoding) costs on top
of the broker. MB/s is MiB/s of record values (the tools' "MB"); the raw sides count request
bytes (about 2 % record and batch overhead on top of the values).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.bench_broker import NULL_SERVER, fetch_load, produce_load, request_payload  # noqa: E402
from bench.common import median, write_results  # noqa: E402
from gregor.common.memory import tune_allocator  # noqa: E402

RECORD_BYTES = 1024
PARTITIONS = 3
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PRODUCE_SUMMARY = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                             r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\.$")
CONSUME_ROW = re.compile(r"^(\S+ \S+), (\S+ \S+), ([\d.]+), ([\d.]+), (\d+), ([\d.]+), (\d+), (-?\d+), ([\d.]+), "
                         r"([\d.]+)$")


@contextmanager
def null_servicer() -> Iterator[str]:
    """bench_broker.py's null gRPC servicer in its own process (the same allocator tuning); yields host:port."""
    proc = subprocess.Popen([sys.executable, "-c", "from gregor.common.memory import tune_allocator; "
                             "tune_allocator()\n" + NULL_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        yield f"127.0.0.1:{proc.stdout.readline().strip()}"  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()


def gregor(bootstrap: str, *args: str) -> list[str]:
    """Run `gregor --bootstrap B ARGS` as a user would; its stdout lines (stderr passes through)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "services"), ROOT])}
    env.pop("GREGOR_BOOTSTRAP", None)
    proc = subprocess.run([sys.executable, "-m", "gregor.cli.main", "--bootstrap", bootstrap, *args],
                          stdout=subprocess.PIPE, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"gregor {' '.join(args)} exited with {proc.returncode}:\n{proc.stdout}")
    return proc.stdout.splitlines()


def perf_produce(bootstrap: str, topic: str, records: int) -> tuple[str, dict[str, float]]:
    lines = gregor(bootstrap, "perf", "produce", "--topic", topic, "--num-records", str(records), "--record-size",
                   str(RECORD_BYTES), "--throughput", "-1", "--producer-props", "acks=1")
    m = PRODUCE_SUMMARY.match(lines[-1])
    if m is None:
        raise SystemExit(f"unexpected perf produce output: {lines[-1]!r}")
    keys = ("records", "records_per_sec", "mb_per_sec", "avg_latency_ms", "max_latency_ms", "p50_ms", "p95_ms",
            "p99_ms", "p999_ms")
    return lines[-1], dict(zip(keys, map(float, m.groups())))


def perf_consume(bootstrap: str, topic: str, records: int, *props: str) -> tuple[str, dict[str, float]]:
    args = ["perf", "consume", "--topic", topic, "--messages", str(records), "--hide-header"]
    if props:
        args += ["--consumer-props", *props]
    lines = gregor(bootstrap, *args)
    m = CONSUME_ROW.match(lines[-1])
    if m is None or int(m.group(5)) != records:
        raise SystemExit(f"unexpected perf consume output: {lines!r}")
    keys = ("mb", "mb_per_sec", "messages", "msg_per_sec", "rebalance_ms", "fetch_ms", "fetch_mb_per_sec",
            "fetch_msg_per_sec")
    return lines[-1], dict(zip(keys, map(float, m.groups()[2:])))


def one_round(null: str, bootstrap: str, payload: bytes, records: int, tag: str) -> dict[str, Any]:
    """Baselines and the three perf runs back to back (fresh topics), so each ratio compares like with like."""
    from tests.integration.test_broker import create_topic

    total = records * RECORD_BYTES
    r: dict[str, Any] = {"load_average": os.getloadavg()[0]}
    r["null_produce_mb_s"] = asyncio.run(produce_load(null, "t", payload, total))
    r["null_fetch_mb_s"] = asyncio.run(fetch_load(null, "t", total))
    asyncio.run(create_topic(bootstrap, f"raw-{tag}"))
    r["raw_produce_mb_s"] = asyncio.run(produce_load(bootstrap, f"raw-{tag}", payload, total))
    r["raw_fetch_mb_s"] = asyncio.run(fetch_load(bootstrap, f"raw-{tag}", total))
    topic = f"perf-{tag}"
    asyncio.run(create_topic(bootstrap, topic, PARTITIONS))
    r["produce_line"], r["perf_produce"] = perf_produce(bootstrap, topic, records)
    r["consume_grpc_line"], r["perf_consume_grpc"] = perf_consume(bootstrap, topic, records)
    r["consume_data_line"], r["perf_consume_data"] = perf_consume(bootstrap, topic, records, "fetch.transport=data")
    produce, grpc, data = (r["perf_produce"]["mb_per_sec"], r["perf_consume_grpc"]["fetch_mb_per_sec"],
                           r["perf_consume_data"]["fetch_mb_per_sec"])
    r["ratios"] = {"produce_vs_null": produce / r["null_produce_mb_s"],
                   "produce_vs_raw": produce / r["raw_produce_mb_s"],
                   "consume_grpc_vs_null": grpc / r["null_fetch_mb_s"],
                   "consume_grpc_vs_raw": grpc / r["raw_fetch_mb_s"],
                   "consume_data_vs_null": data / r["null_fetch_mb_s"],
                   "consume_data_vs_raw": data / r["raw_fetch_mb_s"]}
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="30,000 records, one round (CI smoke size; noisy)")
    ap.add_argument("--records", type=int, default=300_000, help="records of 1 KiB per perf run")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; figures are medians over them")
    args = ap.parse_args()
    records = 30_000 if args.quick else args.records
    repeat = 1 if args.quick else max(1, args.repeat)
    tune_allocator()  # the same allocator settings as the broker and the CLI (gregor.common.memory)
    payload = request_payload()

    from tests.helpers.cluster import broker_process

    rounds = []
    with null_servicer() as null, \
            tempfile.TemporaryDirectory(dir=os.path.join(os.path.dirname(__file__), "results")) as tmp, \
            broker_process(tmp) as b:
        for i in range(repeat):
            rounds.append(one_round(null, b.grpc, payload, records, str(i)))

    print(f"gregor perf produce --num-records {records} --record-size {RECORD_BYTES} --throughput -1 "
          f"--producer-props acks=1 ({PARTITIONS} partitions), one line per round:")
    for r in rounds:
        print(f"  {r['produce_line']}")
    print("gregor perf consume --hide-header (gRPC fetch, then fetch.transport=data, the sendfile port), per round:")
    print("  start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, "
          "fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
    for r in rounds:
        print(f"  {r['consume_grpc_line']}\n  {r['consume_data_line']}")

    def med(f: Any) -> float:
        return median([f(r) for r in rounds])

    summary: dict[str, Any] = {
        "perf_produce_mb_s": med(lambda r: r["perf_produce"]["mb_per_sec"]),
        "perf_consume_grpc_fetch_mb_s": med(lambda r: r["perf_consume_grpc"]["fetch_mb_per_sec"]),
        "perf_consume_data_fetch_mb_s": med(lambda r: r["perf_consume_data"]["fetch_mb_per_sec"]),
        **{k: med(lambda r, k=k: r[k]) for k in ("null_produce_mb_s", "null_fetch_mb_s", "raw_produce_mb_s",
                                                  "raw_fetch_mb_s")},
        "ratios": {k: med(lambda r, k=k: r["ratios"][k]) for k in rounds[0]["ratios"]},
    }
    print(f"medians of {repeat} round(s); each ratio is taken within its round, against that round's baseline:")
    ratios = summary["ratios"]
    for label, value, base, ratio in (
            ("perf produce vs null gRPC", "perf_produce_mb_s", "null_produce_mb_s", "produce_vs_null"),
            ("perf produce vs raw gRPC to the broker", "perf_produce_mb_s", "raw_produce_mb_s", "produce_vs_raw"),
            ("perf consume (grpc) fetch.MB.sec vs null gRPC", "perf_consume_grpc_fetch_mb_s", "null_fetch_mb_s",
             "consume_grpc_vs_null"),
            ("perf consume (grpc) fetch.MB.sec vs raw gRPC fetch", "perf_consume_grpc_fetch_mb_s", "raw_fetch_mb_s",
             "consume_grpc_vs_raw"),
            ("perf consume (data) fetch.MB.sec vs null gRPC", "perf_consume_data_fetch_mb_s", "null_fetch_mb_s",
             "consume_data_vs_null"),
            ("perf consume (data) fetch.MB.sec vs raw gRPC fetch", "perf_consume_data_fetch_mb_s", "raw_fetch_mb_s",
             "consume_data_vs_raw")):
        print(f"{label}: {summary[value]:,.3f} MiB/s vs baseline {summary[base]:,.3f} MiB/s = "
              f"ratio {ratios[ratio]:.3f}", flush=True)
    for label, key, target in (("perf produce", "perf_produce_mb_s", 150.0),
                               ("perf consume (gRPC)", "perf_consume_grpc_fetch_mb_s", 300.0),
                               ("perf consume (data port)", "perf_consume_data_fetch_mb_s", 300.0)):
        verdict = "OK" if summary[key] >= target else "MISSED"
        print(f"  {label}: {summary[key]:,.1f} MiB/s (issue 2 target >= {target:.0f} MiB/s on 2 cores: {verdict})",
              flush=True)
    path = write_results("perf_tools_quick" if args.quick else "perf_tools",
                         {"quick": args.quick, "records": records, "record_bytes": RECORD_BYTES, "repeat": repeat,
                          "partitions": PARTITIONS, "acks": "1", "throughput": -1},
                         {"median": summary, "rounds": rounds})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
