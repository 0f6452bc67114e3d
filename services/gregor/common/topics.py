"""Topic name rules shared by the standalone broker and the controller (Kafka's Topic.validate)."""

from __future__ import annotations

import re

from gregor.common import errors

LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
TOPIC_NAME_MAX = 249  # Kafka's limit, so directory names stay under 255 bytes


def validate_topic_name(name: str) -> None:
    """Raise INVALID_TOPIC_EXCEPTION unless name is a legal topic name."""
    if not name or name in (".", "..") or len(name) > TOPIC_NAME_MAX or not LEGAL_TOPIC.match(name):
        raise errors.error_for(
            errors.Code.INVALID_TOPIC_EXCEPTION,
            f"Topic name {name!r} is illegal: use up to {TOPIC_NAME_MAX} of [a-zA-Z0-9._-], not '.' or '..'",
            topic=name)
