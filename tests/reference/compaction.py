"""Pure-Python reference of log compaction (seed 003, Kafka's log cleaner semantics).

The log is a list of records (offset, key, value); value None is a tombstone.
A cleaning that reaches `end` (the cleaner's new checkpoint: Log.clean's end_offset)
with the previous checkpoint `first_dirty`:

- keeps every record at or above `end` untouched;
- below `end`, drops a record when a record with the same key at a higher offset
  lies in [first_dirty, end) (the dirty part the offset map covers);
- keeps a tombstone that survived the first rule until its delete horizon: the
  first cleaning that keeps it sets horizon = now + delete.retention.ms (KIP-534),
  a cleaning at now >= horizon drops it;
- never renumbers: offsets stay, gaps appear.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class CompactedLogModel:
    delete_retention_ms: int
    records: list[tuple[int, bytes, Optional[bytes]]] = field(default_factory=list)
    next_offset: int = 0
    first_dirty: int = 0
    horizons: dict[int, int] = field(default_factory=dict)  # tombstone offset -> delete horizon

    def append(self, batch: list[tuple[bytes, Optional[bytes]]]) -> None:
        for key, value in batch:
            self.records.append((self.next_offset, key, value))
            self.next_offset += 1

    def clean(self, end: int, now_ms: int) -> None:
        latest: dict[bytes, int] = {}
        for offset, key, _ in self.records:
            if self.first_dirty <= offset < end:
                latest[key] = offset
        kept = []
        for offset, key, value in self.records:
            if offset >= end:
                kept.append((offset, key, value))
                continue
            if offset < latest.get(key, -1):
                continue
            if value is None:
                horizon = self.horizons.get(offset)
                if horizon is not None and horizon <= now_ms:
                    del self.horizons[offset]
                    continue
                if horizon is None:
                    self.horizons[offset] = now_ms + self.delete_retention_ms
            kept.append((offset, key, value))
        self.records = kept
        self.first_dirty = max(self.first_dirty, end)

    def latest_values(self) -> dict[bytes, Optional[bytes]]:
        """What a consumer of the whole log ends up with per key (None: deleted)."""
        out: dict[bytes, Optional[bytes]] = {}
        for _, key, value in self.records:
            out[key] = value
        return out
