"""The standby controller's warm copy of the cluster metadata (issue 24; KRaft's standbys replaying the log).

A standby keeps every key the failover loads (topics with their partition states, topic configs,
deletion marks) loaded and parsed from etcd, a snapshot then a watch of each prefix
(`follow_prefix_kvs`), so a new active controller does not read and parse P partition states after
winning the election. Broker registrations are not kept: a handful of keys, read fresh at failover.

What guarantees that the active controller never acts on a stale copy (a watch event missed, a watch
that broke, restarted or fell behind a compaction, a mirror still loading): on winning the election,
`take()` stops the watches and reads each prefix again *without values* (keys and revisions only).
A key whose mod_revision there equals the copy's holds the same value (etcd gives every write of a
key a revision of its own, and a key deleted and created again a new one), a key with another or an
unknown revision is re-read with its value, a key etcd no longer has is dropped. So after `take()`
the snapshot equals etcd at the verification reads' revisions (or newer for the keys re-read), the
same as a cold read, whatever the watch delivered; the watch only decides how much is re-read. The
active role's watches start after the first verification read's revision (TopicsSnapshot.revision),
as after a cold read.

Concurrency: event-loop owned. The watches write the copy only while they run; `take()` reads it
after stopping them, on the controller's event task.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from gregor.common.etcd import EtcdClient, KeyValue, WatchTask, follow_prefix_kvs
from gregor.common.etcd_layout import DeleteTopicsZNode, PartitionStateZNode, TopicConfigZNode, TopicZNode
from gregor.controller import metadata_store
from gregor.controller.state import LeaderAndIsr, TopicPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TakeOver:
    """What `take()` checked: keys verified, keys re-read or dropped, and the first verification revision."""

    keys: int
    reread: int
    dropped: int
    revision: int
    generation: int  # the copy's generation when handed over (before any re-read)

    @property
    def unchanged(self) -> bool:
        """The copy was current: nothing re-read or dropped."""
        return self.reread == 0 and self.dropped == 0

    def __str__(self) -> str:
        return f"warm: {self.keys} keys verified at revision {self.revision}, {self.reread} re-read, " \
               f"{self.dropped} gone"


class StandbyMetadata:
    """The topics, partition states, configs and deletion marks under etcd, kept current while standby."""

    def __init__(self, etcd: EtcdClient, retry_s: float = 0.5) -> None:
        self.etcd = etcd
        self.retry_s = retry_s
        self.topics_prefix = TopicZNode.prefix(etcd)
        self.configs_prefix = TopicConfigZNode.prefix(etcd)
        self.deletes_prefix = DeleteTopicsZNode.prefix(etcd)
        self.prefixes = (self.topics_prefix, self.configs_prefix, self.deletes_prefix)
        # Per prefix: every key held -> its mod_revision (a key whose value did not parse is left out, so
        # `take()` re-reads it and fails as a cold read would).
        self._revisions: dict[bytes, dict[bytes, int]] = {p: {} for p in self.prefixes}
        # Prefixes whose snapshot read has been applied (absent while (re)loading).
        self._loaded: set[bytes] = set()
        self._watches = {p: WatchTask(f"standby-metadata {p.decode(errors='replace')}") for p in self.prefixes}
        self.revision = 0  # the newest revision applied (logs and tests)
        # Bumped by every change to the copy: a decision prepared from it (Controller) is still the one the
        # failover would take while the generation it was prepared at stands.
        self.generation = 0
        self._clear_topics()
        self.configs: dict[str, dict[str, str]] = {}
        self.topics_to_delete: set[str] = set()

    def _clear_topics(self) -> None:
        self.assignments: dict[str, dict[int, tuple[int, ...]]] = {}
        self.topic_ids: dict[str, bytes] = {}
        self.topic_revisions: dict[str, int] = {}
        self.states: dict[TopicPartition, LeaderAndIsr] = {}

    @property
    def ready(self) -> bool:
        """Every prefix has been read once (else a failover reads cold)."""
        return len(self._loaded) == len(self.prefixes)

    def start(self) -> None:
        """Follow the three prefixes (standby role); a no-op for those already followed."""
        for prefix, watch in self._watches.items():
            watch.start(functools.partial(self._follow, prefix))

    async def stop(self) -> None:
        for watch in self._watches.values():
            await watch.stop()

    async def _follow(self, prefix: bytes) -> None:
        def reset() -> None:
            self.generation += 1
            self._loaded.discard(prefix)
            self._forget_prefix(prefix)

        def loaded(revision: int) -> None:
            self._loaded.add(prefix)
            self.revision = max(self.revision, revision)
            log.info("standby metadata: %s loaded at revision %d (%d keys)", prefix.decode(errors="replace"),
                     revision, len(self._revisions[prefix]))

        def apply(kv: KeyValue, revision: int) -> None:
            self.generation += 1
            self._apply(prefix, kv)
            self.revision = max(self.revision, revision)

        await follow_prefix_kvs(self.etcd, prefix, reset=reset, apply=apply, loaded=loaded,
                                what="standby controller metadata", retry_s=self.retry_s)

    # -- the copy ----------------------------------------------------------------

    def _forget_prefix(self, prefix: bytes) -> None:
        self._revisions[prefix] = {}
        if prefix == self.topics_prefix:
            self._clear_topics()
        elif prefix == self.configs_prefix:
            self.configs = {}
        else:
            self.topics_to_delete = set()

    def _apply(self, prefix: bytes, kv: KeyValue, strict: bool = False) -> None:
        """One key put (version > 0) or deleted (version 0) into the copy. A value that does not parse is
        left out with a warning (the watch goes on), or, `strict` (the take-over's re-read), raises as a
        cold read would."""
        revisions = self._revisions[prefix]
        revisions.pop(kv.key, None)
        try:
            if prefix == self.topics_prefix:
                self._apply_topic_key(kv)
            elif prefix == self.configs_prefix:
                if (topic := TopicConfigZNode.topic(self.etcd, kv.key)) is not None:
                    if kv.version:
                        self.configs[topic] = metadata_store.decode_config(kv.value)
                    else:
                        self.configs.pop(topic, None)
            elif (topic := DeleteTopicsZNode.topic(self.etcd, kv.key)) is not None:
                if kv.version:
                    self.topics_to_delete.add(topic)
                else:
                    self.topics_to_delete.discard(topic)
        except (ValueError, KeyError, TypeError) as exc:  # a malformed value: take() re-reads it
            if strict:
                raise
            log.warning("standby metadata: cannot parse %r (%s); it is read again on failover", kv.key, exc)
            self._apply(prefix, KeyValue(kv.key))  # nor is its previous value kept
            return
        if kv.version:
            revisions[kv.key] = kv.mod_revision

    def _apply_topic_key(self, kv: KeyValue) -> None:
        if (topic := TopicZNode.topic(self.etcd, kv.key)) is not None:
            if not kv.version:
                self.assignments.pop(topic, None)
                self.topic_ids.pop(topic, None)
                self.topic_revisions.pop(topic, None)
                return
            assignment = metadata_store.decode_assignment(kv.value)
            topic_id = metadata_store.decode_topic_id(kv.value)
            self.assignments[topic] = assignment
            self.topic_revisions[topic] = kv.mod_revision
            if topic_id:
                self.topic_ids[topic] = topic_id
            else:
                self.topic_ids.pop(topic, None)
        elif (tp := PartitionStateZNode.topic_partition(self.etcd, kv.key)) is not None:
            if kv.version:
                self.states[TopicPartition(*tp)] = metadata_store.decode_partition_state(kv)
            else:
                self.states.pop(TopicPartition(*tp), None)

    def peek(self, revision: int = 0) -> metadata_store.TopicsSnapshot:
        """The copy as a TopicsSnapshot (its own dicts: the copy goes on changing)."""
        return metadata_store.TopicsSnapshot(
            revision=revision or self.revision, assignments=dict(self.assignments), topic_ids=dict(self.topic_ids),
            topic_revisions=dict(self.topic_revisions),
            # A state whose topic key is gone is a leftover of a half-done deletion (as load_topics).
            states={tp: s for tp, s in self.states.items() if tp.partition in self.assignments.get(tp.topic, {})},
            configs={t: dict(c) for t, c in self.configs.items()}, topics_to_delete=set(self.topics_to_delete))

    # -- failover ----------------------------------------------------------------

    async def take(self) -> tuple[metadata_store.TopicsSnapshot, TakeOver] | None:
        """Stop following and return the copy, verified against etcd key by key (see the module doc);
        None when the copy was not loaded yet (the caller reads cold). The copy is handed over and cleared."""
        await self.stop()
        if not self.ready:
            self._loaded.clear()
            for prefix in self.prefixes:
                self._forget_prefix(prefix)
            return None
        generation = self.generation
        first_revision = 0
        keys = reread = dropped = 0
        for prefix in self.prefixes:
            held = self._revisions[prefix]
            current = await self.etcd.get_prefix(prefix, keys_only=True)
            first_revision = first_revision or current.revision
            now = {kv.key: kv.mod_revision for kv in current.kvs}
            keys += len(now)
            for key in [k for k in held if k not in now]:
                self._apply(prefix, KeyValue(key))
                dropped += 1
            stale = [k for k, revision in now.items() if held.get(k) != revision]
            if stale:
                # One read of everything written since the oldest stale key's revision holds every stale key
                # (their revisions are at least that); a stale key it lacks was deleted since.
                fresh = await self.etcd.get_prefix(prefix, min_mod_revision=min(now[k] for k in stale))
                seen = set()
                for kv in fresh.kvs:
                    self._apply(prefix, kv, strict=True)
                    seen.add(kv.key)
                for key in stale:
                    if key not in seen:
                        self._apply(prefix, KeyValue(key))
                reread += len(stale)
        snap = self.peek(first_revision)
        self._loaded.clear()
        self._revisions = {p: {} for p in self.prefixes}
        self._clear_topics()
        self.configs, self.topics_to_delete = {}, set()
        return snap, TakeOver(keys, reread, dropped, first_revision, generation)
