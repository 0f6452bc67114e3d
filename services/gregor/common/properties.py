"""Kafka-style properties files (`server.properties`) and `--override KEY=VALUE` flags for every role's CLI.

Every role reads its settings the same way Kafka's `kafka-server-start.sh server.properties --override k=v`
does: the file first, each override on top. A malformed line is an error naming the file and line, never
silently skipped, so a typo in a chart's ConfigMap stops the pod with a message instead of running with a
default.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]


def read_properties(path: str) -> dict[str, str]:
    """A server.properties file: `key=value` lines; blank lines and `#`/`!` comments skipped.

    A line without `=` or with an empty key raises InvalidConfigError (file:line), as does an unreadable file.
    """
    props: dict[str, str] = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise InvalidConfigError(f"cannot read properties file {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise InvalidConfigError(f"{path}:{number}: expected KEY=VALUE, got {line!r}")
        props[key.strip()] = value.strip()
    return props


def apply_overrides(props: dict[str, str], overrides: Iterable[str], flag: str = "--override") -> dict[str, str]:
    """`KEY=VALUE` items on top of `props` (later wins); a malformed item raises InvalidConfigError."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidConfigError(f"{flag} expects KEY=VALUE, got {item!r}")
        props[key.strip()] = value.strip()
    return props


def load_properties(path: str | None, overrides: Iterable[str] = (), flag: str = "--override") -> dict[str, str]:
    """The file at `path` (if any) with `overrides` applied: Kafka's --override order."""
    return apply_overrides(read_properties(path) if path else {}, overrides, flag)


def check_known(props: dict[str, str], known: Iterable[str], role: str) -> None:
    """Unknown keys are an error listing the known ones (a misspelt key must not be ignored)."""
    allowed = set(known)
    unknown = sorted(k for k in props if k not in allowed)
    if unknown:
        raise InvalidConfigError(f"Unknown {role} configuration: {', '.join(unknown)}; "
                                 f"known keys: {', '.join(sorted(allowed))}")


def parse_bool(raw: str) -> bool:
    """Kafka's boolean: true or false, any case; anything else is a ValueError."""
    if raw.lower() not in ("true", "false"):
        raise ValueError(raw)
    return raw.lower() == "true"


def settle(ns: Any, props: Mapping[str, str], keys: Mapping[str, tuple[str, Callable[[str], Any], Any]],
           role: str) -> None:
    """Fill `ns.<dest>` for each `key: (dest, parse, default)`: a flag given on the command line (not None)
    wins over the properties, which win over the default. Unknown property keys are refused first.

    Flags with a properties key are declared with default=None, so "given" and "left out" stay apart.
    """
    check_known(dict(props), keys, role)
    for key, (dest, parse, default) in keys.items():
        if getattr(ns, dest, None) is not None:
            continue
        if key in props:
            try:
                value = parse(props[key])
            except ValueError:
                raise InvalidConfigError(f"Invalid value {props[key]!r} for configuration {key}") from None
        else:
            value = default
        setattr(ns, dest, value)
