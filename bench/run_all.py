"""Runs every bench/bench_*.py in turn (`make bench`); extra arguments such as
--quick are passed to each. Exits non-zero if any benchmark failed to run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).resolve().parent
    failed = []
    for script in sorted(here.glob("bench_*.py")):
        print(f"== {script.name} {' '.join(sys.argv[1:])}", flush=True)
        if subprocess.call([sys.executable, str(script), *sys.argv[1:]]) != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
