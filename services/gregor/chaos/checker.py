"""The chaos checker: a verdict over a recorded history (history.py), modelled on Jepsen's Kafka workload.

Pure logic, no Gregor imports: it reads JSON lines and prints a JSON verdict plus a short summary, and
exits 1 when the history shows an anomaly (2 when the history itself is malformed).

    python -m gregor.chaos.checker history.jsonl [--out verdict.json] [--examples 5]

The anomalies, each by name (every one has a unit test in test_checker.py that proves it is found):

  lost_write             an acknowledged send (or a value of a committed transaction) that no read saw
                         although a final read covered its partition or a read saw a later offset; or
                         one read earlier that the final read no longer has.
  duplicate              one value at two offsets (the producers are idempotent, so never legitimate).
  inconsistent_offsets   two values at one offset, or a value read at an offset other than the one
                         its send was acknowledged at.
  nonmonotonic_send      one producer's acknowledged offsets on a partition not increasing in the
                         order it sent.
  nonmonotonic_poll      one consumer's successive reads of a partition going back or repeating
                         without a reassignment (`assign`) in between.
  poll_skip              one consumer's successive reads jumping over an offset that another read
                         shows holds a value (under read_committed only values it may see count).
  aborted_read           G1a: a read_committed read returned a value of an aborted transaction.
  txn_seen_in_part       a committed (or unknown-outcome) transaction of which a read_committed read
                         shows some values but not others it must show.
  unexpected_value       a value read that no operation ever sent.
  committed_offsets_backwards  an OffsetFetch returned less than a commit or fetch that completed
                         before it began.
  hw_backwards           a high watermark observed below one observed earlier, or below an offset
                         whose acks=all send was acknowledged before the observation began.
  replicas_diverged      after healing, the replicas of a partition differ in log end offset or bytes.
  two_controllers_in_epoch     two controller ids registered with one controller epoch, or the
                         `controller` key overwritten while a controller held it.
  controller_epoch_backwards   controller_epoch lower at a later etcd revision.

Unavailability (not an anomaly, reported beside the verdict): per fault, the seconds until acks=all produce
succeeded again on the partitions it affected, and until every transactional client committed again.

Unknown outcomes (timeouts) are neither required nor forbidden: an unknown send may be read or not,
an unknown transaction may be visible or not, but never in part. Failed polls return nothing.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from gregor.chaos.history import (
    FAIL, OK, READ_COMMITTED, UNKNOWN, HistoryError, Op, load_history, tp_name,
)

ANOMALIES = (
    "lost_write", "duplicate", "inconsistent_offsets", "nonmonotonic_send", "nonmonotonic_poll",
    "poll_skip", "aborted_read", "txn_seen_in_part", "unexpected_value", "committed_offsets_backwards",
    "hw_backwards", "replicas_diverged", "two_controllers_in_epoch", "controller_epoch_backwards",
)


@dataclass
class Write:
    """Everything sent with one value: where, how it ended, and (for transactions) which one."""

    value: str
    tp: str
    outcome: str
    offset: int | None
    process: str
    index: int
    txn_id: str | None = None

    @property
    def acknowledged(self) -> bool:
        return self.outcome == OK


@dataclass
class Model:
    """The history indexed: writes by value, reads by partition and offset."""

    writes: dict[str, Write] = field(default_factory=dict)
    # tp -> offset -> {value: [op index, ...]} over every ok poll.
    reads: dict[str, dict[int, dict[str, list[int]]]] = field(default_factory=lambda: defaultdict(dict))
    # value -> {(tp, offset)} over every ok poll.
    read_at: dict[str, set[tuple[str, int]]] = field(default_factory=lambda: defaultdict(set))
    # values some read_committed poll returned.
    read_committed_values: set[str] = field(default_factory=set)
    # tp -> the final read of it (the last one when there are several), and its values.
    final: dict[str, Op] = field(default_factory=dict)
    final_values: dict[str, set[str]] = field(default_factory=dict)
    txns: dict[str, Op] = field(default_factory=dict)


class Anomalies:
    """Collected anomalies: name -> examples (every one counted, at most `limit` kept)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: dict[str, int] = {name: 0 for name in ANOMALIES}
        self.examples: dict[str, list[dict[str, Any]]] = {name: [] for name in ANOMALIES}

    def add(self, name: str, **example: Any) -> None:
        self.counts[name] += 1
        if len(self.examples[name]) < self.limit:
            self.examples[name].append(example)

    @property
    def found(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if v}


