"""The chaos checker on hand-written histories: each anomaly is found, and valid histories (with unknown
outcomes, aborted transactions read uncommitted, control-marker gaps, rebalances) are not flagged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gregor.chaos.checker import ANOMALIES, check, summary
from gregor.chaos.history import HistoryError, HistoryWriter, load_history, parse_ops


class H:
    """A history under construction: each op gets the next instant unless times are given."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.t = 0.0

    def add(self, op: str, process: str = "p0", outcome: str = "ok", invoke: float | None = None,
            complete: float | None = None, **fields: Any) -> "H":
        if invoke is None:
            self.t += 1
            invoke = self.t
        if complete is None:
            complete = invoke + 0.5
        self.t = max(self.t, complete)
        self.ops.append({"process": process, "op": op, "invoke": invoke, "complete": complete,
                         "outcome": outcome, **fields})
        return self

    def send(self, value: str, offset: int | None, tp: tuple[str, int] = ("t", 0), process: str = "prod",
             outcome: str = "ok", **kw: Any) -> "H":
        return self.add("send", process, outcome, topic=tp[0], partition=tp[1], key=None, value=value,
                        offset=offset if outcome == "ok" else None, client="sdk", **kw)

    def poll(self, records: list[tuple[int, str]], tp: tuple[str, int] = ("t", 0), process: str = "cons",
             isolation: str = "read_uncommitted", final: bool = False, **kw: Any) -> "H":
        return self.add("poll", process, "ok", topic=tp[0], partition=tp[1], records=[list(r) for r in records],
                        isolation=isolation, group=None, final=final, **kw)

    def final(self, records: list[tuple[int, str]], tp: tuple[str, int] = ("t", 0),
              isolation: str = "read_committed") -> "H":
        return self.poll(records, tp, process="final", isolation=isolation, final=True, start_offset=0)

    def txn(self, txn_id: str, sends: list[tuple[str, tuple[str, int], int | None]], outcome: str = "ok",
            process: str = "txn") -> "H":
        return self.add("txn", process, outcome, txn_id=txn_id,
                        sends=[{"topic": tp[0], "partition": tp[1], "key": None, "value": v, "offset": o}
                               for v, tp, o in sends])

    def verdict(self) -> dict[str, Any]:
        return check(parse_ops(self.ops))


def counts(h: H) -> dict[str, int]:
    return h.verdict()["anomaly_counts"]


def only(h: H, name: str) -> dict[str, Any]:
    v = h.verdict()
    assert set(v["anomaly_counts"]) == {name}, v["anomaly_counts"]
    assert not v["valid"]
    return v["anomalies"][name][0]


def base() -> H:
    """Three acknowledged sends read back in order by a consumer and a final read."""
    h = H().send("a", 0).send("b", 1).send("c", 2)
    h.poll([(0, "a"), (1, "b")]).poll([(2, "c")])
    return h


# --- valid histories --------------------------------------------------------------------------------------

def test_a_clean_history_is_valid() -> None:
    h = base().final([(0, "a"), (1, "b"), (2, "c")])
    v = h.verdict()
    assert v["valid"] and v["anomaly_counts"] == {}
    assert v["stats"]["values_acknowledged"] == 3 and v["stats"]["values_read"] == 3
    assert "VALID" in summary(v)


def test_unknown_outcomes_are_neither_required_nor_forbidden() -> None:
    h = base()
    # A timed-out send that did land, one that did not, a failed one never read, an unknown
    # transaction that committed (both values visible) and one that did not (neither visible).
    h.send("u1", None, outcome="unknown").send("u2", None, outcome="unknown").send("f", None, outcome="fail")
    h.txn("T1", [("x1", ("t", 0), None), ("y1", ("t", 1), None)], outcome="unknown")
    h.txn("T2", [("x2", ("t", 0), None), ("y2", ("t", 1), None)], outcome="unknown")
    h.send("d", 6)
    h.final([(0, "a"), (1, "b"), (2, "c"), (3, "u1"), (4, "x1"), (6, "d")])  # 5 is a commit marker
    h.final([(0, "y1")], tp=("t", 1))
    v = h.verdict()
    assert v["valid"], v["anomalies"]
    assert v["stats"]["values_unknown"] == 6 and v["stats"]["unknown_values_read"] == 3


