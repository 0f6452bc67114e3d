"""LogManager: opens, owns and maintains every partition log under log.dirs.

Directories are `<log.dir>/<topic>-<partition>` as in Kafka. Retention and
flush run as periodic tasks on the event loop; the native calls release the
GIL and run in worker threads so produce and fetch keep flowing.
Concurrency: event-loop owned; the native Log objects lock internally.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from typing import Any, Callable

import gregor_native as native

from gregor.common.config import BrokerConfig, log_config_kwargs
from gregor.common.clock import now_ms

log = logging.getLogger(__name__)

class LogManager:
    """Every partition log of this broker (event-loop owned)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.log_dirs = [d for d in config.log_dirs.split(",") if d]
        for d in self.log_dirs:
            os.makedirs(d, exist_ok=True)
        self.logs: dict[tuple[str, int], native.Log] = {}
        # Retention never deletes at or above a partition's high watermark (Kafka's
        # upperBoundOffset); the ReplicaManager, which owns the HW, installs this.
        self.retention_upper_bound: Callable[[tuple[str, int]], int | None] = lambda _key: None
        self._tasks: list[asyncio.Task[None]] = []

    def _dir_for(self, topic: str, partition: int) -> str:
        # Place new logs on the log dir with the fewest partitions, as Kafka does.
        for d in self.log_dirs:
            path = os.path.join(d, f"{topic}-{partition}")
            if os.path.isdir(path):
                return path
        counts = {d: sum(1 for _ in os.scandir(d)) for d in self.log_dirs}
        return os.path.join(min(self.log_dirs, key=lambda d: counts[d]), f"{topic}-{partition}")

    def get_or_create_log(self, topic: str, partition: int, topic_configs: dict[str, Any]) -> native.Log:
        key = (topic, partition)
        existing = self.logs.get(key)
        if existing is not None:
            return existing
        path = self._dir_for(topic, partition)
        opened = native.Log(path, native.LogConfig(**log_config_kwargs(topic_configs)), now_ms())
        if opened.recovered_bytes_truncated:
            log.warning("recovered %s-%d: cut %d bytes of torn or corrupt tail",
                        topic, partition, opened.recovered_bytes_truncated)
        self.logs[key] = opened
        return opened

    def update_config(self, topic: str, topic_configs: dict[str, Any]) -> None:
        cfg = native.LogConfig(**log_config_kwargs(topic_configs))
        for (t, _p), lg in self.logs.items():
            if t == topic:
                lg.update_config(cfg)

    def delete_log(self, topic: str, partition: int) -> None:
        lg = self.logs.pop((topic, partition), None)
        if lg is not None:
            lg.delete()
            return
        for d in self.log_dirs:
            shutil.rmtree(os.path.join(d, f"{topic}-{partition}"), ignore_errors=True)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._every(self.config.log_retention_check_interval_ms,
                                                        self.cleanup_logs), name="log-retention"))
        # flush.ms is per topic; check at least once a second whether any log is due.
        self._tasks.append(loop.create_task(self._every(min(1000, self.config.log_flush_scheduler_interval_ms),
                                                        self.flush_dirty_logs), name="log-flusher"))

    async def _every(self, interval_ms: int, job: Any) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000.0)
            try:
                await job()
            except Exception:  # keep the scheduler alive; the next run retries
                log.exception("periodic log job %s failed", job.__name__)

    async def cleanup_logs(self) -> int:
        """Retention (seed 003): delete whole expired or excess segments of every log."""
        deleted = 0
        for key, lg in list(self.logs.items()):
            bound = self.retention_upper_bound(key)
            deleted += await asyncio.to_thread(lg.delete_old_segments, now_ms(), upper_bound_offset=bound)
        return deleted

    async def flush_dirty_logs(self) -> None:
        for lg in list(self.logs.values()):
            await asyncio.to_thread(lg.maybe_flush, now_ms())

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for lg in self.logs.values():
            try:
                lg.close()
            except Exception:
                log.exception("closing %s", lg.dir)
        self.logs.clear()