def build_model(ops: list[Op]) -> Model:
    m = Model()
    for op in ops:
        if op.op == "send":
            _add_write(m, Write(str(op.get("value")), op.tp, op.outcome,
                                _int_or_none(op.get("offset")) if op.ok else None, op.process, op.index))
        elif op.op == "txn":
            m.txns[str(op.get("txn_id"))] = op
            for s in op.get("sends"):
                _add_write(m, Write(str(s["value"]), tp_name(s["topic"], s["partition"]), op.outcome,
                                    _int_or_none(s.get("offset")) if op.ok else None, op.process, op.index,
                                    txn_id=str(op.get("txn_id"))))
        elif op.op == "poll" and op.ok:
            tp = op.tp
            for offset, value in op.get("records"):
                m.reads[tp].setdefault(offset, {}).setdefault(value, []).append(op.index)
                m.read_at[value].add((tp, offset))
                if op.get("isolation") == READ_COMMITTED:
                    m.read_committed_values.add(value)
            if op.get("final"):
                m.final[tp] = op
                m.final_values[tp] = {v for _, v in op.get("records")}
    return m


def _add_write(m: Model, w: Write) -> None:
    # A value is sent once; a second send of it is recorded as its own write only if the first is gone.
    if w.value not in m.writes:
        m.writes[w.value] = w


def _int_or_none(v: Any) -> int | None:
    return None if v is None else int(v)


def _visible_committed(m: Model, value: str) -> bool:
    """May a read_committed reader see this value? Non-transactional and committed ones, or ones a
    read_committed read already returned (an unknown transaction that did commit)."""
    w = m.writes.get(value)
    if w is None or w.txn_id is None:
        return True
    return w.outcome == OK or value in m.read_committed_values


# --- write/read anomalies -------------------------------------------------------------------------------

def check_lost_writes(m: Model, out: Anomalies) -> None:
    max_read = {tp: max(offsets) for tp, offsets in m.reads.items() if offsets}
    for w in m.writes.values():
        if not w.acknowledged:
            continue
        final = m.final.get(w.tp)
        seen = m.read_at.get(w.value)
        if final is not None:
            if w.value not in m.final_values[w.tp]:
                reason = "read earlier, absent from the final read" if seen else "never read; a final read covered it"
                out.add("lost_write", value=w.value, partition=w.tp, offset=w.offset, process=w.process,
                        send_index=w.index, final_read_index=final.index, reason=reason)
        elif not seen and w.offset is not None and max_read.get(w.tp, -1) > w.offset:
            out.add("lost_write", value=w.value, partition=w.tp, offset=w.offset, process=w.process,
                    send_index=w.index, reason=f"never read; offset {max_read[w.tp]} was read")


def check_offsets(m: Model, out: Anomalies) -> None:
    for value, places in m.read_at.items():
        offsets = sorted(places)
        if len(offsets) > 1:
            out.add("duplicate", value=value, at=[f"{tp}@{o}" for tp, o in offsets])
    for tp, by_offset in m.reads.items():
        for offset, values in sorted(by_offset.items()):
            if len(values) > 1:
                out.add("inconsistent_offsets", partition=tp, offset=offset,
                        values=sorted(values), reads={v: idx[:3] for v, idx in values.items()})
    for w in m.writes.values():
        if w.offset is None:
            continue
        for tp, o in m.read_at.get(w.value, ()):
            if (tp, o) != (w.tp, w.offset):
                out.add("inconsistent_offsets", value=w.value, acknowledged_at=f"{w.tp}@{w.offset}",
                        read_at=f"{tp}@{o}", send_index=w.index)
        other = m.reads.get(w.tp, {}).get(w.offset, {})
        for v in other:
            if v != w.value:
                out.add("inconsistent_offsets", partition=w.tp, offset=w.offset, acknowledged=w.value,
                        read=v, send_index=w.index)
    for tp, by_offset in m.reads.items():
        for offset, values in by_offset.items():
            for v, idx in values.items():
                if v not in m.writes:
                    out.add("unexpected_value", partition=tp, offset=offset, value=v, poll_indexes=idx[:3])


