"""Pure pieces of `gregor perf`: Kafka's payload-file splitting, metrics table, detailed-stats figures."""

from __future__ import annotations

import re
from typing import Any

import click
import pytest

from gregor.cli.perf import ConsumerPerfRebListener, progress, progress_row, read_payload_file, scanner_tokens
from gregor.cli.perf_metrics import metric_name, metrics_lines


@pytest.mark.parametrize("text,delimiter,tokens", [
    ("a\nb\nc", "\n", ["a", "b", "c"]),
    ("a\nb\n", "\n", ["a", "b"]),  # a trailing delimiter ends the last token, it does not start an empty one
    ("a\n\nb", "\n", ["a", "", "b"]),  # two in a row: an empty payload, as java.util.Scanner returns
    ("\na", "\n", ["a"]),  # one leading delimiter is skipped
    ("\n\na", "\n", ["", "a"]),
    ("a\n\n", "\n", ["a", ""]),
    ("x|yy||zzz", r"\|", ["x", "yy", "", "zzz"]),
    ("one, two,three", r",\s*", ["one", "two", "three"]),  # a regular expression, as Scanner takes it
    ("no delimiter", "\n", ["no delimiter"]),
])
def test_scanner_tokens_follow_java_util_scanner(text: str, delimiter: str, tokens: list[str]) -> None:
    assert scanner_tokens(text, re.compile(delimiter)) == tokens


def test_payload_file_default_delimiter_is_a_newline_and_text_is_utf8(tmp_path: Any) -> None:
    f = tmp_path / "p.txt"
    f.write_bytes("héllo\nwörld\n\xff".encode("utf-8") + b"\xff\n")
    # Kafka's default is the two characters backslash-n, meaning a newline; bad UTF-8 becomes U+FFFD.
    assert read_payload_file(str(f), "\\n") == ["héllo".encode(), "wörld".encode(), "ÿ\ufffd".encode()]
    with pytest.raises(click.BadParameter, match="matches the empty string"):
        read_payload_file(str(f), "x*")
    with pytest.raises(click.BadParameter, match="not a valid regular expression"):
        read_payload_file(str(f), "(")


def test_metrics_table_is_kafkas_tools_utils_layout() -> None:
    a = metric_name("producer-metrics", "record-send-total", (("client-id", "c"),))
    b = metric_name("producer-topic-metrics", "byte-total", (("client-id", "c"), ("topic", "t")))
    assert a == "producer-metrics:record-send-total:{client-id=c}"
    assert b == "producer-topic-metrics:byte-total:{client-id=c, topic=t}"
    lines = metrics_lines({b: 2.0, a: 1234.5678})
    width = len(b)
    assert lines == ["", "Metric Name".ljust(width) + "   Value",
                     a.ljust(width) + " : 1234.568", b + " : 2.000"]
    assert metrics_lines({}) == []


def test_progress_figures_are_per_interval_with_the_join_time_taken_out() -> None:
    r = progress(bytes_read=3 * 1048576, last_bytes=1048576, messages=300, last_messages=100, start_ms=10_000,
                 end_ms=12_000, join_ms_in_round=500)
    assert (r["mb"], r["mb_sec"], r["msg_sec"]) == (3.0, 1.0, 100.0)
    assert (r["rebalance_ms"], r["fetch_ms"]) == (500, 1500)
    assert r["fetch_mb_sec"] == pytest.approx(2 / 1.5) and r["fetch_msg_sec"] == pytest.approx(200 / 1.5)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:000, 0, 3\.0000, 1\.0000, 300, 100\.0000, 500, 1500, "
                        r"1\.3333, 133\.3333", progress_row(r))


def test_rebalance_timer_counts_from_no_partitions_to_some() -> None:
    t = ConsumerPerfRebListener(start_ms=0)
    t.join_start_ms = 0
    t.on_partitions_assigned([("t", 0)])
    first = t.join_ms
    assert t.rebalances == 1 and first > 0
    t.on_partitions_assigned([("t", 1)])  # cooperative: more partitions while owning some is no new join
    assert t.rebalances == 1 and t.join_ms == first
    t.on_partitions_revoked([("t", 0)])
    assert t.join_start_ms == 0  # still owns t-1
    t.on_partitions_revoked([("t", 1)])
    assert t.join_start_ms > 0
