"""Consumer groups end to end with real processes: etcd, a controller, 3 brokers and a group coordinator (seed 003, 6.4-6.5).

Members split a topic, a SIGKILLed member's partitions move to the survivors within the
session timeout without losing a committed offset, a cooperative rebalance leaves the
partitions that do not move assigned throughout, and `gregor groups` shows lag and resets offsets.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from gregor.client import AdminClient, Consumer, NewTopic, Producer
from gregor.client.group_admin import GroupAdmin
from gregor.client.group_membership import ConsumerRebalanceListener
from gregor.common import errors
from tests.helpers.cluster import LocalCluster, tear_down
from tests.helpers.wait import until

SERVICES = os.path.join(os.path.dirname(__file__), "..", "..", "services")
SESSION_TIMEOUT_MS = 6000  # the coordinator's group.min.session.timeout.ms (Kafka's default)
FAST = {"heartbeat.interval.ms": 300, "session.timeout.ms": SESSION_TIMEOUT_MS, "auto.commit.interval.ms": 200,
        "fetch.max.wait.ms": 100}
TP = tuple[str, int]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("groups")), brokers=3, controllers=1, coordinators=1,
                        lease_ttl_ms=3000, coordinator_overrides={"group.initial.rebalance.delay.ms": "0"})
    try:
        yield c
    finally:
        tear_down(c)


def bootstrap(c: LocalCluster) -> str:
    return ",".join(p.grpc for p in c.by_role("broker"))


def config(c: LocalCluster, group: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap(c), "group.id": group,
            "coordinator.bootstrap.servers": ",".join(p.grpc for p in c.by_role("coordinator")),
            "auto.offset.reset": "earliest", **FAST, **{k.replace("_", "."): v for k, v in extra.items()}}


async def create_topic(c: LocalCluster, name: str, partitions: int, replication_factor: int = 3) -> None:
    async with AdminClient({"bootstrap.servers": bootstrap(c)}) as admin:
        await admin.create_topics([NewTopic(name, partitions, replication_factor)])
        for _ in range(100):
            try:
                info = (await admin.describe_topics([name]))[name]
            except errors.UnknownTopicOrPartitionError:  # type: ignore[attr-defined]
                await asyncio.sleep(0.1)  # not on every broker yet
                continue
            if len(info.partitions) == partitions and all(p.leader >= 0 for p in info.partitions):
                return
            await asyncio.sleep(0.1)


async def produce(c: LocalCluster, topic: str, partitions: int, per_partition: int, tag: str) -> set[str]:
    values = set()
    async with Producer({"bootstrap.servers": bootstrap(c), "linger.ms": 0}) as p:
        handles = []
        for part in range(partitions):
            for i in range(per_partition):
                v = f"{tag}-{part}-{i}"
                values.add(v)
                handles.append(await p.send(topic, v.encode(), partition=part))
        for h in handles:
            await h
    return values



class Recorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[TP]]] = []

    def on_partitions_revoked(self, partitions: list[TP]) -> None:
        self.calls.append(("revoked", partitions))

    def on_partitions_assigned(self, partitions: list[TP]) -> None:
        self.calls.append(("assigned", partitions))

    def on_partitions_lost(self, partitions: list[TP]) -> None:
        self.calls.append(("lost", partitions))


class Poller:
    """Polls a consumer in a background task (as an application's poll loop), collecting values."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.values: list[str] = []
        self.stop = False
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while not self.stop:
            for rec in await self.consumer.poll(100):
                self.values.append(rec.value.decode() if rec.value else "")

    async def close(self) -> None:
        self.stop = True
        await self.task
        await self.consumer.close()


# ------------------------------------------------------------------ membership with the SDK
async def test_three_members_split_six_partitions_and_eager_listener_sequence(cluster: LocalCluster) -> None:
    await create_topic(cluster, "split", 6)
    sent = await produce(cluster, "split", 6, 5, "a")
    recorders = [Recorder() for _ in range(3)]
    pollers = []
    for i in range(3):
        c = Consumer(config(cluster, "split-g", client_id=f"c{i}"))
        c.subscribe(["split"], listener=recorders[i])
        pollers.append(Poller(c))
    try:
        async def split() -> bool:
            parts = [set(p.consumer.assignment()) for p in pollers]
            return all(len(s) == 2 for s in parts) and len(set().union(*parts)) == 6

        await until(split, 60, "3 members with 2 partitions each")
        await until(lambda: asyncio.sleep(0, sum(len(p.values) for p in pollers) >= len(sent)), 30, "all consumed")
        assert set(v for p in pollers for v in p.values) == sent
        # Eager protocol (range): every rebalance after the first revokes all, then assigns the full set.
        for r in recorders:
            assert r.calls[0][0] == "assigned"
            for (kind, _), (nxt, _) in zip(r.calls, r.calls[1:]):
                assert (kind, nxt) in (("assigned", "revoked"), ("revoked", "assigned")), r.calls
            assert not any(k == "lost" for k, _ in r.calls)
        async with GroupAdmin(config(cluster, "split-g")) as admin:
            desc = await admin.describe_group("split-g")
            assert desc.state == "Stable" and desc.protocol == "range" and len(desc.members) == 3
            assert sorted(tp for m in desc.members for tp in m.assignment) == [("split", p) for p in range(6)]
            assert sorted(m.client_id for m in desc.members) == ["c0", "c1", "c2"]
    finally:
        for p in pollers:
            await p.close()
    async with GroupAdmin(config(cluster, "split-g")) as admin:
        # close() committed every position and left: all 30 records committed, group empty.
        assert sum((await admin.committed_offsets("split-g")).values()) == len(sent)
        assert (await admin.describe_group("split-g")).state == "Empty"


async def test_cooperative_rebalance_keeps_unaffected_partitions_assigned(cluster: LocalCluster) -> None:
    await create_topic(cluster, "coop", 6)
    await produce(cluster, "coop", 6, 3, "x")
    strategy = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"
    r1, r2, r3 = Recorder(), Recorder(), Recorder()
    c1 = Consumer(config(cluster, "coop-g", partition_assignment_strategy=strategy))
    c1.subscribe(["coop"], listener=r1)
    p1 = Poller(c1)
    c2 = c3 = None
    pollers = [p1]
    try:
        await until(lambda: asyncio.sleep(0, len(c1.assignment()) == 6), 30, "c1 owns all 6")
        c2 = Consumer(config(cluster, "coop-g", partition_assignment_strategy=strategy))
        c2.subscribe(["coop"], listener=r2)
        pollers.append(Poller(c2))
        await until(lambda: asyncio.sleep(0, len(c1.assignment()) == 3 and len(c2.assignment()) == 3), 30,
                    "3 + 3 after c2 joined")
        kept = set(c1.assignment())
        c3 = Consumer(config(cluster, "coop-g", partition_assignment_strategy=strategy))
        c3.subscribe(["coop"], listener=r3)
        pollers.append(Poller(c3))
        await until(lambda: asyncio.sleep(0, [len(c.assignment()) for c in (c1, c2, c3)] == [2, 2, 2]), 30,
                    "2 + 2 + 2 after c3 joined")
        # Cooperative: c1 only ever revoked what it gave away; what it kept was never revoked.
        revoked1 = [tp for kind, tps in r1.calls if kind == "revoked" for tp in tps]
        assert set(c1.assignment()) <= kept and not set(c1.assignment()) & set(revoked1)
        assert len(revoked1) == 3 + 1  # 3 to c2, then 1 to c3
        assert all(kind != "lost" for kind, _ in r1.calls + r2.calls + r3.calls)
        # Newcomers only ever get additions; nothing went straight from one owner to another.
        assert [k for k, _ in r3.calls if k != "assigned"] == []
        for r in (r1, r2, r3):
            owned: set[TP] = set()
            for kind, tps in r.calls:
                if kind == "assigned":
                    assert not owned & set(tps)
                    owned |= set(tps)
                else:
                    assert set(tps) <= owned
                    owned -= set(tps)
    finally:
        for p in pollers:
            await p.close()


async def test_commit_sync_async_committed_and_positions(cluster: LocalCluster) -> None:
    await create_topic(cluster, "commits", 2)
    await produce(cluster, "commits", 2, 10, "c")
    tps = [("commits", 0), ("commits", 1)]
    async with Consumer(config(cluster, "commit-g", enable_auto_commit=False)) as c:
        assert await c.committed(tps) == {tps[0]: None, tps[1]: None}
        c.assign(tps)
        got = []
        while len(got) < 20:
            got += await c.poll(1000)
        assert await c.position(tps[0]) == 10
        await c.commit_sync({tps[0]: 4})
        done: list[tuple[Any, Any]] = []
        await c.commit_async({tps[1]: 7}, callback=lambda offsets, exc: done.append((dict(offsets), exc)))
        assert done == [({tps[1]: 7}, None)]
        assert await c.committed(tps) == {tps[0]: 4, tps[1]: 7}
        found = await c.offsets_for_times({tps[0]: 0, tps[1]: int(time.time() * 1000) + 3600_000})
        assert found[tps[0]] is not None and found[tps[0]].offset == 0 and found[tps[1]] is None
    # A member of the group resumes at the committed offsets.
    async with Consumer(config(cluster, "commit-g")) as c:
        c.subscribe(["commits"])
        recs: list[Any] = []
        deadline = time.monotonic() + 30
        while len(recs) < 9 and time.monotonic() < deadline:
            recs += await c.poll(500)
        assert sorted((r.partition, r.offset) for r in recs)[:1] == [(0, 4)]
        assert sorted((r.partition, r.offset) for r in recs if r.partition == 1)[0] == (1, 7)
        assert len(recs) == 6 + 3
    # auto.offset.reset=none without a committed offset is an error from poll(), not a silent start.
    async with Consumer(config(cluster, "none-g", auto_offset_reset="none")) as c:
        c.subscribe(["commits"])
        with pytest.raises(errors.OffsetOutOfRangeError):  # type: ignore[attr-defined]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await c.poll(500)


async def test_subscribe_needs_group_id_and_excludes_assign(cluster: LocalCluster) -> None:
    async with Consumer({"bootstrap.servers": bootstrap(cluster)}) as c:
        with pytest.raises(errors.InvalidGroupIdError):  # type: ignore[attr-defined]
            c.subscribe(["x"])
        with pytest.raises(errors.InvalidGroupIdError):  # type: ignore[attr-defined]
            await c.commit_sync({("x", 0): 1})
    async with Consumer(config(cluster, "excl-g")) as c:
        c.subscribe(pattern="excl-.*")
        with pytest.raises(errors.InvalidRequestError):  # type: ignore[attr-defined]
            c.assign([("x", 0)])


async def test_pattern_subscription_picks_up_new_topics(cluster: LocalCluster) -> None:
    await create_topic(cluster, "pat-a", 1)
    async with Consumer(config(cluster, "pat-g", metadata_max_age_ms=500)) as c:
        c.subscribe(pattern=r"pat-.*")
        await until(lambda: _poll_until(c, lambda: c.assignment() == [("pat-a", 0)]), 30, "pat-a assigned")
        await create_topic(cluster, "pat-b", 1)
        await until(lambda: _poll_until(c, lambda: sorted(c.assignment()) == [("pat-a", 0), ("pat-b", 0)]), 30,
                    "pat-b assigned too")


async def _poll_until(c: Consumer, cond: Callable[[], bool]) -> bool:
    await c.poll(200)
    return cond()


async def test_max_poll_interval_leaves_group_and_partitions_are_lost(cluster: LocalCluster) -> None:
    await create_topic(cluster, "slow", 2)
    r = Recorder()
    slow = Consumer(config(cluster, "slow-g", max_poll_interval_ms=1500))
    slow.subscribe(["slow"], listener=r)
    other = None
    try:
        await until(lambda: _poll_until(slow, lambda: len(slow.assignment()) == 2), 30, "slow owns both")
        other = Consumer(config(cluster, "slow-g"))
        other.subscribe(["slow"])
        # `slow` stops polling: after max.poll.interval.ms it leaves, and `other` gets everything.
        await until(lambda: _poll_until(other, lambda: len(other.assignment()) == 2), 30, "other owns both")
        await slow.poll(200)  # the stale member learns its partitions are lost, then rejoins
        assert ("lost", [("slow", 0), ("slow", 1)]) in r.calls
    finally:
        await slow.close()
        if other is not None:
            await other.close()


# ------------------------------------------------------------------ topic deletion and creation (seed 003 triggers)
async def test_coordinator_rebalances_on_deletion_and_creation_of_a_subscribed_topic(cluster: LocalCluster) -> None:
    from tests.integration.coordinator_client import Member, join_and_sync, stub
    from tests.integration.test_group_coordinator import retrying

    await create_topic(cluster, "doomed", 2)

    async def rebalancing(m: Member, others: list[Member]) -> bool:
        """Heartbeat m (and keep the others alive) until the coordinator says REBALANCE_IN_PROGRESS."""
        for o in others:
            await o.heartbeat()
        try:
            await m.heartbeat()
        except errors.GregorError as exc:
            assert exc.code == errors.Code.REBALANCE_IN_PROGRESS, exc
            return True
        return False

    ch, s = stub(cluster.by_role("coordinator")[0].grpc)
    async with ch, AdminClient({"bootstrap.servers": bootstrap(cluster)}) as admin:
        m = Member(s, "g-doomed", ["doomed"])
        other = Member(s, "g-unrelated", ["unrelated"])
        await retrying(lambda: join_and_sync([m], {"doomed": 2}))
        await retrying(lambda: join_and_sync([other], {"unrelated": 1}))
        await admin.delete_topic("doomed")
        took = await until(lambda: rebalancing(m, [other]), 10, "deleting a subscribed topic rebalances its group")
        await other.heartbeat()  # a group not subscribed to the topic is left alone
        await join_and_sync([m], {})  # the leader assigns what exists: nothing
        assert m.generation == 2 and m.assignment is not None and m.assignment.partitions == []

        waiting = Member(s, "g-later", ["later"])  # subscribed to a topic that does not exist yet
        await join_and_sync([waiting], {})
        await create_topic(cluster, "later", 2)
        await until(lambda: rebalancing(waiting, [m, other]), 10, "creating a subscribed topic rebalances its group")
        await join_and_sync([waiting], {"later": 2})
        assert waiting.assignment is not None and waiting.assignment.partitions == [("later", [0, 1])]
        print(f"rebalance {took:.2f} s after the subscribed topic was deleted")


async def test_deleting_a_subscribed_topic_revokes_its_partitions(cluster: LocalCluster) -> None:
    await create_topic(cluster, "keep", 2)
    await create_topic(cluster, "drop", 2)
    recorders = [Recorder(), Recorder()]
    pollers = []
    for i, r in enumerate(recorders):
        c = Consumer(config(cluster, "drop-g", client_id=f"d{i}"))
        c.subscribe(["keep", "drop"], listener=r)
        pollers.append(Poller(c))
    both = {("keep", 0), ("keep", 1), ("drop", 0), ("drop", 1)}
    try:
        async def owned(expected: set[TP], each: int) -> bool:
            parts = [set(p.consumer.assignment()) for p in pollers]
            return set().union(*parts) == expected and all(len(x) == each for x in parts)

        await until(lambda: owned(both, 2), 60, "two members with one partition of each topic")
        async with AdminClient({"bootstrap.servers": bootstrap(cluster)}) as admin:
            await admin.delete_topic("drop")
        took = await until(lambda: owned({("keep", 0), ("keep", 1)}, 1), 30, "drop's partitions revoked")
        for r in recorders:
            revoked = [tp for kind, tps in r.calls if kind == "revoked" for tp in tps]
            assert any(tp[0] == "drop" for tp in revoked), r.calls
            assert r.calls[-1][0] == "assigned" and all(tp[0] == "keep" for tp in r.calls[-1][1]), r.calls
            assert not any(kind == "lost" for kind, _ in r.calls), r.calls
        async with GroupAdmin(config(cluster, "drop-g")) as ga:
            desc = await ga.describe_group("drop-g")
        assert desc.state == "Stable"
        assert sorted(tp for m in desc.members for tp in m.assignment) == [("keep", 0), ("keep", 1)]
        print(f"partitions of the deleted topic revoked after {took:.2f} s")
    finally:
        for p in pollers:
            await p.close()


# ------------------------------------------------------------------ processes: SIGKILL, CLI
def gregor_cmd(cluster: LocalCluster, *args: str) -> list[str]:
    return [sys.executable, "-m", "gregor.cli.main", "--data-dir", cluster.data_dir, *args]


def env() -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": os.path.abspath(SERVICES)}
    e.pop("GREGOR_BOOTSTRAP", None)
    e.pop("GREGOR_COORDINATORS", None)
    return e


class ConsoleConsumer:
    """`gregor -o json consume TOPIC --group G` as a subprocess; stdout lines collected by a thread."""

    def __init__(self, cluster: LocalCluster, topic: str, group: str, name: str) -> None:
        props = [f"{k}={v}" for k, v in {**FAST, "client.id": name, "max.poll.records": 10}.items()]
        args = ["-o", "json", "consume", topic, "--group", group, "--from-beginning"]
        for p in props:
            args += ["--consumer-property", p]
        self.proc = subprocess.Popen(gregor_cmd(cluster, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env())
        self.records: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.records.append(json.loads(line))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.thread.join(5)


async def test_sigkilled_member_is_replaced_within_session_timeout_without_losing_commits(
        cluster: LocalCluster) -> None:
    topic, group = "kill", "kill-g"
    await create_topic(cluster, topic, 6)
    sent = await produce(cluster, topic, 6, 20, "before")
    consumers = [ConsoleConsumer(cluster, topic, group, f"m{i}") for i in range(3)]
    history: dict[TP, list[int]] = {}
    admin = GroupAdmin(config(cluster, group))
    try:
        async def stable_with(n: int) -> bool:
            try:
                d = await admin.describe_group(group)
            except errors.GregorError:
                return False
            return (d.state == "Stable" and len(d.members) == n
                    and sorted(tp for m in d.members for tp in m.assignment) == [(topic, p) for p in range(6)]
                    and all(m.assignment for m in d.members))

        await until(lambda: stable_with(3), 60, "3 console consumers share the topic")
        await until(lambda: asyncio.sleep(0, sum(len(c.records) for c in consumers) >= len(sent)), 60,
                    "first batch consumed")
        sampling = True

        async def sample() -> None:
            while sampling:
                for tp, off in (await admin.committed_offsets(group)).items():
                    if not history.get(tp) or history[tp][-1] != off:
                        history.setdefault(tp, []).append(off)
                await asyncio.sleep(0.1)

        sampler = asyncio.ensure_future(sample())
        desc = await admin.describe_group(group)
        victim_parts = next(m.assignment for m in desc.members if m.client_id == "m0")
        consumers[0].stop(signal.SIGKILL)
        killed_at = time.monotonic()
        sent |= await produce(cluster, topic, 6, 20, "after")
        took = await until(lambda: stable_with(2), SESSION_TIMEOUT_MS / 1000 + 15, "survivors own all 6")
        reassigned_s = time.monotonic() - killed_at
        survivors = consumers[1:]
        await until(lambda: asyncio.sleep(0, {r["value"] for c in consumers for r in c.records} >= sent), 60,
                    "every record consumed at least once")
        # Survivors commit everything; committed offsets only ever grew.
        async def all_committed() -> bool:
            got = await admin.committed_offsets(group)
            return all(got.get((topic, p)) == 40 for p in range(6))

        await until(all_committed, 30, "committed offsets reach the log end")
        sampling = False
        await sampler
        for tp, offs in history.items():
            assert offs == sorted(offs), f"{tp} committed offsets went backwards: {offs}"
        moved = {r["value"] for c in survivors for r in c.records if (topic, r["partition"]) in victim_parts}
        assert {v for v in sent if v.startswith("after") and (topic, int(v.split("-")[1])) in victim_parts} <= moved
        print(f"SIGKILLed member replaced after {reassigned_s:.1f} s (session.timeout.ms={SESSION_TIMEOUT_MS})")
        assert reassigned_s < SESSION_TIMEOUT_MS / 1000 + 10, (reassigned_s, took)
    finally:
        for c in consumers:
            c.stop()
        await admin.close()
    for c in consumers[1:]:
        assert c.proc.returncode == 0, c.proc.stderr.read() if c.proc.stderr else ""


def run_cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gregor_cmd(cluster, *args), capture_output=True, text=True, env=env(), timeout=120)


async def test_groups_describe_shows_lag_and_reset_offsets_dry_run_then_execute(cluster: LocalCluster) -> None:
    topic, group = "lag", "lag-g"
    await create_topic(cluster, topic, 3)
    await produce(cluster, topic, 3, 10, "l")
    out = run_cli(cluster, "-o", "json", "consume", topic, "--group", group, "--from-beginning",
                  "--max-messages", "30", "--consumer-property", "fetch.max.wait.ms=100")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 30
    await produce(cluster, topic, 3, 4, "more")

    described = run_cli(cluster, "-o", "json", "groups", "describe", group)
    assert described.returncode == 0, described.stderr
    rows = {r["partition"]: r for r in json.loads(described.stdout)["partitions"]}
    assert {p: (r["current_offset"], r["log_end_offset"], r["lag"]) for p, r in rows.items()} == {
        p: (10, 14, 4) for p in range(3)}
    text = run_cli(cluster, "groups", "describe", group)
    assert "LOG-END-OFFSET" in text.stdout and "has no active members" in text.stderr  # Kafka's note, on stderr

    listed = json.loads(run_cli(cluster, "-o", "json", "groups", "list").stdout)
    assert {"group": group, "state": "Empty", "protocol_type": "consumer"} in listed

    async def committed() -> dict[TP, int]:
        async with GroupAdmin(config(cluster, group)) as admin:
            return await admin.committed_offsets(group)

    before = await committed()
    dry = run_cli(cluster, "-o", "json", "groups", "reset-offsets", "--group", group, "--topic", topic,
                  "--to-earliest", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [p["new_offset"] for p in json.loads(dry.stdout)["partitions"]] == [0, 0, 0]
    assert await committed() == before  # a dry run changes nothing

    shifted = run_cli(cluster, "groups", "reset-offsets", "--group", group, "--all-topics", "--shift-by", "-3",
                      "--execute")
    assert shifted.returncode == 0, shifted.stderr
    assert await committed() == {(topic, p): 7 for p in range(3)}
    ran = run_cli(cluster, "groups", "reset-offsets", "--group", group, "--topic", f"{topic}:1", "--to-offset",
                  "999", "--execute")
    assert ran.returncode == 0 and "14" in ran.stdout  # clamped to the log end, as Kafka does
    assert (await committed())[(topic, 1)] == 14

    # The next member resumes at the reset positions: 2 x 7 remaining + 0.
    again = run_cli(cluster, "-o", "json", "consume", topic, "--group", group, "--timeout-ms", "8000")
    assert again.returncode == 0, again.stderr
    assert sorted((r["partition"], r["offset"]) for r in map(json.loads, again.stdout.splitlines()))[0] == (0, 7)
    assert len(again.stdout.splitlines()) == 7 + 7

    bad = run_cli(cluster, "groups", "reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
                  "--to-latest")
    assert bad.returncode == 2 and "exactly one" in bad.stderr
    deleted = run_cli(cluster, "groups", "delete", "--group", group)
    assert deleted.returncode == 0 and "successful" in deleted.stdout
    missing = run_cli(cluster, "groups", "describe", group)
    assert missing.returncode == 1 and "does not exist" in missing.stderr


async def test_static_member_restart_within_session_timeout_keeps_its_partitions(cluster: LocalCluster) -> None:
    await create_topic(cluster, "static", 2)
    rb = Recorder()
    a = Consumer(config(cluster, "static-g", group_instance_id="inst-a", client_id="a"))
    a.subscribe(["static"])
    b = Consumer(config(cluster, "static-g", client_id="b"))
    b.subscribe(["static"], listener=rb)
    pb = Poller(b)
    try:
        await until(lambda: _poll_until(a, lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1), 30,
                    "one partition each")
        mine = a.assignment()
        await a.close()  # a static member does not send LeaveGroup: its slot waits for session.timeout.ms
        calls_before = list(rb.calls)
        a = Consumer(config(cluster, "static-g", group_instance_id="inst-a", client_id="a"))
        a.subscribe(["static"])
        await until(lambda: _poll_until(a, lambda: a.assignment() == mine), 10, "same partition back")
        for _ in range(10):
            await a.poll(100)
        assert rb.calls == calls_before  # the dynamic member never noticed: no rebalance
        assert b.assignment() != mine and len(b.assignment()) == 1
    finally:
        await a.close()
        await pb.close()


def test_sync_consumer_subscribe_commit_unsubscribe(cluster: LocalCluster) -> None:
    from gregor.client import SyncConsumer

    asyncio.run(create_topic(cluster, "sync", 2))
    asyncio.run(produce(cluster, "sync", 2, 5, "s"))
    r = Recorder()
    with SyncConsumer(config(cluster, "sync-g", enable_auto_commit=False)) as c:
        c.subscribe(["sync"], listener=r)
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            got += c.poll(500)
        assert len(got) == 10 and c.subscription() == ["sync"]
        assert c.committed([("sync", 0)]) == {("sync", 0): None}  # auto-commit is off
        c.commit_sync()
        assert c.committed([("sync", 0), ("sync", 1)]) == {("sync", 0): 5, ("sync", 1): 5}
        c.unsubscribe()
        assert c.assignment() == [] and c.subscription() == []
        assert r.calls[-1] == ("revoked", [("sync", 0), ("sync", 1)])
        c.assign([("sync", 1)])  # manual assignment is allowed again after unsubscribe()
        assert c.position(("sync", 1)) == 5  # as in Kafka, assign() with a group.id starts at the committed offset
        c.seek_to_beginning(("sync", 1))
        assert c.position(("sync", 1)) == 0


async def test_mixed_strategy_list_runs_eager_and_leaves_nothing_unassigned(cluster: LocalCluster) -> None:
    # cooperative-sticky is preferred but range is listed too: Kafka's rule makes the protocol eager,
    # so the assignor must not withhold partitions for a follow-up rebalance that never comes.
    await create_topic(cluster, "mixed", 4)
    strategy = "cooperative-sticky,range"
    c1 = Consumer(config(cluster, "mixed-g", partition_assignment_strategy=strategy))
    c1.subscribe(["mixed"])
    p1 = Poller(c1)
    c2 = None
    try:
        await until(lambda: asyncio.sleep(0, len(c1.assignment()) == 4), 30, "c1 owns all 4")
        c2 = Consumer(config(cluster, "mixed-g", partition_assignment_strategy=strategy))
        c2.subscribe(["mixed"])
        p2 = Poller(c2)
        await until(lambda: asyncio.sleep(0, len(c1.assignment()) == 2 and len(c2.assignment()) == 2), 30,
                    "2 + 2, nothing withheld")
        async with GroupAdmin(config(cluster, "mixed-g")) as admin:
            assert (await admin.describe_group("mixed-g")).protocol == "cooperative-sticky"
        await p2.close()
    finally:
        await p1.close()
