"""The group and transaction coordinators' client quotas: request_percentage (KIP-124) on their calls.

In Kafka every broker is a group and transaction coordinator, so JoinGroup, Heartbeat, SyncGroup,
OffsetCommit, OffsetFetch, FindCoordinator, AddPartitionsToTxn, EndTxn and the rest count against the
caller's request quota like any other request. Gregor's coordinators are processes of their own that the
SDK calls directly over gRPC, so each keeps the brokers' quota view (broker/quota_manager.BrokerQuotas:
the same etcd configs and watch, sensors, channel mutes and metrics) and hands it to its servicers as
rpc_method's `request_quota`. Byte rates do not apply here (no records go through a coordinator).

Exempt, as Kafka exempts its inter-broker (ClusterAction) requests: the coordinators' calls to each other,
ValidateTxnOffsetCommit (transaction coordinator -> group coordinator, KIP-447) and the ListGroups /
ListTransactions fan-out (`gregor-list-scope: local`) from a caller allowed ClusterAction on the Cluster.
Without an authorizer nobody can be told apart, so a local-scope call is metered like any other.

Concurrency: event-loop owned (BrokerQuotas's).
"""

from __future__ import annotations

from typing import Any

from gregor.broker.quota_manager import BrokerQuotas
from gregor.common import authz as az
from gregor.common.acl import CLUSTER_NAME, Operation, ResourceType
from gregor.coordinator.server import LIST_SCOPE_HEADER

INTERNAL_APIS = frozenset({"ValidateTxnOffsetCommit"})
FAN_OUT_APIS = frozenset({"ListGroups", "ListTransactions"})


class CoordinatorQuotas(BrokerQuotas):
    """A coordinator's client-quota view: the brokers' BrokerQuotas with the coordinators' exemptions."""

    def __init__(self, authz: az.Authz) -> None:
        super().__init__()
        self.authz = authz

    def exempt(self, api: str, request: Any, context: Any) -> bool:
        if api in INTERNAL_APIS:
            return True
        if api not in FAN_OUT_APIS or not self.authz.enabled:
            return False
        if dict(context.invocation_metadata() or ()).get(LIST_SCOPE_HEADER) != "local":
            return False
        try:
            caller = self.authz.caller_of(context)
        except Exception:  # an unmappable principal: metered, and the servicer answers the denial
            return False
        return self.authz.check(caller, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME,
                                api, audit=False)
