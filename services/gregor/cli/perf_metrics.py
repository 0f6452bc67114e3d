"""--print-metrics of `gregor perf`: Kafka-named client metrics the perf tools measure, printed as Kafka's
ToolsUtils.printMetrics prints a client's metrics."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from gregor.client.accumulator import ProducerBatch, record_size
from gregor.client.consumer import Consumer, ConsumerRecord


def metric_name(group: str, name: str, tags: Sequence[tuple[str, str]]) -> str:
    """A metric as Kafka prints it: group:name:{tag=value, ...} (tags in MetricName's insertion order)."""
    return group + ":" + name + ":{" + ", ".join(f"{k}={v}" for k, v in tags) + "}"


def metrics_lines(metrics: dict[str, float]) -> list[str]:
    """ToolsUtils.printMetrics: a blank line, a header, then `name : value` sorted by name, padded to the
    longest name, doubles with 3 decimals."""
    if not metrics:
        return []
    width = max(len(name) for name in metrics)
    return ["", f"{'Metric Name':<{width}}   Value"] + [f"{name:<{width}} : {value:.3f}"
                                                        for name, value in sorted(metrics.items())]


class ProducerPerfMetrics:
    """Kafka-named producer metrics measured from the perf run's own batches (for --print-metrics).

    Only what the tool sees exactly: records acknowledged or failed per completed batch,
    record and batch sizes as batch.size counts them (record_size estimates), and
    buffer.memory. Rates are over the whole run (Kafka's are over its last 30 s sample
    windows). Event-loop owned: batch callbacks feed it.
    """

    def __init__(self, client_id: str, topic: str, fixed_record_bytes: Optional[int]) -> None:
        self.client_id, self.topic = client_id, topic
        self.fixed_record_bytes = fixed_record_bytes
        self.records = self.errors = self.batches = 0
        self.record_bytes = self.record_bytes_max = self.batch_bytes_max = 0

    def on_batch(self, batch: ProducerBatch, failed: bool) -> None:
        n = len(batch.records)
        if failed:
            self.errors += n
            return
        if self.fixed_record_bytes is not None:
            sizes_total, size_max = n * self.fixed_record_bytes, self.fixed_record_bytes
        else:
            sizes = [record_size(k, v, h) for k, v, h, _ in batch.records]
            sizes_total, size_max = sum(sizes), max(sizes, default=0)
        self.records += n
        self.batches += 1
        self.record_bytes += sizes_total
        self.record_bytes_max = max(self.record_bytes_max, size_max)
        self.batch_bytes_max = max(self.batch_bytes_max, sizes_total)

    def snapshot(self, elapsed_s: float, buffer_total: int, buffer_available: int) -> dict[str, float]:
        elapsed_s = max(elapsed_s, 1e-9)
        client = (("client-id", self.client_id),)
        topic = client + (("topic", self.topic),)
        m = {
            ("producer-metrics", "record-send-total", client): self.records,
            ("producer-metrics", "record-send-rate", client): self.records / elapsed_s,
            ("producer-metrics", "record-error-total", client): self.errors,
            ("producer-metrics", "record-error-rate", client): self.errors / elapsed_s,
            ("producer-metrics", "record-size-avg", client): self.record_bytes / self.records if self.records else 0,
            ("producer-metrics", "record-size-max", client): self.record_bytes_max,
            ("producer-metrics", "batch-size-avg", client): self.record_bytes / self.batches if self.batches else 0,
            ("producer-metrics", "batch-size-max", client): self.batch_bytes_max,
            ("producer-metrics", "buffer-total-bytes", client): buffer_total,
            ("producer-metrics", "buffer-available-bytes", client): buffer_available,
            ("producer-topic-metrics", "record-send-total", topic): self.records,
            ("producer-topic-metrics", "record-send-rate", topic): self.records / elapsed_s,
            ("producer-topic-metrics", "record-error-total", topic): self.errors,
            ("producer-topic-metrics", "record-error-rate", topic): self.errors / elapsed_s,
            ("producer-topic-metrics", "byte-total", topic): self.record_bytes,
            ("producer-topic-metrics", "byte-rate", topic): self.record_bytes / elapsed_s,
        }
        return {metric_name(g, n, tags): float(v) for (g, n, tags), v in m.items()}


class ConsumerPerfMetrics:
    """Kafka-named consumer metrics measured by the perf run itself (for --print-metrics): records and bytes
    (key + value, as data.consumed.in.MB) consumed, the largest lag seen after a poll (high watermark
    of the partition's last fetch - next offset), assigned partitions and the rebalances the listener
    timed. Rates are over the whole run."""

    def __init__(self, client_id: str, topic: str) -> None:
        self.client_id, self.topic = client_id, topic
        self.lag_max = 0

    def on_records(self, consumer: Consumer, records: list[ConsumerRecord]) -> None:
        last: dict[int, int] = {}
        for r in records:
            last[r.partition] = r.offset
        for partition, offset in last.items():
            hw = consumer.highwater((self.topic, partition))
            if hw >= 0:
                self.lag_max = max(self.lag_max, hw - offset - 1)

    def snapshot(self, elapsed_s: float, messages: int, nbytes: int, assigned: int,
                 timer: Optional[Any]) -> dict[str, float]:
        elapsed_s = max(elapsed_s, 1e-9)
        client = (("client-id", self.client_id),)
        topic = client + (("topic", self.topic),)
        fetch = "consumer-fetch-manager-metrics"
        m: dict[tuple[str, str, Any], float] = {
            (fetch, "records-consumed-total", client): messages,
            (fetch, "records-consumed-rate", client): messages / elapsed_s,
            (fetch, "bytes-consumed-total", client): nbytes,
            (fetch, "bytes-consumed-rate", client): nbytes / elapsed_s,
            (fetch, "records-lag-max", client): self.lag_max,
            (fetch, "records-consumed-total", topic): messages,
            (fetch, "records-consumed-rate", topic): messages / elapsed_s,
            (fetch, "bytes-consumed-total", topic): nbytes,
            (fetch, "bytes-consumed-rate", topic): nbytes / elapsed_s,
        }
        if timer is not None:  # a group member: the coordinator's view of this consumer
            coord = "consumer-coordinator-metrics"
            m[(coord, "assigned-partitions", client)] = assigned
            m[(coord, "rebalance-total", client)] = timer.rebalances
            m[(coord, "rebalance-latency-total", client)] = timer.join_ms
            m[(coord, "rebalance-latency-avg", client)] = timer.join_ms / timer.rebalances if timer.rebalances else 0
            m[(coord, "rebalance-latency-max", client)] = timer.join_ms_max
        return {metric_name(g, n, tags): float(v) for (g, n, tags), v in m.items()}
