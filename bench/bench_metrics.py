"""The cost of Gregor's metrics: produce throughput with every process scraped once a second vs no
scraper (target >= 0.97), and the per-request metric work on the broker's produce path.

1. A local cluster (1 controller, 2 brokers); `gregor perf produce` (acks=1, 1 KiB records, no
   throughput cap) runs alternately without and with a thread that GETs every process's /metrics
   every second, `--repeat` rounds; the ratio is the median of the per-round with / without ratios.
2. The metric work one produce request does on the broker (rpc_method's timing, latency histogram
   and result counter, against the bare handler; the topic's bytes-in and messages-in counters),
   timed in a loop: it is per request, so it does not grow with records per batch; printed as µs per
   request and as a share of the Produce handler's own time per request during part 1 (from
   gregor_request_latency_seconds).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import timeit
import urllib.request
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import median, print_ratio, write_results  # noqa: E402
from gregor.cli.local_cluster import LocalCluster  # noqa: E402

PRODUCE_SUMMARY = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")
SCRAPE_INTERVAL_S = 1.0


class Scraper:
    """A thread that fetches every /metrics URL once per interval, like a Prometheus with scrape_interval 1s."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.scrapes = 0
        self.scrape_s = 0.0  # wall time of the scrapes: the served process renders /metrics meanwhile
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                started = timeit.default_timer()
                with urllib.request.urlopen(url, timeout=5) as r:
                    r.read()
                self.scrape_s += timeit.default_timer() - started
                self.scrapes += 1
            self._stop.wait(SCRAPE_INTERVAL_S)

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def perf_produce(data_dir: str, topic: str, records: int) -> float:
    env = {**os.environ, "GREGOR_DATA_DIR": data_dir}
    out = subprocess.run([sys.executable, "-m", "gregor.cli.main", "perf", "produce", "--topic", topic,
                          "--num-records", str(records), "--record-size", "1024", "--throughput", "-1",
                          "--producer-props", "acks=1"], capture_output=True, text=True, env=env, timeout=1800)
    m = PRODUCE_SUMMARY.match(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    if m is None:
        raise SystemExit(f"perf produce failed: {out.stdout[-500:]} {out.stderr[-2000:]}")
    return float(m.group(3))


def produce_handler_stats(url: str) -> tuple[float, float]:
    """(count, seconds) of the broker's Produce handler so far (gregor_request_latency_seconds)."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    count = total = 0.0
    for line in text.splitlines():
        if 'api="Produce"' in line and 'service="BrokerService"' in line:
            if line.startswith("gregor_request_latency_seconds_count{"):
                count += float(line.rsplit(" ", 1)[1])
            elif line.startswith("gregor_request_latency_seconds_sum{"):
                total += float(line.rsplit(" ", 1)[1])
    return count, total


def _drive(handler: Any) -> None:
    """Run a handler coroutine that never suspends to its end, without an event loop."""
    coro = handler(None, None, None)
    try:
        coro.send(None)
    except StopIteration:
        pass


def hot_path_cost_us(loops: int = 100_000) -> float:
    """µs of metric work one produce request does on the broker: rpc_method's wrapper (timing, latency
    histogram, result counter) measured against the bare handler, plus the topic's two counters."""
    from gregor.broker.replica_manager import BYTES_IN, MESSAGES_IN
    from gregor.common.rpc import rpc_method

    async def Produce(self: Any, request: Any, context: Any) -> None:
        return None

    wrapped = rpc_method("BenchService")(Produce)

    def topic_counters() -> None:
        BYTES_IN.labels(topic="bench").inc(16384)
        MESSAGES_IN.labels(topic="bench").inc(16)

    def best(fn: Any) -> float:
        return min(timeit.repeat(fn, number=loops, repeat=5)) / loops * 1e6

    return best(lambda: _drive(wrapped)) - best(lambda: _drive(Produce)) + best(topic_counters)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI size: fewer records and rounds (noisy)")
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None)
    args = ap.parse_args()
    records = args.records or (20_000 if args.quick else 150_000)
    repeat = args.repeat or (2 if args.quick else 8)
    results: dict[str, Any] = {"without": [], "with": [], "scrapes": 0, "scrape_s": 0.0}
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as data_dir:
        cluster = LocalCluster.up(data_dir, brokers=2, controllers=1)
        try:
            env = {**os.environ, "GREGOR_DATA_DIR": data_dir}
            subprocess.run([sys.executable, "-m", "gregor.cli.main", "topics", "create", "bench", "--partitions", "4",
                            "--replication-factor", "1"], check=True, env=env, capture_output=True)
            urls = [p.metrics for p in cluster.processes if p.metrics]
            broker_urls = [p.metrics for p in cluster.by_role("broker")]
            perf_produce(data_dir, "bench", records // 4)  # warm-up: connections, page cache
            before = [produce_handler_stats(u) for u in broker_urls]
            for i in range(repeat):
                for scraped in ((False, True) if i % 2 == 0 else (True, False)):
                    if scraped:
                        with Scraper(urls) as s:
                            results["with"].append(perf_produce(data_dir, "bench", records))
                        results["scrapes"] += s.scrapes
                        results["scrape_s"] += s.scrape_s
                    else:
                        results["without"].append(perf_produce(data_dir, "bench", records))
            after = [produce_handler_stats(u) for u in broker_urls]
            requests = sum(a[0] - b[0] for a, b in zip(after, before))
            handler_s = sum(a[1] - b[1] for a, b in zip(after, before))
        finally:
            cluster.down()
    print(f"perf produce, {records} x 1 KiB, acks=1, {repeat} rounds each side, alternating; "
          f"{results['scrapes']} scrapes of {len(urls)} processes, "
          f"{results['scrape_s'] / max(1, results['scrapes']) * 1000:.2f} ms wall per scrape under load")
    print_ratio("produce MB/s with a 1 s scraper (medians)", median(results["with"]), median(results["without"]),
                "MB/s")
    # Each round runs the two sides back to back: the median of the per-round ratios cancels the
    # drift of a shared machine's load better than the ratio of medians.
    pairs = [w / wo for w, wo in zip(results["with"], results["without"])]
    ratio = median(pairs)
    print(f"per-round ratios {', '.join(f'{p:.3f}' for p in pairs)}: median {ratio:.3f} "
          f"(target >= 0.97: {'OK' if ratio >= 0.97 else 'MISSED'}); load average {os.getloadavg()[0]:.1f}")
    cost_us = hot_path_cost_us()
    per_request_us = handler_s / requests * 1e6 if requests else float("nan")
    print(f"broker produce path: {cost_us:.2f} µs of metric work per request (timing + 3 updates, none per "
          f"record) vs {per_request_us:.0f} µs in the Produce handler per request ({requests:.0f} requests) "
          f"= {cost_us / per_request_us:.2%}")
    results.update({"ratio": ratio, "metric_cost_us_per_request": cost_us, "produce_requests": requests,
                    "handler_us_per_request": per_request_us})
    path = write_results("metrics_quick" if args.quick else "metrics", {"records": records, "repeat": repeat},
                         results)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
