"""Group-coordinator metrics read at scrape time: committed offsets per group and partition (bounded), and
rebalance durations. Lag itself is computed in Prometheus from these offsets and the brokers' high watermarks
(deploy/prometheus/gregor-rules.yaml), so the coordinator never asks brokers for log end offsets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from gregor.common.metrics import PARTITION_SERIES_MAX, top_series

if TYPE_CHECKING:
    from gregor.coordinator.group_manager import GroupManager

# Rebalances last from milliseconds (static members) to the rebalance timeout (5 min by default).
REBALANCE_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
REBALANCE_TIME = Histogram("gregor_coordinator_rebalance_duration_seconds",
                           "From PreparingRebalance to Stable, seen at the coordinator's tick (RebalanceTimeMs)",
                           buckets=REBALANCE_BUCKETS_S)


class RebalanceTimer:
    """Start times of rebalances in progress; `observe_done` records those whose group is Stable again.
    Concurrency: event-loop owned (the coordinator's tick)."""

    def __init__(self) -> None:
        self.started_ms: dict[str, int] = {}

    def started(self, group_id: str, now_ms: int) -> None:
        self.started_ms.setdefault(group_id, now_ms)

    def observe_done(self, stable: dict[str, bool], now_ms: int) -> None:
        for group_id in list(self.started_ms):
            if group_id not in stable:  # deleted or moved to another coordinator
                del self.started_ms[group_id]
            elif stable[group_id]:
                REBALANCE_TIME.observe((now_ms - self.started_ms.pop(group_id)) / 1000)


class CommittedOffsetsCollector:
    """gregor_coordinator_committed_offset{group,topic,partition}, at most PARTITION_SERIES_MAX series
    (the groups' largest offsets win). Concurrency: read-only on the /metrics thread; copies first."""

    def __init__(self) -> None:
        self.managers: dict[int, "GroupManager"] = {}

    def collect(self) -> Iterator[Metric]:
        values: dict[tuple[str, ...], float] = {}
        for manager in list(self.managers.values()):
            for group in list(manager.groups.values()):
                for (topic, partition), committed in list(group.offsets.items()):
                    values[(group.group_id, topic, str(partition))] = committed[0]
        family = GaugeMetricFamily("gregor_coordinator_committed_offset",
                                   "Committed offset per group and partition (consumer lag = high watermark minus "
                                   f"this); at most {PARTITION_SERIES_MAX} series", labels=["group", "topic", "partition"])
        for labels, value in top_series(values):
            family.add_metric(list(labels), value)
        yield family


COMMITTED_OFFSETS = CommittedOffsetsCollector()
REGISTRY.register(COMMITTED_OFFSETS)  # type: ignore[arg-type]
