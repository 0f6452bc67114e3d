"""An unclean restart (issue 24), real processes: etcd, a controller, two brokers with a 30 s session timeout.

A SIGKILLed broker leaves its registration in etcd until the lease expires; relaunched at once, it holds its
log dirs' `.lock` (so the previous process is gone), finds its key bound to the lease that process recorded in
`.registration`, revokes it and registers at once with a new broker epoch, well inside the 30 s, then takes its
place in the ISR again. The control: a recorded lease that is not the key's (another live process with the same
id) is not revoked, and the restart waits for the lease to run out.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from gregor.broker.log_dir_lock import REGISTRATION_FILE
from gregor.cli.local_cluster import Process
from tests.helpers.cluster import restart_broker, running_cluster, stop_process
from tests.helpers.wait import until
from tests.integration.test_cli import gregor, ok
from tests.integration.test_fetch_sessions import scrape

SESSION_MS = 30_000
REVOKED = "gregor_broker_stale_registrations_revoked_total"


def isr_full(boot: str, topic: str, partitions: int) -> bool:
    rows = [line for line in ok(gregor("topics", "describe", topic, bootstrap=boot)).splitlines() if "\tIsr: " in line]
    return len(rows) == partitions and all(line.split("Isr:")[1].split()[0].count(",") == 1 for line in rows)


def kill_and_restart(c, victim: Process, overrides: dict[str, str]) -> tuple[Process, float]:  # type: ignore[no-untyped-def]
    stop_process(victim, signal.SIGKILL)
    started = time.monotonic()
    back = restart_broker(c, victim, overrides)  # returns once the broker is registered and serving
    return back, time.monotonic() - started


async def test_a_sigkilled_broker_revokes_its_previous_registration_and_is_back_within_seconds(tmp_path: Path) -> None:
    overrides = {"broker.session.timeout.ms": str(SESSION_MS)}
    with running_cluster(str(tmp_path), brokers=2, controllers=1, broker_overrides=overrides) as c:
        boot = c.bootstrap
        ok(gregor("topics", "create", "t", "--partitions", "4", "--replication-factor", "2", bootstrap=boot))
        await until(lambda: isr_full(boot, "t", 4), 30, "every ISR full")
        victim = next(b for b in c.by_role("broker") if b.id == 1)
        recorded = json.loads((Path(victim.data_dir) / REGISTRATION_FILE).read_text())
        assert recorded["broker_id"] == 1 and recorded["lease_id"] > 0

        back, took = kill_and_restart(c, victim, overrides)
        assert took < SESSION_MS / 1000 / 3, f"re-registered in {took:.1f} s: the old lease was waited out"
        assert back.extra["broker_epoch"] > victim.extra["broker_epoch"], "a new broker epoch"
        text = Path(back.log).read_text()
        assert f"revoked the registration lease {recorded['lease_id']:x} of its previous process" in text, text[-3000:]
        assert scrape(back.metrics, REVOKED) == 1
        assert json.loads((Path(back.data_dir) / REGISTRATION_FILE).read_text())["lease_id"] != recorded["lease_id"]
        # The controller saw the old incarnation go and the new one come: it rejoins every ISR it was in.
        await until(lambda: isr_full(boot, "t", 4), 60, "the restarted broker back in every ISR")


async def test_a_registration_on_another_lease_than_the_recorded_one_is_waited_out(tmp_path: Path) -> None:
    session_ms = 6_000
    overrides = {"broker.session.timeout.ms": str(session_ms)}
    with running_cluster(str(tmp_path), brokers=1, controllers=1, broker_overrides=overrides) as c:
        victim = c.by_role("broker")[0]
        record = Path(victim.data_dir) / REGISTRATION_FILE
        real = json.loads(record.read_text())["lease_id"]
        record.write_text(json.dumps({"broker_id": victim.id, "lease_id": real + 1}))  # not the key's lease

        back, took = kill_and_restart(c, victim, overrides)
        assert took >= session_ms / 1000 / 2, f"registered after {took:.1f} s: a lease not ours was revoked"
        text = Path(back.log).read_text()
        # Said once for that lease, not on every 0.2 s retry while it runs out (~20 retries here).
        assert text.count(f"is registered with lease {real:x}, not {real + 1:x}") == 1, text[-3000:]
        assert "revoked the registration lease" not in text
        assert scrape(back.metrics, REVOKED) == 0
