"""`gregor consume TOPIC`: print records, like kafka-console-consumer (manual assignment, or --group G)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any, Iterator, Optional

import click

from gregor.cli.common import emit_json, is_tty, load_properties_file, obj, parse_kv, run, text
from gregor.client.admin import AdminClient
from gregor.client.config import ConfigError, consumer_config
from gregor.client.consumer import Consumer, ConsumerRecord

# kafka-console-consumer's DefaultMessageFormatter properties.
FORMATTER_PROPERTIES = {"print.timestamp": "false", "print.key": "false", "print.value": "true",
                        "print.partition": "false", "print.offset": "false", "print.headers": "false",
                        "key.separator": "\t", "line.separator": "\n", "headers.separator": ",",
                        "null.literal": "null"}


def format_text(rec: ConsumerRecord, p: dict[str, str]) -> str:
    """One record in DefaultMessageFormatter's layout (timestamp, partition, offset, headers, key, value)."""
    sep = p["key.separator"]
    parts: list[str] = []
    if p["print.timestamp"] == "true":
        parts.append(f"CreateTime:{rec.timestamp}")
    if p["print.partition"] == "true":
        parts.append(f"Partition:{rec.partition}")
    if p["print.offset"] == "true":
        parts.append(f"Offset:{rec.offset}")
    if p["print.headers"] == "true":
        parts.append(p["headers.separator"].join(f"{k}:{text(v)}" for k, v in rec.headers) or "NO_HEADERS")
    if p["print.key"] == "true":
        parts.append(p["null.literal"] if rec.key is None else str(text(rec.key)))
    if p["print.value"] == "true":
        parts.append(p["null.literal"] if rec.value is None else str(text(rec.value)))
    return sep.join(parts)


def record_json(rec: ConsumerRecord) -> dict[str, Any]:
    return {"partition": rec.partition, "offset": rec.offset, "key": text(rec.key), "value": text(rec.value),
            "timestamp": rec.timestamp, "headers": {k: text(v) for k, v in rec.headers}}


def coordinator_servers(ctx: click.Context) -> str:
    """Optional override for FindCoordinator (GREGOR_COORDINATORS): brokers answer it, as in Kafka, so the
    CLI needs only --bootstrap; coordinators listed here are asked only when no broker answers."""
    return os.environ.get("GREGOR_COORDINATORS", "")


@contextlib.contextmanager
def progress(total: Optional[int], description: str) -> Iterator[Any]:
    """A rich progress bar on stderr when stderr is a terminal (else a no-op); yields advance(n)."""
    if total is None or not is_tty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


async def _consume(bootstrap: str, topic: str, config: dict[str, Any], partition: Optional[int],
                   offset: Optional[str], from_beginning: bool, max_messages: Optional[int],
                   timeout_ms: Optional[int], props: dict[str, str], as_json: bool) -> int:
    group = bool(config.get("group.id"))
    if not group:
        async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            info = (await admin.describe_topics([topic]))[topic]
        all_parts = [p.partition for p in info.partitions]
        if partition is not None and partition not in all_parts:
            raise click.ClickException(f"topic {topic} has no partition {partition} (partitions: {all_parts})")
    count = 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        # SIGTERM: close cleanly (commit, leave the group), as kafka-console-consumer's shutdown hook.
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with Consumer(config) as consumer:
        if group:
            # Kafka's console consumer: --from-beginning only sets auto.offset.reset=earliest, so it
            # matters only for partitions without a committed offset.
            consumer.subscribe([topic])
        else:
            tps = [(topic, partition)] if partition is not None else [(topic, p) for p in all_parts]
            consumer.assign(tps)
            if offset == "earliest" or (offset is None and from_beginning):
                consumer.seek_to_beginning(*tps)
            elif offset == "latest" or offset is None:
                consumer.seek_to_end(*tps)
            else:
                consumer.seek(tps[0], int(offset))
        with progress(max_messages, f"consuming {topic}") as advance:
            count = await _print_loop(consumer, stop, max_messages, timeout_ms, props, as_json, advance)
    return count


