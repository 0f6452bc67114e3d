"""The broker's hold on its log directories (Kafka's `.lock`, LogManager.lockLogDirs) and the registration
lease it records there.

A broker takes an exclusive `flock` on `<dir>/.lock` in every log dir when it starts and keeps it for its
life; the kernel drops it when the process ends, however it ends (SIGKILL, OOM kill). So a second broker
process on the same directory is refused at once, with an error naming the directory, instead of two
processes writing one log; and a broker that holds the lock knows the previous process on the directory
is dead.

That knowledge shortens an unclean restart. A broker's registration (`brokers/ids/<id>`) is bound to an
etcd lease that outlives a SIGKILLed process by up to the session timeout, and the restarted broker
cannot register while the old key exists. The broker records its registration's lease id in
`<first log dir>/.registration`; at the next start, holding the lock, it may revoke that lease if the key
is still bound to it (`ClusterMembership`), and register at once. A key bound to another lease is
another live process's (the same broker id on another host: a configuration error) and is left alone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
REGISTRATION_FILE = ".registration"


class LogDirLockedError(OSError):
    """Another process holds a log directory's lock."""


class LogDirLock:
    """Exclusive locks on every log dir, held until `release` (or the process's end)."""

    def __init__(self, log_dirs: list[str]) -> None:
        self.log_dirs = log_dirs
        self._fds: list[int] = []
        try:
            for d in log_dirs:
                self._fds.append(self._lock(d))
        except BaseException:
            self.release()
            raise

    @staticmethod
    def _lock(d: str) -> int:
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LogDirLockedError(
                    exc.errno, f"cannot lock {path}: another broker process is using the log directory {d} "
                               f"(stop it, or give this broker its own log.dirs)") from None
            raise OSError(exc.errno, f"cannot lock {path}: {exc.strerror}") from None
        return fd

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing the descriptor drops its flock
        self._fds.clear()

    # -- the registration lease of the process that holds the lock ------------------------

    @property
    def _registration_path(self) -> str:
        return os.path.join(self.log_dirs[0], REGISTRATION_FILE)

    def previous_registration_lease(self, broker_id: int) -> int:
        """The lease id the previous process on these dirs registered broker `broker_id` with (0: none known)."""
        try:
            with open(self._registration_path, encoding="utf-8") as f:
                record = json.load(f)
            if int(record["broker_id"]) != broker_id:
                return 0  # the dirs served another broker id before: its lease is not ours to revoke
            return int(record["lease_id"])
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring %s: %s", self._registration_path, exc)
            return 0

    def record_registration_lease(self, broker_id: int, lease_id: int) -> None:
        """Record the lease our registration is bound to (temp file and rename, no fsync: after a machine
        crash the lease is long expired anyway, and a missing or older record only means waiting for it)."""
        tmp = self._registration_path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"broker_id": broker_id, "lease_id": lease_id}, f)
            os.replace(tmp, self._registration_path)
        except OSError as exc:  # an offline first dir: the next unclean restart waits for the lease instead
            log.warning("cannot record the registration lease in %s: %s", self._registration_path, exc)
