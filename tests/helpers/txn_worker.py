"""A consume-transform-produce worker (seed 003's "advanced" transaction case), run as a real process by tests.

    python -m tests.helpers.txn_worker --bootstrap B --transactional-id T --input in --output out \
        --group g --partitions 2 [--hold-file F]

For every poll: begin a transaction, write each input record's value upper-cased
to the same partition of the output topic, send the consumed offsets to the
transaction, commit. It starts by init_transactions() (which fences an older
instance and completes or aborts its transaction, its offsets included) and
only then reads the group's committed offsets, so a restart resumes exactly
after the last committed transaction. With --hold-file the worker stops after
its first sends of a transaction, prints HOLDING, and waits until the file
exists before committing (the zombie test freezes it there). Prints COMMITTED n
after each commit and exits when --stop-after records are committed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from gregor.client import Consumer, Producer
from gregor.common import errors


async def run(a: argparse.Namespace) -> int:
    tps = [(a.input, p) for p in range(a.partitions)]
    async with Producer({"bootstrap.servers": a.bootstrap, "transactional.id": a.transactional_id,
                         "linger.ms": 2, "transaction.timeout.ms": a.transaction_timeout_ms}) as producer:
        await producer.init_transactions()
        print("READY", flush=True)  # where a stalled start stopped, in the test's log
        async with Consumer({"bootstrap.servers": a.bootstrap, "group.id": a.group, "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                             "fetch.max.wait.ms": 50, "max.poll.records": a.max_poll_records}) as consumer:
            consumer.assign(tps)
            done = 0
            while a.stop_after <= 0 or done < a.stop_after:
                records = await consumer.poll(200)
                if not records:
                    continue
                await producer.begin_transaction()
                next_offsets: dict[tuple[str, int], int] = {}
                for r in records:
                    await producer.send(a.output, r.value.upper() if r.value else r.value, key=r.key,
                                        partition=r.partition)
                    next_offsets[(r.topic, r.partition)] = r.offset + 1
                if a.hold_file:
                    await producer.flush()
                    print("HOLDING", flush=True)
                    while not os.path.exists(a.hold_file):
                        await asyncio.sleep(0.05)
                await producer.send_offsets_to_transaction(next_offsets, a.group)
                await producer.commit_transaction()
                done += len(records)
                print(f"COMMITTED {done}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--transactional-id", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--max-poll-records", type=int, default=20)
    ap.add_argument("--transaction-timeout-ms", type=int, default=60000)
    ap.add_argument("--stop-after", type=int, default=0)
    ap.add_argument("--hold-file", default="")
    a = ap.parse_args()
    try:
        return asyncio.run(run(a))
    except errors.GregorError as exc:
        print(f"FAILED {exc.name}: {exc.message}", flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
