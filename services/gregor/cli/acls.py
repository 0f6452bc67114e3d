"""`gregor acls add | list | remove`, shaped like Kafka's kafka-acls.sh (AclCommand).

    gregor acls add --allow-principal User:alice --operation Read --operation Describe --topic orders
    gregor acls add --allow-principal User:alice --producer --topic orders --transactional-id tx-
              --resource-pattern-type prefixed
    gregor acls add --allow-principal User:bob --consumer --topic orders --group billing
    gregor acls list [--topic orders] [--resource-pattern-type match] [--principal User:alice]
    gregor acls remove --allow-principal User:alice --operation Read --topic orders --force

The ACLs go through the Admin API (CreateAcls / DescribeAcls / DeleteAcls on the controller, reached
through any broker, so the caller needs Alter / Describe on the Cluster), or, with `--etcd`, straight into
etcd: the operator's bootstrap path, like kafka-acls.sh's `--authorizer-properties zookeeper.connect=...`
(whoever can write to etcd owns the cluster anyway).

Text output is kafka-acls.sh's: "Adding ACLs for resource `ResourcePattern(...)`:" then one
"(principal=..., host=..., operation=..., permissionType=...)" line per ACL, and "Current ACLs for
resource `ResourcePattern(...)`:" for each resource afterwards. `--output json`: one document
{"acls": [{principal, host, resource_type, resource_name, pattern_type, operation, permission}, ...]}.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Iterable, Optional

import click

from gregor.cli.common import emit_json, obj, run
from gregor.common import authz as az
from gregor.common.acl import (CLUSTER_NAME, AclBinding, Operation, PatternType, Permission, ResourceType)

PATTERN_TYPES = ("literal", "prefixed", "any", "match")
_UPPER_TYPE = {ResourceType.TOPIC: "TOPIC", ResourceType.GROUP: "GROUP", ResourceType.CLUSTER: "CLUSTER",
               ResourceType.TRANSACTIONAL_ID: "TRANSACTIONAL_ID"}


def resource_pattern(rtype: ResourceType, name: str, pattern: PatternType) -> str:
    """Kafka's ResourcePattern.toString."""
    return f"ResourcePattern(resourceType={_UPPER_TYPE[rtype]}, name={name}, patternType={pattern.name})"


def _resources(topics: Iterable[str], groups: Iterable[str], cluster: bool,
               txn_ids: Iterable[str]) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.TOPIC, t) for t in topics] + [(ResourceType.GROUP, g) for g in groups]
    if cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return out + [(ResourceType.TRANSACTIONAL_ID, t) for t in txn_ids]


def _operations(names: Iterable[str]) -> list[Operation]:
    try:
        return [az.enum_value(Operation, n, "operation") for n in names]
    except Exception as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1], param_hint="--operation") from None


