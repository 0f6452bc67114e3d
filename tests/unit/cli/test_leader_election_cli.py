"""`gregor leader-election` option rules and election-file parsing (kafka-leader-election.sh's)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gregor.cli.leader_election import parse_election_file, target_partitions
from gregor.cli.main import cli


def write(tmp_path: Path, content: object) -> str:
    path = tmp_path / "election.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_exactly_one_source_of_partitions() -> None:
    assert target_partitions("t", 3, False, None) == [("t", 3)]
    assert target_partitions(None, None, True, None) is None
    for args in ((None, None, False, None), ("t", 1, True, None), (None, None, True, "f.json")):
        with pytest.raises(click.UsageError, match="One and only one"):
            target_partitions(*args)
    with pytest.raises(click.UsageError, match="--partition"):
        target_partitions("t", None, False, None)
    with pytest.raises(click.UsageError, match="only allowed with --topic"):
        target_partitions(None, 2, True, None)


def test_election_file(tmp_path: Path) -> None:
    path = write(tmp_path, {"partitions": [{"topic": "a", "partition": 0}, {"topic": "b", "partition": 2}]})
    assert parse_election_file(path) == [("a", 0), ("b", 2)]
    bad = [
        ({"partitions": [{"topic": "a", "partition": 0}, {"topic": "a", "partition": 0}]}, "duplicate partitions: a-0"),
        ({"partitions": [{"topic": "a", "partition": -1}]}, "invalid partition entry"),
        ({"partitions": [{"topic": "a", "partition": True}]}, "invalid partition entry"),
        ({"partitions": [{"topic": "", "partition": 1}]}, "invalid partition entry"),
        ({"topics": []}, "must hold"),
        ({"partitions": []}, "lists no partitions"),
        ("{not json", "not valid JSON"),
    ]
    for content, message in bad:
        with pytest.raises(click.BadParameter, match=message):
            parse_election_file(write(tmp_path, content))
    with pytest.raises(click.BadParameter, match="cannot read"):
        parse_election_file(str(tmp_path / "missing.json"))


def test_command_is_registered_and_rejects_bad_flags_with_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["leader-election", "--election-type", "preferred"])
    assert result.exit_code == 2 and "One and only one" in result.output
    result = runner.invoke(cli, ["leader-election", "--election-type", "fair", "--all-topic-partitions"])
    assert result.exit_code == 2 and "fair" in result.output
    result = runner.invoke(cli, ["leader-election", "--election-type", "unclean",
                                 "--path-to-json-file", write(tmp_path, {"partitions": 1})])
    assert result.exit_code == 2 and "must hold" in result.output
