"""Shared fixtures: a real etcd or broker process on loopback, started through gregor's own launcher."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.helpers.cluster import Process, broker_process, etcd_process


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
