"""replication-offset-checkpoint: the high watermarks of a log dir's partitions, in Kafka's text format.

    0                 <- version
    2                 <- number of entries
    orders 0 1234     <- topic partition offset
    orders 1 99

Written atomically (temp file, fsync, rename) so a crash leaves the old or the new file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CHECKPOINT_VERSION = 0


def write_offsets(path: str, offsets: Mapping[tuple[str, int], int]) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_offsets(path: str) -> dict[tuple[str, int], int]:
    """The checkpointed offsets; {} if the file is missing. A malformed file raises ValueError."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return {}
    if not lines or int(lines[0]) != CHECKPOINT_VERSION:
        raise ValueError(f"{path}: unknown checkpoint version {lines[:1]}")
    count = int(lines[1])
    out: dict[tuple[str, int], int] = {}
    for line in lines[2:2 + count]:
        topic, partition, offset = line.rsplit(" ", 2)
        out[(topic, int(partition))] = int(offset)
    if len(out) != count:
        raise ValueError(f"{path}: expected {count} entries, found {len(out)}")
    return out
