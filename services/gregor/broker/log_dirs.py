"""LogDirHealth: which log dirs are offline after a storage error, and when they come back.

Kafka takes a log dir offline on the first IOException in it (LogDirFailureChannel): every replica in
it goes offline, produce and fetch to them answer KAFKA_STORAGE_ERROR, and the dir stays offline until
the broker restarts. Gregor takes the dir offline the same way (the first OSError of an append in it,
ENOSPC above all) but brings it back without a restart: a probe task writes PROBE_BYTES to a file in
each offline dir every PROBE_INTERVAL_S, and once that write and its fsync succeed the dir is online
again. Before it is, the LogManager reopens (recovers, as after a crash) every log of the dir that saw a
failed write, so a torn write cannot stay in a log (docs/architecture.md, "A full log dir").

While a dir is offline, appends to its logs are refused up front (no write is tried, so a full disk is
not hammered) with KAFKA_STORAGE_ERROR naming the dir and the error; reads keep being served (the data
on disk is intact). One WARN when a dir goes offline and one INFO when it is back, never per record.
Concurrency: event-loop owned; `offline` is read by the produce and replica fetch paths on the loop.
"""

from __future__ import annotations

import errno as errno_mod
import logging
import os
import re
import weakref
from collections.abc import Callable

from prometheus_client import Counter, Gauge

from gregor.common import errors

log = logging.getLogger(__name__)

PROBE_FILE = ".gregor-log-dir-probe"
# A dir is back once this much can be written and fsynced in it: a dir with a few pages free would go
# online and offline again at every append.
PROBE_BYTES = 1 << 20
PROBE_INTERVAL_S = 1.0

LOG_DIR_OFFLINE = Gauge("gregor_log_dir_offline",
                        "1 while a log dir is offline after a storage error (Kafka's offline log dir), else 0",
                        ["dir"])
OFFLINE_LOG_DIRS = Gauge("gregor_broker_offline_log_directories",
                         "Log dirs offline after a storage error (Kafka's LogManager OfflineLogDirectoryCount)")
# Every broker's LogDirHealth in this process (tests run several brokers in one): the count sums them.
_HEALTHS: "weakref.WeakSet[LogDirHealth]" = weakref.WeakSet()
OFFLINE_LOG_DIRS.set_function(lambda: sum(len(h.offline) for h in list(_HEALTHS)))
LOG_DIR_STORAGE_ERRORS = Counter("gregor_log_dir_storage_errors_total",
                                 "Writes that failed with a storage error (ENOSPC, EIO...) in a log dir, each "
                                 "append, replica append or refused append of an offline dir counted once",
                                 ["dir"])

_OS_ERROR = re.compile(r"os error (\d+)")


def os_errno(exc: BaseException) -> int | None:
    """The errno of an OSError, also of the native engine's (its message ends "(os error N)")."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno
    m = _OS_ERROR.search(str(exc))
    return int(m.group(1)) if m else None


def describe(exc: BaseException) -> str:
    """"ENOSPC: No space left on device", or the exception's text when it has no errno."""
    code = os_errno(exc)
    if code is None:
        return str(exc)
    return f"{errno_mod.errorcode.get(code, str(code))}: {os.strerror(code)}"


def is_storage_error(exc: BaseException) -> bool:
    """An I/O failure of the file system (it takes the dir offline); not a bad batch or a closed log."""
    return isinstance(exc, OSError) or os_errno(exc) is not None


def probe(log_dir: str) -> None:
    """Write PROBE_BYTES to a file in log_dir, fsync it and remove it; raises OSError if the dir cannot."""
    path = os.path.join(log_dir, PROBE_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            chunk = b"\0" * (64 << 10)
            for _ in range(PROBE_BYTES // len(chunk)):
                os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


class LogDirHealth:
    """The offline log dirs of one broker (keys: normalized dir paths) and why each went offline."""

    def __init__(self, log_dirs: list[str]) -> None:
        self.dirs = [os.path.normpath(d) for d in log_dirs]
        self.offline: dict[str, str] = {}
        # Partition directories whose write failed: reopened (recovered) before their dir is online again.
        self.failed_logs: set[str] = set()
        # Told (dir, online) when a dir goes offline (False) or comes back (True): in cluster mode the broker
        # writes a log dir event notification for the controller (broker/log_dir_events.py).
        self.on_change: Callable[[str, bool], None] = lambda _dir, _online: None
        for d in self.dirs:
            LOG_DIR_OFFLINE.labels(dir=d).set(0)
        _HEALTHS.add(self)

    @staticmethod
    def dir_of(partition_dir: str) -> str:
        """The log dir holding a partition directory."""
        return os.path.dirname(os.path.normpath(partition_dir))

    def is_offline(self, partition_dir: str) -> bool:
        return bool(self.offline) and self.dir_of(partition_dir) in self.offline

    def _error(self, log_dir: str, topic: str, partition: int) -> errors.GregorError:
        return errors.error_for(errors.Code.KAFKA_STORAGE_ERROR,
                                f"Log directory {log_dir} is offline: {self.offline[log_dir]}",
                                topic=topic, partition=partition)

    def check(self, partition_dir: str, topic: str, partition: int) -> None:
        """Raise KAFKA_STORAGE_ERROR when the partition's log dir is offline (before any write)."""
        if self.offline:
            d = self.dir_of(partition_dir)
            if d in self.offline:
                LOG_DIR_STORAGE_ERRORS.labels(dir=d).inc()
                raise self._error(d, topic, partition)

    def failed(self, partition_dir: str, exc: BaseException, topic: str, partition: int) -> errors.GregorError:
        """A write in the partition's log dir failed with a storage error: the dir goes offline (one WARN);
        returns the KAFKA_STORAGE_ERROR to answer with."""
        d = self.dir_of(partition_dir)
        self.failed_logs.add(os.path.normpath(partition_dir))
        self.failed_dir(d, exc, f"{topic}-{partition}")
        return self._error(d, topic, partition)

    def failed_dir(self, log_dir: str, exc: BaseException, what: str) -> None:
        """A write of `what` in log_dir failed with a storage error (an append, the HW checkpoint): the dir goes
        offline, with one WARN when it was online."""
        d = os.path.normpath(log_dir)
        LOG_DIR_STORAGE_ERRORS.labels(dir=d).inc()
        if d in self.offline:
            return
        self.offline[d] = describe(exc)
        LOG_DIR_OFFLINE.labels(dir=d).set(1)
        log.warning("log dir %s is offline after a failed write of %s (%s): its partitions answer "
                    "KAFKA_STORAGE_ERROR until it can be written again", d, what, self.offline[d])
        self.on_change(d, False)

    def online(self, log_dir: str) -> None:
        """The dir can be written again (probe passed and its logs recovered): one INFO."""
        reason = self.offline.pop(log_dir, None)
        if reason is None:
            return
        LOG_DIR_OFFLINE.labels(dir=log_dir).set(0)
        log.info("log dir %s is online again (it was offline: %s)", log_dir, reason)
        self.on_change(log_dir, True)