def check_nonmonotonic_send(ops: list[Op], out: Anomalies) -> None:
    last: dict[tuple[str, str], tuple[int, Op]] = {}
    sends: list[tuple[float, int, str, str, int, Op]] = []
    for op in ops:
        if op.op == "send" and op.ok and op.get("offset") is not None:
            sends.append((op.invoke, op.index, op.process, op.tp, int(op.get("offset")), op))
        elif op.op == "txn" and op.ok:
            for s in op.get("sends"):
                if s.get("offset") is not None:
                    sends.append((op.invoke, op.index, op.process, tp_name(s["topic"], s["partition"]),
                                  int(s["offset"]), op))
    for _, _, process, tp, offset, op in sorted(sends, key=lambda s: (s[0], s[1])):
        prev = last.get((process, tp))
        if prev is not None and offset <= prev[0]:
            out.add("nonmonotonic_send", process=process, partition=tp, previous_offset=prev[0],
                    offset=offset, previous_index=prev[1].index, index=op.index)
        last[(process, tp)] = (offset, op)


def check_polls(ops: list[Op], m: Model, out: Anomalies) -> None:
    """nonmonotonic_poll and poll_skip: each consumer's reads of each partition, in its own order."""
    # Which offsets hold a value a reader of each isolation level must not jump over.
    holds_any: dict[str, list[int]] = {tp: sorted(by) for tp, by in m.reads.items()}
    holds_committed: dict[str, list[int]] = {
        tp: sorted(o for o, values in by.items() if any(_visible_committed(m, v) for v in values))
        for tp, by in m.reads.items()
    }
    position: dict[tuple[str, str], tuple[int, int]] = {}  # (process, tp) -> (last offset, poll index)
    for op in sorted((o for o in ops if o.op in ("poll", "assign")), key=lambda o: (o.invoke, o.index)):
        key = (op.process, op.tp)
        if op.op == "assign":
            position.pop(key, None)
            continue
        if not op.ok or op.get("final"):
            continue
        holds = holds_committed if op.get("isolation") == READ_COMMITTED else holds_any
        for offset, value in op.get("records"):
            prev = position.get(key)
            if prev is not None:
                if offset <= prev[0]:
                    out.add("nonmonotonic_poll", process=op.process, partition=op.tp, previous_offset=prev[0],
                            offset=offset, value=value, previous_index=prev[1], index=op.index)
                else:
                    held = holds.get(op.tp, [])
                    skipped = held[bisect.bisect_right(held, prev[0]):bisect.bisect_left(held, offset)]
                    if skipped:
                        out.add("poll_skip", process=op.process, partition=op.tp, previous_offset=prev[0],
                                offset=offset, skipped=skipped[:10], skipped_count=len(skipped),
                                previous_index=prev[1], index=op.index)
            position[key] = (offset, op.index)
    # The final read must itself be gap-free against every value read anywhere.
    for tp, final in m.final.items():
        holds = holds_committed if final.get("isolation") == READ_COMMITTED else holds_any
        got = [o for o, _ in final.get("records")]
        if not got:
            continue
        start = int(final.get("start_offset", got[0]))
        in_final = set(got)
        skipped = sorted(o for o in holds.get(tp, ()) if start <= o <= got[-1] and o not in in_final)
        if skipped:
            out.add("poll_skip", process=final.process, partition=tp, final=True, skipped=skipped[:10],
                    skipped_count=len(skipped), index=final.index)
        for a, b in zip(got, got[1:]):
            if b <= a:
                out.add("nonmonotonic_poll", process=final.process, partition=tp, final=True,
                        previous_offset=a, offset=b, index=final.index)


