"""Leader appends of 512 KiB and more are checked on a pool thread while the
calling thread writes them (native/src/log.rs); these tests cover what the
pool adds: a process forked after the pool started has none of its threads and
must still append (on one thread) instead of waiting forever."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import gregor_native as native

from tests.unit.native.support import values_batch


def _big_batch(tag: int) -> bytes:
    batch = values_batch(700, 1000, tag=tag)  # ~700 KiB: over the 512 KiB threshold
    assert len(batch) > 512 * 1024
    return batch


def test_forked_child_appends_after_the_parent_started_the_check_pool(tmp_path: Path) -> None:
    parent_log = native.Log(str(tmp_path / "parent"), native.LogConfig(max_message_bytes=2 << 20))
    parent_log.append_as_leader(_big_batch(0), 0)  # starts the pool in this process
    parent_log.close()
    pid = os.fork()
    if pid == 0:  # the child: a fresh log, a large append, exit code says whether it is right
        code = 1
        try:
            log = native.Log(str(tmp_path / "child"), native.LogConfig(max_message_bytes=2 << 20))
            info = log.append_as_leader(_big_batch(1), 0)
            log.close()
            code = 0 if (info.first_offset, info.log_end_offset) == (0, 700) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child's large append hung (waiting on the parent's check threads)")
    reopened = native.Log(str(tmp_path / "child"), native.LogConfig(max_message_bytes=2 << 20))
    try:
        assert reopened.log_end_offset == 700
        assert reopened.read(0, 2 << 20)[61:] == _big_batch(1)[61:]  # records as sent (the head was rewritten)
    finally:
        reopened.close()
