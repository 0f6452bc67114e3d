"""Wall and monotonic time in milliseconds, in one place so tests can reason about it."""

import time


def now_ms() -> int:
    """Milliseconds since the epoch (record timestamps, retention)."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """Monotonic milliseconds (timeouts, lag windows)."""
    return time.monotonic_ns() // 1_000_000
