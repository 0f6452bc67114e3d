"""A clean restart of a broker with many partitions (issue 24), real processes: etcd, a controller, two brokers,
600 partitions at RF 2 (600 replicas on each broker), one acks=all record in each.

SIGTERM one broker: it shuts down cleanly (its log says where the time went, phase by phase) and closes its
600 logs on num.recovery.threads.per.data.dir threads; every partition directory is left with the native log's
clean-shutdown marker and a producer snapshot at its log end, so the next start recovers no log (the
gregor_broker_logs_loaded_total counter and the LeaderAndIsr line say recovery was skipped for all 600). The
control: after a SIGKILL the same broker recovers all 600, so the check can tell the two apart.

The long form is `make bench-clean-restart` (bench/bench_clean_restart.py, RF 3 on 3 brokers, default 2,000
partitions); its before/after numbers are in docs/operations.md ("Restarting a broker with many partitions").
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from gregor.cli.local_cluster import Process
from gregor.client.producer import Producer
from gregor.broker.log_manager import CLEAN_SHUTDOWN_FILE
from tests.helpers.cluster import restart_broker, running_cluster, stop_process
from tests.helpers.wait import until
from tests.integration.test_cli import gregor, ok
from tests.integration.test_fetch_sessions import scrape

PARTITIONS = 600
THREADS = 3  # num.recovery.threads.per.data.dir (Kafka's default is 2): the close line names it
LOADED = "gregor_broker_logs_loaded_total"


def loaded(broker: Process, recovery: str) -> float:
    return scrape(broker.metrics, LOADED, recovery=recovery)


def all_loaded(broker: Process) -> bool:
    return loaded(broker, "skipped") + loaded(broker, "performed") >= PARTITIONS


async def test_a_broker_with_many_partitions_stops_cleanly_and_its_next_start_recovers_no_log(tmp_path: Path) -> None:
    overrides = {"num.recovery.threads.per.data.dir": str(THREADS), "broker.session.timeout.ms": "4000"}
    with running_cluster(str(tmp_path), brokers=2, controllers=1, broker_overrides=overrides) as c:
        boot = c.bootstrap
        ok(gregor("topics", "create", "many", "--partitions", str(PARTITIONS), "--replication-factor", "2",
                  bootstrap=boot))
        async with Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5}) as p:
            sent = [await p.send("many", b"v", partition=i) for i in range(PARTITIONS)]
            await p.flush()
            assert [(await f).offset for f in sent] == [0] * PARTITIONS  # acks=all: both replicas have it
        victim = next(b for b in c.by_role("broker") if b.id == 1)

        os.kill(victim.pid, signal.SIGTERM)
        await until(lambda: not victim.alive(), 120, "broker 1 exited after SIGTERM")
        text = Path(victim.log).read_text()
        assert "[Broker id=1] shut down completed in" in text, text[-3000:]
        assert f"closed {PARTITIONS} logs on {THREADS} threads" in text, text[-3000:]
        for phase in ("controlled shutdown", "replication", "gRPC server", "log manager"):
            assert re.search(rf"\[Broker id=1\] {re.escape(phase)}.* shut down in \d+\.\d+ s", text), phase
        dirs = sorted(Path(victim.data_dir).glob("many-*"))
        assert len(dirs) == PARTITIONS
        for d in dirs:
            assert (d / CLEAN_SHUTDOWN_FILE).exists(), d
            assert (d / f"{1:020d}.snapshot").exists(), d  # the producer state at the log end, taken at close

        back = restart_broker(c, victim, overrides)
        await until(lambda: all_loaded(back), 120, "broker 1 reopened every log")
        assert (loaded(back, "skipped"), loaded(back, "performed")) == (PARTITIONS, 0)
        text = Path(back.log).read_text()
        skipped = sum(int(n) for n in re.findall(r"recovery skipped for (\d+) shut down cleanly, 0 recovered", text))
        assert skipped == PARTITIONS, text[-3000:]

        stop_process(back, signal.SIGKILL)  # the control: a crash leaves no marker, and every log is recovered
        again = restart_broker(c, back, overrides)
        await until(lambda: all_loaded(again), 120, "broker 1 reopened every log after the crash")
        assert (loaded(again, "skipped"), loaded(again, "performed")) == (0, PARTITIONS)
