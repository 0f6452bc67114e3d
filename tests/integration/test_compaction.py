"""Log compaction in a real broker process (seed 003): many updates of a few keys to a
cleanup.policy=compact topic with small segments; the LogCleaner thread compacts the sealed
segments, a consumer from the beginning sees the latest value per key in offset order,
tombstones go after delete.retention.ms, and a SIGKILL (possibly mid-cleaning) followed by a
restart leaves a consistent log."""

from __future__ import annotations

import asyncio
import glob
import os
import re
import signal
import time
import urllib.request

from gregor.common import records
from gregor.common.errors import Code
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2_grpc
from tests.integration.test_bad_input import expect_error
from tests.integration.test_broker import create_topic, fetch, produce
from tests.helpers.cluster import broker_process, stop_process

OVERRIDES = {"log.cleaner.backoff.ms": "100"}
KEYS = [f"k{i}".encode() for i in range(5)]


async def consume_all(stub: broker_pb2_grpc.BrokerServiceStub, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    out: list[tuple[int, bytes, bytes | None]] = []
    at = 0
    while True:
        resp = await fetch(stub, topic, at, max_bytes=1 << 16)
        if not resp.records:
            assert at >= resp.high_watermark, (at, resp.high_watermark)
            return out
        for rec in records.iter_records(resp.records, min_offset=at):
            assert rec.key is not None
            out.append((rec.offset, rec.key, rec.value))
        at = records.split_batches(resp.records)[-1][0].next_offset


async def produce_updates(stub: broker_pb2_grpc.BrokerServiceStub, topic: str, rounds: int, tag: str,
                          tombstone: bytes | None) -> dict[bytes, bytes | None]:
    """rounds x len(KEYS) single-record batches; returns the last value per key."""
    last: dict[bytes, bytes | None] = {}
    for r in range(rounds):
        for key in KEYS:
            value = None if (key == tombstone and r == rounds - 1) else f"{tag}-{r}-{key.decode()}-".encode() * 4
            codec = ["none", "gzip", "lz4", "zstd", "snappy"][r % 5]
            await produce(stub, topic, records.build_batch([(key, value, [], int(time.time() * 1000))],
                                                            compression=codec))
            last[key] = value
    return last


async def seal(stub: broker_pb2_grpc.BrokerServiceStub, topic: str) -> None:
    """Let segment.ms pass and append a marker, so every update sits in a sealed segment."""
    await asyncio.sleep(0.4)
    await produce(stub, topic, records.build_batch([(b"marker", b"m", [], int(time.time() * 1000))]))


async def wait_compacted(stub: broker_pb2_grpc.BrokerServiceStub, topic: str, expected: int,
                         timeout_s: float = 60.0) -> list[tuple[int, bytes, bytes | None]]:
    """Consume until the log before the marker holds `expected` records (one per live key)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await consume_all(stub, topic)
        before_marker = [r for r in got if r[1] != b"marker"]
        if len(before_marker) == expected or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.2)


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not exported"
    return float(m.group(1))


async def test_compaction_keeps_latest_per_key_and_survives_sigkill(tmp_path) -> None:
    data_dir = str(tmp_path / "c")
    with broker_process(data_dir, overrides=OVERRIDES) as b:
        await create_topic(b.grpc, "table", cleanup_policy="compact", segment_bytes="2048", segment_ms="300",
                           min_cleanable_dirty_ratio="0.01", delete_retention_ms="3000")
        async with channel(b.grpc) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            # A compacted topic refuses records without a key (Kafka: INVALID_RECORD), writing nothing.
            await expect_error(produce(stub, "table", records.build_batch([(None, b"v", [], 0)])), Code.INVALID_RECORD)
            last = await produce_updates(stub, "table", rounds=40, tag="a", tombstone=KEYS[4])
            await seal(stub, "table")
            # 200 updates of 5 keys: compacted, 4 live values and the tombstone (kept for now).
            got = await wait_compacted(stub, "table", expected=5)
            body = [r for r in got if r[1] != b"marker"]
            assert [(k, v) for _, k, v in body] == [(k, last[k]) for k in KEYS]
            assert [o for o, _, _ in body] == sorted(o for o, _, _ in body)
            assert body[-1][0] == 199 and got[-1] == (200, b"marker", b"m")
            # Offsets removed by cleaning: a fetch there answers the next batch.
            resp = await fetch(stub, "table", 0)
            assert records.split_batches(resp.records)[0][0].base_offset == body[0][0] > 0
            text = urllib.request.urlopen(b.metrics, timeout=5).read().decode()
            assert metric(text, "gregor_log_cleaner_runs_total") >= 1
            assert metric(text, "gregor_log_cleaner_cleaned_bytes_total") > 0
            assert 0 < metric(text, "gregor_log_cleaner_recopy_percent") < 100
            for name in ("gregor_log_cleaner_max_dirty_percent", "gregor_log_cleaner_time_since_last_run_seconds"):
                metric(text, name)
            # After delete.retention.ms the tombstoned key is gone.
            got = await wait_compacted(stub, "table", expected=4, timeout_s=30)
            assert [(k, v) for _, k, v in got if k != b"marker"] == [(k, last[k]) for k in KEYS[:4]]
            # More updates, then SIGKILL while the cleaner is at work: as soon as a
            # .cleaned or .swap file shows up in the partition directory (or after 10 s).
            last = await produce_updates(stub, "table", rounds=30, tag="b", tombstone=None)
            await seal(stub, "table")
        part = os.path.join(b.data_dir, "table-0")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (glob.glob(os.path.join(part, "*.cleaned"))
                                                   or glob.glob(os.path.join(part, "*.swap"))):
            time.sleep(0.0005)
        os.kill(b.pid, signal.SIGKILL)
        stop_process(b, signal.SIGKILL)
    with broker_process(data_dir, overrides=OVERRIDES) as b2:
        async with channel(b2.grpc) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            got = await consume_all(stub, "table")
            offsets = [o for o, _, _ in got]
            assert offsets == sorted(set(offsets))
            latest: dict[bytes, bytes | None] = {}
            for _, k, v in got:
                latest[k] = v
            assert {k: latest[k] for k in KEYS} == last
            assert offsets[-1] == 200 + 1 + 150  # 150 more updates and the second marker
            got = await wait_compacted(stub, "table", expected=5)
            assert [(k, v) for _, k, v in got if k != b"marker"] == [(k, last[k]) for k in KEYS]
            # No half-done cleaning is left on disk.
            part = os.path.join(b2.data_dir, "table-0")
            assert not glob.glob(os.path.join(part, "*.cleaned")) + glob.glob(os.path.join(part, "*.swap"))
            assert (await produce(stub, "table", records.build_batch([(b"k0", b"new", [], 0)]))).base_offset == 352
