"""The group and transaction coordinators' client quotas: request_percentage (KIP-124) on their calls.

In Kafka every broker is a group and transaction coordinator, so JoinGroup, Heartbeat, SyncGroup,
OffsetCommit, OffsetFetch, FindCoordinator, AddPartitionsToTxn, EndTxn and the rest count against the
caller's request quota like any other request. Gregor's coordinators are processes of their own that the
SDK calls directly over gRPC, so each keeps the brokers' quota view (broker/quota_manager.BrokerQuotas:
the same etcd configs and watch, sensors, channel mutes and metrics) and hands it to its servicers as
rpc_method's `request_quota`. Byte rates do not apply here (no records go through a coordinator).

Not metered, as Kafka meters a request once, on the broker that received it, and exempts its
inter-broker (ClusterAction) requests:
- ValidateTxnOffsetCommit (transaction coordinator -> group coordinator, KIP-447), by name;
- calls marked relayed (common/quotas.RELAYED_METADATA): the Kafka listener relaying a Kafka client's
  JoinGroup, EndTxn... (the broker metered that request already, for that client; metering it here
  again would charge the broker's one connection and mute it for every client relayed through it), a
  coordinator's ListGroups / ListTransactions fan-out and its transactional OffsetCommit. With the
  authorizer on the mark counts only from a peer allowed ClusterAction on the Cluster (a broker or a
  coordinator); without it nobody's identity is checked anyway (a client may pick any client.id too).

Concurrency: event-loop owned (BrokerQuotas's).
"""

from __future__ import annotations

from typing import Any

from gregor.broker.quota_manager import BrokerQuotas
from gregor.common import authz as az
from gregor.common.quotas import RELAYED_METADATA

INTERNAL_APIS = frozenset({"ValidateTxnOffsetCommit"})


class CoordinatorQuotas(BrokerQuotas):
    """A coordinator's client-quota view: the brokers' BrokerQuotas with the coordinators' exemptions."""

    def __init__(self, authz: az.Authz) -> None:
        super().__init__()
        self.authz = authz

    def exempt(self, api: str, request: Any, context: Any) -> bool:
        if api in INTERNAL_APIS:
            return True
        key, value = RELAYED_METADATA
        if not any(k == key and v == value for k, v in context.invocation_metadata() or ()):
            return False
        return self.authz.peer_may_cluster_action(context)
