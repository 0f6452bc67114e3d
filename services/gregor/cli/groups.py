"""`gregor groups`: list, describe, reset-offsets and delete consumer groups, like kafka-consumer-groups.sh."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import click

from gregor.cli.common import emit_json, obj, print_table, run
from gregor.cli.consume import coordinator_servers, progress
from gregor.client.consumer import Consumer
from gregor.client.group_admin import GroupAdmin, GroupDescription
from gregor.common import errors

TopicPartition = tuple[str, int]
INACTIVE_STATES = ("Empty", "Dead")


def _config(ctx: click.Context) -> dict[str, Any]:
    return {"bootstrap.servers": obj(ctx).bootstrap(), "coordinator.bootstrap.servers": coordinator_servers(ctx)}


@click.group()
def groups() -> None:
    """Consumer groups: list, describe (members, assignment, offsets, lag), reset-offsets, delete."""


def _one_group(positional: Optional[str], option: Optional[str]) -> str:
    """The group named as `G` (DESIGN.md's contract) or `--group G` (kafka-consumer-groups.sh's flag)."""
    if positional and option and positional != option:
        raise click.UsageError(f"two different groups given: {positional!r} and --group {option!r}")
    group = positional or option
    if not group:
        raise click.UsageError("give the group: GROUP or --group GROUP")
    return group


def _group_state_note(group: str, state: str) -> None:
    """kafka-consumer-groups.sh's notes about an inactive or rebalancing group, on stderr."""
    if state == "Empty":
        click.echo(f"\nConsumer group '{group}' has no active members.", err=True)
    elif state in ("PreparingRebalance", "CompletingRebalance"):
        click.echo(f"\nWarning: Consumer group '{group}' is rebalancing.", err=True)


def _assignment_text(assignment: list[TopicPartition]) -> str:
    """--members --verbose ASSIGNMENT as Kafka prints it: `orders(0,1), payments(2)`, `-` when empty."""
    by_topic: dict[str, list[int]] = {}
    for t, p in assignment:
        by_topic.setdefault(t, []).append(p)
    return ", ".join(f"{t}({','.join(str(p) for p in sorted(ps))})" for t, ps in sorted(by_topic.items())) or "-"


@groups.command("list")
@click.option("--state", "with_state", is_flag=True, help="also print each group's state")
@click.pass_context
def list_(ctx: click.Context, with_state: bool) -> None:
    """Every consumer group the coordinators know."""
    async def go() -> list[Any]:
        async with GroupAdmin(_config(ctx)) as admin:
            return await admin.list_groups()

    listed = run(go())
    if obj(ctx).json:
        emit_json([{"group": g.group_id, "state": g.state, "protocol_type": g.protocol_type} for g in listed])
    elif with_state:
        print_table([[g.group_id, g.state] for g in listed], ["GROUP", "STATE"])
    else:
        for g in listed:
            click.echo(g.group_id)


async def _offset_rows(admin: GroupAdmin, desc: GroupDescription, bootstrap: str) -> list[dict[str, Any]]:
    """One row per partition with a committed offset or an owner: committed, log-end offset, lag, owner."""
    committed = await admin.committed_offsets(desc.group_id)
    owner: dict[TopicPartition, Any] = {}  # -> MemberDescription
    for member in desc.members:
        for tp in member.assignment:
            owner[tp] = member
    tps = sorted(set(committed) | set(owner))
    ends: dict[TopicPartition, Optional[int]] = {}
    if tps:
        async with Consumer({"bootstrap.servers": bootstrap}) as c:
            for tp in tps:
                try:
                    ends[tp] = await c.list_offset(tp, -1)
                except errors.GregorError:
                    ends[tp] = None  # e.g. the topic was deleted: Kafka prints "-"
    rows = []
    for tp in tps:
        m: Any = owner.get(tp)
        cur, end = committed.get(tp), ends.get(tp)
        rows.append({"group": desc.group_id, "topic": tp[0], "partition": tp[1], "current_offset": cur,
                     "log_end_offset": end, "lag": None if cur is None or end is None else max(0, end - cur),
                     "consumer_id": m.member_id if m else None, "host": m.host if m else None,
                     "client_id": m.client_id if m else None})
    return rows


