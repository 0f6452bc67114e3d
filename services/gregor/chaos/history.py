"""The chaos history: one JSON object per line, one line per completed operation (Jepsen's invoke and
completion folded into one record with both times).

Every line has `process` (str), `op` (str), `invoke` and `complete` (seconds, float; `complete` may be
null for an operation that never returned) and `outcome`: "ok" (it happened), "fail" (it definitely did
not happen) or "unknown" (a timeout or a lost connection: it may or may not have happened, as in
Jepsen's :info). The operations and their own fields:

  send            topic, partition, key, value, offset (null unless ok), client ("sdk" | "sync" |
                  "gateway"), compression; one acks=all record sent by an idempotent producer.
  txn             txn_id, sends: [{topic, partition, key, value, offset}], a transactional
                  consume-transform-produce step; ok = committed, fail = aborted, unknown = unknown.
  poll            topic, partition, records: [[offset, value], ...] in the order the consumer returned
                  them, isolation ("read_committed" | "read_uncommitted"), group (or null), final
                  (true for the final read of everything after healing).
  assign          topic, partition: the consumer's position was (re)set (rebalance, seek, restart);
                  the next poll by this process on this partition may start anywhere.
  commit_offsets  group, topic, partition, offset: an OffsetCommit.
  fetch_offsets   group, topic, partition, offset: an OffsetFetch (the committed offset observed).
  hw              topic, partition, offset, broker: a high watermark observed from a partition leader.
  replica         topic, partition, broker, log_end_offset, digest: the replica's bytes as the native
                  engine reads them after healing (sha256 of every batch from offset 0).
  controller      revision, epoch, controller (id or null when the key was deleted), version (the
                  `controller` key's version at that revision): one change from etcd's history.
  nemesis         fault (kind), phase ("start" | "stop"), targets ([str]), partitions (["topic/p"] or
                  null for every partition), detail (free-form).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, TextIO

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"
OUTCOMES = (OK, FAIL, UNKNOWN)
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"

# The fields each operation must carry beyond the common ones.
REQUIRED: dict[str, tuple[str, ...]] = {
    "send": ("topic", "partition", "value"),
    "txn": ("txn_id", "sends"),
    "poll": ("topic", "partition", "records"),
    "assign": ("topic", "partition"),
    "commit_offsets": ("group", "topic", "partition", "offset"),
    "fetch_offsets": ("group", "topic", "partition", "offset"),
    "hw": ("topic", "partition", "offset"),
    "replica": ("topic", "partition", "broker", "log_end_offset", "digest"),
    "controller": ("revision", "epoch", "controller"),
    "nemesis": ("fault", "phase"),
}


class HistoryError(ValueError):
    """A history line that is not a valid operation (with its 1-based line number)."""


@dataclass(frozen=True)
class Op:
    """One completed operation: the common fields typed, the rest in `fields`."""

    index: int
    process: str
    op: str
    invoke: float
    complete: float | None
    outcome: str
    fields: dict[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    @property
    def tp(self) -> str:
        return tp_name(self.fields["topic"], self.fields["partition"])

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "process": self.process, "op": self.op, "invoke": self.invoke,
                "complete": self.complete, "outcome": self.outcome, **self.fields}


def tp_name(topic: str, partition: int) -> str:
    return f"{topic}/{int(partition)}"


def parse_op(raw: dict[str, Any], index: int) -> Op:
    """A typed Op from one decoded line; HistoryError on anything malformed."""
    if not isinstance(raw, dict):
        raise HistoryError(f"line {index + 1}: not a JSON object")
    try:
        process, op, outcome = str(raw["process"]), str(raw["op"]), str(raw["outcome"])
        invoke = float(raw["invoke"])
        complete = None if raw.get("complete") is None else float(raw["complete"])
    except (KeyError, TypeError, ValueError) as exc:
        raise HistoryError(f"line {index + 1}: missing or bad common field ({exc})") from None
    if op not in REQUIRED:
        raise HistoryError(f"line {index + 1}: unknown op {op!r}")
    if outcome not in OUTCOMES:
        raise HistoryError(f"line {index + 1}: outcome must be one of {OUTCOMES}, not {outcome!r}")
    missing = [f for f in REQUIRED[op] if f not in raw]
    if missing:
        raise HistoryError(f"line {index + 1}: {op} lacks {', '.join(missing)}")
    fields = {k: v for k, v in raw.items() if k not in ("process", "op", "invoke", "complete", "outcome", "index")}
    if op == "poll":
        try:
            fields["records"] = [(int(o), str(v)) for o, v in fields["records"]]
        except (TypeError, ValueError):
            raise HistoryError(f"line {index + 1}: poll records must be [[offset, value], ...]") from None
    if op == "txn":
        for s in fields["sends"]:
            if not isinstance(s, dict) or not {"topic", "partition", "value"} <= s.keys():
                raise HistoryError(f"line {index + 1}: each txn send needs topic, partition and value")
    return Op(index, process, op, invoke, complete, outcome, fields)


def read_history(stream: TextIO) -> list[Op]:
    ops: list[Op] = []
    for n, line in enumerate(stream):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"line {n + 1}: not JSON ({exc.msg})") from None
        ops.append(parse_op(raw, n))
    return ops


def load_history(path: str) -> list[Op]:
    with open(path, encoding="utf-8") as f:
        return read_history(f)


def parse_ops(raws: Iterable[dict[str, Any]]) -> list[Op]:
    return [parse_op(r, i) for i, r in enumerate(raws)]


class HistoryWriter:
    """Appends operations as JSON lines, flushed per line so a killed run keeps what it recorded.

    Not thread-safe by itself: callers from several threads share one lock (`record` takes it).
    """

    def __init__(self, path: str) -> None:
        import threading

        self._f = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def record(self, **op: Any) -> None:
        line = json.dumps(op, separators=(",", ":"), default=str)
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_kind(ops: Iterable[Op], kind: str) -> Iterator[Op]:
    return (o for o in ops if o.op == kind)
