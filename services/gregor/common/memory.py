"""glibc allocator tuning for processes that move multi-megabyte buffers.

Produce requests and fetch responses are 1-8 MiB bytes objects. By default
glibc serves allocations above 128 KiB with a fresh mmap and returns them on
free, so every request pays page faults to zero new pages; measured on the
fetch path this halved gRPC throughput (bench/bench_broker.py). Keeping such
buffers in the heap (higher mmap threshold, lazy trimming) removes that cost.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD_BYTES = 256 << 20  # give memory back only when this much is free at the top
TOP_PAD_BYTES = 16 << 20  # grow the heap in 16 MiB steps


def tune_allocator() -> bool:
    """Apply the settings above; returns False (and changes nothing) off glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = all(mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (M_TOP_PAD, TOP_PAD_BYTES),
    ))
    if not ok:
        log.warning("mallopt refused the allocator settings; large buffers will page-fault")
    return ok
