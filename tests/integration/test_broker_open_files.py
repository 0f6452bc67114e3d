"""Issue 24, the file wall: a replica holds one descriptor per segment (its .log; the offset and time
indexes are opened only to load and write), and a creation that would take a broker past its open-file
limit (`ulimit -n`) is refused up front with an error naming the limit while the broker keeps serving.

The CI form of `make bench-partition-fds` (bench/bench_partition_fds.py runs 10,000 partitions at RF 3)."""

from __future__ import annotations

import collections
import contextlib
import os
import resource
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gregor.cli.local_cluster import LocalCluster, Process
from gregor.client.producer import Producer
from tests.helpers.cluster import running_cluster
from tests.helpers.wait import until
from tests.integration.test_cli import failed, gregor, ok

PARTITIONS = 40
CONVERGE_S = 60.0


def descriptors_by_file(proc: Process) -> collections.Counter[str]:
    """The files under the broker's data dir its process holds open, by path (one count per descriptor)."""
    data = os.path.realpath(proc.data_dir)
    held: collections.Counter[str] = collections.Counter()
    for fd in os.listdir(f"/proc/{proc.pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
            if target.startswith(data + os.sep):
                held[target] += 1
    return held


def metric(proc: Process, name: str) -> float:
    with urllib.request.urlopen(proc.metrics, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported by {proc.role} {proc.id}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("fds")), brokers=3, controllers=1) as c:
        yield c


async def test_a_replica_holds_one_descriptor_per_segment(cluster: LocalCluster) -> None:
    boot = cluster.bootstrap
    # Small segments, so replicas have several: each holds one descriptor per segment, never more.
    ok(gregor("topics", "create", "many", "--partitions", str(PARTITIONS), "--replication-factor", "3",
              "--config", "segment.bytes=1024", bootstrap=boot))
    async with Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5}) as p:
        for round_ in range(4):
            sent = [await p.send("many", b"v" * 300, partition=i) for i in range(PARTITIONS)]
            await p.flush()
            assert [(await f).offset for f in sent] == [round_] * PARTITIONS
    brokers = cluster.by_role("broker")

    def replicas_caught_up() -> bool:
        return all(len(list(Path(b.data_dir).glob("**/many-*/*.log"))) >= PARTITIONS * 2 for b in brokers)

    await until(replicas_caught_up, CONVERGE_S, "every replica rolled a segment")
    for b in brokers:
        held = descriptors_by_file(b)
        assert not [f for f in held if f.endswith((".index", ".timeindex", ".txnindex"))], held
        dirs = sorted(Path(b.data_dir).glob("**/many-*"))
        assert len(dirs) == PARTITIONS, b.id
        for d in dirs:
            segments = len(list(d.glob("*.log")))
            open_here = sum(n for f, n in held.items() if Path(f).parent == d.resolve())
            assert 1 <= open_here <= segments, (d, open_here, segments)
        opened, limit = metric(b, "gregor_broker_open_file_descriptors"), metric(
            b, "gregor_broker_open_file_descriptors_max")
        assert 0 < opened < limit == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@contextlib.contextmanager
def open_file_limit(soft: int) -> Iterator[None]:
    """Processes started inside inherit this soft RLIMIT_NOFILE (`ulimit -n`)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


async def test_a_creation_past_the_open_file_limit_is_refused_up_front(tmp_path: Path) -> None:
    """Brokers at `ulimit -n 400` (a reserve of 100): 300 replicas each fit, 301 do not. The request that
    would pass the limit is refused before any replica is placed, naming the limit, and the broker keeps
    serving the partitions it has."""
    with contextlib.ExitStack() as stack:
        with open_file_limit(400):
            c = stack.enter_context(running_cluster(str(tmp_path), brokers=1, controllers=1))
        boot = c.bootstrap
        ok(gregor("topics", "create", "a", "--partitions", "200", "--replication-factor", "1", bootstrap=boot))
        r = gregor("topics", "create", "b", "--partitions", "101", "--replication-factor", "1", bootstrap=boot)
        failed(r, "POLICY_VIOLATION")
        assert "open-file limit (ulimit -n, RLIMIT_NOFILE) of 400" in r.stderr, r.stderr
        assert "301 replicas" in r.stderr, r.stderr
        r = gregor("topics", "alter", "a", "--partitions", "301", bootstrap=boot)
        failed(r, "POLICY_VIOLATION")
        assert "ulimit -n" in r.stderr
        assert "b" not in ok(gregor("topics", "list", bootstrap=boot)).split()
        assert "PartitionCount: 200" in ok(gregor("topics", "describe", "a", bootstrap=boot)).replace("\t", " ")
        # Up to the limit is fine, and every partition takes a write.
        ok(gregor("topics", "create", "b", "--partitions", "100", "--replication-factor", "1", bootstrap=boot))
        async with Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5}) as p:
            sent = [await p.send(t, b"x", partition=i) for t, n in (("a", 200), ("b", 100)) for i in range(n)]
            await p.flush()
            assert [(await f).offset for f in sent] == [0] * 300
        broker = c.by_role("broker")[0]
        assert metric(broker, "gregor_broker_open_file_descriptors_max") == 400
        assert metric(broker, "gregor_broker_open_file_descriptors") < 400
        ok(gregor("topics", "describe", bootstrap=boot))
