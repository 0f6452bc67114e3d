"""Global options typed after the subcommand reach the root group."""

from __future__ import annotations

from gregor.cli.main import hoist_global_options


def test_output_and_bootstrap_after_the_subcommand_move_to_the_front() -> None:
    assert hoist_global_options(["consume", "t", "--output", "json", "--from-beginning"]) == [
        "--output", "json", "consume", "t", "--from-beginning"]
    assert hoist_global_options(["topics", "list", "-o", "json", "--bootstrap=h:1"]) == [
        "-o", "json", "--bootstrap=h:1", "topics", "list"]
    assert hoist_global_options(["--output", "json", "topics", "list"]) == ["--output", "json", "topics", "list"]


def test_arguments_after_double_dash_are_left_alone() -> None:
    assert hoist_global_options(["produce", "t", "--", "--output", "x"]) == ["produce", "t", "--", "--output", "x"]
