"""Kafka's ACL model and its authorizer decision (pure logic; the etcd store and watches live elsewhere).

An ACL binding is (principal, host, operation, permission) on a resource pattern (resource type,
name, LITERAL or PREFIXED). `Authorizer.authorize` decides as Kafka's StandardAuthorizer /
AclAuthorizer does:

1. a super user (`super.users`) is allowed everything;
2. the ACLs that match the resource are the LITERAL ones with its name, the LITERAL wildcard `*`,
   and the PREFIXED ones whose name starts the resource's name;
3. with none of them, `allow.everyone.if.no.acl.found` decides (false when the authorizer is on);
4. a matching DENY (principal or `User:*`, host or `*`, operation or ALL) wins over every ALLOW;
5. otherwise a matching ALLOW is needed, where DESCRIBE is implied by READ, WRITE, DELETE and ALTER,
   and DESCRIBE_CONFIGS by ALTER_CONFIGS.

Concurrency: none (immutable snapshots; a new Authorizer is built when the ACL set changes).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Iterable, Mapping

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(enum.Enum):
    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"
    TRANSACTIONAL_ID = "TransactionalId"


class PatternType(enum.Enum):
    LITERAL = "Literal"
    PREFIXED = "Prefixed"


class Operation(enum.Enum):
    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"


class Permission(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


CLUSTER_NAME = "kafka-cluster"  # the one Cluster resource's name, as in Kafka

# The operations each resource type takes (kafka-acls.sh refuses the others).
VALID_OPERATIONS: Mapping[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({Operation.ALL, Operation.READ, Operation.WRITE, Operation.CREATE,
                                   Operation.DELETE, Operation.ALTER, Operation.DESCRIBE,
                                   Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({Operation.ALL, Operation.READ, Operation.DELETE, Operation.DESCRIBE}),
    ResourceType.CLUSTER: frozenset({Operation.ALL, Operation.CREATE, Operation.ALTER, Operation.DESCRIBE,
                                     Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                                     Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.ALL, Operation.DESCRIBE, Operation.WRITE}),
}

# An ALLOW of any of these grants the key operation too (Kafka's implied operations).
_IMPLIED_BY: Mapping[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                                   Operation.ALTER}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}


class AclError(ValueError):
    """An ACL that Kafka would refuse (bad principal, an operation the resource does not take, ...)."""


@dataclass(frozen=True)
class AclBinding:
    principal: str  # "User:CN=billing" or "User:*"
    host: str  # "*" or an IP address
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: Operation
    permission: Permission

    def validate(self) -> "AclBinding":
        if ":" not in self.principal or not self.principal.split(":", 1)[1]:
            raise AclError(f"principal {self.principal!r} must be TYPE:NAME, e.g. User:CN=billing")
        if not self.resource_name:
            raise AclError("resource name must not be empty")
        if self.operation not in VALID_OPERATIONS[self.resource_type]:
            raise AclError(f"operation {self.operation.value} is not valid for resource type "
                           f"{self.resource_type.value}")
        if self.resource_type is ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise AclError(f"the cluster resource is named {CLUSTER_NAME!r}")
        if self.pattern_type is PatternType.PREFIXED and self.resource_name == WILDCARD:
            raise AclError("a PREFIXED pattern cannot be the wildcard '*'")
        return self

    def to_json(self) -> str:
        return json.dumps({"principal": self.principal, "host": self.host,
                           "resource_type": self.resource_type.value, "resource_name": self.resource_name,
                           "pattern_type": self.pattern_type.value, "operation": self.operation.value,
                           "permission": self.permission.value}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "AclBinding":
        d = json.loads(text)
        return cls(d["principal"], d["host"], ResourceType(d["resource_type"]), d["resource_name"],
                   PatternType(d["pattern_type"]), Operation(d["operation"]), Permission(d["permission"]))

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type is not resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name == name or self.resource_name == WILDCARD

    def describe(self) -> str:
        """One line as kafka-acls.sh --list prints an ACL."""
        return (f"(principal={self.principal}, host={self.host}, operation={self.operation.name}, "
                f"permissionType={self.permission.name})")


class Authorizer:
    """One snapshot of the ACLs and the authorizer's settings; authorize() is Kafka's decision."""

    def __init__(self, acls: Iterable[AclBinding], super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.acls = tuple(acls)
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        for acl in self.acls:
            self._by_type.setdefault(acl.resource_type, []).append(acl)

    def matching(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        return [a for a in self._by_type.get(resource_type, ()) if a.matches_resource(resource_type, name)]

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        acls = self.matching(resource_type, name)
        if not acls:
            return self.allow_everyone_if_no_acl_found
        mine = [a for a in acls if a.principal in (principal, WILDCARD_PRINCIPAL) and a.host in (host, WILDCARD)]
        if any(a.permission is Permission.DENY and a.operation in (operation, Operation.ALL) for a in mine):
            return False
        granting = _IMPLIED_BY.get(operation, frozenset({operation}))
        return any(a.permission is Permission.ALLOW and (a.operation in granting or a.operation is Operation.ALL)
                   for a in mine)


def filter_acls(acls: Iterable[AclBinding], principal: str | None = None,
                resource_type: ResourceType | None = None, resource_name: str | None = None,
                pattern_type: PatternType | None = None) -> list[AclBinding]:
    """kafka-acls.sh --list / --remove filters: each given field must equal the ACL's (None matches all)."""
    return [a for a in acls
            if (principal is None or a.principal == principal)
            and (resource_type is None or a.resource_type is resource_type)
            and (resource_name is None or a.resource_name == resource_name)
            and (pattern_type is None or a.pattern_type is pattern_type)]
