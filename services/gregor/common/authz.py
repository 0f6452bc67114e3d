"""The authorizer as every service runs it: its config, the etcd-backed ACL cache, and the checks.

- `AuthorizerConfig`: Kafka's keys `authorizer.class.name` (any non-empty value turns the authorizer on),
  `super.users` (`User:a;User:b`), `allow.everyone.if.no.acl.found` (false by default).
- `AclCache`: every ACL under etcd's `acls/` (etcd_layout.AclZNode), read once and then followed with a
  watch, so a change reaches every broker, controller and coordinator within a watch round trip. Each
  change swaps in a new immutable `acl.Authorizer` snapshot (and empties the decision memo).
- `Authz.check` / `Authz.require`: one decision (memoized per snapshot: a dict lookup on the produce and
  fetch paths), a denial counted in `gregor_authorizer_denials_total{resource_type,operation}` and written
  to the `gregor.audit` logger as one JSON object per line (Kafka's kafka.authorizer.logger: denials at
  INFO, allowed requests at DEBUG).
- `caller_of(context)`: the principal and host of a gRPC call. The principal is `User:` + the client
  certificate's subject mapped by `ssl.principal.mapping.rules` when the connection is mTLS
  (`gregor.common.tls.peer_subject`), else `User:ANONYMOUS`, as on Kafka's PLAINTEXT listener. A call
  forwarded by a broker (AdminService, KIP-590's envelope) names its client in the
  `gregor-forwarded-principal` metadata, honoured only from a caller allowed ClusterAction on the Cluster.

Until the first read of the ACLs completes only super users are allowed (fail closed).
Concurrency: event-loop owned; decisions are synchronous reads of the current snapshot.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from prometheus_client import Counter

from gregor.common import errors
from gregor.common.acl import CLUSTER_NAME, AclBinding, Authorizer, Operation, ResourceType
from gregor.common.aio import wait_for
from gregor.common.principal import DEFAULT_RULES, PrincipalMappingError, parse_rules, principal_for

log = logging.getLogger(__name__)
AUDIT = logging.getLogger("gregor.audit")

DENIALS = Counter("gregor_authorizer_denials_total",
                  "Requests the authorizer refused, by resource type and operation (issue 23)",
                  ["resource_type", "operation"])

ANONYMOUS = "User:ANONYMOUS"
FORWARDED_PRINCIPAL_HEADER = "gregor-forwarded-principal"
FORWARDED_HOST_HEADER = "gregor-forwarded-host"
RETRY_S = 0.5  # after a failed etcd read of the ACLs
MEMO_MAX = 65536  # decisions kept per snapshot before the memo is emptied

_FAILED = {
    ResourceType.TOPIC: errors.Code.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: errors.Code.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: errors.Code.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: errors.Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def failed_code(resource_type: ResourceType) -> int:
    """Kafka's *_AUTHORIZATION_FAILED code for a denial on this resource type."""
    return _FAILED[resource_type]


def parse_super_users(text: str) -> frozenset[str]:
    """`super.users`: principals separated by ';' (Kafka's separator: a DN may hold commas)."""
    users = [u.strip() for u in text.split(";") if u.strip()]
    for u in users:
        if ":" not in u or not u.split(":", 1)[1]:
            raise errors.error_for(errors.Code.INVALID_CONFIG,
                                   f"Invalid value {text!r} for configuration super.users: "
                                   f"{u!r} is not TYPE:NAME (e.g. User:admin)")
    return frozenset(users)


