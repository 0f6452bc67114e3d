"""`gregor groups` against a live group (etcd, a controller, 3 brokers, a coordinator; kafka-consumer-groups.sh).

describe on an ACTIVE group (owners, committed offsets, lag; --members [--verbose], --state) in text
and JSON; reset-offsets and delete refused while the group has members, as Kafka refuses them; once
the members left, reset-offsets --to-latest and --to-datetime --execute commit what they print, and
`groups delete G` (positional, the DESIGN.md contract) removes the group.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import time
from typing import Any

from gregor.client import Consumer
from gregor.client.group_admin import GroupAdmin
from tests.helpers.cluster import LocalCluster
from tests.integration.test_consumer_groups import (  # noqa: F401  (cluster: the module's fixture)
    TP, Poller, cluster, config, create_topic, produce, run_cli, until,
)


async def cli(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`gregor ARGS` in a subprocess, off the event loop: the in-process members keep heartbeating."""
    return await asyncio.to_thread(run_cli, c, *args)


async def committed(c: LocalCluster, group: str) -> dict[TP, int]:
    async with GroupAdmin(config(c, group)) as admin:
        return await admin.committed_offsets(group)


async def test_describe_active_group_refuse_reset_while_active_then_reset_and_delete(cluster: LocalCluster) -> None:
    topic, group = "cli-active", "cli-active-g"
    tps = [(topic, p) for p in range(3)]
    await create_topic(cluster, topic, 3)
    await produce(cluster, topic, 3, 10, "a")
    members = [Consumer(config(cluster, group, client_id=f"m{i}", enable_auto_commit=False)) for i in range(2)]
    for m in members:
        m.subscribe([topic])
    pollers = [Poller(m) for m in members]
    try:
        async def settled() -> bool:
            owner = {tp: m for m in members for tp in m.assignment()}
            if sorted(owner) != tps or not all(m.assignment() for m in members):
                return False
            return all([await m.position(tp) == 10 for tp, m in owner.items()])

        await until(settled, 60, "two members own the 3 partitions and consumed them")
        for m in members:
            await m.commit_sync()  # their positions: 10 per partition
        await produce(cluster, topic, 3, 4, "b")  # log end 14: lag 4 (the members read on, without committing)
        owner_client = {tp: f"m{i}" for i, m in enumerate(members) for tp in m.assignment()}
        async with GroupAdmin(config(cluster, group)) as admin:
            desc = await admin.describe_group(group)
        assert sorted(m.client_id for m in desc.members) == ["m0", "m1"]
        owner_id = {tp: d.member_id for d in desc.members for tp in d.assignment}
        assert {tp: d.client_id for d in desc.members for tp in d.assignment} == owner_client

        described = await cli(cluster, "-o", "json", "groups", "describe", group)
        assert described.returncode == 0, described.stderr
        doc = json.loads(described.stdout)
        assert doc["state"] == "Stable"
        rows = {(r["topic"], r["partition"]): r for r in doc["partitions"]}
        assert {tp: (r["current_offset"], r["log_end_offset"], r["lag"]) for tp, r in rows.items()} == {
            tp: (10, 14, 4) for tp in tps}
        assert {tp: (r["consumer_id"], r["client_id"]) for tp, r in rows.items()} == {
            tp: (owner_id[tp], owner_client[tp]) for tp in tps}
        assert all(r["host"] for r in rows.values())
        assert json.loads((await cli(cluster, "-o", "json", "groups", "describe", "--group", group)).stdout) == doc

        text = await cli(cluster, "groups", "describe", group)
        assert text.returncode == 0 and "no active members" not in text.stderr, text.stderr
        lines = text.stdout.strip().splitlines()
        assert lines[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                                    "CONSUMER-ID", "HOST", "CLIENT-ID"]
        for line, tp in zip(lines[1:], tps):
            cells = line.split()
            assert cells[:6] == [group, topic, str(tp[1]), "10", "14", "4"] and cells[6] == owner_id[tp]
            assert cells[-1] == owner_client[tp]

        listed = json.loads((await cli(cluster, "-o", "json", "groups", "describe", group, "--members")).stdout)
        assert sorted((r["client_id"], r["partitions"], r["assignment"]) for r in listed) == sorted(
            (f"m{i}", len(m.assignment()), [f"{t}-{p}" for t, p in sorted(m.assignment())])
            for i, m in enumerate(members))
        verbose = await cli(cluster, "groups", "describe", group, "--members", "--verbose")
        assert verbose.returncode == 0, verbose.stderr
        assert verbose.stdout.splitlines()[0].split()[-2:] == ["#PARTITIONS", "ASSIGNMENT"]
        for i, m in enumerate(members):
            parts = ",".join(str(p) for _, p in sorted(m.assignment()))
            assert any(f" m{i} " in line and line.endswith(f"{topic}({parts})") for line in verbose.stdout.splitlines())
        state = json.loads((await cli(cluster, "-o", "json", "groups", "describe", group, "--state")).stdout)
        assert (state["state"], state["members"], state["assignment_strategy"]) == ("Stable", 2, "range")

        # Kafka refuses to reset (even a dry run) or delete a group with active members.
        before = await committed(cluster, group)
        assert before == {tp: 10 for tp in tps}
        for mode in ("--execute", "--dry-run"):
            refused = await cli(cluster, "groups", "reset-offsets", group, "--topic", topic, "--to-latest", mode)
            assert refused.returncode == 1, refused
            assert (f"Assignments can only be reset if the group '{group}' is inactive, but the current state "
                    "is Stable.") in refused.stderr
        busy = await cli(cluster, "groups", "delete", group)
        assert busy.returncode == 1 and "NON_EMPTY_GROUP" in busy.stderr, busy
        assert await committed(cluster, group) == before
    finally:
        for p in pollers:
            await p.close()  # LeaveGroup; auto-commit is off, so nothing more is committed

    async def empty() -> bool:
        async with GroupAdmin(config(cluster, group)) as admin:
            return (await admin.describe_group(group)).state == "Empty"

    await until(empty, 20, "the group is Empty once both members left")
    latest = await cli(cluster, "groups", "reset-offsets", "--group", group, "--topic", topic, "--to-latest",
                       "--execute")
    assert latest.returncode == 0, latest.stderr
    assert [line.split()[-1] for line in latest.stdout.strip().splitlines()[1:]] == ["14", "14", "14"]
    assert await committed(cluster, group) == {tp: 14 for tp in tps}
    idle = await cli(cluster, "-o", "json", "groups", "describe", group)
    assert [(r["current_offset"], r["lag"], r["consumer_id"]) for r in json.loads(idle.stdout)["partitions"]] == [
        (14, 0, None)] * 3
    assert "has no active members" in (await cli(cluster, "groups", "describe", group)).stderr

    # --to-datetime: the first offset at or after the time, here the first record produced after it.
    await asyncio.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await produce(cluster, topic, 3, 3, "c")  # offsets 14..16
    assert (await cli(cluster, "groups", "reset-offsets", group, "--all-topics", "--to-earliest",
                      "--execute")).returncode == 0
    assert await committed(cluster, group) == {tp: 0 for tp in tps}
    when = dt.datetime.fromtimestamp(middle_ms / 1000).isoformat(timespec="milliseconds")  # local time, as Kafka's
    by_time = await cli(cluster, "-o", "json", "groups", "reset-offsets", group, "--topic", topic,
                        "--to-datetime", when, "--execute")
    assert by_time.returncode == 0, by_time.stderr
    plan: dict[str, Any] = json.loads(by_time.stdout)
    assert plan["executed"] is True and [p["new_offset"] for p in plan["partitions"]] == [14, 14, 14]
    assert await committed(cluster, group) == {tp: 14 for tp in tps}
    rows = json.loads((await cli(cluster, "-o", "json", "groups", "describe", group)).stdout)["partitions"]
    assert [(r["current_offset"], r["log_end_offset"], r["lag"]) for r in rows] == [(14, 17, 3)] * 3

    deleted = await cli(cluster, "groups", "delete", group)  # positional, as DESIGN.md's contract
    assert deleted.returncode == 0 and f"('{group}')" in deleted.stdout, deleted
    gone = await cli(cluster, "groups", "describe", group)
    assert gone.returncode == 1 and "does not exist" in gone.stderr
    assert group not in [g["group"] for g in json.loads((await cli(cluster, "-o", "json", "groups", "list")).stdout)]


async def test_delete_takes_positional_groups_and_repeated_group_flags(cluster: LocalCluster) -> None:
    names = ["del-a", "del-b", "del-c"]
    for g in names:
        async with GroupAdmin(config(cluster, g)) as admin:
            await admin.alter_offsets(g, {("t", 0): 1})  # an Empty group with a committed offset
    out = await cli(cluster, "-o", "json", "groups", "delete", "del-a", "--group", "del-b", "--group", "del-c",
                    "no-such-group")
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert {g: result[g] for g in names} == {g: None for g in names}
    assert result["no-such-group"]["error"] == "GROUP_ID_NOT_FOUND"
    for g in names:
        assert await committed(cluster, g) == {}
