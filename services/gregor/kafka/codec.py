"""Kafka request/response framing over `kio` schemas.

A request frame is `int32 size | header | body`. The header is RequestHeader v1 (api key,
version, correlation id, nullable client id) plus tagged fields (v2) when the request's
version is flexible. Responses are `int32 size | correlation id [| tagged fields] | body`;
ApiVersions always answers with header v0 (KIP-511) so old clients can read the error.

kio's readers are native (Rust) and skip unknown tagged fields as the protocol requires;
its writers take typed values, which `build` coerces from plain ints (error codes, ms
durations and timestamps).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
_UTC = datetime.timezone.utc

API_VERSIONS = 18


class ProtocolError(Exception):
    """A frame that cannot be parsed: the connection is closed (Kafka does the same)."""


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def _read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise ProtocolError("malformed unsigned varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _skip_tagged_fields(buf: bytes, pos: int) -> int:
    count, pos = _read_uvarint(buf, pos)
    for _ in range(count):
        _, pos = _read_uvarint(buf, pos)
        size, pos = _read_uvarint(buf, pos)
        pos += size
    if pos > len(buf):
        raise ProtocolError("tagged field runs past the frame")
    return pos


def read_header(frame: bytes) -> tuple[RequestHeader, int]:
    """The header fields common to every version, and where the rest (tagged fields or body) starts."""
    if len(frame) < 10:
        raise ProtocolError(f"request frame of {len(frame)} bytes is shorter than a header")
    api_key, version, corr = _HEAD.unpack_from(frame, 0)
    (n,) = _I16.unpack_from(frame, 8)
    pos = 10
    client_id = None
    if n >= 0:
        if pos + n > len(frame):
            raise ProtocolError("client id runs past the frame")
        client_id = frame[pos:pos + n].decode("utf-8", "replace")
        pos += n
    return RequestHeader(api_key, version, corr, client_id), pos


def module(api_key: int, version: int, kind: Any) -> ModuleType:  # EntityType.request or .response
    return load_payload_module(api_key, version, kind)


def request_class(api_key: int, version: int) -> Any:
    mod = module(api_key, version, EntityType.request)
    for value in vars(mod).values():
        if getattr(value, "__type__", None) == EntityType.request and value.__module__ == mod.__name__:
            return value
    raise ProtocolError(f"no request schema for api {api_key} v{version}")


def parse_body(frame: bytes, pos: int, header: RequestHeader) -> Any:
    cls = request_class(header.api_key, header.api_version)
    if cls.__flexible__:
        pos = _skip_tagged_fields(frame, pos)
    try:
        value, _ = entity_reader(cls)(memoryview(frame), pos)
    except Exception as exc:  # kio raises a variety of errors on truncated or malformed input
        raise ProtocolError(f"cannot parse api {header.api_key} v{header.api_version}: {exc!r}") from exc
    return value


def encode_response(header: RequestHeader, body: Any) -> bytes:
    """size | correlation id | [tagged fields] | body."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_I32.pack(header.correlation_id))
    if type(body).__flexible__ and header.api_key != API_VERSIONS:
        out.write(b"\0")  # response header v1: no tagged fields
    entity_writer(type(body))(out, body)
    data = out.getbuffer()
    _I32.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def _ms_datetime(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, _UTC)


def to_ms(value: Any) -> int:
    """A kio timestamp or duration field back to Kafka's int milliseconds."""
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


_ZERO: dict[str, Any] = {
    "int8": 0, "int16": 0, "int32": 0, "int64": 0, "uint16": 0, "float64": 0.0, "bool": False,
    "string": "", "bytes": b"", "records": None, "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(0), "timedelta_i64": datetime.timedelta(0),
}


def _coerce(kafka_type: str | None, value: Any) -> Any:
    if kafka_type == "error_code" and not isinstance(value, ErrorCode):
        return ErrorCode(int(value))
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        return _ms_datetime(value)
    if kafka_type is None and isinstance(value, list):
        return tuple(value)
    return value


def build(cls: Any, **values: Any) -> Any:
    """An instance of a kio dataclass from plain values; fields the version lacks are dropped,
    fields not given take their schema default or a zero value."""
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kafka_type = f.metadata.get("kafka_type")
        if f.name in values and (values[f.name] is not None or "None" in str(f.type)):
            kw[f.name] = _coerce(kafka_type, values[f.name])  # None only where this version allows null
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        elif kafka_type in _ZERO:
            kw[f.name] = _ZERO[kafka_type]
        elif kafka_type == "datetime_i64":
            kw[f.name] = _ms_datetime(-1)
        elif kafka_type == "uuid":
            kw[f.name] = None
        else:
            kw[f.name] = ()
    return cls(**kw)
