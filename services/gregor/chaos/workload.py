"""The chaos workload: clients of every kind against a Gregor cluster, each operation recorded in a history
(history.py), then a final read of everything once the faults have healed.

    python -m gregor.chaos.workload --bootstrap B [--gateway G] --seconds S --history H \
        [--healed-file F] [--partitions 2]

Clients (each a `process` in the history; a client that has to be rebuilt after an error takes a new name):
  sdk-<n>     idempotent acks=all Producer (asyncio SDK), one outstanding send per partition; sdk-1
              compresses with gzip.
  sync-0      the blocking SyncProducer (send().get()) on a thread of its own.
  gw-<n>      one record per Produce call to a producer gateway (idempotent, acks=all inside).
  group-<n>   consumers of one group (subscribe), committing after each poll, fetching the committed
              offsets now and then.
  txn-0       consume-transform-produce: read_committed from the input topic, write two values per input
              record to two partitions of the output topic in one transaction with the offsets; one in
              five is aborted on purpose.
  hw-0        the high watermark of every partition (end offsets, read_uncommitted).
  final       after --healed-file appears (or at once without it): every partition of both topics from
              offset 0 up to the end, read_committed.
Timeouts and errors whose effect is unknown are `unknown`; a transaction is `fail` only when abort
returned before any commit was asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import threading
import time
from typing import Any

from gregor.chaos.history import FAIL, OK, UNKNOWN, HistoryWriter

TOPIC, TXN_TOPIC, GROUP, TXN_GROUP = "chaos", "chaos-txn", "chaos-group", "chaos-txn-group"
OP_TIMEOUT_S = 15.0


def now() -> float:
    return time.time()


class Workload:
    """Owns the clients of one run. Concurrency: asyncio tasks on one loop, plus the SyncProducer thread;
    they share only the HistoryWriter (locked) and `stop` (an Event each side reads)."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.h = HistoryWriter(a.history)
        self.stop = asyncio.Event()
        self.stop_thread = threading.Event()
        self.seq = itertools.count()
        self.rng = random.Random(a.seed)
        self.cfg: dict[str, Any] = {"bootstrap.servers": a.bootstrap, "request.timeout.ms": 5000,
                                    "metadata.max.age.ms": 2000, "retry.backoff.ms": 100}

    def value(self, process: str) -> str:
        return f"{process}:{next(self.seq)}"

    def record(self, process: str, op: str, invoke: float, outcome: str, **fields: Any) -> None:
        self.h.record(process=process, op=op, invoke=invoke, complete=now(), outcome=outcome, **fields)

    # --- setup ---------------------------------------------------------------------------------------------

    async def create_topics(self) -> None:
        from gregor.client import AdminClient
        from gregor.client.admin import NewTopic

        deadline = time.monotonic() + 120
        while True:
            try:
                async with AdminClient(self.cfg) as admin:
                    existing = set(await admin.list_topics())
                    new = [NewTopic(t, self.a.partitions, self.a.replication_factor,
                                    configs={"min.insync.replicas": str(min(2, self.a.replication_factor))})
                           for t in (TOPIC, TXN_TOPIC) if t not in existing]
                    if new:
                        await admin.create_topics(new)
                return
            except Exception as exc:  # noqa: BLE001 - a cluster still settling: retry until the deadline
                if time.monotonic() > deadline:
                    raise
                print(f"create topics: {exc!r}; retrying", flush=True)
                await asyncio.sleep(1)

    # --- producers -----------------------------------------------------------------------------------------

    async def sdk_producer(self, n: int) -> None:
        from gregor.client import Producer

        generation = 0
        while not self.stop.is_set():
            process = f"sdk-{n}" + (f".{generation}" if generation else "")
            props = {**self.cfg, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                     "delivery.timeout.ms": 12000, "max.block.ms": 5000,
                     "compression.type": "gzip" if n % 2 else "none"}
            try:
                async with Producer(props) as producer:
                    broken = await asyncio.gather(*(self._sdk_slot(producer, process, p)
                                                    for p in range(self.a.partitions)))
                    if not any(broken):
                        return
            except Exception as exc:  # noqa: BLE001 - a producer that cannot start: a new one
                print(f"{process}: {exc!r}", flush=True)
                await asyncio.sleep(0.5)
            generation += 1

    async def _sdk_slot(self, producer: Any, process: str, partition: int) -> bool:
        """Sends to one partition until stop; True when the producer should be rebuilt."""
        failures = 0
        while not self.stop.is_set():
            value = self.value(process)
            t0 = now()
            try:
                fut = await asyncio.wait_for(producer.send(TOPIC, value.encode(), key=value.encode(),
                                                           partition=partition), OP_TIMEOUT_S)
                md = await asyncio.wait_for(fut, OP_TIMEOUT_S)
                self.record(process, "send", t0, OK, topic=TOPIC, partition=partition, key=value, value=value,
                            offset=md.offset, client="sdk")
                failures = 0
            except Exception as exc:  # noqa: BLE001 - any error: the record may or may not be in the log
                self.record(process, "send", t0, UNKNOWN, topic=TOPIC, partition=partition, key=value,
                            value=value, offset=None, client="sdk", error=type(exc).__name__)
                failures += 1
                if failures >= 5:
                    return True
                await asyncio.sleep(0.2)
        return False

    def sync_producer(self) -> None:
        from gregor.client import SyncProducer

        generation = 0
        while not self.stop_thread.is_set():
            process = "sync-0" + (f".{generation}" if generation else "")
            try:
                p = SyncProducer({**self.cfg, "acks": "all", "enable.idempotence": True, "linger.ms": 1,
                                  "delivery.timeout.ms": 12000, "max.block.ms": 5000})
            except Exception as exc:  # noqa: BLE001
                print(f"{process}: {exc!r}", flush=True)
                time.sleep(0.5)
                generation += 1
                continue
            failures = 0
            try:
                while not self.stop_thread.is_set() and failures < 5:
                    partition = next(self.seq) % self.a.partitions
                    value = self.value(process)
                    t0 = now()
                    try:
                        md = p.send(TOPIC, value.encode(), key=value.encode(), partition=partition).result(OP_TIMEOUT_S)
                        self.record(process, "send", t0, OK, topic=TOPIC, partition=partition, key=value,
                                    value=value, offset=md.offset, client="sync")
                        failures = 0
                    except Exception as exc:  # noqa: BLE001
                        self.record(process, "send", t0, UNKNOWN, topic=TOPIC, partition=partition, key=value,
                                    value=value, offset=None, client="sync", error=type(exc).__name__)
                        failures += 1
                        time.sleep(0.2)
            finally:
                try:
                    p.close(5)
                except Exception:  # noqa: BLE001 - closing a broken producer
                    pass
            generation += 1

    async def gateway_producer(self, n: int, address: str) -> None:
        import grpc  # type: ignore[import-untyped]

        from gregor.rpc.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

        process = f"gw-{n}"
        from gregor.common.rpc import channel as rpc_channel

        async with rpc_channel(address) as channel:  # TLS per the process's settings (gregor.common.tls)
            stub = gateway_pb2_grpc.ProducerGatewayServiceStub(channel)
            while not self.stop.is_set():
                partition = next(self.seq) % self.a.partitions
                value = self.value(process)
                t0 = now()
                outcome, offset, error = UNKNOWN, None, None
                try:
                    resp = await stub.Produce(gateway_pb2.GatewayProduceRequest(
                        topic=TOPIC, partition=partition,
                        records=[common_pb2.Record(key=value.encode(), value=value.encode())]), timeout=OP_TIMEOUT_S)
                    result = resp.results[0]
                    if result.HasField("error") and result.error.code != 0:
                        error = f"{result.error.code}"
                    else:
                        outcome, offset = OK, int(result.offset)
                except Exception as exc:  # noqa: BLE001 - unavailable, deadline: unknown
                    error = type(exc).__name__
                self.record(process, "send", t0, outcome, topic=TOPIC, partition=partition, key=value, value=value,
                            offset=offset, client="gateway", **({"error": error} if error else {}))
                if outcome != OK:
                    await asyncio.sleep(0.2)

    # --- consumers -----------------------------------------------------------------------------------------

    async def group_consumer(self, n: int) -> None:
        from gregor.client import Consumer

        generation = 0
        while not self.stop.is_set():
            process = f"group-{n}" + (f".{generation}" if generation else "")
            try:
                async with Consumer({**self.cfg, "group.id": GROUP, "enable.auto.commit": False,
                                     "auto.offset.reset": "earliest", "isolation.level": "read_uncommitted",
                                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                                     "fetch.max.wait.ms": 100, "max.poll.records": 50}) as c:
                    c.subscribe([TOPIC])
                    await self._consume(c, process)
                    return
            except Exception as exc:  # noqa: BLE001 - a consumer that broke: a new member
                print(f"{process}: {exc!r}", flush=True)
                await asyncio.sleep(0.5)
            generation += 1

    async def _consume(self, c: Any, process: str) -> None:
        assigned: set[tuple[str, int]] = set()
        polls = 0
        while not self.stop.is_set():
            t0 = now()
            try:
                records = await asyncio.wait_for(c.poll(300), OP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - the poll returned nothing we can use
                self.record(process, "poll", t0, UNKNOWN, topic=TOPIC, partition=-1, records=[],
                            error=type(exc).__name__)
                raise
            current = {(tp[0], tp[1]) for tp in c.assignment()}
            for tp in sorted(current - assigned):
                self.record(process, "assign", t0, OK, topic=tp[0], partition=tp[1])
            assigned = current
            by_tp: dict[tuple[str, int], list[list[Any]]] = {}
            for r in records:
                by_tp.setdefault((r.topic, r.partition), []).append([r.offset, (r.value or b"").decode()])
            t1 = now()
            for (topic, partition), recs in sorted(by_tp.items()):
                self.h.record(process=process, op="poll", invoke=t0, complete=t1, outcome=OK, topic=topic,
                              partition=partition, records=recs, isolation="read_uncommitted", group=GROUP)
            if by_tp:
                offsets = {tp: recs[-1][0] + 1 for tp, recs in by_tp.items()}
                t2 = now()
                try:
                    await asyncio.wait_for(c.commit_sync(offsets), OP_TIMEOUT_S)
                    outcome = OK
                except Exception:  # noqa: BLE001 - a commit that may or may not have landed
                    outcome = UNKNOWN
                for (topic, partition), off in sorted(offsets.items()):
                    self.record(process, "commit_offsets", t2, outcome, group=GROUP, topic=topic,
                                partition=partition, offset=off)
                # After a failed commit the group may have moved on: rejoin from the committed offsets.
                if outcome != OK:
                    raise RuntimeError("commit failed")
            polls += 1
            if polls % 10 == 0:
                tps = [(TOPIC, p) for p in range(self.a.partitions)]
                t3 = now()
                try:
                    got = await asyncio.wait_for(c.committed(tps), OP_TIMEOUT_S)
                    for (topic, partition), off in sorted(got.items()):
                        if off is not None:
                            self.record(process, "fetch_offsets", t3, OK, group=GROUP, topic=topic,
                                        partition=partition, offset=off)
                except Exception:  # noqa: BLE001 - nothing observed
                    pass

    async def hw_observer(self) -> None:
        from gregor.client import Consumer

        while not self.stop.is_set():
            try:
                async with Consumer({**self.cfg, "isolation.level": "read_uncommitted"}) as c:
                    while not self.stop.is_set():
                        tps = [(TOPIC, p) for p in range(self.a.partitions)]
                        t0 = now()
                        ends = await asyncio.wait_for(c.end_offsets(tps), OP_TIMEOUT_S)
                        for (topic, partition), off in sorted(ends.items()):
                            self.record("hw-0", "hw", t0, OK, topic=topic, partition=partition, offset=off)
                        await asyncio.sleep(0.5)
            except Exception:  # noqa: BLE001 - observe again with a new client
                await asyncio.sleep(0.5)

    # --- transactions ----------------------------------------------------------------------------------------

    async def transactions(self) -> None:
        from gregor.client import Consumer, Producer

        generation = 0
        while not self.stop.is_set():
            process = "txn-0" + (f".{generation}" if generation else "")
            try:
                async with Producer({**self.cfg, "transactional.id": "chaos-txn-0", "linger.ms": 2,
                                     "transaction.timeout.ms": 10000, "delivery.timeout.ms": 12000,
                                     "max.block.ms": 5000}) as producer:
                    await asyncio.wait_for(producer.init_transactions(), 30)
                    async with Consumer({**self.cfg, "group.id": TXN_GROUP, "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                                         "fetch.max.wait.ms": 100, "max.poll.records": 5}) as c:
                        tps = [(TOPIC, p) for p in range(self.a.partitions)]
                        c.assign(tps)
                        await self._txn_loop(producer, c, process, tps)
                        return
            except Exception as exc:  # noqa: BLE001 - fenced, timed out: a new producer (fences the old)
                print(f"{process}: {exc!r}", flush=True)
                await asyncio.sleep(0.5)
            generation += 1

    async def _txn_loop(self, producer: Any, c: Any, process: str, tps: list[tuple[str, int]]) -> None:
        committed = await asyncio.wait_for(c.committed(tps), OP_TIMEOUT_S)
        for tp in tps:
            c.seek(tp, committed.get(tp) or 0)
            self.record(process, "assign", now(), OK, topic=tp[0], partition=tp[1])
        n = 0
        while not self.stop.is_set():
            t0 = now()
            records = await asyncio.wait_for(c.poll(300), OP_TIMEOUT_S)
            by_tp: dict[tuple[str, int], list[list[Any]]] = {}
            for r in records:
                by_tp.setdefault((r.topic, r.partition), []).append([r.offset, (r.value or b"").decode()])
            for (topic, partition), recs in sorted(by_tp.items()):
                self.h.record(process=process, op="poll", invoke=t0, complete=now(), outcome=OK, topic=topic,
                              partition=partition, records=recs, isolation="read_committed", group=TXN_GROUP)
            if not records:
                continue
            n += 1
            txn_id = f"{process}/{n}"
            abort = self.rng.random() < 0.2
            sends: list[dict[str, Any]] = []
            futures = []
            asked_commit = False
            t1 = now()
            try:
                await asyncio.wait_for(producer.begin_transaction(), OP_TIMEOUT_S)
                for r in records[:3]:
                    for k in range(2):  # two values in two partitions: atomic or not at all
                        partition = (r.partition + k) % self.a.partitions
                        value = f"{txn_id}:{r.offset}:{k}"
                        sends.append({"topic": TXN_TOPIC, "partition": partition, "key": value, "value": value,
                                      "offset": None})
                        futures.append(await asyncio.wait_for(
                            producer.send(TXN_TOPIC, value.encode(), key=value.encode(), partition=partition),
                            OP_TIMEOUT_S))
                last = {}
                for r in records[:3]:
                    last[(r.topic, r.partition)] = r.offset + 1
                if abort:
                    await asyncio.wait_for(producer.abort_transaction(), OP_TIMEOUT_S)
                    self.record(process, "txn", t1, FAIL, txn_id=txn_id, sends=sends, aborted_by="client")
                else:
                    await asyncio.wait_for(producer.send_offsets_to_transaction(last, GROUP_META(c)), OP_TIMEOUT_S)
                    asked_commit = True
                    await asyncio.wait_for(producer.commit_transaction(), OP_TIMEOUT_S)
                    for s, f in zip(sends, futures):
                        s["offset"] = f.result().offset
                    self.record(process, "txn", t1, OK, txn_id=txn_id, sends=sends)
            except Exception as exc:  # noqa: BLE001
                outcome = UNKNOWN
                if not asked_commit:
                    try:
                        await asyncio.wait_for(producer.abort_transaction(), OP_TIMEOUT_S)
                        outcome = FAIL
                    except Exception:  # noqa: BLE001 - could not even abort: unknown
                        pass
                self.record(process, "txn", t1, outcome, txn_id=txn_id, sends=sends, error=type(exc).__name__)
                raise
            if abort or len(records) > 3:
                # Re-read what was not committed: back to the group's committed offsets.
                committed = await asyncio.wait_for(c.committed(tps), OP_TIMEOUT_S)
                for tp in tps:
                    c.seek(tp, committed.get(tp) or 0)
                    self.record(process, "assign", now(), OK, topic=tp[0], partition=tp[1])

    # --- the final read --------------------------------------------------------------------------------------

    async def final_read(self) -> None:
        """Every partition of both topics from 0 to its end, read_committed, once no transaction is open."""
        from gregor.client import Consumer

        deadline = time.monotonic() + 180
        tps = [(t, p) for t in (TOPIC, TXN_TOPIC) for p in range(self.a.partitions)]
        while True:
            try:
                async with Consumer({**self.cfg, "isolation.level": "read_committed",
                                     "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100}) as c:
                    async with Consumer({**self.cfg, "isolation.level": "read_uncommitted"}) as ru:
                        # Wait until the LSO reaches the HW: every transaction decided.
                        while True:
                            lso = await c.end_offsets(tps)
                            hw = await ru.end_offsets(tps)
                            if lso == hw or time.monotonic() > deadline:
                                break
                            await asyncio.sleep(1)
                    for tp in tps:
                        t0 = now()
                        c.assign([tp])
                        c.seek(tp, 0)
                        recs: list[list[Any]] = []
                        end = lso[tp]
                        while (recs[-1][0] + 1 if recs else 0) < end:
                            got = await asyncio.wait_for(c.poll(500), OP_TIMEOUT_S)
                            recs += [[r.offset, (r.value or b"").decode()] for r in got]
                            if await c.position(tp) >= end:
                                break
                        self.h.record(process="final", op="poll", invoke=t0, complete=now(), outcome=OK,
                                      topic=tp[0], partition=tp[1], records=recs, isolation="read_committed",
                                      group=None, final=True, start_offset=0, end_offset=end)
                return
            except Exception as exc:  # noqa: BLE001 - still settling: again, until the deadline
                if time.monotonic() > deadline:
                    raise
                print(f"final read: {exc!r}; retrying", flush=True)
                await asyncio.sleep(1)

    # --- the run ---------------------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.create_topics()
        print("WORKLOAD STARTED", flush=True)
        thread = threading.Thread(target=self.sync_producer, name="sync-0", daemon=True)
        thread.start()
        tasks = [asyncio.create_task(self.sdk_producer(n)) for n in range(self.a.sdk_producers)]
        tasks += [asyncio.create_task(self.gateway_producer(n, g))
                  for n, g in enumerate(filter(None, self.a.gateway.split(",")))]
        tasks += [asyncio.create_task(self.group_consumer(n)) for n in range(self.a.consumers)]
        tasks.append(asyncio.create_task(self.transactions()))
        tasks.append(asyncio.create_task(self.hw_observer()))
        await asyncio.sleep(self.a.seconds)
        self.stop.set()
        self.stop_thread.set()
        await asyncio.wait(tasks, timeout=60)
        for t in tasks:
            t.cancel()
        await asyncio.to_thread(thread.join, 60)
        print("WORKLOAD STOPPED", flush=True)
        if self.a.healed_file:
            while not os.path.exists(self.a.healed_file):
                await asyncio.sleep(0.2)
        await self.final_read()
        self.h.close()
        print("FINAL READ DONE", flush=True)


def GROUP_META(c: Any) -> Any:  # noqa: N802 - Kafka's consumer.groupMetadata(), or the group id
    meta = getattr(c, "group_metadata", None)
    return meta() if callable(meta) else TXN_GROUP


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gregor chaos workload", description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--gateway", default="")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--history", required=True)
    ap.add_argument("--healed-file", default="")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--replication-factor", type=int, default=3)
    ap.add_argument("--sdk-producers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    asyncio.run(Workload(a).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
