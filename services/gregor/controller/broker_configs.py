"""Dynamic broker configs in etcd (Kafka's AdminZkClient.changeBrokerConfig, KIP-226).

The active controller validates (common/broker_configs.validate) and writes `config/brokers/<id>` or
`config/brokers/<default>` under its epoch guard; every broker watches `config/brokers/` (broker/dynamic_config.py)
and applies the change. Runs on the controller's event task (run_request), like every other admin write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from gregor.common import broker_configs as bc
from gregor.common.etcd import Delete, Put
from gregor.common.etcd_layout import BrokerConfigZNode

if TYPE_CHECKING:
    from gregor.controller.controller import Controller


async def read_entity(controller: "Controller", entity: str) -> dict[str, str]:
    kv = await controller.etcd.get(BrokerConfigZNode.key(controller.etcd, entity))
    return BrokerConfigZNode.decode(kv.value) if kv is not None and kv.value else {}


async def alter(controller: "Controller", broker: str, set_: Mapping[str, str], delete: Iterable[str],
                validate_only: bool, replace: bool) -> dict[str, str]:
    """The entity's configs after the change, written unless validate_only (none left: its key deleted).
    GregorError (nothing written) for a read-only or unknown key or a bad value."""
    entity = bc.entity_name(broker)
    bc.check_entity(entity)
    configs = bc.altered(await read_entity(controller, entity), set_, delete, replace)
    if not validate_only:
        key = BrokerConfigZNode.key(controller.etcd, entity)
        op: Put | Delete = Put(key, BrokerConfigZNode.encode(configs)) if configs else Delete(key)
        await controller.guarded_write([], [op])
    return configs