@dataclass(frozen=True)
class AuthorizerConfig:
    class_name: str = ""
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False
    principal_mapping_rules: str = DEFAULT_RULES

    @property
    def enabled(self) -> bool:
        return bool(self.class_name.strip())

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "AuthorizerConfig":
        """From Kafka's dotted keys (other keys are ignored); bad values raise InvalidConfigError."""
        allow = str(props.get("allow.everyone.if.no.acl.found", "false")).strip().lower()
        if allow not in ("true", "false"):
            raise errors.error_for(errors.Code.INVALID_CONFIG,
                                   f"Invalid value {allow!r} for configuration allow.everyone.if.no.acl.found: "
                                   f"expected true or false")
        rules = str(props.get("ssl.principal.mapping.rules", DEFAULT_RULES))
        try:
            parse_rules(rules)
        except PrincipalMappingError as exc:
            raise errors.error_for(errors.Code.INVALID_CONFIG, str(exc)) from None
        return cls(str(props.get("authorizer.class.name", "")).strip(),
                   parse_super_users(str(props.get("super.users", ""))), allow == "true", rules)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the principal and the client's IP address (ACL hosts are IPs, '*' for any)."""

    principal: str = ANONYMOUS
    host: str = "*"


def peer_host(peer: str) -> str:
    """gRPC's 'ipv4:127.0.0.1:5555' / 'ipv6:[::1]:5555' -> the IP address ('' when not an IP peer)."""
    kind, _, rest = (peer or "").partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return ""


def user_name(conn: Any, rules: str = DEFAULT_RULES) -> str:
    """The user name of a gRPC call's or a connection's principal, without `User:` (client quotas key on it):
    the certificate subject mapped by the rules, `ANONYMOUS` on plain text or when no rule maps it."""
    try:
        principal = principal_from_subject(_peer_subject(conn), rules)
    except PrincipalMappingError:
        principal = ANONYMOUS
    return principal.split(":", 1)[1]


def _peer_subject(conn: Any) -> str | None:
    """The client certificate's subject on an mTLS connection (None on plain text or before TLS exists)."""
    try:
        from gregor.common import tls  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return None
    subject = tls.peer_subject(conn)
    return str(subject) if subject else None


def principal_from_subject(subject: str | None, rules: str = DEFAULT_RULES) -> str:
    """`User:<mapped subject>`, or `User:ANONYMOUS` without a certificate (Kafka's PLAINTEXT principal)."""
    if not subject:
        return ANONYMOUS
    return _mapped(subject, rules)


@functools.lru_cache(maxsize=4096)
def _mapped(subject: str, rules: str) -> str:
    """The rules applied to a subject, once per (subject, rules): a request never re-parses them."""
    return principal_for(subject, parse_rules(rules))


def cli_principal() -> str:
    """The principal the gregor CLI connects as: its client certificate's once TLS is wired (issue 23),
    `User:ANONYMOUS` on plain text."""
    return ANONYMOUS