def check_transactions(ops: list[Op], m: Model, out: Anomalies) -> None:
    by_txn_values: dict[str, list[Write]] = defaultdict(list)
    for w in m.writes.values():
        if w.txn_id is not None:
            by_txn_values[w.txn_id].append(w)
    for op in ops:
        if op.op != "poll" or not op.ok or op.get("isolation") != READ_COMMITTED:
            continue
        records = op.get("records")
        returned = {v for _, v in records}
        for offset, value in records:
            read = m.writes.get(value)
            if read is not None and read.txn_id is not None and read.outcome == FAIL:
                out.add("aborted_read", value=value, txn_id=read.txn_id, partition=op.tp, offset=offset,
                        poll_index=op.index, process=op.process)
        if not records:
            continue
        # In part: a transaction with a value here, and a sibling in the same partition inside the range
        # this poll covered (or anywhere in it, for a final read) that it did not return.
        lo = int(op.get("start_offset", records[0][0])) if op.get("final") else records[0][0]
        hi = records[-1][0]
        txns_here = {m.writes[v].txn_id for v in returned if v in m.writes and m.writes[v].txn_id}
        for txn_id in txns_here:
            siblings = by_txn_values[str(txn_id)]
            if siblings[0].outcome == FAIL:
                continue  # already an aborted read
            missing = []
            for sib in siblings:
                if sib.tp != op.tp or sib.value in returned:
                    continue
                places = [o for tp, o in m.read_at.get(sib.value, ()) if tp == op.tp]
                offsets = places or ([sib.offset] if sib.offset is not None else [])
                if op.get("final") and not offsets and sib.acknowledged:
                    missing.append(sib.value)
                elif any(lo <= o <= hi for o in offsets):
                    missing.append(sib.value)
            if missing:
                out.add("txn_seen_in_part", txn_id=txn_id, partition=op.tp, poll_index=op.index,
                        process=op.process, seen=sorted(v for v in returned if m.writes.get(v) is not None
                                                        and m.writes[v].txn_id == txn_id),
                        missing=sorted(missing))
    # Across partitions: final reads must show all or none of each transaction they cover.
    for txn_id, writes in by_txn_values.items():
        covered = [w for w in writes if w.tp in m.final and m.final[w.tp].get("isolation") == READ_COMMITTED]
        if len(covered) < 2 or covered[0].outcome == FAIL:
            continue
        in_final = [w for w in covered if w.value in m.final_values[w.tp]]
        if in_final and len(in_final) < len(covered):
            tps = {w.tp for w in in_final}
            absent = [w for w in covered if w not in in_final]
            if all(w.tp in tps for w in absent):
                continue  # same-partition gaps were reported above
            out.add("txn_seen_in_part", txn_id=txn_id, final=True, outcome=covered[0].outcome,
                    seen=sorted(f"{w.tp}:{w.value}" for w in in_final),
                    missing=sorted(f"{w.tp}:{w.value}" for w in absent))


# --- metadata anomalies ---------------------------------------------------------------------------------

Obs = tuple[float, float, int, Op]  # (invoke, complete, value, op)


def _realtime_backwards(sources: list[Obs], observations: list[Obs]) -> Iterable[tuple[Op, int, Op]]:
    """(observation, floor, source) for each observation below the highest source value that completed
    before the observation began."""
    by_complete = sorted(sources, key=lambda x: x[1])
    best: tuple[int, Op] | None = None
    i = 0
    for invoke, _, value, op in sorted(observations, key=lambda x: (x[0], x[3].index)):
        while i < len(by_complete) and by_complete[i][1] < invoke:
            if best is None or by_complete[i][2] > best[0]:
                best = (by_complete[i][2], by_complete[i][3])
            i += 1
        if best is not None and value < best[0]:
            yield op, best[0], best[1]


def check_committed_offsets(ops: list[Op], out: Anomalies) -> None:
    groups: dict[tuple[str, str], list[Obs]] = defaultdict(list)
    for op in ops:
        if op.op in ("commit_offsets", "fetch_offsets") and op.ok and op.complete is not None:
            if op.get("offset") is None or int(op.get("offset")) < 0:
                continue
            groups[(str(op.get("group")), op.tp)].append((op.invoke, op.complete, int(op.get("offset")), op))
    for (group, tp), obs in groups.items():
        fetches = [o for o in obs if o[3].op == "fetch_offsets"]
        for later, floor, earlier in _realtime_backwards(obs, fetches):
            out.add("committed_offsets_backwards", group=group, partition=tp, fetched=later.get("offset"),
                    earlier=floor, earlier_op=earlier.op, earlier_index=earlier.index, index=later.index)


def check_hw(ops: list[Op], out: Anomalies) -> None:
    per_tp: dict[str, list[Obs]] = defaultdict(list)
    acks: dict[str, list[Obs]] = defaultdict(list)
    for op in ops:
        if op.op == "hw" and op.ok and op.complete is not None:
            per_tp[op.tp].append((op.invoke, op.complete, int(op.get("offset")), op))
        elif op.op == "send" and op.ok and op.get("offset") is not None and op.complete is not None:
            # An acks=all acknowledgement at offset o means the high watermark had passed o.
            acks[op.tp].append((op.invoke, op.complete, int(op.get("offset")) + 1, op))
    for tp, obs in per_tp.items():
        for later, floor, earlier in _realtime_backwards(obs, obs):
            out.add("hw_backwards", partition=tp, hw=later.get("offset"), earlier_hw=floor,
                    earlier_index=earlier.index, index=later.index, broker=later.get("broker"))
        for later, floor, earlier in _realtime_backwards(acks.get(tp, []), obs):
            out.add("hw_backwards", partition=tp, hw=later.get("offset"), acknowledged_offset=floor - 1,
                    send_index=earlier.index, index=later.index, broker=later.get("broker"),
                    reason="below an offset acknowledged before the observation began")