@groups.command()
@click.argument("group", required=False)
@click.option("--group", "group_opt", metavar="GROUP", help="the group (same as the GROUP argument)")
@click.option("--members", is_flag=True, help="members and how many partitions each has")
@click.option("--state", is_flag=True, help="coordinator, assignment strategy, state and member count")
@click.option("--verbose", is_flag=True, help="with --members: each member's assignment")
@click.pass_context
def describe(ctx: click.Context, group: Optional[str], group_opt: Optional[str], members: bool, state: bool,
             verbose: bool) -> None:
    """A group's partitions with committed offset, log-end offset and lag (or --members / --state)."""
    if members and state:
        raise click.UsageError("--members and --state are mutually exclusive")
    group = _one_group(group, group_opt)
    cfg = _config(ctx)

    async def go() -> tuple[GroupDescription, list[dict[str, Any]]]:
        async with GroupAdmin(cfg) as admin:
            desc = await admin.describe_group(group)
            if desc.state == "Dead":
                raise click.ClickException(f"Consumer group '{group}' does not exist.")
            rows = [] if members or state else await _offset_rows(admin, desc, cfg["bootstrap.servers"])
            return desc, rows

    desc, rows = run(go())
    as_json = obj(ctx).json
    if state:
        info = {"group": desc.group_id, "coordinator": desc.coordinator, "assignment_strategy": desc.protocol,
                "state": desc.state, "members": len(desc.members), "generation": desc.generation_id}
        if as_json:
            emit_json(info)
        else:
            print_table([[desc.group_id, desc.coordinator, desc.protocol or "", desc.state, len(desc.members)]],
                   ["GROUP", "COORDINATOR", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"])
        return
    if members:
        out: list[dict[str, Any]] = [{"group": desc.group_id, "consumer_id": m.member_id, "group_instance_id": m.group_instance_id or None,
                "host": m.host, "client_id": m.client_id, "partitions": len(m.assignment),
                "assignment": [f"{t}-{p}" for t, p in m.assignment]} for m in desc.members]
        if as_json:
            emit_json(out)
            return
        _group_state_note(group, desc.state)
        if not out:
            return
        header = ["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
        table = [[r["group"], r["consumer_id"], r["group_instance_id"], r["host"], r["client_id"], r["partitions"]]
                 + ([_assignment_text(m.assignment)] if verbose else []) for r, m in zip(out, desc.members)]
        print_table(table, header + (["ASSIGNMENT"] if verbose else []))
        return
    if as_json:
        emit_json({"group": desc.group_id, "state": desc.state, "partitions": rows})
        return
    _group_state_note(group, desc.state)
    print_table([[r["group"], r["topic"], r["partition"], r["current_offset"], r["log_end_offset"], r["lag"],
             r["consumer_id"], r["host"], r["client_id"]] for r in rows],
           ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
            "CLIENT-ID"])


def parse_datetime(value: str) -> int:
    """--to-datetime: ISO 8601 ('2024-01-31T12:00:00.000', optional zone; naive = local time) -> epoch ms."""
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 date-time (YYYY-MM-DDTHH:mm:SS.sss)",
                                 param_hint="--to-datetime") from None
    return int(when.timestamp() * 1000)


def _parse_topic(spec: str) -> tuple[str, Optional[list[int]]]:
    """--topic T or T:0,2 (kafka-consumer-groups.sh syntax)."""
    name, sep, parts = spec.partition(":")
    if not sep:
        return name, None
    try:
        return name, [int(p) for p in parts.split(",") if p.strip()]
    except ValueError:
        raise click.BadParameter(f"{spec!r}: expected TOPIC or TOPIC:P1,P2", param_hint="--topic") from None


def plan_reset(tps: list[TopicPartition], committed: dict[TopicPartition, int], earliest: dict[TopicPartition, int],
               latest: dict[TopicPartition, int], by_time: dict[TopicPartition, Optional[int]], *,
               to_earliest: bool, to_latest: bool, to_offset: Optional[int], shift_by: Optional[int],
               to_datetime: Optional[int]) -> dict[TopicPartition, int]:
    """New offsets as kafka-consumer-groups.sh computes them (offsets clamped into [earliest, latest])."""
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        lo, hi = earliest[tp], latest[tp]
        if to_earliest:
            new = lo
        elif to_latest:
            new = hi
        elif to_offset is not None:
            new = to_offset
        elif shift_by is not None:
            if tp not in committed:
                raise click.ClickException(f"Cannot shift offset for partition {tp[0]}-{tp[1]} since there is no "
                                           "current committed offset")
            new = committed[tp] + shift_by
        else:
            assert to_datetime is not None
            found = by_time.get(tp)
            new = hi if found is None else found
        out[tp] = min(max(new, lo), hi)
    return out


@groups.command("reset-offsets")
@click.argument("group", required=False)
@click.option("--group", "group_opt", metavar="GROUP", help="the consumer group (same as the GROUP argument); "
              "it must have no active members")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P,...]", help="topic (and partitions) to reset")