def test_aborted_values_read_uncommitted_and_marker_gaps_are_valid() -> None:
    h = base()
    h.txn("A", [("ab", ("t", 0), None)], outcome="fail")
    h.send("d", 5)
    h.poll([(3, "ab"), (5, "d")], process="ru", isolation="read_uncommitted")
    h.poll([(0, "a"), (1, "b"), (2, "c"), (5, "d")], process="rc", isolation="read_committed")
    h.final([(0, "a"), (1, "b"), (2, "c"), (5, "d")])
    assert h.verdict()["valid"], h.verdict()["anomalies"]


def test_a_rebalance_lets_a_consumer_reread() -> None:
    h = base()
    h.add("assign", "cons", topic="t", partition=0)
    h.poll([(1, "b"), (2, "c")])
    assert h.verdict()["valid"]


def test_commits_and_fetches_that_only_go_forward_are_valid() -> None:
    h = base()
    h.add("commit_offsets", "cons", group="g", topic="t", partition=0, offset=2)
    h.add("fetch_offsets", "cons", group="g", topic="t", partition=0, offset=2)
    h.add("commit_offsets", "cons", group="g", topic="t", partition=0, offset=3)
    # Concurrent with the commit of 3, a fetch may still see 2.
    h.add("fetch_offsets", "c2", invoke=h.t - 0.4, complete=h.t + 0.1, group="g", topic="t", partition=0, offset=2)
    h.add("fetch_offsets", "cons", group="g", topic="t", partition=0, offset=3)
    h.add("hw", "hw", topic="t", partition=0, offset=3, broker=1)
    h.add("hw", "hw", topic="t", partition=0, offset=3, broker=2)
    assert h.verdict()["valid"], h.verdict()["anomalies"]


# --- each anomaly -----------------------------------------------------------------------------------------

def test_lost_write_never_read_with_a_final_read() -> None:
    h = base().send("d", 3).final([(0, "a"), (1, "b"), (2, "c")])
    ex = only(h, "lost_write")
    assert ex["value"] == "d" and ex["partition"] == "t/0"


def test_lost_write_below_a_read_offset_without_final_read() -> None:
    h = H().send("a", 0).send("b", 1).send("c", 2).poll([(0, "a"), (2, "c")])
    v = h.verdict()
    assert v["anomaly_counts"]["lost_write"] == 1 and v["anomalies"]["lost_write"][0]["value"] == "b"
    # The consumer's jump from 0 to 2 is not a poll skip: nobody saw offset 1 hold a value.
    assert "poll_skip" not in v["anomaly_counts"]


def test_lost_write_read_once_then_gone() -> None:
    h = base().final([(0, "a"), (2, "c")])
    v = h.verdict()
    assert v["anomalies"]["lost_write"][0]["reason"].startswith("read earlier")
    assert v["anomaly_counts"]["lost_write"] == 1


def test_lost_committed_transaction_value() -> None:
    h = base().txn("T", [("x", ("t", 0), 3)]).final([(0, "a"), (1, "b"), (2, "c")])
    assert only(h, "lost_write")["value"] == "x"


def test_duplicate() -> None:
    h = base().poll([(3, "b")], process="other").final([(0, "a"), (1, "b"), (2, "c"), (3, "b")])
    v = h.verdict()
    assert v["anomaly_counts"]["duplicate"] == 1
    assert v["anomalies"]["duplicate"][0]["at"] == ["t/0@1", "t/0@3"]


def test_inconsistent_offsets_two_values_at_one_offset() -> None:
    h = base().send("d", 3).poll([(3, "d")], process="x").poll([(3, "e")], process="y")
    h.send("e", None, outcome="unknown")
    v = h.verdict()
    assert v["anomalies"]["inconsistent_offsets"][0]["values"] == ["d", "e"]