def check_replicas(ops: list[Op], out: Anomalies) -> None:
    last: dict[str, dict[Any, Op]] = defaultdict(dict)
    for op in ops:
        if op.op == "replica" and op.ok:
            last[op.tp][op.get("broker")] = op
    for tp, by_broker in last.items():
        shapes = {(int(o.get("log_end_offset")), str(o.get("digest"))) for o in by_broker.values()}
        if len(shapes) > 1:
            out.add("replicas_diverged", partition=tp,
                    replicas={str(b): {"log_end_offset": o.get("log_end_offset"), "digest": o.get("digest")}
                              for b, o in sorted(by_broker.items(), key=lambda kv: str(kv[0]))})


def check_controllers(ops: list[Op], out: Anomalies) -> None:
    changes = sorted((o for o in ops if o.op == "controller" and o.ok), key=lambda o: int(o.get("revision")))
    holders: dict[int, set[Any]] = defaultdict(set)
    prev: Op | None = None
    for op in changes:
        epoch = op.get("epoch")
        if epoch is None:
            continue
        epoch = int(epoch)
        if op.get("controller") is not None:
            holders[epoch].add(op.get("controller"))
            if op.get("version") is not None and int(op.get("version")) > 1:
                out.add("two_controllers_in_epoch", epoch=epoch, controller=op.get("controller"),
                        revision=op.get("revision"), version=op.get("version"),
                        reason="controller key overwritten while a controller held it")
        if prev is not None and epoch < int(prev.get("epoch")):
            out.add("controller_epoch_backwards", epoch=epoch, revision=op.get("revision"),
                    previous_epoch=prev.get("epoch"), previous_revision=prev.get("revision"))
        prev = op
    for epoch, ids in sorted(holders.items()):
        if len(ids) > 1:
            out.add("two_controllers_in_epoch", epoch=epoch, controllers=sorted(map(str, ids)))


# --- unavailability ---------------------------------------------------------------------------------------

def unavailability(ops: list[Op]) -> dict[str, Any]:
    """Per fault: seconds from its start until an acks=all send invoked after the start succeeds on every
    affected partition (the slowest of them); and until every transactional client (txn-0, gwtxn-0, ...:
    the process name before its generation suffix) has a transaction invoked after the start committed,
    which shows a transaction coordinator that cannot complete transactions although produce works.
    Per fault kind: the distribution of each (None per fault, counted as never recovered, when the
    history ends first)."""
    sends_by_tp: dict[str, list[Op]] = defaultdict(list)
    commits_by_client: dict[str, list[Op]] = defaultdict(list)
    txn_clients: set[str] = set()
    for op in ops:
        if op.op == "send" and op.ok and op.complete is not None:
            sends_by_tp[op.tp].append(op)
        elif op.op == "txn":
            client = op.process.split(".", 1)[0]
            txn_clients.add(client)
            if op.ok and op.complete is not None:
                commits_by_client[client].append(op)
    faults: list[dict[str, Any]] = []
    for op in sorted((o for o in ops if o.op == "nemesis" and o.get("phase") == "start"), key=lambda o: o.invoke):
        t0 = op.invoke
        produce = _recovery(t0, sends_by_tp, op.get("partitions") or sorted(sends_by_tp))
        fault = {"fault": op.get("fault"), "start": t0, "targets": op.get("targets"), "unavailable_s": produce}
        if txn_clients:
            fault["txn_unavailable_s"] = _recovery(t0, commits_by_client, sorted(txn_clients))
        faults.append(fault)
    return {"per_fault": faults, "per_kind": _per_kind(faults, "unavailable_s"),
            "txn_per_kind": _per_kind(faults, "txn_unavailable_s") if txn_clients else {},
            "txn_longest_gap": _longest_txn_gap(ops, commits_by_client, txn_clients)}


