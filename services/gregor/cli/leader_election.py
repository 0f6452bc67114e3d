"""`gregor leader-election`, shaped like Kafka's kafka-leader-election.sh (LeaderElectionCommand).

    gregor leader-election --election-type preferred|unclean
        (--topic T --partition P | --all-topic-partitions | --path-to-json-file F)

The JSON file holds `{"partitions": [{"topic": "t", "partition": 0}, ...]}`. The
text output is Kafka's:

    Successfully completed leader election (PREFERRED) for partitions t-0, t-1
    Valid replica already elected for partitions t-2
    Error completing leader election (PREFERRED) for partition: t-3: PREFERRED_LEADER_NOT_AVAILABLE: ...

and any failed partition makes the command exit 1 ("N replica(s) could not be elected").
With `--output json`: one document {"election_type", "succeeded": [{"topic","partition","leader"}],
"noop": [{"topic","partition","leader"}], "failed": [{"topic","partition","error","message"}]}.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import click

from gregor.cli.common import emit_json, obj, run
from gregor.client.admin import AdminClient
from gregor.common import errors
from gregor.rpc.v1 import common_pb2, controller_pb2

ELECTION_TYPES = {"preferred": controller_pb2.PREFERRED, "unclean": controller_pb2.UNCLEAN}


def parse_election_file(path: str) -> list[tuple[str, int]]:
    """The partitions of a Kafka election JSON file; a bad file is a usage error naming the option."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint="--path-to-json-file")
    except ValueError as exc:
        raise click.BadParameter(f"{path} is not valid JSON: {exc}", param_hint="--path-to-json-file")
    entries = raw.get("partitions") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise click.BadParameter(f'{path} must hold {{"partitions": [{{"topic": T, "partition": P}}, ...]}}',
                                 param_hint="--path-to-json-file")
    out: list[tuple[str, int]] = []
    for entry in entries:
        topic = entry.get("topic") if isinstance(entry, dict) else None
        partition = entry.get("partition") if isinstance(entry, dict) else None
        if not isinstance(topic, str) or not topic or not isinstance(partition, int) or isinstance(partition, bool) \
                or partition < 0:
            raise click.BadParameter(f"invalid partition entry {entry!r} in {path}: expected "
                                     f'{{"topic": "<name>", "partition": <non-negative int>}}',
                                     param_hint="--path-to-json-file")
        out.append((topic, partition))
    duplicates = sorted({f"{t}-{p}" for t, p in out if out.count((t, p)) > 1})
    if duplicates:
        raise click.BadParameter(f"Replica election data contains duplicate partitions: {','.join(duplicates)}",
                                 param_hint="--path-to-json-file")
    if not out:
        raise click.BadParameter(f"{path} lists no partitions", param_hint="--path-to-json-file")
    return out


def target_partitions(topic: Optional[str], partition: Optional[int], all_topic_partitions: bool,
                      json_file: Optional[str]) -> Optional[list[tuple[str, int]]]:
    """The partitions to elect (None: every partition), checking Kafka's option rules."""
    chosen = [name for name, given in (("--all-topic-partitions", all_topic_partitions), ("--topic", topic is not None),
                                       ("--path-to-json-file", json_file is not None)) if given]
    if len(chosen) != 1:
        raise click.UsageError("One and only one of the following options is required: "
                               "--all-topic-partitions, --topic, --path-to-json-file")
    if topic is not None and partition is None:
        raise click.UsageError("Missing required option(s): --partition (with --topic)")
    if partition is not None and topic is None:
        raise click.UsageError("Option --partition is only allowed with --topic")
    if topic is not None:
        assert partition is not None
        return [(topic, partition)]
    if json_file is not None:
        return parse_election_file(json_file)
    return None


@click.command("leader-election")
@click.option("--election-type", type=click.Choice(sorted(ELECTION_TYPES), case_sensitive=False), required=True,
              help="preferred: elect the preferred replica; unclean: elect a live replica for leaderless partitions")
@click.option("--topic", help="topic of the partition to elect (with --partition)")
@click.option("--partition", type=click.IntRange(min=0), help="partition to elect (with --topic)")
@click.option("--all-topic-partitions", is_flag=True, help="elect every partition of every topic")
@click.option("--path-to-json-file", "json_file", metavar="FILE",
              help='partitions to elect: {"partitions": [{"topic": "t", "partition": 0}, ...]}')
@click.pass_context
def leader_election(ctx: click.Context, election_type: str, topic: Optional[str], partition: Optional[int],
                    all_topic_partitions: bool, json_file: Optional[str]) -> None:
    """Elect leaders for partitions (Kafka's kafka-leader-election.sh)."""
    partitions = target_partitions(topic, partition, all_topic_partitions, json_file)
    kind = election_type.upper()
    request = controller_pb2.ElectLeadersRequest(
        election_type=ELECTION_TYPES[election_type.lower()], unclean=election_type.lower() == "unclean",
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions or []])

    async def go() -> controller_pb2.ElectLeadersResponse:
        async with AdminClient({"bootstrap.servers": obj(ctx).bootstrap()}) as a:
            return await a.elect_leaders(request)

    response = run(go())
    succeeded: list[dict[str, Any]] = []
    noop: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for r in response.results:
        entry: dict[str, Any] = {"topic": r.partition.topic, "partition": r.partition.partition}
        code = r.error.code if r.HasField("error") else errors.Code.NONE
        if code == errors.Code.NONE:
            succeeded.append({**entry, "leader": r.leader})
        elif code == errors.Code.ELECTION_NOT_NEEDED:
            noop.append({**entry, "leader": r.leader})
        else:
            failed.append({**entry, "error": errors.code_name(code), "message": r.error.message})
    if obj(ctx).json:
        emit_json({"election_type": kind, "succeeded": succeeded, "noop": noop, "failed": failed})
    else:
        name = lambda e: f"{e['topic']}-{e['partition']}"  # noqa: E731
        if succeeded:
            click.echo(f"Successfully completed leader election ({kind}) for partitions "
                       f"{', '.join(name(e) for e in succeeded)}")
        if noop:
            click.echo(f"Valid replica already elected for partitions {', '.join(name(e) for e in noop)}")
        for e in failed:
            click.echo(f"Error completing leader election ({kind}) for partition: {name(e)}: "
                       f"{e['error']}: {e['message']}")
    if failed:
        raise click.ClickException(f"{len(failed)} replica(s) could not be elected")