def test_inconsistent_offsets_read_elsewhere_than_acknowledged() -> None:
    h = H().send("a", 0).send("b", 5).poll([(0, "a"), (1, "b")]).final([(0, "a"), (1, "b")])
    ex = only(h, "inconsistent_offsets")
    assert ex["acknowledged_at"] == "t/0@5" and ex["read_at"] == "t/0@1"


def test_nonmonotonic_send() -> None:
    h = H().send("a", 4).send("b", 2).final([(2, "b"), (4, "a")])
    ex = only(h, "nonmonotonic_send")
    assert (ex["previous_offset"], ex["offset"]) == (4, 2)


def test_nonmonotonic_poll_across_polls() -> None:
    h = base().poll([(1, "b")])
    ex = only(h, "nonmonotonic_poll")
    assert (ex["previous_offset"], ex["offset"]) == (2, 1)


def test_nonmonotonic_poll_within_a_poll() -> None:
    h = H().send("a", 0).send("b", 1).poll([(1, "b"), (0, "a")])
    assert only(h, "nonmonotonic_poll")["offset"] == 0


def test_poll_skip() -> None:
    h = base().send("d", 3).send("e", 4).poll([(4, "e")]).poll([(3, "d"), (4, "e")], process="other")
    ex = only(h, "poll_skip")
    assert ex["skipped"] == [3] and ex["process"] == "cons"


def test_poll_skip_in_the_final_read() -> None:
    h = base().final([(0, "a"), (2, "c")])
    assert h.verdict()["anomaly_counts"]["poll_skip"] == 1  # and a lost write: b disappeared


def test_read_committed_skipping_only_an_aborted_value_is_no_skip() -> None:
    h = base().txn("A", [("ab", ("t", 0), None)], outcome="fail").send("d", 4)
    h.poll([(3, "ab"), (4, "d")], process="ru")
    h.poll([(0, "a"), (1, "b"), (2, "c"), (4, "d")], process="rc", isolation="read_committed")
    assert h.verdict()["valid"]
    h.poll([(0, "a"), (1, "b"), (2, "c"), (4, "d")], process="ru2", isolation="read_uncommitted")
    assert only(h, "poll_skip")["process"] == "ru2"


def test_aborted_read_g1a() -> None:
    h = base().txn("A", [("ab", ("t", 0), None)], outcome="fail")
    h.poll([(3, "ab")], process="rc", isolation="read_committed")
    ex = only(h, "aborted_read")
    assert ex["txn_id"] == "A" and ex["value"] == "ab"


def test_txn_seen_in_part_within_a_partition() -> None:
    h = base().txn("T", [("x", ("t", 0), 3), ("y", ("t", 0), 4)]).send("z", 6)
    h.poll([(3, "x"), (6, "z")], process="rc", isolation="read_committed")
    h.poll([(3, "x"), (4, "y"), (6, "z")], process="rc2", isolation="read_committed")
    v = h.verdict()
    assert v["anomaly_counts"].get("txn_seen_in_part") == 1, v["anomalies"]
    assert v["anomalies"]["txn_seen_in_part"][0]["missing"] == ["y"]


def test_txn_seen_in_part_across_partitions_in_the_final_read() -> None:
    h = base().txn("T", [("x", ("t", 0), None), ("y", ("t", 1), None)], outcome="unknown")
    h.final([(0, "a"), (1, "b"), (2, "c"), (3, "x")])
    h.final([], tp=("t", 1))
    ex = only(h, "txn_seen_in_part")
    assert ex["txn_id"] == "T" and ex["missing"] == ["t/1:y"]


def test_unexpected_value() -> None:
    h = base().poll([(3, "ghost")], process="x")
    assert only(h, "unexpected_value")["value"] == "ghost"


def test_committed_offsets_backwards() -> None:
    h = base()
    h.add("commit_offsets", "cons", group="g", topic="t", partition=0, offset=3)
    h.add("fetch_offsets", "other", group="g", topic="t", partition=0, offset=1)
    ex = only(h, "committed_offsets_backwards")
    assert (ex["fetched"], ex["earlier"]) == (1, 3)


