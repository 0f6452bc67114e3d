"""Shared fixtures: a real etcd or broker process on loopback, started through gregor's own launcher."""

from __future__ import annotations

import ast
import os
import sys
import threading

# Before anything imports grpc. PySpark launches its JVM with a preexec_fn, so the at-fork handlers run in the
# child; gRPC's (its core's fork support) ran there while other threads of this process were in gRPC calls,
# and in one CI rehearsal the gateway died before sending its port (JAVA_GATEWAY_EXITED: every tests/spark test
# errored) while this process's epoll poller saw EBADF. The processes the tests fork exec at once or use no gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
from typing import Any, Iterator

import pytest

from tests.helpers.cluster import Process, broker_process, etcd_process

if sys.version_info < (3, 12):
    # CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread: two threads in
    # ast.parse at once can fail one with "SystemError: AST constructor recursion depth mismatch" (CPython
    # gh-106905 and its family; a fresh-clone CI run's Hypothesis state machine hit it in inspect.getsource while
    # another thread of the test process parsed). Tests parse from several threads (Hypothesis, inspect, pytest's
    # assertion rewriting on imports): one parse at a time in the test process. The services never parse.
    _AST_LOCK = threading.Lock()
    _ast_parse = ast.parse

    def _one_parse_at_a_time(*args: Any, **kwargs: Any) -> Any:
        with _AST_LOCK:
            return _ast_parse(*args, **kwargs)

    ast.parse = _one_parse_at_a_time  # type: ignore[assignment]


@pytest.fixture
def broker(tmp_path) -> Iterator[Process]:  # type: ignore[no-untyped-def]
    """A standalone broker subprocess with its own data dir; .grpc is its address."""
    with broker_process(str(tmp_path / "cluster")) as proc:
        yield proc


@pytest.fixture
def etcd(tmp_path) -> Iterator[Process]:  # type: ignore[no-untyped-def]
    """A single-member etcd subprocess with its own data dir; .grpc is its client address."""
    with etcd_process(str(tmp_path / "etcd")) as proc:
        yield proc
