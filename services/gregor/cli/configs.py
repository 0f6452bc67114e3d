"""`gregor configs --alter|--describe`, shaped like kafka-configs.sh: client quotas for users and client ids,
topic configs (the same AlterConfigs / DescribeConfigs `gregor topics alter` uses) and dynamic broker configs
(KIP-226: per broker with --entity-name ID, cluster-wide with --entity-default; --describe --all lists every
config of a broker with its source).

    gregor configs --alter --entity-type clients --entity-name c1 --add-config producer_byte_rate=1024
    gregor configs --alter --entity-type users --entity-default --add-config consumer_byte_rate=2048
    gregor configs --alter --user alice --client c1 --add-config request_percentage=50
    gregor configs --describe --entity-type users --entity-name alice
    gregor configs --alter --entity-type users --entity-name alice --delete-config producer_byte_rate
    gregor configs --alter --entity-type brokers --entity-default --add-config log.retention.ms=3600000
    gregor configs --describe --entity-type brokers --entity-name 0 --all

Writes go through the AdminService (any broker forwards them to the active controller, which stores
them in etcd; every broker watches those keys), as Kafka 2.6+'s tool uses AlterClientQuotas rather
than writing ZooKeeper: the CLI needs only `--bootstrap`, and the controller is the one writer.
"""

from __future__ import annotations

from typing import Any, Optional

import click

from gregor.cli.common import emit_json, obj, run
from gregor.client.admin import AdminClient
from gregor.common import broker_configs as bc
from gregor.common.quotas import DEFAULT

ENTITY_TYPES = ("topics", "brokers", "users", "clients")
KIND_WORDS = {"users": "user-principal", "clients": "client-id"}


def _admin(ctx: click.Context) -> AdminClient:
    return AdminClient({"bootstrap.servers": obj(ctx).bootstrap()})


def parse_add_config(text: Optional[str]) -> dict[str, str]:
    """kafka-configs.sh's --add-config 'k1=v1,k2=v2' (values in [...] may hold commas)."""
    out: dict[str, str] = {}
    if not text:
        return out
    item, depth, items = "", 0, []
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    for raw in filter(None, (i.strip() for i in items)):
        key, sep, value = raw.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected k=v, got {raw!r}", param_hint="--add-config")
        out[key.strip()] = value.strip().strip("[]") if value.startswith("[") else value.strip()
    return out


def _entities(types: tuple[str, ...], names: tuple[str, ...], default: bool, user: Optional[str],
              client: Optional[str], user_defaults: bool, client_defaults: bool) -> dict[str, Optional[str]]:
    """entity type -> name (DEFAULT for --entity-default, None for every entity of the type)."""
    picked: dict[str, Optional[str]] = {}
    if user is not None or user_defaults:
        picked["users"] = DEFAULT if user_defaults else user
    if client is not None or client_defaults:
        picked["clients"] = DEFAULT if client_defaults else client
    if types and picked:
        raise click.UsageError("use either --entity-type/--entity-name or --user/--client, not both")
    if picked:
        return picked
    if not types:
        raise click.UsageError("--entity-type is required (or --user / --client)")
    if len(set(types)) != len(types):
        raise click.UsageError("each --entity-type may be given once")
    if len(types) > 1 and set(types) != {"users", "clients"}:
        raise click.UsageError("only users and clients combine (a quota of a user's client id)")
    if default and len(types) > 1:
        raise click.UsageError("--entity-default with two entity types is ambiguous: use --user-defaults / "
                               "--client-defaults")
    if default and names:
        raise click.UsageError("--entity-name and --entity-default exclude each other")
    if len(names) > len(types):
        raise click.UsageError("more --entity-name than --entity-type")
    for i, t in enumerate(types):
        picked[t] = DEFAULT if default else (names[i] if i < len(names) else None)
    return picked


def _describe_entity(user: Optional[str], client_id: Optional[str]) -> str:
    parts = []
    for kind, name in (("users", user), ("clients", client_id)):
        if name is not None:
            parts.append(f"the default {KIND_WORDS[kind]}" if name == DEFAULT else f"{KIND_WORDS[kind]} '{name}'")
    return ", ".join(parts)


def _configs_text(configs: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(configs.items()))


