"""Topic administration for a standalone broker, until the controller owns topics.

Topic definitions persist in `<first log.dir>/__gregor_topics.json` (written
atomically), each with its topic id (KIP-516, `topic_id`, Kafka's text form); a
file written before topic ids gets them when it is loaded. With a controller, the same AdminService is served by the
controller and this module is not used.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gregor.common import errors, uuid
from gregor.common.config import validate_topic_configs
from gregor.common.topics import LEGAL_TOPIC, TOPIC_NAME_MAX, validate_topic_name  # noqa: F401 (re-exported)


class LocalTopicStore:
    """Topics of a standalone broker: name -> {partitions, configs} (event-loop owned)."""

    def __init__(self, log_dir: str) -> None:
        self.path = os.path.join(log_dir, "__gregor_topics.json")
        self.topics: dict[str, dict[str, Any]] = {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.topics = json.load(f)
            missing = [entry for entry in self.topics.values() if not entry.get("topic_id")]
            for entry in missing:
                entry["topic_id"] = uuid.to_string(uuid.random_topic_id())
            if missing:
                self._save()

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.topics, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def create(self, name: str, partitions: int, replication_factor: int, configs: dict[str, str],
               validate_only: bool = False) -> dict[str, Any]:
        validate_topic_name(name)
        if name in self.topics:
            raise errors.error_for(errors.Code.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.", topic=name)
        if partitions <= 0:
            raise errors.error_for(errors.Code.INVALID_PARTITIONS, "Number of partitions must be larger than 0.",
                                   topic=name)
        if replication_factor != 1:
            raise errors.error_for(
                errors.Code.INVALID_REPLICATION_FACTOR,
                f"Replication factor: {replication_factor} larger than available brokers: 1.", topic=name)
        validate_topic_configs(configs)
        entry = {"partitions": partitions, "replication_factor": 1, "configs": dict(configs),
                 "topic_id": uuid.to_string(uuid.random_topic_id())}
        if not validate_only:
            self.topics[name] = entry
            self._save()
        return entry

    def delete(self, name: str) -> dict[str, Any]:
        entry = self.get(name)
        del self.topics[name]
        self._save()
        return entry

    def topic_id(self, name: str) -> bytes:
        """The topic's id (KIP-516); b"" for an unknown topic."""
        entry = self.topics.get(name)
        return uuid.from_string(entry["topic_id"]) if entry is not None and entry.get("topic_id") else b""

    def get(self, name: str) -> dict[str, Any]:
        entry = self.topics.get(name)
        if entry is None:
            raise errors.error_for(errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
                                   f"Topic '{name}' does not exist.", topic=name)
        return entry

    def add_partitions(self, name: str, count: int, validate_only: bool = False) -> dict[str, Any]:
        entry = self.get(name)
        if count <= entry["partitions"]:
            raise errors.error_for(
                errors.Code.INVALID_PARTITIONS,
                f"Topic currently has {entry['partitions']} partitions, {count} would not be an increase.",
                topic=name)
        if not validate_only:
            entry["partitions"] = count
            self._save()
        return entry

    def alter_configs(self, name: str, set_: dict[str, str], delete: list[str], validate_only: bool) -> dict[str, Any]:
        entry = self.get(name)
        configs = {k: v for k, v in entry["configs"].items() if k not in delete}
        configs.update(set_)
        validate_topic_configs(configs)
        if not validate_only:
            entry["configs"] = configs
            self._save()
        return entry
