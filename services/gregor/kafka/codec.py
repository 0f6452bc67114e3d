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
import functools
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


@functools.lru_cache(maxsize=None)
def module(api_key: int, version: int, kind: Any) -> ModuleType:  # EntityType.request or .response
    """Cached: kio resolves the module by name (pkgutil) on every call, a per-request cost on Produce."""
    return load_payload_module(api_key, version, kind)


@functools.lru_cache(maxsize=None)
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


class EncodedTopics(tuple):  # type: ignore[type-arg]
    """A Metadata response's topics, each already encoded (encode_entity of a MetadataResponseTopic of the
    response's version): encode_response writes them as they are (KafkaHandlers caches them per topic)."""


def encode_entity(value: Any) -> bytes:
    """One kio entity (a struct of a response) in its wire form."""
    out = io.BytesIO()
    entity_writer(type(value))(out, value)
    return out.getvalue()


def encode_response(header: RequestHeader, body: Any) -> bytes:
    """size | correlation id | [tagged fields] | body."""
    if header.api_key == PRODUCE and 3 <= header.api_version <= 9:
        return encode_produce_response(header, body)
    if header.api_key == METADATA and isinstance(body.topics, EncodedTopics):
        return _encode_metadata_response(header, body)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_I32.pack(header.correlation_id))
    if type(body).__flexible__ and header.api_key != API_VERSIONS:
        out.write(b"\0")  # response header v1: no tagged fields
    entity_writer(type(body))(out, body)
    data = out.getbuffer()
    _I32.pack_into(data, 0, len(data) - 4)
    return bytes(data)


_PARTITION_HEAD = struct.Struct(">ihqq")  # index, error code, base offset, log append time
_I64 = struct.Struct(">q")
PRODUCE = 0
METADATA = 3


def _encode_metadata_response(header: RequestHeader, body: Any) -> bytes:
    """A Metadata response whose topics are EncodedTopics: the rest written by kio with no topics, the
    encoded topics put where the empty array was. After the topics array come only
    cluster_authorized_operations (v8-v10) and the tagged fields (flexible, v9+)."""
    pieces: EncodedTopics = body.topics
    flexible = bool(type(body).__flexible__)
    version = header.api_version
    empty = encode_response(header, dataclasses.replace(body, topics=()))
    tail = len(empty) - ((4 if 8 <= version <= 10 else 0) + (1 if flexible else 0))
    out = bytearray(empty[:tail - (1 if flexible else 4)])
    _array_len(out, len(pieces), flexible)
    for piece in pieces:
        out += piece
    out += empty[tail:]
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _array_len(out: bytearray, n: int, flexible: bool) -> None:
    out += _uvarint(n + 1) if flexible else _I32.pack(n)


def _string(out: bytearray, value: str | None, flexible: bool) -> None:
    if value is None:
        out += b"\0" if flexible else b"\xff\xff"
        return
    data = value.encode()
    out += _uvarint(len(data) + 1) if flexible else _I16.pack(len(data))
    out += data


def encode_produce_response(header: RequestHeader, body: Any) -> bytes:
    """A Produce response (v3-v9) written with struct: the same bytes as kio's generic writer
    (tests/unit/kafka/test_codec.py checks every version), at a fraction of its per-field Python calls,
    since one is written for every Produce request."""
    version = header.api_version
    flexible = version >= 9
    out = bytearray(b"\0\0\0\0")
    out += _I32.pack(header.correlation_id)
    if flexible:
        out += b"\0"  # response header v1: no tagged fields
    _array_len(out, len(body.responses), flexible)
    for topic in body.responses:
        _string(out, topic.name, flexible)
        _array_len(out, len(topic.partition_responses), flexible)
        for p in topic.partition_responses:
            out += _PARTITION_HEAD.pack(p.index, p.error_code.value, p.base_offset,
                                        round(p.log_append_time.timestamp() * 1000))
            if version >= 5:
                out += _I64.pack(p.log_start_offset)
            if version >= 8:
                _array_len(out, len(p.record_errors), flexible)
                for e in p.record_errors:
                    out += _I32.pack(e.batch_index)
                    _string(out, e.batch_index_error_message, flexible)
                    if flexible:
                        out += b"\0"
                _string(out, p.error_message, flexible)
            if flexible:
                out += b"\0"
        if flexible:
            out += b"\0"
    out += _I32.pack(round(body.throttle_time.total_seconds() * 1000))
    if flexible:
        out += b"\0"
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _ms_datetime(ms: int) -> datetime.datetime:
    if ms == -1:
        return _MINUS_ONE_MS  # Produce's log_append_time on every answer
    return datetime.datetime.fromtimestamp(ms / 1000, _UTC)


_MINUS_ONE_MS = datetime.datetime.fromtimestamp(-1 / 1000, _UTC)


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


_NO_ZERO = object()  # a field with a schema default: left out when not given


@functools.lru_cache(maxsize=None)
def _plan(cls: Any) -> tuple[tuple[str, Any, bool, Any], ...]:
    """Per field of a kio class, once: (name, kafka type, whether null is allowed, the value when not given)."""
    out = []
    for f in dataclasses.fields(cls):
        kafka_type = f.metadata.get("kafka_type")
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            zero: Any = _NO_ZERO
        elif kafka_type in _ZERO:
            zero = _ZERO[kafka_type]
        elif kafka_type == "datetime_i64":
            zero = _ms_datetime(-1)
        elif kafka_type == "uuid":
            zero = None
        else:
            zero = ()
        out.append((f.name, kafka_type, "None" in str(f.type), zero))
    return tuple(out)


def build(cls: Any, **values: Any) -> Any:
    """An instance of a kio dataclass from plain values; fields the version lacks are dropped,
    fields not given take their schema default or a zero value. The per-class field walk is cached
    (_plan): this runs for every partition of every Produce answer."""
    kw: dict[str, Any] = {}
    for name, kafka_type, nullable, zero in _plan(cls):
        value = values.get(name, _NO_ZERO)
        if value is not _NO_ZERO and (value is not None or nullable):
            kw[name] = _coerce(kafka_type, value)  # None only where this version allows null
        elif zero is not _NO_ZERO:
            kw[name] = zero
    return cls(**kw)
