"""Kafka's DescribeAcls (29), CreateAcls (30) and DeleteAcls (31) on the Kafka listener, relayed to the
controller's AdminService with the connection's principal (the controller checks Describe / Alter on
the Cluster), so kafka-acls.sh --bootstrap-server and the Admin clients manage Gregor's ACLs.

The protocol's enums (Kafka's ResourceType, PatternType, AclOperation, AclPermissionType codes) are mapped
to gregor.common.acl's; ANY (1) in a filter matches every value, MATCH (2) every pattern that applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gregor.common import authz as az, errors
from gregor.common.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from gregor.kafka import codec
from gregor.rpc.v1 import controller_pb2

if TYPE_CHECKING:
    from gregor.kafka.handlers import KafkaHandlers

ANY, MATCH = 1, 2
RESOURCE_TYPES = {2: ResourceType.TOPIC, 3: ResourceType.GROUP, 4: ResourceType.CLUSTER,
                  5: ResourceType.TRANSACTIONAL_ID}
PATTERN_TYPES = {3: PatternType.LITERAL, 4: PatternType.PREFIXED}
OPERATIONS = {2: Operation.ALL, 3: Operation.READ, 4: Operation.WRITE, 5: Operation.CREATE, 6: Operation.DELETE,
              7: Operation.ALTER, 8: Operation.DESCRIBE, 9: Operation.CLUSTER_ACTION,
              10: Operation.DESCRIBE_CONFIGS, 11: Operation.ALTER_CONFIGS, 12: Operation.IDEMPOTENT_WRITE}
PERMISSIONS = {2: Permission.DENY, 3: Permission.ALLOW}


def _code(table: dict[int, Any], value: Any) -> int:
    return next(k for k, v in table.items() if v is value)


def _lookup(table: dict[int, Any], code: int, what: str) -> Any:
    if code not in table:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"unsupported {what} code {code}")
    return table[code]


def _filter(f: Any) -> az.AclFilter:
    """A DescribeAcls request or DeleteAcls filter as an AclFilter (INVALID_REQUEST for codes we lack)."""
    rt, pt = int(f.resource_type_filter), int(getattr(f, "pattern_type_filter", 3))
    op, perm = int(f.operation), int(f.permission_type)
    return az.AclFilter(
        principal=f.principal_filter, host=f.host_filter,
        resource_type=None if rt == ANY else _lookup(RESOURCE_TYPES, rt, "resource type"),
        resource_name=f.resource_name_filter,
        pattern_type="Any" if pt == ANY else "Match" if pt == MATCH else _lookup(PATTERN_TYPES, pt,
                                                                                 "pattern type").value,
        operation=None if op == ANY else _lookup(OPERATIONS, op, "operation"),
        permission=None if perm == ANY else _lookup(PERMISSIONS, perm, "permission type"))


def _binding(c: Any) -> AclBinding:
    return AclBinding(c.principal, c.host, _lookup(RESOURCE_TYPES, int(c.resource_type), "resource type"),
                      c.resource_name, _lookup(PATTERN_TYPES, int(getattr(c, "resource_pattern_type", 3)),
                                               "pattern type"),
                      _lookup(OPERATIONS, int(c.operation), "operation"),
                      _lookup(PERMISSIONS, int(c.permission_type), "permission type"))


def _fields(a: AclBinding) -> dict[str, Any]:
    return {"resource_type": _code(RESOURCE_TYPES, a.resource_type), "resource_name": a.resource_name,
            "pattern_type": _code(PATTERN_TYPES, a.pattern_type), "principal": a.principal, "host": a.host,
            "operation": _code(OPERATIONS, a.operation), "permission_type": _code(PERMISSIONS, a.permission)}


async def describe_acls(h: "KafkaHandlers", header: codec.RequestHeader, req: Any, mod: Any) -> Any:
    try:
        resp = await h.admin("DescribeAcls", az.filter_to_pb(_filter(req)))
        found = [az.binding_from_pb(a) for a in resp.acls]
    except errors.GregorError as err:
        return codec.build(mod.DescribeAclsResponse, error_code=int(err.code), error_message=err.message,
                           resources=[])
    by_resource: dict[tuple[Any, ...], list[AclBinding]] = {}
    for a in found:
        by_resource.setdefault((a.resource_type, a.resource_name, a.pattern_type), []).append(a)
    return codec.build(mod.DescribeAclsResponse, error_code=0, error_message=None, resources=[
        codec.build(mod.DescribeAclsResource, resource_type=_code(RESOURCE_TYPES, rt), resource_name=name,
                    pattern_type=_code(PATTERN_TYPES, pt), acls=[
                        codec.build(mod.AclDescription, principal=a.principal, host=a.host,
                                    operation=_code(OPERATIONS, a.operation),
                                    permission_type=_code(PERMISSIONS, a.permission)) for a in acls])
        for (rt, name, pt), acls in by_resource.items()])


async def create_acls(h: "KafkaHandlers", header: codec.RequestHeader, req: Any, mod: Any) -> Any:
    outcomes: list[errors.GregorError | AclBinding] = []
    for c in req.creations:
        try:
            outcomes.append(az.binding_from_pb(az.binding_to_pb(_binding(c))))  # validated as kafka-acls.sh does
        except errors.GregorError as bad:
            outcomes.append(bad)
    valid = [o for o in outcomes if isinstance(o, AclBinding)]
    failed: errors.GregorError | None = None
    if valid:
        try:
            await h.admin("CreateAcls", controller_pb2.CreateAclsRequest(acls=[az.binding_to_pb(a) for a in valid]))
        except errors.GregorError as refused:
            failed = refused
    results = []
    for o in outcomes:
        err = o if isinstance(o, errors.GregorError) else failed
        results.append(codec.build(mod.AclCreationResult, error_code=int(err.code) if err else 0,
                                   error_message=err.message if err else None))
    return codec.build(mod.CreateAclsResponse, results=results)


async def delete_acls(h: "KafkaHandlers", header: codec.RequestHeader, req: Any, mod: Any) -> Any:
    out = []
    for f in req.filters:
        try:
            resp = await h.admin("DeleteAcls", controller_pb2.DeleteAclsRequest(filters=[az.filter_to_pb(_filter(f))]))
            deleted = [az.binding_from_pb(a) for a in resp.deleted]
        except errors.GregorError as err:
            out.append(codec.build(mod.DeleteAclsFilterResult, error_code=int(err.code), error_message=err.message,
                                   matching_acls=[]))
            continue
        out.append(codec.build(mod.DeleteAclsFilterResult, error_code=0, error_message=None, matching_acls=[
            codec.build(mod.DeleteAclsMatchingAcl, error_code=0, error_message=None, **_fields(a)) for a in deleted]))
    return codec.build(mod.DeleteAclsResponse, filter_results=out)
