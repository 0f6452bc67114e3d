"""LogDirHealth (broker/log_dirs.py): a storage error takes a log dir offline once, appends to it are refused with
KAFKA_STORAGE_ERROR naming the dir and the errno, and it comes back online once. Pure bookkeeping; the real
full file system is tests/integration/test_log_dir_full.py."""

from __future__ import annotations

import errno
import logging
import os

import pytest
from prometheus_client import REGISTRY

from gregor.broker.log_dirs import LogDirHealth, describe, is_storage_error, os_errno, probe
from gregor.common import errors


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_the_native_engines_io_errors_carry_their_errno_in_the_text() -> None:
    native_like = OSError("No space left on device (os error 28)")  # pyo3 passes only the message
    assert os_errno(native_like) == errno.ENOSPC and is_storage_error(native_like)
    assert describe(native_like) == "ENOSPC: No space left on device"
    assert describe(OSError(errno.EIO, "Input/output error")) == "EIO: Input/output error"
    assert not is_storage_error(ValueError("invalid record: batch base offset 0 where 1 was expected"))


def test_a_dir_goes_offline_once_and_comes_back_once(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    health = LogDirHealth([a, b])
    full = OSError("No space left on device (os error 28)")
    caplog.set_level(logging.INFO, logger="gregor.broker.log_dirs")
    health.check(os.path.join(a, "t-0"), "t", 0)  # online: nothing raised
    before = sample("gregor_log_dir_storage_errors_total", dir=a) or 0.0
    err = health.failed(os.path.join(a, "t-0"), full, "t", 0)
    assert err.code == errors.Code.KAFKA_STORAGE_ERROR and err.retriable
    assert f"Log directory {a} is offline: ENOSPC: No space left on device" in str(err)
    health.failed(os.path.join(a, "t-1"), full, "t", 1)  # a second failure in the same dir: no second WARN
    with pytest.raises(errors.GregorError) as refused:
        health.check(os.path.join(a, "u-0"), "u", 0)  # every log of the dir, not only those that failed
    assert refused.value.code == errors.Code.KAFKA_STORAGE_ERROR
    health.check(os.path.join(b, "t-2"), "t", 2)  # the other dir serves
    assert sample("gregor_log_dir_offline", dir=a) == 1.0 and sample("gregor_log_dir_offline", dir=b) == 0.0
    assert (sample("gregor_log_dir_storage_errors_total", dir=a) or 0.0) - before == 3
    assert health.failed_logs == {os.path.join(a, "t-0"), os.path.join(a, "t-1")}
    health.online(a)
    health.online(a)  # already online: no second INFO
    health.check(os.path.join(a, "t-0"), "t", 0)
    assert sample("gregor_log_dir_offline", dir=a) == 0.0
    lines = [r.getMessage() for r in caplog.records]
    assert sum(f"log dir {a} is offline" in m for m in lines) == 1, lines
    assert sum(f"log dir {a} is online again" in m for m in lines) == 1, lines


def test_the_probe_leaves_nothing_behind(tmp_path) -> None:
    probe(str(tmp_path))
    assert os.listdir(tmp_path) == []
    with pytest.raises(OSError):
        probe(str(tmp_path / "missing"))