class AclCache:
    """Every ACL in etcd, followed by a watch; `authorizer` is the current immutable snapshot."""

    def __init__(self, etcd: Any, config: AuthorizerConfig) -> None:
        self.etcd = etcd
        self.config = config
        self.acls: dict[bytes, AclBinding] = {}
        self.authorizer = Authorizer((), config.super_users, config.allow_everyone_if_no_acl_found)
        self.revision = 0  # etcd revision of the last change applied
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.on_change: list[Any] = []  # callables run after each new snapshot (Authz empties its memo)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow(), name="acl-cache")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _swap(self, revision: int) -> None:
        self.authorizer = Authorizer(self.acls.values(), self.config.super_users,
                                     self.config.allow_everyone_if_no_acl_found)
        self.revision = revision
        for fn in self.on_change:
            fn()

    def _apply(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.acls.pop(key, None)
            return
        from gregor.common.etcd_layout import AclZNode

        try:
            self.acls[key] = AclZNode.decode(value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("authorizer: ignoring malformed ACL %r: %s", key, exc)

    async def _follow(self) -> None:
        from gregor.common.etcd import follow_prefix
        from gregor.common.etcd_layout import AclZNode

        loading = True  # while the snapshot is applied, one swap at its end; then one per watched change

        def reset() -> None:
            nonlocal loading
            loading, self.acls = True, {}

        def apply(key: bytes, value: bytes | None, revision: int) -> None:
            self._apply(key, value)
            if not loading:
                self._swap(revision)

        def loaded(revision: int) -> None:
            nonlocal loading
            loading = False
            self._swap(revision)
            self.synced.set()

        await follow_prefix(self.etcd, AclZNode.prefix(self.etcd), reset=reset, apply=apply, loaded=loaded,
                            what="authorizer (ACLs)", retry_s=RETRY_S)


@dataclass
class Authz:
    """A service's authorizer: off (every check passes, nothing is looked up) or on over an AclCache."""

    config: AuthorizerConfig = field(default_factory=AuthorizerConfig)
    cache: AclCache | None = None
    _memo: dict[tuple[str, str, Operation, ResourceType, str], bool] = field(default_factory=dict)

    @classmethod
    def create(cls, config: AuthorizerConfig, etcd: Any | None) -> "Authz":
        """The authorizer of a service; on without etcd (a standalone broker) it has no ACLs to follow."""
        if not config.enabled:
            return cls(config)
        if etcd is None:
            raise errors.error_for(errors.Code.INVALID_CONFIG,
                                   "authorizer.class.name needs a cluster: the ACLs live in etcd (pass --etcd)")
        authz = cls(config, AclCache(etcd, config))
        authz.cache.on_change.append(authz._memo.clear)  # type: ignore[union-attr]
        return authz

    @property
    def enabled(self) -> bool:
        return self.cache is not None

    def start(self) -> None:
        if self.cache is not None:
            self.cache.start()

    async def wait_synced(self, timeout_s: float) -> bool:
        if self.cache is None:
            return True
        try:
            await wait_for(self.cache.synced.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        if self.cache is not None:
            await self.cache.stop()

    # -- callers ----------------------------------------------------------------

    def caller_of(self, context: Any) -> Caller:
        """The principal and host of a gRPC call (see the module doc for forwarded calls)."""
        if self.cache is None:
            return Caller()
        caller = self._peer_caller(context)
        forwarded = _metadata(context, FORWARDED_PRINCIPAL_HEADER)
        if forwarded and self.check(caller, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME,
                                    "ForwardedRequest"):
            return Caller(forwarded, _metadata(context, FORWARDED_HOST_HEADER) or "*")
        return caller

    def _peer_caller(self, context: Any) -> Caller:
        host = peer_host(context.peer())
        try:
            principal = principal_from_subject(_peer_subject(context), self.config.principal_mapping_rules)
        except PrincipalMappingError as exc:
            raise errors.error_for(errors.Code.CLUSTER_AUTHORIZATION_FAILED, str(exc)) from None
        return Caller(principal, host or "*")

    def peer_may_cluster_action(self, context: Any) -> bool:
        """Whether the gRPC call's own peer (not a principal it forwards) may ClusterAction on the Cluster: a
        broker or coordinator calling for itself or relaying (True with the authorizer off)."""
        if self.cache is None:
            return True
        try:
            caller = self._peer_caller(context)
        except errors.GregorError:
            return False
        return self.check(caller, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME, "Relayed",
                          audit=False)

    # -- decisions --------------------------------------------------------------

    def check(self, caller: Caller, operation: Operation, resource_type: ResourceType, name: str,
              api: str = "", audit: bool = True) -> bool:
        """Kafka's decision for one action; a denial is counted and audited (unless audit=False, used
        where Kafka filters silently, e.g. Metadata's topic list)."""
        cache = self.cache
        if cache is None:
            return True
        key = (caller.principal, caller.host, operation, resource_type, name)
        allowed = self._memo.get(key)
        if allowed is None:
            allowed = (cache.synced.is_set() or caller.principal in self.config.super_users) and \
                cache.authorizer.authorize(caller.principal, caller.host, operation, resource_type, name)
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            if cache.synced.is_set():
                self._memo[key] = allowed
        if audit:
            _audit(caller, operation, resource_type, name, api, allowed)
        return allowed

    def require(self, caller: Caller, operation: Operation, resource_type: ResourceType, name: str,
                api: str = "", topic: str = "") -> None:
        """check(), raising Kafka's *_AUTHORIZATION_FAILED for the resource type when denied."""
        if not self.check(caller, operation, resource_type, name, api):
            raise denial(caller, operation, resource_type, name, topic=topic)

    def require_cluster(self, caller: Caller, operation: Operation, api: str = "") -> None:
        self.require(caller, operation, ResourceType.CLUSTER, CLUSTER_NAME, api)

    def can_write_idempotently(self, caller: Caller, topics: list[str], api: str = "") -> bool:
        """Kafka 3.x (KIP-679): an idempotent producer needs IdempotentWrite on the Cluster or Write on
        any topic (checked without auditing the topics one by one)."""
        if self.check(caller, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME, api, audit=False):
            return True
        return any(self.check(caller, Operation.WRITE, ResourceType.TOPIC, t, api, audit=False) for t in topics)


def denial(caller: Caller, operation: Operation, resource_type: ResourceType, name: str,
           topic: str = "") -> errors.GregorError:
    where = {"topic": topic} if topic else {}
    return errors.error_for(failed_code(resource_type),
                            f"{caller.principal} is not authorized to {operation.value} "
                            f"{resource_type.value} {name!r}", **where)


def _metadata(context: Any, name: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == name:
            return str(v)
    return ""


def _audit(caller: Caller, operation: Operation, resource_type: ResourceType, name: str, api: str,
           allowed: bool) -> None:
    if allowed:
        if not AUDIT.isEnabledFor(logging.DEBUG):
            return
    else:
        DENIALS.labels(resource_type=resource_type.value, operation=operation.value).inc()
        if not AUDIT.isEnabledFor(logging.INFO):
            return
    AUDIT.log(logging.DEBUG if allowed else logging.INFO, "%s", json.dumps({
        "ts_ms": int(time.time() * 1000), "principal": caller.principal, "host": caller.host,
        "operation": operation.value, "resource_type": resource_type.value, "resource_name": name,
        "api": api, "decision": "Allowed" if allowed else "Denied"}, separators=(",", ":")))


# -- per-API helpers (shared by the gRPC servicers and the Kafka listener) ---------

def produce_denials(authz: Authz, caller: Caller, transactional_id: str, topics: list[str],
                    api: str = "Produce") -> dict[str, errors.GregorError]:
    """Kafka's Produce checks: Write on the TransactionalId of a transactional request (else the whole
    request fails TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then Write on each topic; the topics denied."""
    if not authz.enabled:
        return {}
    if transactional_id:
        authz.require(caller, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id, api)
    return {t: denial(caller, Operation.WRITE, ResourceType.TOPIC, t, topic=t)
            for t in dict.fromkeys(topics) if not authz.check(caller, Operation.WRITE, ResourceType.TOPIC, t, api)}


def with_denials(parts: list[tuple[str, int, bytes]], denied: Mapping[str, errors.GregorError],
                 start: Any) -> list[Any]:
    """start(allowed parts) for the partitions of authorized topics, the denials in request order for the rest
    (Kafka answers per partition: one unauthorized topic never fails the others)."""
    if not denied:
        return list(start(parts))
    allowed = [p for p in parts if p[0] not in denied]
    results = iter(start(allowed) if allowed else ())
    return [errors.error_for(denied[t].code, denied[t].message, topic=t, partition=n) if t in denied
            else next(results) for t, n, _ in parts]


# -- configuration from a service's properties (settle()'s key table) -------------

SETTLE_KEYS: dict[str, tuple[str, Any, Any]] = {
    "authorizer.class.name": ("authorizer_class_name", str, ""),
    "super.users": ("super_users", str, ""),
    "allow.everyone.if.no.acl.found": ("allow_everyone_if_no_acl_found", str, "false"),
    "ssl.principal.mapping.rules": ("ssl_principal_mapping_rules", str, DEFAULT_RULES),
}


def config_from_namespace(ns: Any) -> AuthorizerConfig:
    """The AuthorizerConfig of an argparse namespace filled by properties.settle(ns, props, SETTLE_KEYS, ...)."""
    return AuthorizerConfig.from_properties({key: getattr(ns, dest) for key, (dest, _, _) in SETTLE_KEYS.items()})


# -- the Admin API's ACL calls (CreateAcls / DescribeAcls / DeleteAcls) over etcd ---------

ANY = "Any"
MATCH = "Match"


@dataclass(frozen=True)
class AclFilter:
    """Kafka's AclBindingFilter: None matches any value; pattern_type also takes Any and Match."""

    principal: str | None = None
    host: str | None = None
    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern_type: str = ANY  # "Literal" | "Prefixed" | "Any" | "Match"
    operation: Operation | None = None
    permission: Any = None  # acl.Permission | None

    def matches(self, acl: AclBinding) -> bool:
        from gregor.common.acl import PatternType

        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.resource_type is not None and acl.resource_type is not self.resource_type:
            return False
        if self.operation is not None and acl.operation is not self.operation:
            return False
        if self.permission is not None and acl.permission is not self.permission:
            return False
        if self.pattern_type == MATCH:  # every ACL that applies to resource_name
            return self.resource_name is None or acl.matches_resource(acl.resource_type, self.resource_name)
        if self.pattern_type != ANY and acl.pattern_type is not PatternType(self.pattern_type):
            return False
        return self.resource_name is None or acl.resource_name == self.resource_name


def enum_value(kind: Any, text: str, what: str) -> Any:
    """An enum member from Kafka's spelling, case-insensitive, '-' and '_' ignored (kafka-acls.sh takes
    `--operation Read`, `read`, `IdempotentWrite`, `idempotent-write`)."""
    want = text.replace("-", "").replace("_", "").lower()
    for member in kind:
        if member.value.lower() == want or member.name.replace("_", "").lower() == want:
            return member
    raise errors.error_for(errors.Code.INVALID_REQUEST,
                           f"unknown {what} {text!r}: one of {', '.join(m.value for m in kind)}")


def binding_from_fields(principal: str, host: str, resource_type: str, resource_name: str, pattern_type: str,
                        operation: str, permission: str) -> AclBinding:
    from gregor.common.acl import AclError, PatternType, Permission

    try:
        return AclBinding(principal, host or "*", enum_value(ResourceType, resource_type, "resource type"),
                          resource_name, enum_value(PatternType, pattern_type or "Literal", "pattern type"),
                          enum_value(Operation, operation, "operation"),
                          enum_value(Permission, permission, "permission type")).validate()
    except AclError as exc:
        raise errors.error_for(errors.Code.INVALID_REQUEST, str(exc)) from None


def binding_from_pb(pb: Any) -> AclBinding:
    return binding_from_fields(pb.principal, pb.host, pb.resource_type, pb.resource_name, pb.pattern_type,
                               pb.operation, pb.permission)


def binding_to_pb(acl: AclBinding) -> Any:
    from gregor.rpc.v1 import controller_pb2

    return controller_pb2.AclBinding(principal=acl.principal, host=acl.host, resource_type=acl.resource_type.value,
                                     resource_name=acl.resource_name, pattern_type=acl.pattern_type.value,
                                     operation=acl.operation.value, permission=acl.permission.value)


def filter_from_pb(pb: Any) -> AclFilter:
    from gregor.common.acl import Permission

    pattern = pb.pattern_type or ANY
    if pattern.lower() in ("any", "match"):
        pattern = pattern.capitalize()
    else:
        from gregor.common.acl import PatternType

        pattern = enum_value(PatternType, pattern, "pattern type").value
    return AclFilter(pb.principal or None, pb.host or None,
                     enum_value(ResourceType, pb.resource_type, "resource type") if pb.resource_type else None,
                     pb.resource_name or None, pattern,
                     enum_value(Operation, pb.operation, "operation") if pb.operation else None,
                     enum_value(Permission, pb.permission, "permission type") if pb.permission else None)


def filter_to_pb(f: AclFilter) -> Any:
    from gregor.rpc.v1 import controller_pb2

    return controller_pb2.AclFilter(
        principal=f.principal or "", host=f.host or "", resource_type=f.resource_type.value if f.resource_type else "",
        resource_name=f.resource_name or "", pattern_type=f.pattern_type,
        operation=f.operation.value if f.operation else "", permission=f.permission.value if f.permission else "")


async def stored_acls(etcd: Any) -> dict[bytes, AclBinding]:
    """Every ACL in etcd by key (malformed values are skipped with a warning)."""
    from gregor.common.etcd_layout import AclZNode

    out: dict[bytes, AclBinding] = {}
    for kv in (await etcd.get_prefix(AclZNode.prefix(etcd))).kvs:
        try:
            out[kv.key] = AclZNode.decode(kv.value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring malformed ACL %r: %s", kv.key, exc)
    return out


async def create_acls(etcd: Any, acls: list[AclBinding]) -> None:
    """Store each ACL (idempotent: the same binding is the same key)."""
    from gregor.common.etcd_layout import AclZNode

    for acl in acls:
        await etcd.put(AclZNode.key(etcd, acl.validate()), AclZNode.encode(acl))


async def describe_acls(etcd: Any, f: AclFilter) -> list[AclBinding]:
    return sorted((a for a in (await stored_acls(etcd)).values() if f.matches(a)), key=_acl_order)


async def delete_acls(etcd: Any, filters: list[AclFilter]) -> list[AclBinding]:
    """Delete every ACL any filter matches; the ACLs deleted."""
    deleted = []
    for key, acl in (await stored_acls(etcd)).items():
        if any(f.matches(acl) for f in filters):
            await etcd.delete(key)
            deleted.append(acl)
    return sorted(deleted, key=_acl_order)


def _acl_order(a: AclBinding) -> tuple[str, ...]:
    return (a.resource_type.value, a.pattern_type.value, a.resource_name, a.principal, a.host,
            a.operation.value, a.permission.value)


# -- the Kafka listener's connection principal ------------------------------------

_CONNECTION_CALLER: "contextvars.ContextVar[Caller]" = contextvars.ContextVar("gregor_kafka_caller", default=Caller())


def transport_caller(authz: Authz, transport: Any, peername: Any) -> Caller:
    """The caller of a raw connection (Kafka listener, data port): its certificate's mapped principal or
    User:ANONYMOUS, and its IP address. PrincipalMappingError when no rule maps its subject."""
    principal = principal_from_subject(_peer_subject(transport), authz.config.principal_mapping_rules)
    host = peername[0] if isinstance(peername, tuple) and peername else "*"
    return Caller(principal, str(host))


def set_connection_caller(authz: Authz, transport: Any, peername: Any) -> bool:
    """Set the caller of the current Kafka connection (its own task: every request handled in it sees it);
    False when its certificate subject maps to no principal (Kafka closes such a connection)."""
    if not authz.enabled:
        return True
    try:
        caller = transport_caller(authz, transport, peername)
    except PrincipalMappingError as exc:
        log.warning("kafka: refusing %s: %s", peername, exc)
        return False
    _CONNECTION_CALLER.set(caller)
    return True


def connection_caller() -> Caller:
    """The principal and host of the Kafka connection whose request is being handled."""
    return _CONNECTION_CALLER.get()


def forwarded_metadata(authz: Authz, caller: Caller) -> tuple[tuple[str, str], ...] | None:
    """gRPC metadata that names caller to a controller or coordinator we relay its request to."""
    if not authz.enabled:
        return None
    return ((FORWARDED_PRINCIPAL_HEADER, caller.principal), (FORWARDED_HOST_HEADER, caller.host))
