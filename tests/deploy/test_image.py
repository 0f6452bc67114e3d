"""What the Dockerfile's build stage produces, built here with the same commands (no Docker engine here).

The build stage runs `make setup` and then `pip wheel --no-deps .`; the runtime stage installs that wheel
and the native one maturin left in native/target/wheels. These tests build the project wheel the same
way and check that it carries the generated stubs and the role commands the chart starts.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.deploy.chart import ROOT

ROLE_SCRIPTS = ("gregor-broker", "gregor-controller", "gregor-coordinator", "gregor-gateway",
                "gregor-broker-shutdown", "gregor")


def test_the_wheel_step_of_the_dockerfile(tmp_path: Path) -> None:
    step = re.search(r"pip wheel (.*?) \.", (ROOT / "Dockerfile").read_text())
    assert step and "--no-deps" in step.group(1)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                    "--wheel-dir", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("gregor-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for stub in ("broker", "common", "controller", "coordinator", "gateway"):
        assert f"gregor/rpc/v1/{stub}_pb2.py" in names and f"gregor/rpc/v1/{stub}_pb2_grpc.py" in names
    for script in ROLE_SCRIPTS:
        assert re.search(rf"^{script} = ", entry_points, re.M), script
    # The native wheel the runtime stage copies from native/target/wheels (abi3: any CPython >= 3.11).
    assert list((ROOT / "native" / "target" / "wheels").glob("gregor_native-*-abi3-*.whl"))


def test_every_role_command_starts(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    for script in ROLE_SCRIPTS:
        done = subprocess.run([str(bin_dir / script), "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), f"{script}: {done.stderr}"
