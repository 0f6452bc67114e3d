"""CoordinatorLookup's answer from its etcd view (pure logic; the etcd watch is covered by
tests/integration/test_find_coordinator.py with real processes)."""

from __future__ import annotations

from typing import Any

import pytest

from gregor.broker.coordinator_lookup import CoordinatorLookup
from gregor.common import errors
from gregor.common.etcd import EtcdClient
from gregor.common.coordinator_ownership import desired_owner, partition_for
from gregor.common.etcd_layout import CoordinatorKey, CoordinatorsZNode


ETCD = EtcdClient("http://127.0.0.1:2379", cluster="c")  # no connection: only its key prefix is used


def lookup(num_partitions: int = 4) -> CoordinatorLookup:
    c = CoordinatorLookup(etcd=None)  # type: ignore[arg-type]  # never touched: the view is set by hand
    c.num_partitions = num_partitions
    c._synced.set()
    return c


def register(c: CoordinatorLookup, cid: int) -> None:
    c._apply(CoordinatorKey("ids", cid), CoordinatorsZNode.encode_info(cid, "h", 9000 + cid))


async def test_claim_holder_wins_then_desired_owner_when_it_dies() -> None:
    c = lookup()
    register(c, 1)
    register(c, 2)
    p = partition_for("g", 4)
    other = 1 if desired_owner(p, [1, 2]) == 2 else 2
    c._apply(CoordinatorKey("partitions", p), str(other).encode())  # still held by the previous owner
    cid, host, port, part = await c.find("g")
    assert (cid, host, port, part) == (other, "h", 9000 + other, p)
    # Its lease expires: registration and claim vanish together; the rule names the survivor.
    c._apply(CoordinatorKey("ids", other), None)
    c._apply(CoordinatorKey("partitions", p), None)
    assert (await c.find("g"))[0] == 3 - other


async def test_stale_claim_of_a_dead_instance_is_ignored() -> None:
    c = lookup()
    register(c, 5)
    p = partition_for("g", 4)
    c._apply(CoordinatorKey("partitions", p), b"7")  # holder 7 is not registered
    assert (await c.find("g"))[0] == 5


@pytest.mark.parametrize("args,code", [(("",), errors.Code.INVALID_GROUP_ID), (("g", 2), errors.Code.INVALID_REQUEST),
                                       (("g",), errors.Code.COORDINATOR_NOT_AVAILABLE)])
async def test_typed_errors(args: Any, code: int) -> None:
    with pytest.raises(errors.GregorError) as e:
        await lookup().find(*args)  # no coordinator registered
    assert e.value.code == code


async def test_malformed_keys_are_ignored() -> None:
    c = lookup()
    c._apply(CoordinatorsZNode.parse(ETCD, b"/gregor/c/coordinators/ids/x"), b"{}")
    c._apply(CoordinatorKey("ids", 3), b"not json")
    c._apply(CoordinatorKey("partitions", 1), b"nope")
    assert c.live == {} and c.claims == {}
