"""Broker gauges computed at scrape time from the replica manager's state, so the hot path pays nothing.

Kafka's ReplicaManager and Log MBeans (AtMinIsrPartitionCount, OfflinePartitionsCount, Log Size,
NumLogSegments, LogStartOffset, LogEndOffset) are read when Prometheus scrapes: one pass over the
hosted partitions per scrape instead of an update per produce request. Topic-level labels by
default; metrics.partition.level.enable=true adds a partition label (one series per replica).
"""

from __future__ import annotations

import os
import resource
import shutil
from typing import TYPE_CHECKING, Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replica_manager import ReplicaManager



class BrokerStateCollector:
    """A prometheus_client collector over the process's ReplicaManagers (one in a broker process; tests
    may run several in one process and see their sum). Concurrency: read-only, runs on the /metrics
    thread; it copies the partition dicts first, so a concurrent add/remove cannot break it."""

    def __init__(self) -> None:
        self.sources: dict[int, tuple["ReplicaManager", list[str]]] = {}
        self.partition_level = False

    def collect(self) -> Iterator[Metric]:
        sources = list(self.sources.values())
        partitions = [p for rm, _ in sources for p in list(rm.partitions.values())]
        log_dirs = sorted({d for _, dirs in sources for d in dirs})
        at_min = GaugeMetricFamily("gregor_broker_at_min_isr_partitions",
                                   "Led partitions whose ISR size equals min.insync.replicas (AtMinIsrPartitionCount)")
        at_min.add_metric([], sum(1 for p in partitions if p.is_leader and len(p.isr) == p.min_insync_replicas))
        yield at_min
        offline = GaugeMetricFamily("gregor_broker_offline_replicas",
                                    "Hosted replicas that know no live leader (leader -1)")
        offline.add_metric([], sum(1 for p in partitions if p.leader_id < 0))
        yield offline
        yield from self._log_families(partitions)
        yield from self._disk_families(log_dirs)
        if sources:
            yield from self._file_families()

    def _log_families(self, partitions: list["Partition"]) -> Iterator[Metric]:
        labels = ["topic", "partition"] if self.partition_level else ["topic"]
        size = GaugeMetricFamily("gregor_log_size_bytes", "Bytes of the partition logs on disk (Log Size)", labels=labels)
        segments = GaugeMetricFamily("gregor_log_segments", "Log segments (NumLogSegments)", labels=labels)
        start = GaugeMetricFamily("gregor_log_start_offset", "Log start offset; summed over a topic's replicas "
                                  "here without the partition label (LogStartOffset)", labels=labels)
        end = GaugeMetricFamily("gregor_log_end_offset", "Log end offset; summed over a topic's replicas here "
                                "without the partition label (LogEndOffset)", labels=labels)
        hw = GaugeMetricFamily("gregor_broker_leader_high_watermark", "High watermark of the partitions this "
                               "broker leads, summed per topic without the partition label (consumer lag's end)",
                               labels=labels)
        rows: dict[tuple[str, ...], list[int]] = {}
        for p in partitions:
            try:
                log = p.log
                values = [log.size_bytes, log.num_segments, log.log_start_offset, log.log_end_offset,
                          p.high_watermark if p.is_leader else 0, 1 if p.is_leader else 0]
            except Exception:  # a log closed by a concurrent delete: skip it this scrape
                continue
            key: tuple[str, ...] = (p.topic, str(p.partition)) if self.partition_level else (p.topic,)
            acc = rows.setdefault(key, [0] * 6)
            for i, v in enumerate(values):
                acc[i] += int(v)
        for key, (s, n, lso, leo, hwm, leads) in sorted(rows.items()):
            size.add_metric(list(key), s)
            segments.add_metric(list(key), n)
            start.add_metric(list(key), lso)
            end.add_metric(list(key), leo)
            if leads:
                hw.add_metric(list(key), hwm)
        yield from (size, segments, start, end, hw)

    @staticmethod
    def _disk_families(log_dirs: list[str]) -> Iterator[Metric]:
        free = GaugeMetricFamily("gregor_broker_log_dir_free_bytes", "Free bytes of the file system of a log dir",
                                 labels=["dir"])
        total = GaugeMetricFamily("gregor_broker_log_dir_total_bytes", "Size of the file system of a log dir",
                                  labels=["dir"])
        for d in log_dirs:
            try:
                usage = shutil.disk_usage(d)
            except OSError:
                continue
            free.add_metric([os.path.abspath(d)], usage.free)
            total.add_metric([os.path.abspath(d)], usage.total)
        yield free
        yield total

    @staticmethod
    def _file_families() -> Iterator[Metric]:
        """Open descriptors against the soft RLIMIT_NOFILE (`ulimit -n`): a replica holds one per segment,
        plus one per connection; at the limit every new segment, socket and file fails (issue 24)."""
        opened, limit = open_file_descriptors()
        now = GaugeMetricFamily("gregor_broker_open_file_descriptors",
                                "File descriptors the broker process has open (a replica holds one per segment)")
        now.add_metric([], opened)
        yield now
        top = GaugeMetricFamily("gregor_broker_open_file_descriptors_max",
                                "The broker process's open-file limit (soft RLIMIT_NOFILE, ulimit -n)")
        top.add_metric([], limit)
        yield top


def open_file_descriptors() -> tuple[int, int]:
    """(descriptors open now, soft open-file limit) of this process; the limit is -1 when unlimited."""
    try:
        opened = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself holds
    except OSError:
        opened = -1
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return opened, -1 if soft == resource.RLIM_INFINITY else int(soft)


COLLECTOR = BrokerStateCollector()
REGISTRY.register(COLLECTOR)  # type: ignore[arg-type]


def watch_broker(replica_manager: "ReplicaManager", log_dirs: list[str], partition_level: bool = False) -> None:
    """Export this replica manager's state at scrape time (until unwatch_broker)."""
    COLLECTOR.sources[id(replica_manager)] = (replica_manager, list(log_dirs))
    COLLECTOR.partition_level = partition_level


def unwatch_broker(replica_manager: "ReplicaManager") -> None:
    COLLECTOR.sources.pop(id(replica_manager), None)
