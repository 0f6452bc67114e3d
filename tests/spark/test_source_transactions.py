"""isolation.level with Spark for real (local[2]): read_committed drops aborted transactions' batches whole
(batch and streaming reads), read_uncommitted returns every data record; neither returns control records."""

from __future__ import annotations

from typing import Any

from gregor.client import Producer

from tests.spark.conftest import create_topic, run

TOPIC = "txn-src-t"


async def _write(bootstrap: str) -> dict[str, list[tuple[int, int, bytes]]]:
    """Two transactional producers (A aborts one transaction while B's overlapping one commits, then A
    commits one) interleaved with plain records on two partitions; every send is its own batch.
    Returns (partition, offset, value) per kind: plain, committed, aborted."""
    got: dict[str, list[tuple[int, int, bytes]]] = {"plain": [], "committed": [], "aborted": []}
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 0}
    async with Producer({**conf, "transactional.id": "spark-txn-a"}) as a, \
            Producer({**conf, "transactional.id": "spark-txn-b"}) as b, Producer({**conf, "acks": "all"}) as plain:

        async def put(p: Producer, kind: str, value: str, partition: int) -> None:
            handle = await p.send(TOPIC, value.encode(), partition=partition)
            await p.flush()
            md = await handle
            got[kind].append((md.partition, md.offset, value.encode()))

        await a.init_transactions()
        await b.init_transactions()
        for part in (0, 1):
            await put(plain, "plain", f"p0-{part}", part)
        await a.begin_transaction()
        await put(a, "aborted", "a-0", 0)
        await put(a, "aborted", "a-1", 1)
        await put(plain, "plain", "p1", 0)
        await b.begin_transaction()
        await put(b, "committed", "b-0", 0)
        await put(b, "committed", "b-1", 1)
        await put(a, "aborted", "a-2", 0)
        await put(plain, "plain", "p2", 0)
        await a.abort_transaction()
        await put(b, "committed", "b-2", 1)
        await put(plain, "plain", "p3", 1)
        await b.commit_transaction()
        await a.begin_transaction()  # the same producer again: its next transaction commits
        await put(a, "committed", "a-c0", 0)
        await put(a, "committed", "a-c1", 1)
        await a.commit_transaction()
        for part in (0, 1):
            await put(plain, "plain", f"p4-{part}", part)
    return got


def _rows(df: Any) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect())


def test_read_committed_drops_aborted_transactions(spark: Any, gregor: Any) -> None:
    run(create_topic(gregor.bootstrap, TOPIC, 2))
    got = run(_write(gregor.bootstrap))
    committed = sorted(got["plain"] + got["committed"])
    every = sorted(committed + got["aborted"])
    # Control records (two COMMITs and one ABORT per partition touched) hold offsets no data row has.
    data_offsets = {(p, o) for p, o, _ in every}
    assert max(o for p, o, _ in every if p == 0) + 1 > sum(1 for p, _, _ in every if p == 0)

    read = spark.read.format("gregor").option("subscribe", TOPIC)
    assert _rows(read.option("isolation.level", "read_committed").load()) == committed
    uncommitted = _rows(read.option("isolation.level", "read_uncommitted").load())
    assert uncommitted == every and {(p, o) for p, o, _ in uncommitted} == data_offsets

    # Streaming: small micro-batches, so ranges start and end inside the aborted transaction.
    q = (spark.readStream.format("gregor").option("subscribe", TOPIC).option("startingOffsets", "earliest")
         .option("isolation.level", "read_committed").option("maxOffsetsPerTrigger", "4").load()
         .writeStream.format("memory").queryName("txn_src_stream").trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(120)
        assert _rows(spark.table("txn_src_stream")) == committed
        assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 3
    finally:
        q.stop()
