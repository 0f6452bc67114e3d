"""Shared plumbing of the `gregor` commands: connection settings, output, key=value flags, error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Awaitable, Iterable, Iterator, Optional, TypeVar

import click

from gregor.common import errors

T = TypeVar("T")

DEFAULT_DATA_DIR = "./.gregor"


@dataclass
class CliContext:
    """What the global options decided; commands read it through `obj(ctx)`."""

    bootstrap_flag: Optional[str]
    data_dir: str
    output: str  # "text" or "json"

    @property
    def json(self) -> bool:
        return self.output == "json"

    def bootstrap(self) -> str:
        """--bootstrap / GREGOR_BOOTSTRAP, else the "bootstrap" of DATA_DIR/cluster.json."""
        if self.bootstrap_flag:
            return self.bootstrap_flag
        path = os.path.join(self.data_dir, "cluster.json")
        try:
            with open(path) as f:
                value = json.load(f).get("bootstrap")
        except FileNotFoundError:
            raise click.ClickException(
                f"no broker to talk to: pass --bootstrap HOST:PORT, set GREGOR_BOOTSTRAP, "
                f"or start a local cluster with `gregor cluster up` (looked for {path})") from None
        except (OSError, ValueError, AttributeError) as exc:
            raise click.ClickException(f"cannot read {path}: {exc}") from None
        if not value:
            raise click.ClickException(f"{path} has no \"bootstrap\" entry; is the cluster up?")
        return str(value)


def obj(ctx: click.Context) -> CliContext:
    root = ctx.find_root()
    if not isinstance(root.obj, CliContext):
        params = root.params
        root.obj = CliContext(params.get("bootstrap"), params.get("data_dir") or DEFAULT_DATA_DIR,
                              params.get("output") or "text")
    return root.obj


def parse_kv(items: Iterable[str], option: str) -> dict[str, str]:
    """['k=v', ...] -> {'k': 'v'}; a bad item is a usage error naming the option."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=option)
        out[key.strip()] = value
    return out


def load_properties_file(path: str, option: str) -> dict[str, str]:
    """A Java .properties file (`key=value` or `key: value`, `#`/`!` comments), as
    Kafka's --command-config / --producer.config / --consumer.config read it."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint=option) from None
    out: dict[str, str] = {}
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise click.BadParameter(f"{path}:{n}: expected key=value, got {raw!r}", param_hint=option)
        out[line[:cut].strip()] = line[cut + 1:].strip()
    return out


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def print_table(rows: list[list[Any]], header: list[str]) -> None:
    """Left-aligned columns as kafka-consumer-groups.sh and kafka-transactions.sh print them."""
    cells = [header] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        click.echo(" ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


def text(data: Optional[bytes]) -> Optional[str]:
    """Record bytes as the UTF-8 text the command line shows (invalid bytes replaced)."""
    return None if data is None else data.decode("utf-8", errors="replace")


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """The one CLI error mapping: GregorErrors and connection failures become clean CLI errors."""
    try:
        yield
    except errors.GregorError as err:
        raise click.ClickException(describe_error(err)) from None
    except (ConnectionError, OSError) as exc:
        raise click.ClickException(f"connection failed: {exc}") from None


def run(coro: Awaitable[T]) -> T:
    """Run a command's coroutine under cli_errors()."""
    with cli_errors():
        return asyncio.run(coro)  # type: ignore[arg-type]


def describe_error(err: errors.GregorError) -> str:
    if err.code in (errors.Code.NETWORK_EXCEPTION, errors.Code.REQUEST_TIMED_OUT) and "answered" in err.message:
        return f"cannot reach the cluster: {err.message}"
    return str(err)


def is_tty() -> bool:
    return sys.stderr.isatty()


class VariadicOption(click.Option):
    """An option that, like Kafka's tools, takes several space-separated values: `--producer-props a=1 b=2`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("multiple", True)
        super().__init__(*args, **kwargs)


class VariadicCommand(click.Command):
    """Rewrites `--opt a b c` into `--opt a --opt b --opt c` for its VariadicOptions before parsing."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        names = {n for p in self.params if isinstance(p, VariadicOption) for n in p.opts}
        out: list[str] = []
        current: Optional[str] = None
        for arg in args:
            if arg in names:
                current = arg
                continue
            if current is not None and not arg.startswith("-"):
                out += [current, arg]
                continue
            if current is not None and not out[-2:-1] == [current]:
                out.append(current)  # flag with no value: let click report it
            current = None
            out.append(arg)
        if current is not None and not (out and out[-2:-1] == [current]):
            out.append(current)
        return super().parse_args(ctx, out)
