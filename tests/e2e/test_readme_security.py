"""The README's `cluster up --tls --authorizer` walk-through, run as written (issue 23: the README shows it).

The bash block after "With `--authorizer` too" is taken from README.md itself, so the test follows the README
when it changes. Each of its commands runs in order in one shell, in a scratch directory where `.venv` points
at this checkout's: every command must succeed, except the one the README marks TOPIC_AUTHORIZATION_FAILED,
which must fail (non-zero exit) and say so. The block's last command stops the cluster; a trap stops it too if
a command before fails.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "With `--authorizer` too"
DENIED = "TOPIC_AUTHORIZATION_FAILED"


def readme_block() -> list[str]:
    """The commands of the first bash block after MARKER, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index(MARKER):]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block is not None, "the README's --authorizer example has no bash block"
    return [c.strip() for c in block.group(1).replace("\\\n", " ").splitlines() if c.strip()]


def script(commands: list[str]) -> str:
    lines = ["set -u", "trap '.venv/bin/gregor cluster down --data-dir .gregor-sec >/dev/null 2>&1 || true' EXIT"]
    for n, raw in enumerate(commands, 1):
        command = re.sub(r"\s+#\s.*$", "", raw)  # the README's trailing comments (no '#' inside its commands)
        if raw.rstrip().endswith(f"# {DENIED}"):
            lines.append(f"if {command} 2>denied.txt; then echo 'step {n} was not refused' >&2; exit {n}; fi")
            lines.append(f"grep -q {DENIED} denied.txt || {{ cat denied.txt >&2; exit {n}; }}")
        else:
            lines.append(f"{command} || {{ echo 'step {n} failed' >&2; exit {n}; }}")
    return "\n".join(lines) + "\n"


def test_the_readme_authorizer_walk_through_runs_as_written(tmp_path: Path) -> None:
    commands = readme_block()
    assert any(c.startswith(".venv/bin/gregor cluster up") and "--tls --authorizer" in c for c in commands)
    assert sum(c.rstrip().endswith(f"# {DENIED}") for c in commands) == 1, commands
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "services"),
                                                                       os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(["bash", "-c", script(commands)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, f"exit {run.returncode}: {commands[run.returncode - 1] if 0 < run.returncode <= len(commands) else ''}\nstdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    # the billing principal's record, written once its ACL was added, is on the topic's replicas (RF 3: three copies)
    logs = list((tmp_path / ".gregor-sec").rglob("invoices-*/*.log"))
    assert len(logs) == 9 and sum(1 for p in logs if p.stat().st_size > 0) == 3, {str(p): p.stat().st_size for p in logs}
