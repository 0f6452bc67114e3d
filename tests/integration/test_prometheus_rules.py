"""The shared rules file (deploy/prometheus/gregor-rules.yaml) passes `promtool check rules`, and every
alert has promtool unit tests (deploy/prometheus/tests/): a case that fires and one that must not."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gregor.cli.local_prometheus import prometheus_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "gregor-rules.yaml"
TESTS = ROOT / "deploy" / "prometheus" / "tests" / "gregor-rules.test.yaml"


def test_promtool_check_rules() -> None:
    r = subprocess.run([prometheus_binary("promtool"), "check", "rules", str(RULES)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert() -> None:
    alerts = re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.M)
    tested = set(re.findall(r"alertname: (\w+)", TESTS.read_text()))
    assert len(alerts) >= 10 and set(alerts) <= tested, set(alerts) - tested
    r = subprocess.run([prometheus_binary("promtool"), "test", "rules", str(TESTS)], capture_output=True, text=True,
                       timeout=120, cwd=TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_a_broken_alert_expectation_fails(tmp_path: Path) -> None:
    """The unit tests can fail: the same firing case with a wrong expected label is reported."""
    broken = TESTS.read_text().replace("exp_labels: {severity: critical, cluster: split}",
                                       "exp_labels: {severity: warning, cluster: split}")
    assert broken != TESTS.read_text()
    path = tmp_path / "broken.test.yaml"
    path.write_text(broken.replace("../gregor-rules.yaml", str(RULES)))
    r = subprocess.run([prometheus_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "GregorActiveControllerCount" in r.stdout + r.stderr