def test_hw_backwards() -> None:
    h = base()
    h.add("hw", "hw", topic="t", partition=0, offset=3, broker=1)
    h.add("hw", "hw", topic="t", partition=0, offset=2, broker=2)
    ex = only(h, "hw_backwards")
    assert (ex["hw"], ex["earlier_hw"]) == (2, 3)


def test_hw_below_an_acknowledged_offset() -> None:
    h = base().add("hw", "hw", topic="t", partition=0, offset=2, broker=1)
    ex = only(h, "hw_backwards")
    assert ex["acknowledged_offset"] == 2


def test_replicas_diverged() -> None:
    h = base()
    for broker, leo, digest in ((1, 3, "aa"), (2, 3, "aa"), (3, 3, "bb")):
        h.add("replica", "final", topic="t", partition=0, broker=broker, log_end_offset=leo, digest=digest)
    h.add("replica", "final", topic="t", partition=1, broker=1, log_end_offset=0, digest="e")
    h.add("replica", "final", topic="t", partition=1, broker=2, log_end_offset=0, digest="e")
    assert only(h, "replicas_diverged")["partition"] == "t/0"


def test_two_controllers_in_one_epoch() -> None:
    h = base()
    h.add("controller", "etcd", revision=10, epoch=1, controller=1, version=1)
    h.add("controller", "etcd", revision=20, epoch=None, controller=None)
    h.add("controller", "etcd", revision=21, epoch=2, controller=2, version=1)
    assert h.verdict()["valid"]
    h.add("controller", "etcd", revision=25, epoch=2, controller=1, version=2)
    v = h.verdict()
    assert set(v["anomaly_counts"]) == {"two_controllers_in_epoch"}
    assert v["anomaly_counts"]["two_controllers_in_epoch"] == 2  # the overwrite, and epoch 2 with {1, 2}


def test_controller_epoch_backwards() -> None:
    h = base()
    h.add("controller", "etcd", revision=10, epoch=3, controller=1, version=1)
    h.add("controller", "etcd", revision=12, epoch=None, controller=None)
    h.add("controller", "etcd", revision=15, epoch=2, controller=2, version=1)
    ex = only(h, "controller_epoch_backwards")
    assert (ex["previous_epoch"], ex["epoch"]) == (3, 2)


def test_every_named_anomaly_has_a_test() -> None:
    tested = {name for name in ANOMALIES if any(name in fn for fn in globals())}
    assert tested >= set(ANOMALIES) - {"aborted_read", "two_controllers_in_epoch"}
    assert "test_aborted_read_g1a" in globals() and "test_two_controllers_in_one_epoch" in globals()


# --- unavailability, format, command line -----------------------------------------------------------------

def test_unavailability_per_fault_and_per_kind() -> None:
    h = H()
    h.add("nemesis", "nemesis", invoke=10.0, complete=10.0, fault="kill", phase="start", targets=["broker-1"],
          partitions=["t/0"])
    h.send("a", 0, invoke=10.5, complete=14.0)  # invoked after the fault, done 4 s after it began
    h.send("b", 1, invoke=11.0, complete=11.5, tp=("t", 1))  # another partition: not affected
    h.add("nemesis", "nemesis", invoke=20.0, complete=20.0, fault="kill", phase="start", targets=["broker-2"],
          partitions=["t/0"])
    h.send("c", 1, invoke=20.1, complete=21.0)
    h.add("nemesis", "nemesis", invoke=30.0, complete=30.0, fault="partition", phase="start", targets=["b3"],
          partitions=["t/0"])
    u = h.verdict()["unavailability"]
    assert [f["unavailable_s"] for f in u["per_fault"]] == [4.0, 1.0, None]
    assert u["per_kind"]["kill"]["count"] == 2 and u["per_kind"]["kill"]["max"] == 4.0
    assert u["per_kind"]["partition"]["never_recovered"] == 1


