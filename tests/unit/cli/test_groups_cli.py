"""`gregor groups` argument handling and kafka-consumer-groups.sh's reset arithmetic (no cluster needed)."""

from __future__ import annotations

import datetime as dt

import click
import pytest
from click.testing import CliRunner

from gregor.cli.groups import _assignment_text, _parse_topic, parse_datetime, plan_reset
from gregor.cli.main import cli

T0, T1 = ("t", 0), ("t", 1)
EARLIEST = {T0: 10, T1: 0}
LATEST = {T0: 50, T1: 20}


def plan(by_time: dict[tuple[str, int], int | None] | None = None, **kw: object) -> dict[tuple[str, int], int]:
    args: dict[str, object] = dict(to_earliest=False, to_latest=False, to_offset=None, shift_by=None,
                                   to_datetime=None)
    args.update(kw)
    return plan_reset([T0, T1], {T0: 30, T1: 5}, EARLIEST, LATEST, by_time or {}, **args)  # type: ignore[arg-type]


def test_reset_targets_are_clamped_into_the_log() -> None:
    assert plan(to_earliest=True) == {T0: 10, T1: 0}
    assert plan(to_latest=True) == {T0: 50, T1: 20}
    assert plan(to_offset=15) == {T0: 15, T1: 15}
    assert plan(to_offset=1000) == {T0: 50, T1: 20}
    assert plan(to_offset=0) == {T0: 10, T1: 0}
    assert plan(shift_by=-25) == {T0: 10, T1: 0}
    assert plan(shift_by=3) == {T0: 33, T1: 8}
    assert plan(to_datetime=1, by_time={T0: 12, T1: None}) == {T0: 12, T1: 20}  # none found: the log end


def test_shift_by_needs_a_committed_offset() -> None:
    with pytest.raises(click.ClickException, match="no current committed offset"):
        plan_reset([T0], {}, EARLIEST, LATEST, {}, to_earliest=False, to_latest=False, to_offset=None,
                   shift_by=1, to_datetime=None)


def test_datetime_and_topic_specs() -> None:
    assert parse_datetime("2024-01-31T12:00:00.000+00:00") == int(
        dt.datetime(2024, 1, 31, 12, tzinfo=dt.timezone.utc).timestamp() * 1000)
    assert parse_datetime("2024-01-31T12:00:00Z") == parse_datetime("2024-01-31T12:00:00+00:00")
    with pytest.raises(click.BadParameter):
        parse_datetime("yesterday")
    assert _parse_topic("orders") == ("orders", None)
    assert _parse_topic("orders:0,2") == ("orders", [0, 2])
    with pytest.raises(click.BadParameter):
        _parse_topic("orders:x")


@pytest.mark.parametrize("args,fragment", [
    (["groups", "reset-offsets", "--group", "g", "--to-earliest"], "exactly one of --topic and --all-topics"),
    (["groups", "reset-offsets", "--group", "g", "--all-topics"], "exactly one of --to-earliest"),
    (["groups", "reset-offsets", "--group", "g", "--all-topics", "--to-latest", "--shift-by", "1"], "exactly one"),
    (["groups", "reset-offsets", "--group", "g", "--all-topics", "--to-latest", "--dry-run", "--execute"],
     "mutually exclusive"),
    (["groups", "reset-offsets", "--all-topics", "--to-latest"], "give the group"),
    (["groups", "reset-offsets", "g", "--group", "h", "--all-topics", "--to-latest"], "two different groups"),
    (["groups", "describe", "g", "--members", "--state"], "mutually exclusive"),
    (["groups", "describe"], "give the group"),
    (["groups", "describe", "g", "--group", "h"], "two different groups"),
    (["groups", "delete"], "give the groups to delete"),
    (["groups", "delete", ""], "must not be empty"),
    (["consume", "t", "--group", "g", "--partition", "0"], "cannot be combined"),
])
def test_usage_errors_exit_2(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(cli, ["--bootstrap", "127.0.0.1:1", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output


def test_members_verbose_assignment_is_printed_as_kafka_does() -> None:
    assert _assignment_text([("orders", 1), ("orders", 0), ("audit", 2)]) == "audit(2), orders(0,1)"
    assert _assignment_text([]) == "-"
