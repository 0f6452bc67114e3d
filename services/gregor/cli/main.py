"""The `gregor` command: one entry point modelled on Kafka's tools and kcat (contract in shared/DESIGN.md)."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import click

from gregor.cli.acls import acls_group
from gregor.cli.analytics import analytics
from gregor.cli.certs import certs_group
from gregor.cli.chaos import chaos_group
from gregor.cli.configs import configs
from gregor.cli.common import DEFAULT_DATA_DIR, CliContext, cli_errors
from gregor.cli.consume import consume
from gregor.cli.controller_events import controller_group
from gregor.cli.dashboards import dashboards_group
from gregor.cli.leader_election import leader_election
from gregor.cli.groups import groups
from gregor.cli.logdump import log_group
from gregor.cli.perf import perf
from gregor.cli.produce import produce
from gregor.cli.topics import topics
from gregor.cli.transactions import transactions


class GregorGroup(click.Group):
    """Maps every failure to a message on stderr and a non-zero exit, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        with cli_errors():
            return super().invoke(ctx)


@click.group(cls=GregorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--bootstrap", envvar="GREGOR_BOOTSTRAP", metavar="HOST:PORT[,...]",
              help="any broker of the cluster [env GREGOR_BOOTSTRAP; default: DATA_DIR/cluster.json]")
@click.option("--data-dir", envvar="GREGOR_DATA_DIR", default=DEFAULT_DATA_DIR, show_default=True,
              help="local cluster directory holding cluster.json [env GREGOR_DATA_DIR]")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: machine-readable output, one JSON document per line")
@click.option("--command-config", envvar="GREGOR_COMMAND_CONFIG", metavar="FILE",
              help="client properties (Kafka's --command-config), e.g. security.protocol=SSL and ssl.* "
                   "[env GREGOR_COMMAND_CONFIG; default: DATA_DIR/cluster.json's TLS client settings]")
@click.version_option(package_name="gregor", prog_name="gregor")
@click.pass_context
def cli(ctx: click.Context, bootstrap: Optional[str], data_dir: str, output: str,
        command_config: Optional[str] = None) -> None:
    """Gregor: a partitioned, replicated commit log with Kafka's semantics."""
    ctx.obj = CliContext(bootstrap, data_dir, output)
    configure_security(command_config, data_dir, bootstrap)


cli.add_command(topics)
cli.add_command(configs)
cli.add_command(produce)
cli.add_command(consume)
cli.add_command(log_group)
cli.add_command(perf)
cli.add_command(leader_election)
cli.add_command(groups)
cli.add_command(transactions)
cli.add_command(analytics)
cli.add_command(controller_group)
cli.add_command(dashboards_group)
cli.add_command(certs_group)
cli.add_command(chaos_group)
cli.add_command(acls_group)

try:  # `gregor cluster ...` lives with the local-cluster launcher
    from gregor.cli.cluster import cluster
except ImportError:  # pragma: no cover - only while that module is missing
    pass
else:
    cli.add_command(cluster)


def configure_security(command_config: Optional[str], data_dir: str, bootstrap: Optional[str]) -> None:
    """Every channel of this CLI process speaks TLS as --command-config says; without it, as the local
    cluster's cluster.json says (`cluster up --tls`) unless --bootstrap names another cluster."""
    from gregor.cli.common import load_properties_file
    from gregor.client.config import CONSUMER_CONFIGS, PRODUCER_CONFIGS
    from gregor.common import tls

    props: dict[str, str] = {}
    if command_config:
        props = load_properties_file(command_config, "--command-config")
        unknown = sorted(set(props) - set(PRODUCER_CONFIGS) - set(CONSUMER_CONFIGS))
        if unknown:  # a misspelt key is an error, as in Kafka's tools
            raise click.BadParameter(f"unknown client configuration {', '.join(unknown)}",
                                     param_hint="--command-config")
    elif not bootstrap:
        import json

        try:
            with open(os.path.join(data_dir, "cluster.json")) as f:
                props = dict((json.load(f).get("tls") or {}).get("client") or {})
        except (OSError, ValueError, AttributeError):
            props = {}
    try:
        tls.configure(tls.TlsConfig.from_properties(props))
    except tls.TlsConfigError as exc:
        raise click.BadParameter(str(exc.message), param_hint="--command-config") from None


# Global options a user may also type after the subcommand (`gregor consume t --output json`),
# as DESIGN.md promises --output json on every command that prints structures.
HOISTED_OPTIONS = ("--output", "-o", "--bootstrap")  # not --command-config: produce/consume have their own


PASS_THROUGH_COMMANDS = frozenset({"chaos"})  # subcommands whose flags (--bootstrap too) are their own


def hoist_global_options(args: list[str]) -> list[str]:
    """Move --output/-o/--bootstrap (with their values) in front of the subcommand."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or (arg in PASS_THROUGH_COMMANDS and not rest):
            # `gregor chaos workload --bootstrap ...`: the chaos entry points parse their own flags.
            rest += args[i:]
            break
        if arg in HOISTED_OPTIONS and i + 1 < len(args):
            front += args[i:i + 2]
            i += 2
            continue
        if arg.startswith(("--output=", "--bootstrap=")):
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=hoist_global_options(args), prog_name="gregor")
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug: still no traceback unless asked for
        if os.environ.get("GREGOR_DEBUG"):
            raise
        click.echo(f"Error: internal error: {type(exc).__name__}: {exc} (set GREGOR_DEBUG=1 for a traceback)",
                   err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