def test_disk_full_reports_what_the_filled_broker_kept_serving() -> None:
    """A disk-full fault (filled at 10.5, healed at 20) whose dir held t/0: t/1 took an acks=all send while it was
    full, t/2 none (a send before the fill, one completed after the heal, one that failed do not count)."""
    h = H()
    h.send("early", 0, tp=("t", 2), invoke=9.0, complete=9.5)
    h.add("nemesis", "nemesis", invoke=10.0, complete=10.5, fault="disk-full", phase="start", targets=["broker-0"],
          detail={"full_dir_partitions": ["t/0"], "filled_bytes": 1 << 20})
    h.send("stalled", 0, tp=("t", 0), invoke=11.0, complete=21.0)
    h.send("served", 0, tp=("t", 1), invoke=11.0, complete=11.2)
    h.send("late", 1, tp=("t", 2), invoke=19.0, complete=20.5)
    h.send("failed", None, tp=("t", 2), invoke=12.0, complete=12.5, outcome="fail")
    h.add("nemesis", "nemesis", invoke=20.0, complete=20.0, fault="disk-full", phase="stop", targets=["broker-0"])
    v = h.verdict()
    assert v["disk_full"] == [{"start": 10.5, "stop": 20.0, "full_dir_partitions": ["t/0"],
                               "served": {"t/1": 1, "t/2": 0}, "not_served": ["t/2"]}]
    assert v["valid"]
    assert "the other partitions served 1 acks=all sends meanwhile, none on t/2" in summary(v)


def test_transactional_unavailability_shows_a_stuck_transaction_coordinator() -> None:
    """Produce recovers at once, but the transaction coordinator cannot complete transactions for a minute
    (its lease clock stopped after an etcd member was killed: the TLS chaos schedule's etcd-kill, seed 7):
    the per-fault and per-kind transactional unavailability show it, and a stuck one as never recovered."""
    h = H()
    h.txn("txn-0/1", [("x1", ("t", 1), 0)], process="txn-0")
    h.txn("gw/1", [("g1", ("t", 1), 1)], process="gwtxn-0")
    h.add("nemesis", "nemesis", invoke=10.0, complete=10.2, fault="etcd-kill", phase="start", targets=["etcd-0"],
          partitions=None)
    h.send("a", 0, invoke=10.1, complete=10.3)
    h.add("txn", "txn-0", "unknown", invoke=10.5, complete=20.5, txn_id="txn-0/2", error="NotCoordinatorError",
          sends=[{"topic": "t", "partition": 1, "key": None, "value": "x2", "offset": None}])
    # The client rebuilt under a new generation name is the same transactional client.
    h.add("txn", "txn-0.1", "ok", invoke=21.0, complete=78.0, txn_id="txn-0.1/1",
          sends=[{"topic": "t", "partition": 1, "key": None, "value": "x3", "offset": 2}])
    h.add("txn", "gwtxn-0.2", "ok", invoke=11.0, complete=11.4, txn_id="gw/2",
          sends=[{"topic": "t", "partition": 1, "key": None, "value": "g2", "offset": 3}])
    # A later fault after which one client never commits again before the history ends.
    h.add("nemesis", "nemesis", invoke=80.0, complete=80.2, fault="etcd-kill", phase="start", targets=["etcd-1"],
          partitions=None)
    h.send("b", 1, invoke=80.1, complete=80.4)
    h.add("txn", "gwtxn-0.2", "ok", invoke=80.5, complete=80.9, txn_id="gw/3",
          sends=[{"topic": "t", "partition": 1, "key": None, "value": "g3", "offset": 4}])
    u = h.verdict()["unavailability"]
    assert [f["unavailable_s"] for f in u["per_fault"]] == [0.3, 0.4]  # produce was fine
    assert [f["txn_unavailable_s"] for f in u["per_fault"]] == [68.0, None]
    kind = u["txn_per_kind"]["etcd-kill"]
    assert kind["count"] == 2 and kind["max"] == 68.0 and kind["never_recovered"] == 1
    text = summary(h.verdict())
    assert "txn unavailability etcd-kill: n=2 min=68.0 p50=68.0 p90=68.0 max=68.0 never_recovered=1" in text


