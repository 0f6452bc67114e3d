"""The chaos workload: clients of every kind against a Gregor cluster, each operation recorded in a history
(history.py), then a final read of everything once the faults have healed.

    python -m gregor.chaos.workload --bootstrap B [--gateway G] --seconds S --history H \
        [--healed-file F] [--partitions 2] [--client-config client.properties]

--client-config is a Kafka client properties file (e.g. security.protocol=SSL and the ssl.* keys of a
cluster with mTLS): its keys go into every SDK client's config, and its TLS keys become the process's
default (gregor.common.tls), which the gateway channels use.

Clients (each a `process` in the history; a client that has to be rebuilt after an error takes a new name):
  sdk-<n>     idempotent acks=all Producer (asyncio SDK), one outstanding send per partition; sdk-1
              compresses with gzip.
  sync-0      the blocking SyncProducer (send().get()) on a thread of its own.
  gw-<n>      one record per Produce call to a producer gateway (idempotent, acks=all inside).
  gwtxn-<n>   transactions through a gateway's TransactionalProduceStream: two values in two partitions
              of the output topic per transaction, one in five aborted on purpose; a broken stream is
              replaced by a new one with the same transactional.id (whose init fences the old).
  group-<n>   consumers of one group (subscribe), committing after each poll, fetching the committed
              offsets now and then.
  txn-0       consume-transform-produce: read_committed from the input topic, write two values per input
              record to two partitions of the output topic in one transaction with the offsets; one in
              five is aborted on purpose.
  hw-0        the high watermark of every partition (end offsets, read_uncommitted).
  final       every partition of both topics from offset 0 up to the end, read_committed, once the clients
              have stopped: after --seconds, or with --healed-file 3 s after that file appears (the
              orchestrator writes it once every fault has healed), whichever is later.
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
from gregor.common.aio import wait_for

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
                                    "metadata.max.age.ms": 2000, "retry.backoff.ms": 100,
                                    **getattr(a, "client_props", {})}

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
                fut = await wait_for(producer.send(TOPIC, value.encode(), key=value.encode(),
                                                           partition=partition), OP_TIMEOUT_S)
                md = await wait_for(fut, OP_TIMEOUT_S)
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

    async def gateway_transactions(self, n: int, address: str) -> None:
        """Transactions through the gateway's TransactionalProduceStream (one stream, one producer)."""
        from gregor.common.rpc import channel as rpc_channel

        generation = 0
        while not self.stop.is_set():
            process = f"gwtxn-{n}" + (f".{generation}" if generation else "")
            try:
                async with rpc_channel(address) as channel:  # TLS per the process's settings
                    await self._gateway_txn_stream(channel, process, f"chaos-gw-txn-{n}")
                    return
            except Exception as exc:  # noqa: BLE001 - a broken stream or a failed call: a new stream
                print(f"{process}: {exc!r}", flush=True)
                await asyncio.sleep(0.5)
            generation += 1

    async def _gateway_txn_stream(self, channel: Any, process: str, transactional_id: str) -> None:
        from gregor.common import errors
        from gregor.rpc.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

        call = gateway_pb2_grpc.ProducerGatewayServiceStub(channel).TransactionalProduceStream()
        ids = itertools.count(1)

        async def answer() -> Any:
            res = await wait_for(call.read(), OP_TIMEOUT_S)
            if res is grpc_eof():
                raise errors.GregorError("the gateway ended the stream")
            return res

        def control(op: str) -> Any:
            return gateway_pb2.GatewayTxnRequest(**{op: gateway_pb2.GatewayTxnControl(correlation_id=next(ids))})

        await call.write(gateway_pb2.GatewayTxnRequest(init=gateway_pb2.GatewayTxnInit(
            transactional_id=transactional_id, transaction_timeout_ms=10000, correlation_id=next(ids))))
        res = await answer()
        if res.error.code:
            raise errors.from_detail(res.error)
        k = 0
        while not self.stop.is_set():
            k += 1
            txn_id = f"{process}/{k}"
            abort = self.rng.random() < 0.2
            sends: list[dict[str, Any]] = [{"topic": TXN_TOPIC, "partition": part, "key": f"{txn_id}:{part}",
                      "value": f"{txn_id}:{part}", "offset": None} for part in range(min(2, self.a.partitions))]
            t0 = now()
            outcome, asked_commit, error = UNKNOWN, False, None
            try:
                await call.write(control("begin"))
                if (res := await answer()).error.code:
                    raise errors.from_detail(res.error)
                by_id: dict[int, dict[str, Any]] = {}
                for s in sends:
                    rec = common_pb2.Record(key=str(s["key"]).encode(), value=str(s["value"]).encode())
                    by_id[cid := next(ids)] = s
                    await call.write(gateway_pb2.GatewayTxnRequest(record=gateway_pb2.GatewayRecord(
                        topic=TXN_TOPIC, record=rec, partition=int(s["partition"]), correlation_id=cid)))
                failed = None
                for _ in sends:  # answers come as the records are acknowledged, not in request order
                    res = await answer()
                    if res.error.code:
                        failed = failed or errors.from_detail(res.error)
                    else:
                        by_id[res.correlation_id]["offset"] = int(res.offset)
                if failed is not None or abort:
                    await call.write(control("abort"))
                    if (res := await answer()).error.code:
                        raise errors.from_detail(res.error)
                    outcome = FAIL
                    if failed is not None:
                        error = type(failed).__name__
                else:
                    asked_commit = True
                    await call.write(control("commit"))
                    if (res := await answer()).error.code:
                        raise errors.from_detail(res.error)
                    outcome = OK
            except BaseException as exc:
                error = type(exc).__name__
                raise
            finally:
                if outcome != OK:
                    for s in sends:  # an offset of a send in a transaction not known committed means nothing
                        s["offset"] = None
                fields: dict[str, Any] = {"txn_id": txn_id, "sends": sends, "client": "gateway"}
                if abort and outcome == FAIL:
                    fields["aborted_by"] = "client"
                if error:
                    fields["error"] = error
                if asked_commit and outcome != OK:
                    outcome = UNKNOWN
                self.record(process, "txn", t0, outcome, **fields)
        await call.done_writing()

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
                records = await wait_for(c.poll(300), OP_TIMEOUT_S)
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
                    await wait_for(c.commit_sync(offsets), OP_TIMEOUT_S)
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
                    got = await wait_for(c.committed(tps), OP_TIMEOUT_S)
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
                        ends = await wait_for(c.end_offsets(tps), OP_TIMEOUT_S)
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
                    await wait_for(producer.init_transactions(), 30)
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
        committed = await wait_for(c.committed(tps), OP_TIMEOUT_S)
        for tp in tps:
            c.seek(tp, committed.get(tp) or 0)
            self.record(process, "assign", now(), OK, topic=tp[0], partition=tp[1])
        n = 0
        while not self.stop.is_set():
            t0 = now()
            records = await wait_for(c.poll(300), OP_TIMEOUT_S)
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
                await wait_for(producer.begin_transaction(), OP_TIMEOUT_S)
                for r in records[:3]:
                    for k in range(2):  # two values in two partitions: atomic or not at all
                        partition = (r.partition + k) % self.a.partitions
                        value = f"{txn_id}:{r.offset}:{k}"
                        sends.append({"topic": TXN_TOPIC, "partition": partition, "key": value, "value": value,
                                      "offset": None})
                        futures.append(await wait_for(
                            producer.send(TXN_TOPIC, value.encode(), key=value.encode(), partition=partition),
                            OP_TIMEOUT_S))
                last = {}
                for r in records[:3]:
                    last[(r.topic, r.partition)] = r.offset + 1
                if abort:
                    await wait_for(producer.abort_transaction(), OP_TIMEOUT_S)
                    self.record(process, "txn", t1, FAIL, txn_id=txn_id, sends=sends, aborted_by="client")
                else:
                    await wait_for(producer.send_offsets_to_transaction(last, GROUP_META(c)), OP_TIMEOUT_S)
                    asked_commit = True
                    await wait_for(producer.commit_transaction(), OP_TIMEOUT_S)
                    for s, f in zip(sends, futures):
                        s["offset"] = f.result().offset
                    self.record(process, "txn", t1, OK, txn_id=txn_id, sends=sends)
            except Exception as exc:  # noqa: BLE001
                outcome = UNKNOWN
                if not asked_commit:
                    try:
                        await wait_for(producer.abort_transaction(), OP_TIMEOUT_S)
                        outcome = FAIL
                    except Exception:  # noqa: BLE001 - could not even abort: unknown
                        pass
                self.record(process, "txn", t1, outcome, txn_id=txn_id, sends=sends, error=type(exc).__name__)
                raise
            if abort or len(records) > 3:
                # Re-read what was not committed: back to the group's committed offsets.
                committed = await wait_for(c.committed(tps), OP_TIMEOUT_S)
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
                            got = await wait_for(c.poll(500), OP_TIMEOUT_S)
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
        tasks += [asyncio.create_task(self.gateway_transactions(n, g))
                  for n, g in enumerate(filter(None, self.a.gateway.split(",")[:1]))]
        tasks += [asyncio.create_task(self.group_consumer(n)) for n in range(self.a.consumers)]
        tasks.append(asyncio.create_task(self.transactions()))
        tasks.append(asyncio.create_task(self.hw_observer()))
        await asyncio.sleep(self.a.seconds)
        if self.a.healed_file:
            # The nemesis runs late when a fault takes longer than its slot (a rolling restart): the clients go
            # on until every fault has healed and a little after, so each fault's recovery is in the history.
            while not os.path.exists(self.a.healed_file):
                await asyncio.sleep(0.2)
            await asyncio.sleep(3)
        self.stop.set()
        self.stop_thread.set()
        await asyncio.wait(tasks, timeout=60)
        for t in tasks:
            t.cancel()
        await asyncio.to_thread(thread.join, 60)
        print("WORKLOAD STOPPED", flush=True)
        await self.final_read()
        self.h.close()
        print("FINAL READ DONE", flush=True)


def grpc_eof() -> Any:
    import grpc  # type: ignore[import-untyped]

    return grpc.aio.EOF


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
    ap.add_argument("--client-config", default="",
                    help="client properties file merged into every client's config (e.g. security.protocol=SSL, "
                         "ssl.truststore.location, ssl.keystore.location, ssl.key.location)")
    a = ap.parse_args(argv)
    a.client_props = {}
    if a.client_config:
        from gregor.common import tls
        from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]
        from gregor.common.properties import read_properties

        try:
            a.client_props = read_properties(a.client_config)
            tls.configure(tls.TlsConfig.from_properties(a.client_props))  # the gateway channels
        except (OSError, InvalidConfigError) as exc:
            ap.error(f"--client-config {a.client_config}: {exc}")
    asyncio.run(Workload(a).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
