"""`gregor cluster up` option handling: DESIGN.md's defaults, --standalone, and a clear error for a bad mix."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from gregor.cli import cluster as cluster_cli


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What LocalCluster.up was asked to start (the launcher itself is tested end to end in tests/e2e)."""
    calls: list[dict[str, Any]] = []

    class Started:
        def to_json(self) -> dict[str, Any]:
            return {}

    def up(data_dir: str, **kw: Any) -> Started:
        calls.append(kw)
        return Started()

    monkeypatch.setattr(cluster_cli.LocalCluster, "up", staticmethod(up))
    return calls


def counts(kw: dict[str, Any]) -> tuple[int, int, int, int]:
    return kw["brokers"], kw["controllers"], kw["coordinators"], kw["gateways"]


def test_defaults_are_designs_cluster(launched: list[dict[str, Any]], tmp_path: Any) -> None:
    result = CliRunner().invoke(cluster_cli.up, ["--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert counts(launched[0]) == (3, 2, 1, 1)


def test_standalone_is_one_broker_alone(launched: list[dict[str, Any]], tmp_path: Any) -> None:
    assert CliRunner().invoke(cluster_cli.up, ["--data-dir", str(tmp_path), "--standalone"]).exit_code == 0
    assert CliRunner().invoke(cluster_cli.up, ["--data-dir", str(tmp_path), "--brokers", "1",
                                               "--controllers", "0"]).exit_code == 0
    assert counts(launched[0]) == counts(launched[1]) == (1, 0, 0, 0)


def test_standalone_with_more_processes_is_refused(launched: list[dict[str, Any]], tmp_path: Any) -> None:
    result = CliRunner().invoke(cluster_cli.up, ["--data-dir", str(tmp_path), "--standalone", "--brokers", "3"])
    assert result.exit_code != 0 and "--standalone runs one broker alone" in result.output
    assert launched == []
