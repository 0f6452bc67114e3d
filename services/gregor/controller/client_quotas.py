"""Client quota configs in etcd (Kafka's AdminZkClient.changeConfigs for users and clients, KIP-546).

The active controller writes `config/users/...` and `config/clients/...` under its epoch guard; every
broker watches them (broker/quota_manager.py), so nothing else needs telling. Reads go to etcd.
Concurrency: runs on the controller's event task (run_request), like every other admin write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from gregor.common.etcd import Delete, Put
from gregor.common.etcd_layout import QuotaConfigZNode
from gregor.common.quotas import QuotaEntity, validate_quota_configs
from gregor.common import errors

if TYPE_CHECKING:
    from gregor.controller.controller import Controller


async def read_entity(controller: "Controller", entity: QuotaEntity) -> dict[str, float]:
    kv = await controller.etcd.get(QuotaConfigZNode.key(controller.etcd, entity))
    return _values(QuotaConfigZNode.decode(kv.value)) if kv is not None and kv.value else {}


async def describe(controller: "Controller", entity: Optional[QuotaEntity]) -> list[tuple[QuotaEntity, dict[str, float]]]:
    """Every entity with quota configs (or just `entity`), sorted."""
    etcd = controller.etcd
    if entity is not None:
        configs = await read_entity(controller, entity)
        return [(entity, configs)] if configs else []
    res = await etcd.get_prefix(QuotaConfigZNode.watch_prefix(etcd))
    out = []
    for kv in res.kvs:
        found = QuotaConfigZNode.entity(etcd, kv.key)
        if found is not None and kv.value:
            configs = _values(QuotaConfigZNode.decode(kv.value))
            if configs:
                out.append((found, configs))
    return sorted(out, key=lambda e: (e[0].user or "", e[0].client_id or ""))


async def write(controller: "Controller", entity: QuotaEntity, configs: dict[str, float]) -> None:
    """Store the entity's configs (none left: delete its key), guarded by the controller epoch."""
    key = QuotaConfigZNode.key(controller.etcd, entity)
    op: Put | Delete = Put(key, QuotaConfigZNode.encode(configs)) if configs else Delete(key)
    await controller.guarded_write([], [op])


def _values(stored: dict[str, str]) -> dict[str, float]:
    try:
        return validate_quota_configs(stored)
    except ValueError as exc:
        raise errors.error_for(errors.Code.INVALID_CONFIG, f"stored quota configs are malformed: {exc}") from None
