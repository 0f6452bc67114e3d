"""What consumers see: exact reads up to the end offsets of an isolation level (no settle-time guessing)."""

from __future__ import annotations

import asyncio
import time
import uuid

from gregor.client import AdminClient, Consumer, Producer
from gregor.client.admin import NewTopic
from gregor.client.group_admin import GroupAdmin
from tests.helpers.cluster import LocalCluster

PARTITIONS = 3
Read = dict[int, list[bytes]]  # partition -> values in offset order


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(c: LocalCluster, topic: str, partitions: int = PARTITIONS) -> None:
    async def run() -> None:
        async with AdminClient({"bootstrap.servers": c.bootstrap}) as admin:
            await admin.create_topics([NewTopic(topic, partitions, 3)])
    asyncio.run(run())


async def _read(bootstrap: str, topic: str, isolation: str, partitions: int, timeout_s: float) -> Read:
    tps = [(topic, p) for p in range(partitions)]
    out: Read = {p: [] for p in range(partitions)}
    last: dict[int, int] = {}
    async with Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation,
                         "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100}) as consumer:
        ends = await consumer.end_offsets(tps)
        # No explicit seek: position() below waits for the partition's one auto.offset.reset (it used to
        # start a second one, racing the fetch task's, and records came twice; issue 19).
        consumer.assign(tps)
        deadline = time.monotonic() + timeout_s
        while True:
            for r in sorted(await consumer.poll(200), key=lambda r: (r.partition, r.offset)):
                # a consumer returns each offset once, in increasing order (else a duplicate is the consumer's)
                assert r.offset > last.get(r.partition, -1), (
                    f"{isolation} consumer returned {topic}-{r.partition}@{r.offset} after @{last[r.partition]}")
                last[r.partition] = r.offset
                out[r.partition].append(r.value or b"")
            if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                return out
            assert time.monotonic() < deadline, f"{isolation} read of {topic} did not reach {ends}"


def read(c: LocalCluster, topic: str, isolation: str, partitions: int = PARTITIONS, timeout_s: float = 60) -> Read:
    """Every record of topic a consumer at `isolation` returns, up to that level's end offsets (HW or LSO)."""
    return asyncio.run(_read(c.bootstrap, topic, isolation, partitions, timeout_s))


def wait_no_open_transaction(c: LocalCluster, topic: str, partitions: int = PARTITIONS, timeout_s: float = 60) -> None:
    """Until read_committed's end offsets (LSO) equal read_uncommitted's (HW): the markers are written."""
    async def ends(iso: str) -> dict[tuple[str, int], int]:
        async with Consumer({"bootstrap.servers": c.bootstrap, "isolation.level": iso}) as consumer:
            return await consumer.end_offsets([(topic, p) for p in range(partitions)])
    deadline = time.monotonic() + timeout_s
    while asyncio.run(ends("read_committed")) != asyncio.run(ends("read_uncommitted")):
        assert time.monotonic() < deadline, f"a transaction on {topic} stays open"
        time.sleep(0.2)


def end_open_transaction(c: LocalCluster, transactional_id: str) -> None:
    """Kafka's way to end whatever a transactional.id left open: a new instance's init_transactions aborts it."""
    async def run() -> None:
        async with Producer({"bootstrap.servers": c.bootstrap, "transactional.id": transactional_id}) as p:
            await p.init_transactions()
    asyncio.run(run())


def group_offsets(c: LocalCluster, group_id: str, want: dict[tuple[str, int], int] | None = None,
                  timeout_s: float = 30) -> dict[tuple[str, int], int]:
    """The group's committed offsets; with `want`, polled until they equal it (the coordinator applies offsets
    of a committed transaction when its marker is written, after EndTxn answers) or timeout_s passed."""
    async def run() -> dict[tuple[str, int], int]:
        async with GroupAdmin({"bootstrap.servers": c.bootstrap}) as admin:
            return await admin.committed_offsets(group_id)
    deadline = time.monotonic() + timeout_s
    got = asyncio.run(run())
    while want is not None and got != want and time.monotonic() < deadline:
        time.sleep(0.2)
        got = asyncio.run(run())
    return got
