"""Shared plumbing the client and CLI reuse instead of duplicating: gRPC channels, CLI error mapping."""

from __future__ import annotations

from typing import Any

import click
import pytest

from gregor.cli import common as cli_common
from gregor.cli.main import cli
from gregor.client.metadata import ClusterMetadata
from gregor.common import errors, rpc


async def test_metadata_channels_come_from_common_rpc(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real = rpc.channel

    def spy(target: str) -> Any:
        made.append(target)
        return real(target)

    monkeypatch.setattr(rpc, "channel", spy)
    md = ClusterMetadata(["127.0.0.1:1"])
    ch = md.channel("127.0.0.1:1")
    assert md.channel("127.0.0.1:1") is ch and made == ["127.0.0.1:1"]
    await md.close()


def test_cli_error_mapping_is_one_function(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(click.ClickException) as info:
        with cli_common.cli_errors():
            raise errors.NotLeaderOrFollowerError("moved")  # type: ignore[attr-defined]
    assert "NOT_LEADER_OR_FOLLOWER" in info.value.message
    with pytest.raises(click.ClickException, match="connection failed"):
        cli_common.run(_raise(ConnectionRefusedError("refused")))
    # The command group maps through the same function.
    entered: list[bool] = []
    real = cli_common.cli_errors

    def spy() -> Any:
        entered.append(True)
        return real()

    import gregor.cli.main as main_mod

    monkeypatch.setattr(main_mod, "cli_errors", spy)
    from click.testing import CliRunner

    CliRunner().invoke(cli, ["--bootstrap", "127.0.0.1:1", "topics", "--help"])
    assert entered


async def _raise(exc: BaseException) -> None:
    raise exc
