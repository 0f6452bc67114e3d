"""AlterClientQuotas / DescribeClientQuotas in and out of the domain, shared by the controller (etcd) and a
standalone broker (memory): proto <-> QuotaEntity, and Kafka's typed errors for bad input."""

from __future__ import annotations

from typing import Mapping

from gregor.common import errors
from gregor.common.quotas import QuotaConfigError, QuotaEntity, alter_configs
from gregor.rpc.v1 import controller_pb2


def entity_of(pb: controller_pb2.QuotaEntity) -> QuotaEntity:
    """The entity a request names; INVALID_REQUEST for an empty one or an empty name."""
    user = pb.user if pb.HasField("user") else None
    client_id = pb.client_id if pb.HasField("client_id") else None
    if user == "" or (user is None and client_id is None):
        raise errors.error_for(errors.Code.INVALID_REQUEST,
                               "a quota entity names a user (non-empty), a client id, or both")
    try:
        return QuotaEntity(user, client_id)
    except QuotaConfigError as exc:
        raise errors.error_for(errors.Code.INVALID_REQUEST, str(exc)) from None


def entity_pb(entity: QuotaEntity) -> controller_pb2.QuotaEntity:
    out = controller_pb2.QuotaEntity()
    if entity.user is not None:
        out.user = entity.user
    if entity.client_id is not None:
        out.client_id = entity.client_id
    return out


def number(value: float) -> str:
    """A quota value as Kafka prints it (1024, not 1024.0)."""
    return str(int(value)) if float(value).is_integer() else str(value)


def entry_pb(entity: QuotaEntity, configs: Mapping[str, float]) -> controller_pb2.ClientQuotaEntry:
    return controller_pb2.ClientQuotaEntry(entity=entity_pb(entity),
                                           configs={k: number(v) for k, v in configs.items()})


def altered(current: Mapping[str, float], request: controller_pb2.AlterClientQuotasRequest) -> dict[str, float]:
    """The entity's configs after the request; INVALID_CONFIG for a bad name or value."""
    try:
        return alter_configs(current, dict(request.set), list(request.delete))
    except QuotaConfigError as exc:
        raise errors.error_for(errors.Code.INVALID_CONFIG, str(exc)) from None
