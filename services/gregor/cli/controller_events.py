"""`gregor controller events [--watch]`: a live view into the controllers' event managers (seed 001)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import click

from gregor.cli.common import obj, run

WATCH_INTERVAL_S = 1.0  # --watch refresh period: the event queue moves in milliseconds, people read in seconds


def _controller_targets(data_dir: str, flag: str | None) -> list[str]:
    """--controller HOST:PORT[,...], else every controller of DATA_DIR/cluster.json."""
    if flag:
        return [t.strip() for t in flag.split(",") if t.strip()]
    path = os.path.join(data_dir, "cluster.json")
    try:
        with open(path) as f:
            procs = json.load(f).get("processes", [])
    except FileNotFoundError:
        raise click.ClickException(f"no controller to ask: pass --controller HOST:PORT or start a local cluster "
                                   f"with `gregor cluster up` (looked for {path})") from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from None
    targets = [p["grpc"] for p in procs if p.get("role") == "controller"]
    if not targets:
        raise click.ClickException(f"{path} lists no controller (a standalone broker has none)")
    return targets


async def describe(targets: list[str], last: int, all_controllers: bool) -> list[dict[str, Any]]:
    """Ask each controller; the active one only unless all_controllers. Unreachable ones are reported."""
    import grpc

    from gregor.common import errors
    from gregor.common.rpc import channel
    from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc

    views, failures = [], []
    for target in targets:
        async with channel(target) as ch:
            try:
                resp = await controller_pb2_grpc.ControllerServiceStub(ch).DescribeControllerEvents(
                    controller_pb2.DescribeControllerEventsRequest(max_processed=last), timeout=5)
            except grpc.RpcError as exc:
                failures.append(f"{target}: {errors.from_rpc_error(exc)}")
                continue
        views.append({
            "controller_id": resp.controller_id, "endpoint": target, "active": resp.active,
            "controller_epoch": resp.controller_epoch, "state": resp.state,
            "queued": [{"name": q.name, "state": q.state, "enqueue_age_ms": round(q.enqueue_age_seconds * 1000, 3)}
                       for q in resp.queued],
            "processed": [{"name": e.name, "state": e.state, "queue_time_ms": round(e.queue_time_seconds * 1000, 3),
                           "processing_time_ms": round(e.processing_time_seconds * 1000, 3),
                           "age_s": round(e.age_seconds, 3), "error": e.error} for e in resp.processed]})
    if not views:
        raise click.ClickException("no controller answered: " + "; ".join(failures))
    if not all_controllers:
        active = [v for v in views if v["active"]]
        views = active or views[:1]
    return views


def render_text(view: dict[str, Any]) -> str:
    role = "active" if view["active"] else "standby"
    lines = [f"Controller: {view['controller_id']} ({role})\tEpoch: {view['controller_epoch']}\t"
             f"ControllerState: {view['state']}\tEndpoint: {view['endpoint']}",
             f"Queued events ({len(view['queued'])}, oldest first):"]
    lines += [f"  {q['name']:<36} {q['state']:<28} age {q['enqueue_age_ms']:10.3f} ms" for q in view["queued"]]
    lines.append(f"Last processed events ({len(view['processed'])}, newest first):")
    lines.append(f"  {'EVENT':<36} {'STATE':<28} {'QUEUE_MS':>10} {'PROCESS_MS':>11} {'AGO_S':>9}  ERROR")
    lines += [f"  {e['name']:<36} {e['state']:<28} {e['queue_time_ms']:10.3f} {e['processing_time_ms']:11.3f} "
              f"{e['age_s']:9.3f}  {e['error']}" for e in view["processed"]]
    return "\n".join(lines)


@click.group("controller")
def controller_group() -> None:
    """Look into the controllers."""


@controller_group.command("events")
@click.option("--controller", "controller_flag", metavar="HOST:PORT[,...]",
              help="controller endpoints (default: the controllers of DATA_DIR/cluster.json)")
@click.option("--last", type=click.IntRange(1, 100), default=20, show_default=True,
              help="processed events to show, newest first")
@click.option("--all", "all_controllers", is_flag=True, help="show standbys too, not only the active controller")
@click.option("--watch", is_flag=True, help="refresh every second until interrupted")
@click.option("--iterations", type=click.IntRange(min=1), default=None, hidden=True,
              help="with --watch: stop after this many refreshes (tests)")
@click.pass_context
def events(ctx: click.Context, controller_flag: str | None, last: int, all_controllers: bool, watch: bool,
           iterations: int | None) -> None:
    """ControllerState, the queued events with their enqueue age, and the last processed events with
    their state, queue time and processing time."""
    settings = obj(ctx)
    targets = _controller_targets(settings.data_dir, controller_flag)
    rounds = 0
    while True:
        views = run(describe(targets, last, all_controllers))
        if settings.json:
            for view in views:
                click.echo(json.dumps(view))
        else:
            if watch:
                click.clear()
            click.echo("\n\n".join(render_text(v) for v in views))
        rounds += 1
        if not watch or (iterations is not None and rounds >= iterations):
            return
        time.sleep(WATCH_INTERVAL_S)