def test_longest_time_without_a_commit_names_the_fault_before_it() -> None:
    """One transaction slips through just after the fault, then the coordinator is stuck until the workload
    ends (the TLS chaos run's etcd-kill): the fault's own transactional unavailability is short, the longest
    time without a commit shows the stall and the fault it followed."""
    h = H()
    h.txn("txn-0/1", [("x1", ("t", 1), 0)], process="txn-0")
    h.add("nemesis", "nemesis", invoke=10.0, complete=10.2, fault="etcd-kill", phase="start", targets=["etcd-0"],
          partitions=None)
    h.add("txn", "txn-0", "ok", invoke=10.1, complete=10.6, txn_id="txn-0/2",
          sends=[{"topic": "t", "partition": 1, "key": None, "value": "x2", "offset": 1}])
    h.add("txn", "txn-0", "unknown", invoke=10.7, complete=20.7, txn_id="txn-0/3", error="NotCoordinatorError",
          sends=[{"topic": "t", "partition": 1, "key": None, "value": "x3", "offset": None}])
    h.send("a", 0, invoke=79.0, complete=80.0)  # the workload's last operation
    v = h.verdict()
    assert v["unavailability"]["per_fault"][0]["txn_unavailable_s"] == 0.6
    gap = v["unavailability"]["txn_longest_gap"]
    assert (gap["client"], gap["seconds"], gap["ends_with_history"]) == ("txn-0", 69.4, True)
    assert gap["last_fault_before"] == {"fault": "etcd-kill", "start": 10.0, "seconds_before": 0.6}
    assert ("longest time without a committed transaction: 69.4 s (txn-0; 0.6 s after etcd-kill began; "
            "until the workload ended)") in summary(v)


def test_no_transactional_clients_no_transactional_unavailability() -> None:
    h = H()
    h.add("nemesis", "nemesis", invoke=10.0, complete=10.0, fault="kill", phase="start", targets=["b"],
          partitions=["t/0"])
    h.send("a", 0, invoke=10.5, complete=11.0)
    u = h.verdict()["unavailability"]
    assert "txn_unavailable_s" not in u["per_fault"][0] and u["txn_per_kind"] == {} and u["txn_longest_gap"] is None
    assert "txn unavailability" not in summary(h.verdict())


@pytest.mark.parametrize("line, message", [
    ("not json", "not JSON"),
    ('{"process": "p", "op": "send", "invoke": 1, "outcome": "ok"}', "lacks topic"),
    ('{"process": "p", "op": "frob", "invoke": 1, "outcome": "ok"}', "unknown op"),
    ('{"process": "p", "op": "hw", "invoke": 1, "outcome": "maybe", "topic": "t", "partition": 0, "offset": 1}',
     "outcome must be"),
    ('{"process": "p", "op": "poll", "invoke": 1, "outcome": "ok", "topic": "t", "partition": 0, "records": [1]}',
     "poll records"),
])
def test_malformed_history_is_a_typed_error(tmp_path: Path, line: str, message: str) -> None:
    p = tmp_path / "h.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(HistoryError, match=message):
        load_history(str(p))


def test_command_line_exit_codes_and_outputs(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    with HistoryWriter(str(good)) as w:
        for op in base().final([(0, "a"), (1, "b"), (2, "c")]).ops:
            w.record(**op)
    with HistoryWriter(str(bad)) as w:
        for op in base().final([(0, "a"), (1, "b")]).ops:
            w.record(**op)
    run = [sys.executable, "-m", "gregor.cli.main", "chaos", "check"]
    ok = subprocess.run([*run, str(good), "--out", str(tmp_path / "v.json")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "v.json").read_text())["valid"] is True
    assert "verdict: VALID" in ok.stdout
    fail = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert fail.returncode == 1
    assert json.loads(fail.stdout)["anomaly_counts"] == {"lost_write": 1}
    assert "lost_write 1" in fail.stderr
    (tmp_path / "junk.jsonl").write_text("{\n")
    broken = subprocess.run([*run, str(tmp_path / "junk.jsonl")], capture_output=True, text=True)
    assert broken.returncode == 2 and "line 1" in broken.stderr
