"""The pure decisions of the standby's watch on the active controller (gregor.controller.liveness): which connect
outcomes prove the active's process gone, and which registration a revocation may end."""

from __future__ import annotations

import errno

import pytest

from gregor.common.etcd import KeyValue
from gregor.common.etcd_layout import ControllerRegistration, ControllerZNode
from gregor.controller.liveness import (REFUSALS_REQUIRED, ConnectOutcome, WatchedRegistration, classify_connect_error,
                                        parse_endpoint, process_gone, still_registered)

CONNECTED, REFUSED, NO_ANSWER = ConnectOutcome.CONNECTED, ConnectOutcome.REFUSED, ConnectOutcome.NO_ANSWER


def test_only_econnrefused_is_a_refusal() -> None:
    assert classify_connect_error(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is REFUSED
    assert classify_connect_error(OSError(errno.ECONNREFUSED, "refused")) is REFUSED
    for code in (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET, errno.EADDRNOTAVAIL):
        assert classify_connect_error(OSError(code, "x")) is NO_ANSWER, errno.errorcode[code]
    assert classify_connect_error(TimeoutError()) is NO_ANSWER
    assert classify_connect_error(OSError("no errno")) is NO_ANSWER


def test_the_process_is_gone_only_after_enough_refusals_in_a_row() -> None:
    assert REFUSALS_REQUIRED == 2
    assert process_gone([REFUSED, REFUSED])
    assert process_gone([REFUSED, REFUSED, REFUSED])
    assert not process_gone([])
    assert not process_gone([REFUSED])  # one refusal is not confirmed
    assert not process_gone([CONNECTED])  # a listener answered: maybe stopped, maybe restarted, not provably dead
    assert not process_gone([NO_ANSWER, REFUSED, REFUSED])  # a timeout first: a partition, the lease decides
    assert not process_gone([REFUSED, NO_ANSWER])
    assert not process_gone([REFUSED, CONNECTED])
    assert process_gone([REFUSED], required=1) and not process_gone([REFUSED], required=0)


def kv(controller_id: int, lease: int, mod_revision: int, endpoint: str = "127.0.0.1:9000") -> KeyValue:
    value = ControllerZNode.encode(ControllerRegistration(controller_id, 0, endpoint))
    return KeyValue(b"/gregor/gregor/controller", value, mod_revision, mod_revision, 1, lease)


def test_a_revocation_ends_only_the_registration_watched() -> None:
    watched = WatchedRegistration.of(kv(1, 0xA, 10))
    assert watched == WatchedRegistration(1, "127.0.0.1:9000", 0xA, 10)
    assert still_registered(watched, kv(1, 0xA, 10))
    assert not still_registered(watched, None)  # gone already
    assert not still_registered(watched, kv(2, 0xB, 12))  # a newer controller
    assert not still_registered(watched, kv(1, 0xC, 12))  # the same controller id, a new term on a new lease
    assert not still_registered(watched, kv(1, 0xA, 12))  # re-registered on the same lease: a new term too
    assert not still_registered(WatchedRegistration(1, "h:1", 0, 10), kv(1, 0, 10))  # no lease: nothing to revoke


@pytest.mark.parametrize("endpoint, expected", [
    ("127.0.0.1:9093", ("127.0.0.1", 9093)), ("ctl-0.ctl:9093", ("ctl-0.ctl", 9093)), ("[::1]:9093", ("::1", 9093)),
    ("", None), ("127.0.0.1", None), ("0.0.0.0:9093", None), ("[::]:9093", None), (":9093", None), ("h:0", None), ("h:70000", None), ("h:x", None),
])
def test_endpoints_parse_or_are_not_watched(endpoint: str, expected: tuple[str, int] | None) -> None:
    assert parse_endpoint(endpoint) == expected
