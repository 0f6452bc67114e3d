"""The gateway's callers: who they are, what they may write, and their produce quota (issue 23).

The gateway produces with its own producer (and its own certificate) to the brokers, as Kafka's REST proxy
does; with the authorizer on it authorizes each caller itself before anything is buffered, so a caller
can write through the gateway only what it could write to the brokers directly:

- the caller is `User:` + its client certificate's subject mapped by `ssl.principal.mapping.rules`
  (`Authz.caller_of`, the brokers' code), `User:ANONYMOUS` without one;
- a record needs Write on its topic (Kafka 3.x: Write on a topic also allows the idempotent produce the
  gateway's producer does, KIP-679); a transactional stream's init needs Write on its TransactionalId,
  and each of its records Write on the TransactionalId and on the topic;
- a denial answers TOPIC_AUTHORIZATION_FAILED / TRANSACTIONAL_ID_AUTHORIZATION_FAILED, is counted in
  `gregor_authorizer_denials_total` and written to the `gregor.audit` log (Authz.check), and nothing of
  it is buffered.

The ACLs come from etcd with the same watch as every service's (common/authz.AclCache). The caller's
`producer_byte_rate` (users / clients quotas in etcd, Kafka's eight levels) is enforced here too, with the
brokers' quota manager keyed by the caller's user and `client-id` metadata: over it, the caller's
connection (a unary call's HTTP/2 connection, a stream) is muted for the throttle time, as a broker mutes
a channel; the gateway's API has no throttle_time field, so the mute is the signal.

Concurrency: event-loop owned.
"""

from __future__ import annotations

from typing import Any, Optional

from gregor.broker.quota_manager import BrokerQuotas, StreamQuota
from gregor.common import errors
from gregor.common.acl import Operation, ResourceType
from gregor.common.authz import Authz, Caller, denial


class GatewayCallers:
    """The gateway's per-caller checks: authorization (authz on) and produce quotas (quotas given)."""

    def __init__(self, authz: Optional[Authz] = None, quotas: Optional[BrokerQuotas] = None) -> None:
        self.authz = authz if authz is not None and authz.enabled else None
        self.quotas = quotas

    def caller(self, context: Any) -> Optional[Caller]:
        """The caller of a call (None: the authorizer is off, everything is allowed)."""
        return self.authz.caller_of(context) if self.authz is not None else None

    def topic_denial(self, caller: Optional[Caller], topic: str, api: str) -> Optional[errors.GregorError]:
        """TOPIC_AUTHORIZATION_FAILED when caller may not Write topic (counted and audited), else None."""
        if caller is None or self.authz is None:
            return None
        if self.authz.check(caller, Operation.WRITE, ResourceType.TOPIC, topic, api):
            return None
        return denial(caller, Operation.WRITE, ResourceType.TOPIC, topic, topic=topic)

    def require_topic(self, caller: Optional[Caller], topic: str, api: str) -> None:
        err = self.topic_denial(caller, topic, api)
        if err is not None:
            raise err

    def require_transactional_id(self, caller: Optional[Caller], transactional_id: str, api: str) -> None:
        """Write on the TransactionalId, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
        if caller is not None and self.authz is not None and transactional_id:
            self.authz.require(caller, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id, api)

    # -- quotas ---------------------------------------------------------------------------------------

    async def unary_quota(self, context: Any) -> Optional[StreamQuota]:
        """A unary call's produce-quota view, after its connection's mute (None: no quota configured)."""
        return None if self.quotas is None else await self.quotas.unary(context)

    def stream_quota(self, context: Any) -> Optional[StreamQuota]:
        return None if self.quotas is None else self.quotas.stream(context)


async def record_and_wait(view: Optional[StreamQuota], nbytes: int) -> None:
    """Record a stream message's bytes against the caller's producer_byte_rate and wait out the mute."""
    if view is not None and view.quotas.enabled:
        view.record_produce(nbytes)
        await view.channel.wait()