@click.command("configs")
@click.option("--alter", is_flag=True, help="change the entity's configs")
@click.option("--describe", is_flag=True, help="show the entity's configs")
@click.option("--entity-type", "entity_types", multiple=True, type=click.Choice(ENTITY_TYPES),
              help="topics, brokers, users or clients (users and clients may be given together)")
@click.option("--entity-name", "entity_names", multiple=True, help="the entity's name, in --entity-type order")
@click.option("--entity-default", is_flag=True, help="the default entity of the (one) entity type")
@click.option("--user", help="a user principal name (--entity-type users --entity-name USER)")
@click.option("--client", help="a client id (--entity-type clients --entity-name ID)")
@click.option("--user-defaults", is_flag=True, help="the default user")
@click.option("--client-defaults", is_flag=True, help="the default client id")
@click.option("--add-config", help="k1=v1,k2=v2: configs to set")
@click.option("--delete-config", help="k1,k2: configs to remove")
@click.option("--all", "all_", is_flag=True, help="--describe of a broker: every config, not only the dynamic ones")
@click.pass_context
def configs(ctx: click.Context, alter: bool, describe: bool, entity_types: tuple[str, ...],
            entity_names: tuple[str, ...], entity_default: bool, user: Optional[str], client: Optional[str],
            user_defaults: bool, client_defaults: bool, add_config: Optional[str],
            delete_config: Optional[str], all_: bool) -> None:
    """Alter or describe configs of topics, brokers, users and client ids (kafka-configs.sh).

    User and client-id entities take the client quotas producer_byte_rate, consumer_byte_rate
    (bytes per second per broker) and request_percentage (percent of one request thread).
    """
    if alter == describe:
        raise click.UsageError("give exactly one of --alter and --describe")
    entity = _entities(entity_types, entity_names, entity_default, user, client, user_defaults, client_defaults)
    add = parse_add_config(add_config)
    delete = [k.strip() for k in (delete_config or "").split(",") if k.strip()]
    if alter and not add and not delete:
        raise click.UsageError("--alter needs --add-config and/or --delete-config")
    if describe and (add or delete):
        raise click.UsageError("--describe takes no --add-config / --delete-config")
    if all_ and (alter or "brokers" not in entity):
        raise click.UsageError("--all goes with --describe --entity-type brokers")
    if "brokers" in entity:
        _broker_configs(ctx, entity["brokers"], alter, add, delete, all_)
    elif "topics" in entity:
        _topic_configs(ctx, entity, alter, add, delete)
    else:
        _quota_configs(ctx, entity, alter, add, delete)


def _quota_configs(ctx: click.Context, entity: dict[str, Optional[str]], alter: bool, add: dict[str, str],
                   delete: list[str]) -> None:
    user, client_id = entity.get("users"), entity.get("clients")
    if alter:
        if ("users" in entity and user is None) or ("clients" in entity and client_id is None):
            raise click.UsageError("--alter needs --entity-name or --entity-default for every --entity-type")

        async def change() -> dict[str, str]:
            async with _admin(ctx) as a:
                return await a.alter_client_quotas(user, client_id, add, delete)

        after = run(change())
        if obj(ctx).json:
            emit_json({"user": user, "client_id": client_id, "configs": after})
        else:
            click.echo(f"Completed updating config for {_describe_entity(user, client_id)}.")
        return

    async def read() -> list[tuple[Optional[str], Optional[str], dict[str, str]]]:
        async with _admin(ctx) as a:
            exact = all(v is not None for v in entity.values())
            if exact:
                return await a.describe_client_quotas(user, client_id)
            return await a.describe_client_quotas()

    kinds = set(entity)
    rows = [(u, c, cfg) for u, c, cfg in run(read())
            if {k for k, v in (("users", u), ("clients", c)) if v is not None} == kinds
            and (user is None or u == user) and (client_id is None or c == client_id)]
    if obj(ctx).json:
        emit_json([{"user": u, "client_id": c, "configs": cfg} for u, c, cfg in rows])
        return
    for u, c, cfg in rows:
        click.echo(f"Quota configs for {_describe_entity(u, c)} are {_configs_text(cfg)}")