def bindings_to_add(allow_principals: tuple[str, ...], deny_principals: tuple[str, ...],
                    allow_hosts: tuple[str, ...], deny_hosts: tuple[str, ...], operations: tuple[str, ...],
                    topics: tuple[str, ...], groups: tuple[str, ...], cluster: bool, txn_ids: tuple[str, ...],
                    pattern: str, producer: bool, consumer: bool, idempotent: bool) -> list[AclBinding]:
    """The ACLs an `add` (or exact `remove`) names, by kafka-acls.sh's rules."""
    if pattern in ("any", "match"):
        raise click.BadParameter(f"{pattern} is only valid with list and remove filters",
                                 param_hint="--resource-pattern-type")
    if not allow_principals and not deny_principals:
        raise click.UsageError("You must specify one of: --allow-principal, --deny-principal when trying to add ACLs.")
    ptype = PatternType.PREFIXED if pattern == "prefixed" else PatternType.LITERAL
    wanted: list[tuple[ResourceType, str, Operation]] = []
    if producer or consumer:
        if operations:
            raise click.UsageError("--operation cannot be used with --producer or --consumer")
        if not topics:
            raise click.UsageError("With --producer or --consumer you must specify a --topic")
        if consumer and not groups:
            raise click.UsageError("With --consumer you must specify a --group")
        if producer:
            wanted += [(ResourceType.TOPIC, t, op) for t in topics
                       for op in (Operation.WRITE, Operation.DESCRIBE, Operation.CREATE)]
            wanted += [(ResourceType.TRANSACTIONAL_ID, t, op) for t in txn_ids
                       for op in (Operation.WRITE, Operation.DESCRIBE)]
            if idempotent:
                wanted.append((ResourceType.CLUSTER, CLUSTER_NAME, Operation.IDEMPOTENT_WRITE))
        if consumer:
            wanted += [(ResourceType.TOPIC, t, op) for t in topics for op in (Operation.READ, Operation.DESCRIBE)]
            wanted += [(ResourceType.GROUP, g, Operation.READ) for g in groups]
    else:
        resources = _resources(topics, groups, cluster, txn_ids)
        if not resources:
            raise click.UsageError("You must provide at least one resource: --topic <topic> or --cluster or "
                                   "--group <group> or --transactional-id <id>")
        ops = _operations(operations) or [Operation.ALL]
        wanted = [(rtype, name, op) for rtype, name in resources for op in ops]
    out: list[AclBinding] = []
    for rtype, name, op in wanted:
        for principals, hosts, perm in ((allow_principals, allow_hosts, Permission.ALLOW),
                                        (deny_principals, deny_hosts, Permission.DENY)):
            for principal in principals:
                for host in hosts or ("*",):
                    rpattern = PatternType.LITERAL if rtype is ResourceType.CLUSTER else ptype
                    out.append(az.binding_from_fields(principal, host, rtype.value, name, rpattern.value,
                                                      op.value, perm.value))
    return list(dict.fromkeys(out))


class _Backend:
    """The Admin API through a broker, or etcd itself (--etcd)."""

    def __init__(self, ctx: click.Context, etcd: Optional[str], cluster_name: str) -> None:
        self.ctx, self.etcd_endpoints, self.cluster_name = ctx, etcd, cluster_name

    async def __aenter__(self) -> "_Backend":
        if self.etcd_endpoints:
            from gregor.common.etcd import EtcdClient

            self.etcd: Any = EtcdClient(self.etcd_endpoints, cluster=self.cluster_name)
        else:
            from gregor.client.admin import AdminClient

            self.admin = AdminClient({"bootstrap.servers": obj(self.ctx).bootstrap()})
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.etcd_endpoints:
            await self.etcd.close()
        else:
            await self.admin.close()

    async def create(self, acls: list[AclBinding]) -> None:
        if self.etcd_endpoints:
            await az.create_acls(self.etcd, acls)
        else:
            await self.admin.create_acls(acls)

    async def describe(self, f: az.AclFilter) -> list[AclBinding]:
        if self.etcd_endpoints:
            return await az.describe_acls(self.etcd, f)
        return list(await self.admin.describe_acls(f))

    async def delete(self, filters: list[az.AclFilter]) -> list[AclBinding]:
        if self.etcd_endpoints:
            return await az.delete_acls(self.etcd, filters)
        return list(await self.admin.delete_acls(filters))


def _by_resource(acls: Iterable[AclBinding]) -> dict[tuple[ResourceType, str, PatternType], list[AclBinding]]:
    out: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = defaultdict(list)
    for a in acls:
        out[(a.resource_type, a.resource_name, a.pattern_type)].append(a)
    return out


def _print_groups(title: str, acls: Iterable[AclBinding]) -> None:
    for (rtype, name, pattern), group in sorted(_by_resource(acls).items(), key=lambda kv: (kv[0][0].value,
                                                                                           kv[0][1], kv[0][2].value)):
        click.echo(f"{title} for resource `{resource_pattern(rtype, name, pattern)}`: ")
        for a in group:
            click.echo(f" \t{a.describe()} ")
        click.echo("")


