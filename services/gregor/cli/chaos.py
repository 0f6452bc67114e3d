"""`gregor chaos workload|check`: the chaos workload and history checker (docs/chaos.md), the entry points
both the network-namespace suite and the kind pipeline's Jobs run."""

from __future__ import annotations

import click

PASS_THROUGH = {"ignore_unknown_options": True, "help_option_names": []}


@click.group("chaos")
def chaos_group() -> None:
    """Record a history under faults and check it (Jepsen-style anomalies)."""


@chaos_group.command("workload", context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def workload(args: tuple[str, ...]) -> None:
    """Run the recording workload (--bootstrap, --gateway, --seconds, --history, ...; --help for all)."""
    from gregor.chaos.workload import main

    raise SystemExit(main(list(args)))


@chaos_group.command("check", context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def check(args: tuple[str, ...]) -> None:
    """Check a recorded history: JSON verdict, summary, exit 1 when it shows an anomaly (--help for flags)."""
    from gregor.chaos.checker import main

    raise SystemExit(main(list(args)))
