"""`gregor produce TOPIC`: one record per stdin line, like kafka-console-producer."""

from __future__ import annotations

import asyncio
import collections
import sys
from typing import Any, BinaryIO, Optional

import click

from gregor.cli.common import emit_json, obj, load_properties_file, parse_kv, run, text
from gregor.client.accumulator import FutureRecordMetadata
from gregor.client.admin import AdminClient
from gregor.client.config import ConfigError, producer_config
from gregor.client.producer import Producer
from gregor.common import errors

READ_CHUNK_BYTES = 1 << 16  # read1() returns what is there, so interactive input is not held back

# kafka-console-producer's reader properties (LineMessageReader) that we honour.
READER_PROPERTIES = {"parse.key": "false", "key.separator": "\t", "ignore.error": "false",
                     "parse.headers": "false", "headers.delimiter": "\t", "headers.separator": ",",
                     "headers.key.separator": ":", "null.marker": ""}


class LineError(Exception):
    """A stdin line that cannot become a record (e.g. no key separator with parse.key=true)."""


def parse_line(line: str, props: dict[str, str], number: int) -> tuple[Optional[bytes], Optional[bytes],
                                                                        list[tuple[str, bytes]]]:
    """(key, value, headers) of one input line under the reader properties."""
    headers: list[tuple[str, bytes]] = []
    rest = line
    if props["parse.headers"] == "true":
        head, sep, rest = rest.partition(props["headers.delimiter"])
        if not sep:
            raise LineError(f"No headers delimiter found on line number {number}: '{line}'")
        for item in filter(None, head.split(props["headers.separator"])):
            hk, _, hv = item.partition(props["headers.key.separator"])
            headers.append((hk, hv.encode()))
    key: Optional[str] = None
    if props["parse.key"] == "true":
        key, sep, rest = rest.partition(props["key.separator"])
        if not sep:
            if props["ignore.error"] != "true":
                raise LineError(f"No key separator found on line number {number}: '{line}'")
            key, rest = None, line
    marker = props["null.marker"]
    kb = None if key is None or (marker and key == marker) else key.encode()
    vb = None if marker and rest == marker else rest.encode()
    return kb, vb, headers


def _result(handle: Any, key: Optional[bytes], value: Optional[bytes]) -> tuple[dict[str, Any], bool]:
    if isinstance(handle, BaseException):
        return {"error": str(handle), "key": text(key), "value": text(value)}, False
    exc = handle.exception()
    if exc is not None:
        return {"error": str(exc), "key": text(key), "value": text(value)}, False
    md = handle.result()
    return {"partition": md.partition, "offset": md.offset, "key": text(key), "value": text(value)}, True


async def _produce(bootstrap: str, topic: str, config: dict[str, Any], props: dict[str, str],
                   partition: Optional[int], stream: BinaryIO, as_json: bool) -> int:
    async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        await admin.describe_topics([topic])  # unknown topic: fail now, not after max.block.ms
    failed = 0
    pending: collections.deque[tuple[Any, Optional[bytes], Optional[bytes]]] = collections.deque()

    def report(done_only: bool) -> None:
        nonlocal failed
        while pending and (not done_only or isinstance(pending[0][0], BaseException) or pending[0][0].done()):
            handle, key, value = pending.popleft()
            out, ok = _result(handle, key, value)
            failed += not ok
            if as_json:
                emit_json(out)
            elif not ok:
                click.echo(f"error: {out['error']} (value {out['value']!r})", err=True)

    loop = asyncio.get_running_loop()
    producer = Producer(config)
    try:
        number, tail = 0, b""
        while True:
            chunk = await loop.run_in_executor(None, stream.read1, READ_CHUNK_BYTES)  # type: ignore[attr-defined]
            if not chunk:
                lines, tail = ([tail] if tail else []), b""
            else:
                *lines, tail = (tail + chunk).split(b"\n")
            for raw in lines:
                number += 1
                line = raw.decode("utf-8", errors="replace").rstrip("\r")
                try:
                    key, value, headers = parse_line(line, props, number)
                except LineError as exc:
                    pending.append((errors.InvalidRecordError(str(exc)), None, line.encode()))  # type: ignore[attr-defined]
                    continue
                try:
                    handle: FutureRecordMetadata | BaseException = await producer.send(
                        topic, value, key, headers=headers, partition=partition)
                except errors.GregorError as exc:
                    handle = exc
                pending.append((handle, key, value))
            report(done_only=True)
            if not chunk:
                break
        await producer.flush()
        report(done_only=False)
    finally:
        await producer.close()
    return failed


@click.command()
@click.argument("topic")
@click.option("--acks", type=click.Choice(["0", "1", "all", "-1"]), default="all", show_default=True)
@click.option("--key-separator", help="split each line into KEY<SEP>VALUE (implies parse.key=true)")
@click.option("--property", "--reader-property", "properties", multiple=True, metavar="KEY=VALUE",
              help="reader property: parse.key, key.separator, ignore.error, parse.headers, null.marker ...")
@click.option("--producer-property", "--command-property", "producer_properties", multiple=True,
              metavar="KEY=VALUE", help="producer config, e.g. linger.ms=10 (repeatable)")
@click.option("--command-config", "--producer.config", "command_config", metavar="FILE",
              help="producer config from a .properties file (--producer-property wins)")
@click.option("--compression-type", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), default="none",
              show_default=True)
@click.option("--partition", type=int, help="send every record to this partition")
@click.pass_context
def produce(ctx: click.Context, topic: str, acks: str, key_separator: Optional[str], properties: tuple[str, ...],
            producer_properties: tuple[str, ...], command_config: Optional[str], compression_type: str,
            partition: Optional[int]) -> None:
    """Produce one record per stdin line to TOPIC.

    With --output json, prints one line per record: {"partition","offset","key","value"}
    when acknowledged, {"error","key","value"} when not; exits 1 if any failed.
    """
    props = dict(READER_PROPERTIES)
    extra = parse_kv(properties, "--property")
    unknown = sorted(set(extra) - set(READER_PROPERTIES))
    if unknown:
        raise click.BadParameter(f"unknown reader properties {unknown}; known: {sorted(READER_PROPERTIES)}",
                                 param_hint="--property")
    props.update(extra)
    if key_separator is not None:
        if key_separator == "":
            raise click.BadParameter("must not be empty", param_hint="--key-separator")
        props["parse.key"], props["key.separator"] = "true", key_separator
    config: dict[str, Any] = {"bootstrap.servers": obj(ctx).bootstrap(), "acks": acks,
                              "compression.type": compression_type}
    if command_config:
        config.update(load_properties_file(command_config, "--command-config"))
    config.update(parse_kv(producer_properties, "--producer-property"))
    try:
        producer_config(config)  # validate before reading stdin
    except ConfigError as exc:
        raise click.BadParameter(exc.message, param_hint="--producer-property") from None
    failed = run(_produce(config["bootstrap.servers"], topic, config, props, partition, sys.stdin.buffer,
                          obj(ctx).json))
    if failed:
        if not obj(ctx).json:
            click.echo(f"{failed} record(s) were not acknowledged", err=True)
        ctx.exit(1)