def disk_full(ops: list[Op]) -> list[dict[str, Any]]:
    """Per disk-full fault: what the filled broker kept serving while its small log dir was full (issue 21). The
    nemesis start names the partitions whose replica on that broker is in the filled dir (detail
    `full_dir_partitions`); every other partition sent to in the history should have acks=all sends invoked
    after the fill and completed before the heal (`served`: their count; `not_served`: the partitions with none).
    Not an anomaly: the chaos suite's test asserts `not_served` is empty."""
    stops = sorted(o.invoke for o in ops if o.op == "nemesis" and o.get("fault") == "disk-full"
                   and o.get("phase") == "stop")
    sends = [o for o in ops if o.op == "send"]
    all_tps = sorted({o.tp for o in sends})
    out: list[dict[str, Any]] = []
    for start in sorted((o for o in ops if o.op == "nemesis" and o.get("fault") == "disk-full"
                         and o.get("phase") == "start"), key=lambda o: o.invoke):
        t0 = start.complete if start.complete is not None else start.invoke  # the fill is done by then
        t1 = next((t for t in stops if t >= t0), None)
        full = sorted((start.get("detail") or {}).get("full_dir_partitions") or [])
        served = {tp: 0 for tp in all_tps if tp not in full}
        for o in sends:
            if (o.ok and o.tp in served and o.invoke >= t0 and o.complete is not None
                    and (t1 is None or o.complete <= t1)):
                served[o.tp] += 1
        out.append({"start": t0, "stop": t1, "full_dir_partitions": full, "served": served,
                    "not_served": sorted(tp for tp, n in served.items() if n == 0)})
    return out


def _longest_txn_gap(ops: list[Op], commits_by_client: dict[str, list[Op]],
                     clients: set[str]) -> dict[str, Any] | None:
    """The longest time one transactional client went without a commit (from its previous commit, or its
    first transaction, to the next commit or the end of the workload), and the last fault begun before it:
    a coordinator stuck after a fault shows here even where a commit slipped through just after the fault."""
    workload = [o.complete for o in ops if o.op in ("send", "txn") and o.complete is not None]
    if not clients or not workload:
        return None
    end = max(workload)
    starts = sorted((o.invoke, str(o.get("fault"))) for o in ops if o.op == "nemesis" and o.get("phase") == "start")
    best: dict[str, Any] | None = None
    for client in sorted(clients):
        first = min(o.invoke for o in ops if o.op == "txn" and o.process.split(".", 1)[0] == client)
        marks = [first, *sorted(o.complete for o in commits_by_client.get(client, []) if o.complete is not None), end]
        for i, (a, b) in enumerate(zip(marks, marks[1:])):
            if best is None or b - a > best["seconds"]:
                before = [f for f in starts if f[0] <= a]
                best = {"client": client, "from": a, "to": b, "seconds": round(b - a, 3),
                        "ends_with_history": i == len(marks) - 2,
                        "last_fault_before": None if not before else
                        {"fault": before[-1][1], "start": before[-1][0], "seconds_before": round(a - before[-1][0], 3)}}
    return best


def _recovery(t0: float, done_by_key: dict[str, list[Op]], keys: Iterable[str]) -> float | None:
    """The slowest of `keys` to see an operation invoked at or after t0 complete: its completion - t0; None
    if one of them never did."""
    worst = 0.0
    for key in keys:
        after = [o.complete for o in done_by_key.get(key, []) if o.invoke >= t0 and o.complete is not None]
        if not after:
            return None
        worst = max(worst, min(after) - t0)
    return round(worst, 3)


def _per_kind(faults: list[dict[str, Any]], field_name: str) -> dict[str, dict[str, Any]]:
    kinds: dict[str, dict[str, Any]] = {}
    for kind in sorted({str(f["fault"]) for f in faults}):
        of_kind = [f[field_name] for f in faults if f["fault"] == kind]
        values = sorted(v for v in of_kind if v is not None)
        never = sum(1 for v in of_kind if v is None)
        kinds[kind] = {"count": len(values) + never, "never_recovered": never, **_distribution(values)}
    return kinds


