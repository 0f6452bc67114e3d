"""LogDirEventNotifier: tells the controller, through etcd, that one of this broker's log dirs went offline or
came back (Kafka's LogDirFailureHandler writing /log_dir_event_notification/log_dir_event_<seq>).

The notification names only the broker (and the event): the controller deletes it, sends this broker
LeaderAndIsr for all its replicas, and learns from the answers which replicas are offline (KAFKA_STORAGE_ERROR
per partition, ReplicaManager) and which are back. Kafka keeps a failed dir offline until the broker restarts;
Gregor's dir comes back by itself (broker/log_dirs.py), so a second event, LOG_DIR_ONLINE_EVENT, lets the
controller bring those replicas back as followers.

Concurrency: `notify` may be called from any thread (a failed write is noticed where it happens); the writes run
on the event loop, one at a time and in order, each retried until etcd takes it or the notifier stops.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gregor.common.etcd import EtcdClient, EtcdError
from gregor.common.etcd_layout import LOG_DIR_FAILURE_EVENT, LOG_DIR_ONLINE_EVENT, LogDirEventNotificationZNode

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.5


class LogDirEventNotifier:
    def __init__(self, etcd: EtcdClient, broker_id: int) -> None:
        self.etcd = etcd
        self.broker_id = broker_id
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
        self._seq = 0
        self._task: asyncio.Task[None] | None = self._loop.create_task(self._run(), name="log-dir-event-notifier")

    def notify(self, log_dir: str, online: bool) -> None:
        """Queue a notification for a dir that went offline (online=False) or came back (True)."""
        item = (log_dir, LOG_DIR_ONLINE_EVENT if online else LOG_DIR_FAILURE_EVENT)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._queue.put_nowait(item)
        else:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def _run(self) -> None:
        while True:
            log_dir, event = await self._queue.get()
            await self._write(log_dir, event)

    async def _write(self, log_dir: str, event: int) -> None:
        while True:
            self._seq += 1
            key = LogDirEventNotificationZNode.key(self.etcd, time.time_ns(), self.broker_id, self._seq)
            try:
                await self.etcd.put(key, LogDirEventNotificationZNode.encode(self.broker_id, event))
            except EtcdError as exc:
                log.warning("log dir event notification for %s failed, retrying: %s", log_dir, exc)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            log.info("log dir event notification written for %s (%s)", log_dir,
                     "back online" if event == LOG_DIR_ONLINE_EVENT else "gone offline")
            return

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
