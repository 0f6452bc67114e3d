"""gregor.coordinator.quotas: which coordinator calls the request quota leaves out (pure logic; the
metering itself runs against real processes in tests/integration/test_client_quotas.py)."""

from __future__ import annotations

from typing import Any

from gregor.common.acl import CLUSTER_NAME, Operation, ResourceType
from gregor.common.authz import Authz
from gregor.common.quotas import CLIENT_ID_METADATA, RELAYED_METADATA
from gregor.coordinator.quotas import CoordinatorQuotas
from tests.unit.security.test_authz import acl, authz_with


class PlainContext:
    """A plain-text gRPC call's context (no certificate: User:ANONYMOUS)."""

    def __init__(self, *metadata: tuple[str, str]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> Any:
        return self.metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


CLIENT = PlainContext((CLIENT_ID_METADATA, "app"))
RELAYED = PlainContext((CLIENT_ID_METADATA, "app"), RELAYED_METADATA)


def test_client_calls_are_metered_and_internal_ones_are_not() -> None:
    quotas = CoordinatorQuotas(Authz())  # no authorizer
    for api in ("JoinGroup", "Heartbeat", "OffsetCommit", "OffsetFetch", "ListGroups", "EndTxn"):
        assert not quotas.exempt(api, None, CLIENT)
    assert quotas.exempt("ValidateTxnOffsetCommit", None, CLIENT)
    # Relayed by the Kafka listener (metered on that broker) or a coordinator's own call: not again here.
    assert quotas.exempt("JoinGroup", None, RELAYED) and quotas.exempt("ListGroups", None, RELAYED)
    # The brokers' exemptions are theirs: a call named like one is an ordinary call here.
    assert not quotas.exempt("LeaderAndIsr", None, CLIENT)


def test_with_the_authorizer_on_only_a_cluster_action_peer_may_mark_a_call_relayed() -> None:
    anonymous_is_a_broker = authz_with([acl("User:ANONYMOUS", ResourceType.CLUSTER, CLUSTER_NAME,
                                            Operation.CLUSTER_ACTION)])
    assert CoordinatorQuotas(anonymous_is_a_broker).exempt("EndTxn", None, RELAYED)
    assert not CoordinatorQuotas(anonymous_is_a_broker).exempt("EndTxn", None, CLIENT)
    plain_client = authz_with([acl("User:ANONYMOUS", ResourceType.GROUP, "g", Operation.READ)])
    assert not CoordinatorQuotas(plain_client).exempt("EndTxn", None, RELAYED)
