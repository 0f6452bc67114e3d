"""Kafka's client-quota APIs (KIP-546): DescribeClientQuotas (48) and AlterClientQuotas (49), relayed to the
controller's DescribeClientQuotas / AlterClientQuotas, the same etcd store `gregor configs --entity-type
users|clients` writes (controller/client_quotas.py) and every broker watches (broker/quota_manager.py).

Entities are Kafka's: `user` and/or `client-id` components, a null name being the default entity (`<default>`).
`ip` entities (connection_creation_rate) are not kept here: altering one is INVALID_REQUEST, describing finds
none. Filters (DescribeClientQuotas) match as Kafka's: EXACT a name, DEFAULT the default entity, SPECIFIED any
entity of that type (the default included); `strict` keeps only entities with no other component. Kafka's
authorization: DescribeConfigs on the Cluster to describe, AlterConfigs on the Cluster to alter.

DescribeUserScramCredentials (50) is served because `kafka-configs --describe --entity-type users` asks it next to
the quotas and fails without it: Gregor has no SASL/SCRAM, so there are no credentials -- a named user is
RESOURCE_NOT_FOUND (Kafka's answer for a user without credentials), all users an empty list. Kafka's
authorization: Describe on the Cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gregor.common import authz as az, errors
from gregor.common.acl import CLUSTER_NAME, Operation, ResourceType
from gregor.common.quota_admin import number
from gregor.common.quotas import DEFAULT
from gregor.kafka import codec
from gregor.rpc.v1 import controller_pb2

if TYPE_CHECKING:
    from gregor.kafka.handlers import KafkaHandlers

Code = errors.Code
NONE = 0
USER, CLIENT_ID, IP = "user", "client-id", "ip"
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

RESOURCE_NOT_FOUND = 91
QUOTA_SUPPORTED: dict[int, tuple[int, int]] = {
    48: (0, 1),  # DescribeClientQuotas
    49: (0, 1),  # AlterClientQuotas
    50: (0, 0),  # DescribeUserScramCredentials: there are none (kafka-configs --describe --entity-type users asks)
}
QUOTA_API_NAMES = {48: "DescribeClientQuotas", 49: "AlterClientQuotas", 50: "DescribeUserScramCredentials"}


def _components(entity: controller_pb2.QuotaEntity) -> dict[str, str | None]:
    """A stored entity as Kafka's components: type -> name (None: the default entity)."""
    out: dict[str, str | None] = {}
    if entity.HasField("user"):
        out[USER] = None if entity.user == DEFAULT else entity.user
    if entity.HasField("client_id"):
        out[CLIENT_ID] = None if entity.client_id == DEFAULT else entity.client_id
    return out


def matches(components: dict[str, str | None], filters: list[tuple[str, int, str | None]], strict: bool) -> bool:
    """Kafka's filter over one entity's components (pure: tests/unit/kafka drives it)."""
    for etype, match_type, name in filters:
        if etype not in components:
            return False
        have = components[etype]
        if match_type == MATCH_EXACT and have != name:
            return False
        if match_type == MATCH_DEFAULT and have is not None:
            return False
    return not strict or len(components) == len(filters)


def validate_filters(filters: list[tuple[str, int, str | None]]) -> None:
    """INVALID_REQUEST for a component type given twice, an unknown type or match type, or an EXACT without a name."""
    seen = set()
    for etype, match_type, name in filters:
        if etype not in (USER, CLIENT_ID, IP):
            raise errors.error_for(Code.INVALID_REQUEST, f"Custom entity type '{etype}' not supported")
        if etype in seen:
            raise errors.error_for(Code.INVALID_REQUEST, f"Duplicate {etype} filter component entity type")
        seen.add(etype)
        if match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            raise errors.error_for(Code.INVALID_REQUEST, f"Unknown match type {match_type}")
        if match_type == MATCH_EXACT and name is None:
            raise errors.error_for(Code.INVALID_REQUEST, f"an EXACT {etype} filter component needs a name")


def entity_pb(components: list[tuple[str, str | None]]) -> controller_pb2.QuotaEntity:
    """The request's entity as the controller's QuotaEntity; INVALID_REQUEST for ip, unknown or repeated types."""
    out = controller_pb2.QuotaEntity()
    seen = set()
    for etype, name in components:
        if etype in seen:
            raise errors.error_for(Code.INVALID_REQUEST, f"Duplicate {etype} entity type")
        seen.add(etype)
        value = DEFAULT if name is None else name
        if etype == USER:
            out.user = value
        elif etype == CLIENT_ID:
            out.client_id = value
        elif etype == IP:
            raise errors.error_for(Code.INVALID_REQUEST, "ip quota entities (connection_creation_rate) are not "
                                                         "supported here")
        else:
            raise errors.error_for(Code.INVALID_REQUEST, f"Unhandled client quota entity type: {etype}")
    if not seen:
        raise errors.error_for(Code.INVALID_REQUEST, "the quota entity names no component")
    return out