def _distribution(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "p50": None, "p90": None, "max": None}

    def q(p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    return {"min": values[0], "p50": q(0.5), "p90": q(0.9), "max": values[-1]}


# --- verdict ----------------------------------------------------------------------------------------------

def check(ops: list[Op], examples: int = 5) -> dict[str, Any]:
    m = build_model(ops)
    out = Anomalies(examples)
    check_lost_writes(m, out)
    check_offsets(m, out)
    check_nonmonotonic_send(ops, out)
    check_polls(ops, m, out)
    check_transactions(ops, m, out)
    check_committed_offsets(ops, out)
    check_hw(ops, out)
    check_replicas(ops, out)
    check_controllers(ops, out)
    outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for op in ops:
        outcomes[op.op][op.outcome] += 1
    writes = list(m.writes.values())
    stats = {
        "ops": {k: dict(v) for k, v in sorted(outcomes.items())},
        "values_sent": len(writes),
        "values_acknowledged": sum(1 for w in writes if w.outcome == OK),
        "values_unknown": sum(1 for w in writes if w.outcome == UNKNOWN),
        "values_failed": sum(1 for w in writes if w.outcome == FAIL),
        "values_read": len(m.read_at),
        "unknown_values_read": sum(1 for w in writes if w.outcome == UNKNOWN and w.value in m.read_at),
        "partitions_with_final_read": len(m.final),
        "faults": dict(sorted(_count(str(o.get("fault")) for o in ops
                                     if o.op == "nemesis" and o.get("phase") == "start").items())),
    }
    warnings = []
    if not m.final:
        warnings.append("no final read: lost writes are only found below offsets some poll saw")
    return {
        "valid": not out.found,
        "anomaly_counts": out.found,
        "anomalies": {k: v for k, v in out.examples.items() if v},
        "stats": stats,
        "unavailability": unavailability(ops),
        "disk_full": disk_full(ops),
        "warnings": warnings,
    }


def _count(items: Iterable[str]) -> dict[str, int]:
    c: dict[str, int] = defaultdict(int)
    for i in items:
        c[i] += 1
    return c


def summary(verdict: dict[str, Any]) -> str:
    s = verdict["stats"]
    lines = [
        f"verdict: {'VALID' if verdict['valid'] else 'INVALID'}",
        f"values: {s['values_sent']} sent, {s['values_acknowledged']} acknowledged, {s['values_unknown']} unknown "
        f"({s['unknown_values_read']} of them read), {s['values_failed']} failed; {s['values_read']} read; "
        f"{s['partitions_with_final_read']} partitions in the final read",
    ]
    ops = ", ".join(f"{k} {sum(v.values())}" for k, v in s["ops"].items())
    lines.append(f"operations: {ops}")
    if verdict["anomaly_counts"]:
        lines.append("anomalies: " + ", ".join(f"{k} {v}" for k, v in verdict["anomaly_counts"].items()))
    else:
        lines.append("anomalies: none")
    for what, key in (("unavailability", "per_kind"), ("txn unavailability", "txn_per_kind")):
        for kind, d in verdict["unavailability"].get(key, {}).items():
            lines.append(f"{what} {kind}: n={d['count']} min={d['min']} p50={d['p50']} p90={d['p90']} "
                         f"max={d['max']} never_recovered={d['never_recovered']}")
    gap = verdict["unavailability"].get("txn_longest_gap")
    if gap is not None:
        fault = gap["last_fault_before"]
        lines.append(f"longest time without a committed transaction: {gap['seconds']} s ({gap['client']}"
                     + ("" if fault is None else f"; {fault['seconds_before']} s after {fault['fault']} began")
                     + ("; until the workload ended" if gap["ends_with_history"] else "") + ")")
    for d in verdict.get("disk_full", []):
        lines.append(f"disk-full at {d['start']:.3f}: full dir held {', '.join(d['full_dir_partitions']) or 'none'}; "
                     f"the other partitions served {sum(d['served'].values())} acks=all sends meanwhile"
                     + (f", none on {', '.join(d['not_served'])}" if d["not_served"] else ""))
    lines.extend(f"warning: {w}" for w in verdict["warnings"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gregor chaos check",
                                     description="Check a chaos history (JSON lines) for Kafka anomalies.")
    parser.add_argument("history")
    parser.add_argument("--out", help="write the JSON verdict here (default: stdout)")
    parser.add_argument("--examples", type=int, default=5, help="examples kept per anomaly")
    args = parser.parse_args(argv)
    try:
        ops = load_history(args.history)
    except (HistoryError, OSError) as exc:
        print(f"chaos checker: {exc}", file=sys.stderr)
        return 2
    verdict = check(ops, args.examples)
    text = json.dumps(verdict, indent=2, default=str)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    print(summary(verdict), file=sys.stderr if not args.out else sys.stdout)
    return 0 if verdict["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