def _as_json(acls: Iterable[AclBinding]) -> dict[str, Any]:
    return {"acls": [json.loads(a.to_json()) for a in acls]}


def _filters(topics: tuple[str, ...], groups: tuple[str, ...], cluster: bool, txn_ids: tuple[str, ...],
             pattern: str, principal: Optional[str] = None) -> list[az.AclFilter]:
    resources = _resources(topics, groups, cluster, txn_ids)
    if not resources:
        return [az.AclFilter(principal=principal)]
    ptype = pattern.capitalize()
    return [az.AclFilter(principal=principal, resource_type=rtype, resource_name=name,
                         pattern_type="Literal" if rtype is ResourceType.CLUSTER and ptype == "Prefixed" else ptype)
            for rtype, name in resources]


def _common(fn: Any) -> Any:
    options = [
        click.option("--etcd", metavar="URL[,URL...]", help="write etcd directly (the operator's bootstrap, "
                     "like kafka-acls.sh --authorizer-properties); default: the Admin API via --bootstrap"),
        click.option("--etcd-cluster", "etcd_cluster", default="gregor", show_default=True,
                     help="with --etcd: the cluster name (keys under /gregor/<cluster>/)"),
        click.option("--topic", multiple=True, help="topic resource (repeatable)"),
        click.option("--group", multiple=True, help="consumer group resource (repeatable)"),
        click.option("--cluster", is_flag=True, help="the cluster resource"),
        click.option("--transactional-id", "txn_ids", multiple=True, help="transactional id resource (repeatable)"),
        click.option("--resource-pattern-type", "pattern", type=click.Choice(PATTERN_TYPES, case_sensitive=False),
                     default="literal", show_default=True,
                     help="literal or prefixed for add; any or match too for list and remove"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _principal_options(fn: Any) -> Any:
    options = [
        click.option("--allow-principal", "allow_principals", multiple=True, metavar="TYPE:NAME",
                     help="principal of Allow ACLs, e.g. User:alice (repeatable)"),
        click.option("--deny-principal", "deny_principals", multiple=True, metavar="TYPE:NAME",
                     help="principal of Deny ACLs (repeatable)"),
        click.option("--allow-host", "allow_hosts", multiple=True, help="host of the Allow ACLs (default *)"),
        click.option("--deny-host", "deny_hosts", multiple=True, help="host of the Deny ACLs (default *)"),
        click.option("--operation", "operations", multiple=True,
                     help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
                          "AlterConfigs, IdempotentWrite or All (repeatable; default All)"),
        click.option("--producer", is_flag=True, help="Write, Describe, Create on the topics (and Write, Describe "
                                                      "on the transactional ids)"),
        click.option("--consumer", is_flag=True, help="Read, Describe on the topics and Read on the groups"),
        click.option("--idempotent", is_flag=True, help="with --producer: IdempotentWrite on the cluster"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.group("acls")
def acls_group() -> None:
    """Kafka's ACLs (kafka-acls.sh): who may do what on which topic, group, transactional id or cluster."""


@acls_group.command("add")
@_common
@_principal_options
@click.pass_context
def add(ctx: click.Context, etcd: Optional[str], etcd_cluster: str, topic: tuple[str, ...], group: tuple[str, ...],
        cluster: bool, txn_ids: tuple[str, ...], pattern: str, allow_principals: tuple[str, ...],
        deny_principals: tuple[str, ...], allow_hosts: tuple[str, ...], deny_hosts: tuple[str, ...],
        operations: tuple[str, ...], producer: bool, consumer: bool, idempotent: bool) -> None:
    """Add ACLs (--add)."""
    acls = bindings_to_add(allow_principals, deny_principals, allow_hosts, deny_hosts, operations, topic, group,
                           cluster, txn_ids, pattern.lower(), producer, consumer, idempotent)

    async def go() -> list[AclBinding]:
        async with _Backend(ctx, etcd, etcd_cluster) as backend:
            await backend.create(acls)
            current: list[AclBinding] = []
            for key in _by_resource(acls):
                current += await backend.describe(az.AclFilter(resource_type=key[0], resource_name=key[1],
                                                               pattern_type=key[2].value))
            return current

    current = run(go())
    if obj(ctx).json:
        emit_json(_as_json(current))
        return
    _print_groups("Adding ACLs", acls)
    _print_groups("Current ACLs", current)


@acls_group.command("list")
@_common
@click.option("--principal", help="only the ACLs of this principal")
@click.pass_context
def list_(ctx: click.Context, etcd: Optional[str], etcd_cluster: str, topic: tuple[str, ...], group: tuple[str, ...],
          cluster: bool, txn_ids: tuple[str, ...], pattern: str, principal: Optional[str]) -> None:
    """List ACLs (--list): every ACL, or those of the resources given."""
    filters = _filters(topic, group, cluster, txn_ids, pattern.lower(), principal)

    async def go() -> list[AclBinding]:
        async with _Backend(ctx, etcd, etcd_cluster) as backend:
            found: list[AclBinding] = []
            for f in filters:
                found += [a for a in await backend.describe(f) if a not in found]
            return found

    found = run(go())
    if obj(ctx).json:
        emit_json(_as_json(found))
    else:
        _print_groups("Current ACLs", found)


@acls_group.command("remove")
@_common
@_principal_options
@click.option("--force", is_flag=True, help="do not ask for confirmation")
@click.pass_context
def remove(ctx: click.Context, etcd: Optional[str], etcd_cluster: str, topic: tuple[str, ...], group: tuple[str, ...],
           cluster: bool, txn_ids: tuple[str, ...], pattern: str, allow_principals: tuple[str, ...],
           deny_principals: tuple[str, ...], allow_hosts: tuple[str, ...], deny_hosts: tuple[str, ...],
           operations: tuple[str, ...], producer: bool, consumer: bool, idempotent: bool, force: bool) -> None:
    """Remove ACLs (--remove): the ACLs named, or with no principal every ACL of the resources given."""
    if not _resources(topic, group, cluster, txn_ids):
        raise click.UsageError("You must provide at least one resource: --topic <topic> or --cluster or "
                               "--group <group> or --transactional-id <id>")
    if allow_principals or deny_principals:
        if pattern.lower() in ("any", "match"):
            raise click.BadParameter("with a principal, remove names exact ACLs: literal or prefixed",
                                     param_hint="--resource-pattern-type")
        exact = bindings_to_add(allow_principals, deny_principals, allow_hosts, deny_hosts, operations, topic, group,
                                cluster, txn_ids, pattern.lower(), producer, consumer, idempotent)
        filters = [az.AclFilter(a.principal, a.host, a.resource_type, a.resource_name, a.pattern_type.value,
                                a.operation, a.permission) for a in exact]
        what = "ACLs: \n" + "\n".join(f" \t{a.describe()} " for a in exact)
    else:
        filters = _filters(topic, group, cluster, txn_ids, pattern.lower())
        what = "all ACLs"
    if not force and not obj(ctx).json:
        click.confirm(f"Are you sure you want to remove {what} from the resources "
                      f"{', '.join(f.resource_name or '' for f in filters)}?", abort=True)

    async def go() -> tuple[list[AclBinding], list[AclBinding]]:
        async with _Backend(ctx, etcd, etcd_cluster) as backend:
            deleted = await backend.delete(filters)
            current: list[AclBinding] = []
            for f in _filters(topic, group, cluster, txn_ids, "literal" if pattern.lower() == "any"
                              else pattern.lower()):
                current += [a for a in await backend.describe(f) if a not in current]
            return deleted, current

    deleted, current = run(go())
    if obj(ctx).json:
        emit_json({"deleted": _as_json(deleted)["acls"], **_as_json(current)})
        return
    _print_groups("Current ACLs", current)