@click.option("--all-topics", is_flag=True, help="every topic the group has committed offsets for")
@click.option("--to-earliest", is_flag=True)
@click.option("--to-latest", is_flag=True)
@click.option("--to-offset", type=int, metavar="N")
@click.option("--to-datetime", metavar="ISO", help="first offset at or after YYYY-MM-DDTHH:mm:SS.sss")
@click.option("--shift-by", type=int, metavar="N", help="move the committed offset by N (may be negative)")
@click.option("--dry-run", is_flag=True, help="print the new offsets only (the default)")
@click.option("--execute", is_flag=True, help="commit the new offsets")
@click.pass_context
def reset_offsets(ctx: click.Context, group: Optional[str], group_opt: Optional[str], topics: tuple[str, ...],
                  all_topics: bool, to_earliest: bool, to_latest: bool, to_offset: Optional[int],
                  to_datetime: Optional[str], shift_by: Optional[int], dry_run: bool, execute: bool) -> None:
    """Set a group's committed offsets (kafka-consumer-groups.sh --reset-offsets).

    As Kafka's tool, only a group without active members (Empty, or unknown) can be reset,
    even in a dry run: an active member would overwrite the new offsets with its next commit."""
    group = _one_group(group, group_opt)
    if bool(topics) == all_topics:
        raise click.UsageError("give exactly one of --topic and --all-topics")
    chosen = [to_earliest, to_latest, to_offset is not None, to_datetime is not None, shift_by is not None]
    if sum(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
                               "--shift-by")
    if dry_run and execute:
        raise click.UsageError("--dry-run and --execute are mutually exclusive")
    if to_offset is not None and to_offset < 0:
        raise click.BadParameter("must not be negative", param_hint="--to-offset")
    when = parse_datetime(to_datetime) if to_datetime is not None else None
    if not dry_run and not execute:
        click.echo("WARN: No action will be performed as the --execute option is missing. "
                   "Add --dry-run to keep this behaviour without the warning.", err=True)
    specs = [_parse_topic(t) for t in topics]
    cfg = _config(ctx)

    async def go() -> dict[TopicPartition, int]:
        async with GroupAdmin(cfg) as admin, Consumer({"bootstrap.servers": cfg["bootstrap.servers"]}) as c:
            desc = await admin.describe_group(group)
            if desc.state not in INACTIVE_STATES:
                raise click.ClickException(f"Assignments can only be reset if the group '{group}' is inactive, "
                                           f"but the current state is {desc.state}.")
            committed = await admin.committed_offsets(group)
            if all_topics:
                tps = sorted(committed)
            else:
                tps = []
                for name, parts in specs:
                    known = await c.partitions_for(name)
                    for p in parts if parts is not None else known:
                        if p not in known:
                            raise click.ClickException(f"topic {name} has no partition {p}")
                        tps.append((name, p))
            earliest: dict[TopicPartition, int] = {}
            latest: dict[TopicPartition, int] = {}
            by_time: dict[TopicPartition, Optional[int]] = {}
            with progress(len(tps) if len(tps) > 1 else None, "listing offsets") as advance:
                for tp in tps:
                    earliest[tp] = await c.list_offset(tp, -2)
                    latest[tp] = await c.list_offset(tp, -1)
                    if when is not None:
                        found = await c.list_offset(tp, when)
                        by_time[tp] = found if found >= 0 else None
                    advance(1)
            plan = plan_reset(tps, committed, earliest, latest, by_time, to_earliest=to_earliest,
                              to_latest=to_latest, to_offset=to_offset, shift_by=shift_by, to_datetime=when)
            if execute and plan:
                await admin.alter_offsets(group, plan)
            return plan

    plan = run(go())
    if obj(ctx).json:
        emit_json({"group": group, "executed": execute,
                   "partitions": [{"topic": t, "partition": p, "new_offset": o} for (t, p), o in sorted(plan.items())]})
        return
    print_table([[group, t, p, o] for (t, p), o in sorted(plan.items())], ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"])


@groups.command()
@click.argument("groups_pos", metavar="[GROUP]...", nargs=-1)
@click.option("--group", "group_opts", multiple=True, metavar="GROUP",
              help="group to delete (repeatable; same as the GROUP arguments)")
@click.pass_context
def delete(ctx: click.Context, groups_pos: tuple[str, ...], group_opts: tuple[str, ...]) -> None:
    """Delete groups without active members, with their committed offsets."""
    group_ids = tuple(dict.fromkeys(groups_pos + group_opts))
    if not group_ids:
        raise click.UsageError("give the groups to delete: GROUP... or --group GROUP")
    if any(not g for g in group_ids):
        raise click.UsageError("a group id must not be empty")

    async def go() -> dict[str, Optional[errors.GregorError]]:
        async with GroupAdmin(_config(ctx)) as admin:
            return await admin.delete_groups(group_ids)

    results = run(go())
    failed = {g: e for g, e in results.items() if e is not None}
    if obj(ctx).json:
        emit_json({g: (None if e is None else {"error": e.name, "message": e.message}) for g, e in results.items()})
    else:
        ok = [g for g, e in results.items() if e is None]
        if ok:
            click.echo("Deletion of requested consumer groups (" + ", ".join(f"'{g}'" for g in ok)
                       + ") was successful.")
        for g, e in failed.items():
            click.echo(f"Error: Deletion of group '{g}' failed: {e.name}: {e.message}", err=True)
    if failed:
        raise SystemExit(1)
