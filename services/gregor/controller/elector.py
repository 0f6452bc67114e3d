"""Controller election in etcd (seed 001's elect and registerControllerAndIncrementControllerEpoch) and the epoch fence."""

from __future__ import annotations

import time
from dataclasses import dataclass

from gregor.common.etcd import Compare, EtcdClient, Put, mod_revision_is, version_is
from gregor.common.etcd_layout import ControllerEpochZNode, ControllerRegistration, ControllerZNode

NO_CONTROLLER = -1


class ControllerMovedError(RuntimeError):
    """Another controller registered first, or a newer epoch fenced our write (Kafka's ControllerMovedException)."""


@dataclass(frozen=True)
class Election:
    """A won election: the new epoch and the mod_revision of `controller_epoch` that fences older controllers."""

    epoch: int
    epoch_version: int


def epoch_guard(etcd: EtcdClient, epoch_version: int) -> Compare:
    """The compare every controller write carries: controller_epoch was last written by our election."""
    return mod_revision_is(ControllerEpochZNode.key(etcd), epoch_version)


def is_epoch_guard(etcd: EtcdClient, compare: Compare) -> bool:
    return compare.key == ControllerEpochZNode.key(etcd) and compare.target == "mod_revision"


async def read_controller(etcd: EtcdClient) -> ControllerRegistration | None:
    """The active controller's registration, None when the key is absent."""
    kv = await etcd.get(ControllerZNode.key(etcd))
    return ControllerZNode.decode(kv.value) if kv is not None else None


async def read_controller_id(etcd: EtcdClient) -> int:
    """The active controller's id, NO_CONTROLLER when the key is absent (Kafka's getControllerId)."""
    registration = await read_controller(etcd)
    return registration.controller_id if registration is not None else NO_CONTROLLER


async def read_controller_epoch(etcd: EtcdClient) -> tuple[int, int]:
    """(epoch, mod_revision) of `controller_epoch`; (0, 0) before the first election."""
    kv = await etcd.get(ControllerEpochZNode.key(etcd))
    return (ControllerEpochZNode.decode(kv.value), kv.mod_revision) if kv is not None else (0, 0)


async def register_controller_and_increment_epoch(
    etcd: EtcdClient, controller_id: int, lease_id: int, now_ms: int | None = None, endpoint: str = ""
) -> Election:
    """Create the lease-bound `controller` key and bump `controller_epoch` in ONE transaction.

    The transaction holds only if nobody is registered (controller version == 0) and
    controller_epoch is still what we read, so two candidates can never both win
    and every winner gets a distinct epoch. Raises ControllerMovedError when we lose.
    """
    epoch, epoch_version = await read_controller_epoch(etcd)
    registration = ControllerRegistration(controller_id, now_ms if now_ms is not None else int(time.time() * 1000),
                                          endpoint)
    controller_key, epoch_key = ControllerZNode.key(etcd), ControllerEpochZNode.key(etcd)
    result = await etcd.txn(
        [version_is(controller_key, 0), mod_revision_is(epoch_key, epoch_version)],
        [Put(controller_key, ControllerZNode.encode(registration), lease_id),
         Put(epoch_key, ControllerEpochZNode.encode(epoch + 1))],
    )
    if not result:
        failed = ", ".join(map(str, result.failed))
        raise ControllerMovedError(f"controller {controller_id} lost the election ({failed})")
    # Both puts happened at the transaction's revision: that is controller_epoch's new mod_revision.
    return Election(epoch + 1, result.revision)


def should_resign(was_active: bool, active_controller_id: int, controller_id: int) -> bool:
    """maybeResign's test: we were active and the registered controller is now someone else (or nobody)."""
    return was_active and active_controller_id != controller_id
