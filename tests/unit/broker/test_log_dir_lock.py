"""Kafka's log-dir `.lock` (broker/log_dir_lock.py): one process per log directory, released however the holder
ends, and the registration lease the holder records for its successor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gregor.broker.log_dir_lock import LOCK_FILE, REGISTRATION_FILE, LogDirLock, LogDirLockedError

HOLD = """
import sys, time
from gregor.broker.log_dir_lock import LogDirLock
lock = LogDirLock(sys.argv[1].split(","))
print("locked", flush=True)
time.sleep(600)
"""


def _holder(dirs: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, ",".join(dirs)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_process_is_refused_naming_the_dir_and_takes_it_once_the_holder_is_killed(tmp_path: Path) -> None:
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    holder = _holder(dirs)
    try:
        with pytest.raises(LogDirLockedError) as refused:
            LogDirLock([str(tmp_path / "c"), dirs[1]])
        assert f"{dirs[1]}/{LOCK_FILE}" in str(refused.value) and "another broker process" in str(refused.value)
        assert isinstance(refused.value, OSError)  # the broker's main turns it into a message and exit 1
        # The dir it did lock before the refusal is released again: nothing half-held.
        LogDirLock([str(tmp_path / "c")]).release()
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops the flock with the process
        holder.wait()
    taken = LogDirLock(dirs)
    with pytest.raises(LogDirLockedError):  # even in the same process: a lock is per open file
        LogDirLock(dirs[:1])
    taken.release()
    LogDirLock(dirs).release()


def test_the_registration_lease_is_recorded_for_the_next_process_and_only_for_the_same_broker_id(tmp_path: Path) -> None:
    lock = LogDirLock([str(tmp_path / "a"), str(tmp_path / "b")])
    assert lock.previous_registration_lease(3) == 0  # a fresh dir: nothing to revoke
    lock.record_registration_lease(3, 0x1234)
    assert json.loads((tmp_path / "a" / REGISTRATION_FILE).read_text()) == {"broker_id": 3, "lease_id": 0x1234}
    assert not (tmp_path / "b" / REGISTRATION_FILE).exists()  # the first log dir only
    lock.release()
    nxt = LogDirLock([str(tmp_path / "a"), str(tmp_path / "b")])
    assert nxt.previous_registration_lease(3) == 0x1234
    assert nxt.previous_registration_lease(4) == 0, "the dirs served broker 3: broker 4 must not revoke its lease"
    (tmp_path / "a" / REGISTRATION_FILE).write_text("{not json")
    assert nxt.previous_registration_lease(3) == 0  # unreadable: wait for the lease, as without a record
    nxt.release()


def test_a_second_broker_on_the_same_log_dir_exits_at_once_naming_it(tmp_path: Path) -> None:
    """Two standalone brokers on one log.dirs: the second stops with exit 1 and a one-line error, the first
    keeps serving."""
    log_dir = str(tmp_path / "data")
    cmd = [sys.executable, "-m", "gregor.broker", "--log-dirs", log_dir, "--port", "0", "--data-port", "-1",
           "--metrics-port", "-1"]
    ready = tmp_path / "ready.json"
    first = subprocess.Popen([*cmd, "--ready-file", str(ready)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first broker did not start"
            time.sleep(0.05)
        started = time.monotonic()
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second.stderr
        assert time.monotonic() - started < 30
        assert f"cannot lock {log_dir}/{LOCK_FILE}: another broker process is using the log directory {log_dir}" \
            in second.stderr, second.stderr
        assert "Traceback" not in second.stderr, second.stderr
        assert first.poll() is None, "the first broker is unaffected"
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(60)
    assert os.path.exists(os.path.join(log_dir, LOCK_FILE))