def _topic_configs(ctx: click.Context, entity: dict[str, Optional[str]], alter: bool, add: dict[str, str],
                   delete: list[str]) -> None:
    name = entity["topics"]
    if name is None or name == DEFAULT:
        if alter:
            raise click.UsageError("--alter --entity-type topics needs --entity-name TOPIC")
    if alter:
        assert name is not None

        async def change() -> Any:
            async with _admin(ctx) as a:
                return await a.alter_configs(name, add, delete)

        entries = run(change())
        if obj(ctx).json:
            emit_json({"topic": name, "configs": {e.name: e.value for e in entries if not e.is_default}})
        else:
            click.echo(f"Completed updating config for topic {name}.")
        return

    async def read() -> Any:
        async with _admin(ctx) as a:
            return await a.describe_configs([name] if name else None)

    found = run(read())
    if obj(ctx).json:
        emit_json({t: {e.name: e.value for e in es if not e.is_default} for t, es in found.items()})
        return
    for topic, entries in found.items():
        click.echo(f"Dynamic configs for topic {topic} are:")
        for e in entries:
            if not e.is_default:
                click.echo(f"  {e.name}={e.value} sensitive=false synonyms={{DYNAMIC_TOPIC_CONFIG:{e.name}={e.value}}}")


def _synonyms_text(synonyms: list[tuple[str, Optional[str], int]]) -> str:
    return ", ".join(f"{bc.SOURCE_NAMES.get(src, 'UNKNOWN')}:{n}={v if v is not None else 'null'}"
                     for n, v, src in synonyms)


def _broker_configs(ctx: click.Context, name: Optional[str], alter: bool, add: dict[str, str], delete: list[str],
                    all_: bool) -> None:
    """kafka-configs.sh --entity-type brokers: --entity-name ID (one broker) or --entity-default (cluster-wide);
    --describe without either describes every registered broker, then the default, as Kafka's tool does."""
    if name is not None and name != DEFAULT and not name.isdigit():
        raise click.UsageError(f"--entity-name of a broker is its integer id, got {name!r}")
    broker = None if name in (None, DEFAULT) else int(name)
    if alter:
        if name is None:
            raise click.UsageError("--alter --entity-type brokers needs --entity-name ID or --entity-default")
        what = "default config for brokers in the cluster" if broker is None else f"config for broker {broker}"

        async def change() -> dict[str, str]:
            async with _admin(ctx) as a:
                return await a.alter_broker_configs(broker, add, delete)

        after = run(change())
        if obj(ctx).json:
            emit_json({"broker": name, "configs": after})
        else:
            click.echo(f"Completed updating {what}.")
        return

    async def read() -> list[tuple[Optional[int], Any]]:
        async with _admin(ctx) as a:
            if name is not None:
                return [(broker, await a.describe_broker_configs(broker))]
            ids = sorted(b.broker_id for b in (await a.describe_cluster()).brokers)
            return [*[(i, await a.describe_broker_configs(i)) for i in ids],
                    (None, await a.describe_broker_configs(None))]

    found = run(read())
    shown: list[tuple[Optional[int], Any]] = []
    for b, entries in found:
        wanted = bc.DYNAMIC_DEFAULT_BROKER_CONFIG if b is None else bc.DYNAMIC_BROKER_CONFIG
        shown.append((b, entries if all_ else [e for e in entries if e.source == wanted]))
    if obj(ctx).json:
        rows = [{"broker": "<default>" if b is None else b, "name": e.name, "value": e.value,
                 "source": bc.SOURCE_NAMES.get(e.source, "UNKNOWN"), "read_only": e.read_only,
                 "sensitive": e.sensitive,
                 "synonyms": [{"name": n, "value": v, "source": bc.SOURCE_NAMES.get(src, "UNKNOWN")}
                              for n, v, src in e.synonyms]} for b, es in shown for e in es]
        emit_json(rows)
        return
    for b, entries in shown:
        if b is None:
            click.echo("Default configs for brokers in the cluster are:")
        else:
            click.echo(f"{'All' if all_ else 'Dynamic'} configs for broker {b} are:")
        for e in entries:
            value = e.value if e.value is not None else "null"
            click.echo(f"  {e.name}={value} sensitive={str(e.sensitive).lower()} "
                       f"synonyms={{{_synonyms_text(e.synonyms)}}}")
