"""A broker's dynamic configs (Kafka's DynamicBrokerConfig, KIP-226): `config/brokers/<default>` and
`config/brokers/<id>` read at start and kept current by a watch on `config/brokers/` (the controller writes them,
controller/broker_configs.py). A change of either layer recomputes the broker's topic defaults (dynamic per-broker
over dynamic default over the properties file over Kafka's defaults, common/broker_configs.py) and re-applies them
to every hosted topic without its own override: the logs' segment and retention settings and the partitions'
min.insync.replicas / max.message.bytes / compression.type change within the watch's delay.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Iterable

from gregor.common import broker_configs as bc
from gregor.common.config import effective_topic_configs
from gregor.common.etcd import WatchTask
from gregor.common.etcd_layout import BrokerConfigZNode

if TYPE_CHECKING:
    from gregor.broker.broker import Broker

log = logging.getLogger(__name__)
RETRY_S = 1.0


class DynamicBrokerConfig:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.static = dict(broker.config.static_properties)
        self.static_topic_defaults = dict(broker.config.topic_defaults)
        self.entities: dict[str, dict[str, str]] = {}  # every `config/brokers/*` entity (tiny: one per broker)
        self._watcher = WatchTask("dynamic-broker-config")
        self._etcd: Any = None
        self.synced = asyncio.Event()
        self._loading = True

    @property
    def default_layer(self) -> dict[str, str]:
        return self.entities.get(bc.DEFAULT_ENTITY, {})

    @property
    def broker_layer(self) -> dict[str, str]:
        return self.entities.get(str(self.broker.config.broker_id), {})

    def start(self, etcd: Any) -> None:
        self._etcd = etcd
        self._watcher.start(self._watch)

    async def stop(self) -> None:
        await self._watcher.stop()

    async def _watch(self) -> None:
        from gregor.common.etcd import config_entity_apply, follow_prefix

        def reset() -> None:  # a (re)read of every entity: applied once whole, not key by key
            self._loading = True
            self.entities.clear()

        def loaded(_revision: int) -> None:
            self._loading = False
            self.apply()
            self.synced.set()

        what = "dynamic broker configs"
        apply = config_entity_apply(lambda key: BrokerConfigZNode.entity(self._etcd, key), BrokerConfigZNode.decode,
                                    self._set_entity, what=what, logger=log)
        await follow_prefix(self._etcd, BrokerConfigZNode.prefix(self._etcd), reset=reset, apply=apply,
                            loaded=loaded, what=what, retry_s=RETRY_S)

    def _set_entity(self, entity: str, configs: dict[str, str]) -> None:
        """One `config/brokers/*` entity's stored configs (empty: removed); ours or the default re-applied."""
        if configs:
            self.entities[entity] = configs
        else:
            self.entities.pop(entity, None)
        if not self._loading and entity in (bc.DEFAULT_ENTITY, str(self.broker.config.broker_id)):
            self.apply()

    def apply(self) -> None:
        """Recompute the topic defaults from the layers; re-apply them to the hosted topics if they changed."""
        defaults = bc.topic_defaults(self.static, self.default_layer, self.broker_layer, self.static_topic_defaults)
        if defaults == self.broker.config.topic_defaults:
            return
        log.info("broker %d: topic defaults now %s (dynamic default %s, per-broker %s)",
                 self.broker.config.broker_id, defaults, self.default_layer, self.broker_layer)
        self.broker.config.topic_defaults = defaults
        self.broker.replica_manager.reapply_topic_defaults()

    def describe(self, resource_name: str) -> list[bc.Entry]:
        """DescribeConfigs of BROKER `resource_name` on this broker: "" the dynamic defaults, our id everything."""
        if bc.entity_name(resource_name) == bc.DEFAULT_ENTITY:
            return bc.default_entries(self.default_layer)
        return bc.broker_entries(self.broker.config, self.static, self.default_layer, self.broker_layer)

    def inherited(self, topic_config: str, value: Any) -> bc.Entry:
        return bc.inherited_topic_entry(topic_config, value, self.static, self.default_layer, self.broker_layer)

    def topic_entries(self, entries: Iterable[Any]) -> list[bc.Entry]:
        """A topic's configs as the controller described them (its overrides, Kafka's defaults for the rest), as
        this broker describes them, the way Kafka's brokers answer DescribeConfigs of a topic: a config without
        an override takes this broker's value and source (dynamic per-broker, dynamic default, static or Kafka's
        default). Both the Kafka listener and the gRPC AdminService answer with these."""
        defaults = effective_topic_configs({}, self.broker.config.topic_defaults)
        out = []
        for e in entries:
            if e.is_default and e.name in defaults:
                out.append(self.inherited(e.name, defaults[e.name]))
            else:
                out.append(bc.Entry(e.name, e.value, bc.TOPIC_CONFIG, False, False,
                                    ((e.name, e.value, bc.TOPIC_CONFIG),), e.documentation))
        return out
