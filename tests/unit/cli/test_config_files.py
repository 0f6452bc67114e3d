"""Kafka 3.x console-tool flags: --command-config/--producer.config/--consumer.config files and the
--reader-property / --formatter-property / --command-property aliases."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gregor.cli.common import load_properties_file
from gregor.cli.main import cli


def test_properties_file_syntax(tmp_path: Path) -> None:
    f = tmp_path / "p.properties"
    f.write_text("# comment\n! also a comment\n\nacks = all\nlinger.ms: 5\nclient.id=a=b\n")
    assert load_properties_file(str(f), "--command-config") == {"acks": "all", "linger.ms": "5",
                                                                 "client.id": "a=b"}


def test_properties_file_errors_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.properties"
    f.write_text("acks=all\njust-a-word\n")
    with pytest.raises(click.BadParameter, match=r"bad.properties:2"):
        load_properties_file(str(f), "--command-config")
    with pytest.raises(click.BadParameter, match="cannot read"):
        load_properties_file(str(tmp_path / "missing"), "--command-config")


@pytest.mark.parametrize("flag", ["--command-config", "--producer.config"])
def test_producer_config_file_is_validated_before_stdin(tmp_path: Path, flag: str) -> None:
    f = tmp_path / "producer.properties"
    f.write_text("enable.idempotence=true\nmax.in.flight.requests.per.connection=6\n")
    result = CliRunner().invoke(cli, ["--bootstrap", "127.0.0.1:1", "produce", "t", flag, str(f)], input="x\n")
    assert result.exit_code == 2
    assert "max.in.flight.requests.per.connection" in result.output


def test_command_property_overrides_the_file(tmp_path: Path) -> None:
    f = tmp_path / "producer.properties"
    f.write_text("enable.idempotence=true\nmax.in.flight.requests.per.connection=6\n")
    # --command-property is --producer-property and wins over the file: the error is about its value.
    result = CliRunner().invoke(cli, ["--bootstrap", "127.0.0.1:1", "produce", "t", "--command-config", str(f),
                                      "--command-property", "max.in.flight.requests.per.connection=abc"],
                                input="x\n")
    assert result.exit_code == 2
    assert "Invalid value 'abc'" in result.output
    result = CliRunner().invoke(cli, ["--bootstrap", "127.0.0.1:1", "produce", "t",
                                      "--reader-property", "no.such.reader.key=1"], input="x\n")
    assert result.exit_code == 2 and "unknown reader properties" in result.output


def test_consumer_aliases(tmp_path: Path) -> None:
    f = tmp_path / "consumer.properties"
    f.write_text("auto.offset.reset=sideways\n")
    result = CliRunner().invoke(cli, ["--bootstrap", "127.0.0.1:1", "consume", "t", "--consumer.config", str(f)])
    assert result.exit_code == 2 and "auto.offset.reset" in result.output
    result = CliRunner().invoke(cli, ["--bootstrap", "127.0.0.1:1", "consume", "t",
                                      "--formatter-property", "no.such.key=1"])
    assert result.exit_code == 2 and "unknown formatter properties" in result.output
