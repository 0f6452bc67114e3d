"""`gregor topics create/list/describe/alter/delete`, shaped like kafka-topics."""

from __future__ import annotations

from typing import Any, Optional

import click

from gregor.cli.common import emit_json, obj, parse_kv, run
from gregor.client.admin import AdminClient
from gregor.client.metadata import TopicInfo
from gregor.common import errors, uuid


def admin(ctx: click.Context) -> AdminClient:
    return AdminClient({"bootstrap.servers": obj(ctx).bootstrap()})


@click.group()
def topics() -> None:
    """Create, list, describe, alter and delete topics."""


@topics.command()
@click.argument("name")
@click.option("--partitions", type=int, default=-1, help="partition count (default: the broker's num.partitions)")
@click.option("--replication-factor", type=int, default=-1, help="replicas per partition (default: broker's)")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="topic config override (repeatable)")
@click.option("--if-not-exists", is_flag=True, help="succeed quietly when the topic already exists")
@click.pass_context
def create(ctx: click.Context, name: str, partitions: int, replication_factor: int, configs: tuple[str, ...],
           if_not_exists: bool) -> None:
    """Create topic NAME."""
    cfg = parse_kv(configs, "--config")

    async def go() -> bool:
        async with admin(ctx) as a:
            try:
                await a.create_topic(name, partitions, replication_factor, cfg)
            except errors.TopicAlreadyExistsError:  # type: ignore[attr-defined]
                if not if_not_exists:
                    raise
                return False
            return True

    created = run(go())
    if obj(ctx).json:
        emit_json({"topic": name, "created": created})
    elif created:
        click.echo(f"Created topic {name}.")


@topics.command("list")
@click.option("--exclude-internal", is_flag=True, help="hide internal topics")
@click.pass_context
def list_(ctx: click.Context, exclude_internal: bool) -> None:
    """List topic names."""

    async def go() -> list[str]:
        async with admin(ctx) as a:
            return await a.list_topics(include_internal=not exclude_internal)

    names = run(go())
    if obj(ctx).json:
        emit_json(names)
    else:
        for n in names:
            click.echo(n)


def _min_isr(configs: list[Any]) -> int:
    for e in configs:
        if e.name == "min.insync.replicas":
            return int(e.value)
    return 1


@topics.command()
@click.argument("name", required=False)
@click.option("--under-replicated-partitions", "under_replicated", is_flag=True,
              help="only partitions whose ISR is smaller than their replica set")
@click.option("--under-min-isr-partitions", "under_min_isr", is_flag=True,
              help="only partitions whose ISR is smaller than min.insync.replicas")
@click.option("--unavailable-partitions", "unavailable", is_flag=True, help="only partitions without a live leader")
@click.pass_context
def describe(ctx: click.Context, name: Optional[str], under_replicated: bool, under_min_isr: bool,
             unavailable: bool) -> None:
    """Describe topic NAME (every topic without NAME) in kafka-topics --describe layout."""

    async def go() -> tuple[dict[str, TopicInfo], dict[str, list[Any]], set[int]]:
        async with admin(ctx) as a:
            infos = await a.describe_topics([name] if name else None)
            configs = await a.describe_configs(list(infos)) if infos else {}
            return infos, configs, set(a.metadata.brokers)

    infos, configs, live = run(go())
    filtered = under_replicated or under_min_isr or unavailable
    out: list[dict[str, Any]] = []
    for topic, info in infos.items():
        entries = configs.get(topic, [])
        min_isr = _min_isr(entries)
        parts = []
        for p in info.partitions:
            if filtered and not (
                    (under_replicated and len(p.isr) < len(p.replicas))
                    or (under_min_isr and len(p.isr) < min_isr)
                    or (unavailable and (p.leader < 0 or p.leader not in live))):
                continue
            parts.append({"partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                          "replicas": list(p.replicas), "isr": list(p.isr),
                          "offline_replicas": list(p.offline_replicas)})
        if filtered and not parts:
            continue
        out.append({"topic": topic, "topic_id": uuid.to_string(info.topic_id), "partition_count": len(info.partitions),
                    "replication_factor": len(info.partitions[0].replicas) if info.partitions else 0,
                    "configs": {e.name: e.value for e in entries if not e.is_default},
                    "partitions": parts})
    if obj(ctx).json:
        emit_json(out)
        return
    for t in out:
        if not filtered:  # Kafka prints only the partition lines when a filter is given
            cfg = ",".join(f"{k}={v}" for k, v in t["configs"].items())
            click.echo(f"Topic: {t['topic']}\tTopicId: {t['topic_id']}\tPartitionCount: {t['partition_count']}\t"
                       f"ReplicationFactor: {t['replication_factor']}\tConfigs: {cfg}")
        for p in t["partitions"]:
            leader = p["leader"] if p["leader"] >= 0 else "none"
            line = (f"\tTopic: {t['topic']}\tPartition: {p['partition']}\tLeader: {leader}\t"
                    f"Replicas: {','.join(map(str, p['replicas']))}\tIsr: {','.join(map(str, p['isr']))}\t"
                    f"LeaderEpoch: {p['leader_epoch']}")
            if p["offline_replicas"]:
                line += f"\tOffline: {','.join(map(str, p['offline_replicas']))}"
            click.echo(line)


@topics.command()
@click.argument("name")
@click.option("--partitions", type=int, help="new (larger) partition count")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="set a topic config (repeatable)")
@click.option("--delete-config", "delete_configs", multiple=True, metavar="KEY",
              help="reset a topic config to its default (repeatable)")
@click.pass_context
def alter(ctx: click.Context, name: str, partitions: Optional[int], configs: tuple[str, ...],
          delete_configs: tuple[str, ...]) -> None:
    """Add partitions to NAME and/or change its configs."""
    if partitions is None and not configs and not delete_configs:
        raise click.UsageError("nothing to alter: give --partitions N, --config KEY=VALUE or --delete-config KEY")
    cfg = parse_kv(configs, "--config")

    async def go() -> dict[str, str]:
        async with admin(ctx) as a:
            if partitions is not None:
                await a.create_partitions(name, partitions)
            if cfg or delete_configs:
                entries = await a.alter_configs(name, cfg, delete_configs)
                return {e.name: e.value for e in entries if not e.is_default}
            return {}

    overrides = run(go())
    if obj(ctx).json:
        emit_json({"topic": name, "partitions": partitions, "configs": overrides})
    else:
        if partitions is not None:
            click.echo(f"Topic {name} now has {partitions} partitions.")
        if cfg or delete_configs:
            click.echo(f"Completed updating config for topic {name}.")


@topics.command()
@click.argument("name")
@click.option("--if-exists", is_flag=True, help="succeed quietly when the topic does not exist")
@click.pass_context
def delete(ctx: click.Context, name: str, if_exists: bool) -> None:
    """Delete topic NAME."""

    async def go() -> bool:
        async with admin(ctx) as a:
            try:
                await a.delete_topic(name)
            except errors.UnknownTopicOrPartitionError:  # type: ignore[attr-defined]
                if not if_exists:
                    raise
                return False
            return True

    deleted = run(go())
    if obj(ctx).json:
        emit_json({"topic": name, "deleted": deleted})
    elif deleted:
        click.echo(f"Deleted topic {name}.")
