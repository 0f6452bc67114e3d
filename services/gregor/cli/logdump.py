"""`gregor log dump DIR`: the batches of a partition directory's segment files, like kafka-dump-log.

Reads the .log files directly (no broker needed). Each batch is framed by its
length field, validated by the native parser and CRC-checked on its own, so a
corrupt batch is reported, not fatal; scanning a file stops only when the
framing itself is broken (a length that runs past the end).
"""

from __future__ import annotations

import glob
import mmap
import os
import struct
from typing import Any, Iterator

import click
import gregor_native as native

from gregor.cli.common import emit_json, obj, text
from gregor.common import errors
from gregor.common.records import batch_records, codec_name

LOG_OVERHEAD = 12  # baseOffset + batchLength
MIN_BATCH_LENGTH = 49  # header bytes counted by batchLength (61 - 12)
CRC_START = 21  # the CRC covers attributes..end


def segment_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise click.ClickException(f"{path}: no such file or directory")
    files = sorted(glob.glob(os.path.join(path, "*.log")))
    if not files:
        raise click.ClickException(f"{path} holds no .log segment files (is it a partition directory?)")
    return files


def scan(data: Any) -> Iterator[dict[str, Any]]:
    """One dict per batch (or per corruption found) of a segment's bytes."""
    size, pos = len(data), 0
    while pos < size:
        if size - pos < LOG_OVERHEAD:
            if any(data[pos:size]):
                yield {"position": pos, "corrupt": f"truncated tail of {size - pos} bytes"}
            return
        base_offset, batch_length = struct.unpack_from(">qi", data, pos)
        if base_offset == 0 and batch_length == 0 and not any(data[pos:min(size, pos + 4096)]):
            return  # zero padding after the last batch
        end = pos + LOG_OVERHEAD + batch_length
        if batch_length < MIN_BATCH_LENGTH or end > size:
            yield {"position": pos, "corrupt": f"batch length {batch_length} at offset {base_offset} "
                                               f"runs past the end of the file ({size} bytes)"
                   if end > size else f"batch length {batch_length} is below the header size"}
            return
        raw = bytes(data[pos:end])
        try:
            header = native.parse_batches(raw, verify_crc=False)[0]
        except native.NativeError as exc:
            yield {"position": pos, "base_offset": base_offset, "corrupt": str(exc)}
            pos = end
            continue
        yield {"position": pos, "header": header, "raw": raw, "crc_ok": native.crc32c(raw[CRC_START:]) == header.crc}
        pos = end


def batch_fields(h: Any, position: int, crc_ok: bool) -> dict[str, Any]:
    last_seq = h.base_sequence + h.last_offset_delta if h.base_sequence >= 0 else -1
    return {"baseOffset": h.base_offset, "lastOffset": h.base_offset + h.last_offset_delta,
            "count": h.records_count, "baseSequence": h.base_sequence, "lastSequence": last_seq,
            "producerId": h.producer_id, "producerEpoch": h.producer_epoch,
            "partitionLeaderEpoch": h.partition_leader_epoch,
            "isTransactional": bool(h.attributes & 0x10), "isControl": bool(h.attributes & 0x20),
            "position": position,
            ("LogAppendTime" if h.attributes & 0x08 else "CreateTime"): h.max_timestamp,
            "size": h.batch_length + LOG_OVERHEAD, "magic": h.magic,
            "compresscodec": codec_name(h.attributes & 0x07), "crc": h.crc, "isvalid": crc_ok}


def _kafka_value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


@click.group("log")
def log_group() -> None:
    """Inspect partition logs on disk."""


@log_group.command()
@click.argument("path", type=click.Path())
@click.option("--print-data-log", is_flag=True, help="also print every record (offset, sizes, key, payload)")
@click.pass_context
def dump(ctx: click.Context, path: str, print_data_log: bool) -> None:
    """Print the batches of PATH (a partition directory or one .log file).

    Exits 1 when a corrupt batch was found (after reporting every batch it could read).
    """
    as_json = obj(ctx).json
    corrupt = 0
    for seg in segment_files(path):
        if not as_json:
            click.echo(f"Dumping {seg}")
            click.echo(f"Log starting offset: {int(os.path.basename(seg).split('.')[0] or 0)}"
                       if os.path.basename(seg).split(".")[0].isdigit() else "Log starting offset: unknown")
        with open(seg, "rb") as f:
            data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
            try:
                for item in scan(data):
                    if "corrupt" in item:
                        corrupt += 1
                        _report_corrupt(seg, item, as_json)
                        continue
                    fields = batch_fields(item["header"], item["position"], item["crc_ok"])
                    corrupt += not item["crc_ok"]
                    records = _records(item["header"], item["raw"]) if print_data_log else None
                    if as_json:
                        emit_json({"file": seg, **fields, **({"records": records} if records is not None else {})})
                        continue
                    click.echo(" ".join(f"{k}: {_kafka_value(v)}" for k, v in fields.items()))
                    for r in records or []:
                        if "error" in r:
                            click.echo(f"| cannot decode records: {r['error']}")
                            continue
                        click.echo(f"| offset: {r['offset']} CreateTime: {r['timestamp']} keySize: {r['keySize']} "
                                   f"valueSize: {r['valueSize']} sequence: {r['sequence']} "
                                   f"headerKeys: [{','.join(r['headerKeys'])}] key: {_null(r['key'])} payload: {_null(r['payload'])}")
            finally:
                if isinstance(data, mmap.mmap):
                    data.close()
    if corrupt:
        click.echo(f"error: found {corrupt} corrupt batch(es) in {path}", err=True)
        ctx.exit(1)


def _null(v: Any) -> str:
    return "null" if v is None else str(v)


def _report_corrupt(seg: str, item: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json({"file": seg, "position": item["position"], "corrupt": item["corrupt"]})
    else:
        click.echo(f"Found corrupt batch at position {item['position']}: {item['corrupt']}")


def _records(h: Any, raw: bytes) -> list[dict[str, Any]]:
    try:
        decoded = batch_records(h, raw)
    except errors.GregorError as exc:
        return [{"error": exc.message}]
    out = []
    for delta, ts_delta, key, value, headers in decoded:
        out.append({"offset": h.base_offset + delta, "timestamp": h.base_timestamp + ts_delta,
                    "keySize": -1 if key is None else len(key), "valueSize": -1 if value is None else len(value),
                    "sequence": h.base_sequence + delta if h.base_sequence >= 0 else -1,
                    "headerKeys": [k for k, _ in headers], "key": text(key), "payload": text(value)})
    return out