class QuotaApis:
    def __init__(self, handlers: "KafkaHandlers") -> None:
        self.h = handlers

    def table(self) -> dict[int, Any]:
        return {48: self.describe_client_quotas, 49: self.alter_client_quotas,
                50: self.describe_user_scram_credentials}

    def _authorized(self, operation: Operation, api: str) -> bool:
        authz = self.h.broker.authz
        return not authz.enabled or authz.check(az.connection_caller(), operation, ResourceType.CLUSTER,
                                                CLUSTER_NAME, api)

    async def describe_client_quotas(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        filters = [(str(c.entity_type), int(c.match_type), None if c.match is None else str(c.match))
                   for c in req.components]
        try:
            if not self._authorized(Operation.DESCRIBE_CONFIGS, "DescribeClientQuotas"):
                raise errors.error_for(Code.CLUSTER_AUTHORIZATION_FAILED, "DescribeConfigs on the Cluster is needed")
            validate_filters(filters)
            resp = await self.h.admin("DescribeClientQuotas", controller_pb2.DescribeClientQuotasRequest())
        except errors.GregorError as err:
            return codec.build(mod.DescribeClientQuotasResponse, error_code=int(err.code), error_message=err.message,
                               entries=None)
        entries = []
        for e in resp.entries:
            comps = _components(e.entity)
            if not matches(comps, filters, bool(req.strict)):
                continue
            entries.append(codec.build(
                mod.EntryData,
                entity=[codec.build(mod.EntityData, entity_type=t, entity_name=n) for t, n in comps.items()],
                values=[codec.build(mod.ValueData, key=k, value=float(v)) for k, v in sorted(e.configs.items())]))
        return codec.build(mod.DescribeClientQuotasResponse, error_code=NONE, error_message=None, entries=entries)

    async def _alter_one(self, entry: Any, validate_only: bool) -> None:
        entity = entity_pb([(str(c.entity_type), None if c.entity_name is None else str(c.entity_name))
                            for c in entry.entity])
        sets: dict[str, str] = {}
        deletes: list[str] = []
        for op in entry.ops:
            if op.remove:
                deletes.append(str(op.key))
            else:
                sets[str(op.key)] = number(float(op.value))
        try:
            await self.h.admin("AlterClientQuotas", controller_pb2.AlterClientQuotasRequest(
                entity=entity, set=sets, delete=deletes, validate_only=validate_only))
        except errors.GregorError as err:
            if err.code == Code.INVALID_CONFIG:  # Kafka answers a bad quota key or value with INVALID_REQUEST
                raise errors.error_for(Code.INVALID_REQUEST, err.message) from None
            raise

    async def alter_client_quotas(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        allowed = self._authorized(Operation.ALTER_CONFIGS, "AlterClientQuotas")
        out = []
        for entry in req.entries:
            code, message = NONE, None
            try:
                if not allowed:
                    raise errors.error_for(Code.CLUSTER_AUTHORIZATION_FAILED, "AlterConfigs on the Cluster is needed")
                await self._alter_one(entry, bool(req.validate_only))
            except errors.GregorError as err:
                code, message = int(err.code), err.message
            out.append(codec.build(mod.EntryData, error_code=code, error_message=message, entity=[
                codec.build(mod.EntityData, entity_type=c.entity_type, entity_name=c.entity_name)
                for c in entry.entity]))
        return codec.build(mod.AlterClientQuotasResponse, entries=out)

    async def describe_user_scram_credentials(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        if not self._authorized(Operation.DESCRIBE, "DescribeUserScramCredentials"):
            return codec.build(mod.DescribeUserScramCredentialsResponse, results=[],
                               error_code=int(Code.CLUSTER_AUTHORIZATION_FAILED),
                               error_message="Describe on the Cluster is needed")
        results = [codec.build(mod.DescribeUserScramCredentialsResult, user=str(u.name),
                               error_code=RESOURCE_NOT_FOUND,
                               error_message=f"Attempt to describe a user credential that does not exist: {u.name}",
                               credential_infos=[])
                   for u in dict.fromkeys(req.users or ())]  # no SASL/SCRAM here: no user has credentials
        return codec.build(mod.DescribeUserScramCredentialsResponse, error_code=NONE, error_message=None,
                           results=results)