async def _print_loop(consumer: Consumer, stop: asyncio.Event, max_messages: Optional[int],
                      timeout_ms: Optional[int], props: dict[str, str], as_json: bool, advance: Any) -> int:
    count = 0
    last_record = time.monotonic()
    while (max_messages is None or count < max_messages) and not stop.is_set():
        wait_ms = 1000 if timeout_ms is None else max(0, int(timeout_ms - (time.monotonic() - last_record) * 1000))
        # Never take more than --max-messages: with a group, the committed position is exactly what was printed.
        limit = None if max_messages is None else max_messages - count
        records = await consumer.poll(min(wait_ms, 1000), limit)
        if records:
            last_record = time.monotonic()
        elif timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= timeout_ms:
            break
        for rec in records:
            if as_json:
                emit_json(record_json(rec))
            else:
                click.echo(format_text(rec, props), nl=False)
                click.echo(props["line.separator"], nl=False)
        count += len(records)
        advance(len(records))
    return count


@click.command()
@click.argument("topic")
@click.option("--group", help="consume as a member of this consumer group (commits its offsets)")
@click.option("--from-beginning", is_flag=True,
              help="start at the earliest offset instead of the end (with --group: only without a committed offset)")
@click.option("--offset", help="start offset: a number, earliest or latest (needs --partition for a number)")
@click.option("--partition", type=int, help="consume only this partition")
@click.option("--max-messages", type=int, help="exit after this many records")
@click.option("--timeout-ms", type=int, help="exit when no record arrives for this long")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              default="read_uncommitted", show_default=True)
@click.option("--property", "--formatter-property", "properties", multiple=True, metavar="KEY=VALUE",
              help="formatter property: print.key, print.offset, print.partition, print.timestamp, key.separator ...")
@click.option("--consumer-property", "--command-property", "consumer_properties", multiple=True,
              metavar="KEY=VALUE", help="consumer config, e.g. fetch.max.wait.ms=100 (repeatable)")
@click.option("--command-config", "--consumer.config", "command_config", metavar="FILE",
              help="consumer config from a .properties file (--consumer-property wins)")
@click.pass_context
def consume(ctx: click.Context, topic: str, group: Optional[str], from_beginning: bool, offset: Optional[str],
            partition: Optional[int], max_messages: Optional[int], timeout_ms: Optional[int], isolation_level: str,
            properties: tuple[str, ...], consumer_properties: tuple[str, ...], command_config: Optional[str]) -> None:
    """Print records of TOPIC (one per line; --output json: one JSON object per record)."""
    if group is not None and (partition is not None or offset is not None):
        raise click.UsageError("--group cannot be combined with --partition/--offset: a group's partitions "
                               "come from its assignment and its positions from committed offsets")
    if group is not None and not group.strip():
        raise click.BadParameter("must not be empty", param_hint="--group")
    if offset is not None:
        if offset not in ("earliest", "latest"):
            try:
                if int(offset) < 0:
                    raise ValueError
            except ValueError:
                raise click.BadParameter(f"{offset!r} is not an offset, earliest or latest",
                                         param_hint="--offset") from None
            if partition is None:
                raise click.UsageError("--offset N needs --partition P")
        if from_beginning:
            raise click.UsageError("--from-beginning and --offset are mutually exclusive")
    if max_messages is not None and max_messages <= 0:
        raise click.BadParameter("must be positive", param_hint="--max-messages")
    props = dict(FORMATTER_PROPERTIES)
    extra = parse_kv(properties, "--property")
    unknown = sorted(set(extra) - set(FORMATTER_PROPERTIES))
    if unknown:
        raise click.BadParameter(f"unknown formatter properties {unknown}; known: {sorted(FORMATTER_PROPERTIES)}",
                                 param_hint="--property")
    props.update(extra)
    config: dict[str, Any] = {"bootstrap.servers": obj(ctx).bootstrap(), "isolation.level": isolation_level,
                              "auto.offset.reset": "earliest" if from_beginning else "latest"}
    if group is not None:
        config["group.id"] = group
    if command_config:
        config.update(load_properties_file(command_config, "--command-config"))
    config.update(parse_kv(consumer_properties, "--consumer-property"))
    if config.get("group.id") and not config.get("coordinator.bootstrap.servers") and coordinator_servers(ctx):
        config["coordinator.bootstrap.servers"] = coordinator_servers(ctx)
    if config.get("group.id") and (partition is not None or offset is not None):
        raise click.UsageError("a group.id cannot be combined with --partition/--offset")
    try:
        consumer_config(config)
    except ConfigError as exc:
        raise click.BadParameter(exc.message, param_hint="--consumer-property") from None
    try:
        count = run(_consume(config["bootstrap.servers"], topic, config, partition, offset, from_beginning,
                             max_messages, timeout_ms, props, obj(ctx).json))
    except KeyboardInterrupt:
        count = -1
    if not obj(ctx).json and count >= 0:
        click.echo(f"Processed a total of {count} messages", err=True)
