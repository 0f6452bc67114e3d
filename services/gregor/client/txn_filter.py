"""read_committed on the consumer: drop aborted transactions' batches without looking at a record (seed 003).

The broker returns, with a read_committed fetch, the aborted transactions its
range may hold as (producer id, first offset) pairs from the `.txnindex`
(Kafka's FetchResponse.AbortedTransactions). Walking the fetched batch
headers in offset order, a producer joins the aborting set once a batch at or
after its aborted transaction's first offset appears, and leaves it at its
next control batch (the ABORT marker); a transactional batch of a producer in
the set is skipped whole. Control batches are never returned. This is Kafka's
CompletedFetch.nextFetchedRecord logic, done per batch, so only the batches
kept are decoded (one native pass each).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from gregor.common.records import batch_rows


def committed_rows(data: bytes, headers: Sequence[Any], aborted: Sequence[tuple[int, int]], *,
                   min_offset: int = -1, prefix: Optional[tuple[Any, ...]] = None) -> list[tuple[Any, ...]]:
    """Rows (as records.fetched_rows) of the batches of `data` that are not part of an aborted transaction."""
    pending = sorted(aborted, key=lambda t: t[1])
    nxt = 0
    aborting: set[int] = set()
    out: list[tuple[Any, ...]] = []
    pos = 0
    for h in headers:
        start, pos = pos, pos + h.size_bytes
        last = h.base_offset + h.last_offset_delta
        while nxt < len(pending) and pending[nxt][1] <= last:
            aborting.add(pending[nxt][0])
            nxt += 1
        if h.is_control:
            aborting.discard(h.producer_id)  # its marker ends the producer's transaction
            continue
        if last < min_offset or (h.is_transactional and h.producer_id in aborting):
            continue
        out += batch_rows(h, data, start, min_offset=min_offset, prefix=prefix)
    return out
