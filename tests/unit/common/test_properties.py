"""common/properties.py: the properties-file reader every role's CLI shares, and Kafka's override order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]
from gregor.common.properties import load_properties, parse_bool, read_properties, settle


def test_reads_keys_skipping_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("# a comment\n! another\n\n a.b = 1 \nurl=http://h:2379,http://g:2379\nempty=\n")
    assert read_properties(str(path)) == {"a.b": "1", "url": "http://h:2379,http://g:2379", "empty": ""}


@pytest.mark.parametrize("line", ["no.equals.sign", "=value"])
def test_a_malformed_line_is_an_error_naming_file_and_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "server.properties"
    path.write_text(f"a=1\n{line}\n")
    with pytest.raises(InvalidConfigError, match=f"server.properties:2: expected KEY=VALUE, got '{line}'"):
        read_properties(str(path))


def test_a_missing_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="cannot read properties file"):
        read_properties(str(tmp_path / "absent.properties"))


def test_overrides_go_over_the_file_in_order(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("a=file\nb=file\n")
    assert load_properties(str(path), ["a=one", "a=two"]) == {"a": "two", "b": "file"}
    with pytest.raises(InvalidConfigError, match="--override expects KEY=VALUE"):
        load_properties(None, ["novalue"])


def test_settle_flag_over_property_over_default_and_unknown_keys_refused() -> None:
    keys = {"x.y": ("x", int, 1), "on": ("on", parse_bool, False), "z": ("z", str, "d")}
    ns = SimpleNamespace(x=None, on=True, z=None)  # --on given on the command line
    settle(ns, {"x.y": "5", "on": "false"}, keys, "test")
    assert (ns.x, ns.on, ns.z) == (5, True, "d")
    with pytest.raises(InvalidConfigError, match="Unknown test configuration: bogus"):
        settle(SimpleNamespace(x=None, on=None, z=None), {"bogus": "1"}, keys, "test")
    with pytest.raises(InvalidConfigError, match="Invalid value 'maybe' for configuration on"):
        settle(SimpleNamespace(x=None, on=None, z=None), {"on": "maybe"}, keys, "test")
