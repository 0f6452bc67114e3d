"""`gregor analytics JOB`: the Spark jobs of spark/jobs/ through spark-submit (the spark extra installs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

from gregor.cli.common import CliContext

CliError = click.ClickException

JOBS = ("traffic", "lag", "health", "report", "all")


def jobs_dir() -> Path:
    try:
        import gregor_spark
    except ImportError:
        raise CliError("the Spark jobs need the spark extra: run `make spark-deps` "
                       "(pip install -e '.[spark]'; Spark needs Java 17+)") from None
    return Path(gregor_spark.__file__).resolve().parents[1] / "jobs"


@click.command("analytics", context_settings={"ignore_unknown_options": True})
@click.argument("job", type=click.Choice(JOBS))
@click.option("--out", default="analytics-out", show_default=True, help="Parquet tables, PNG charts, report.html")
@click.option("--master", default="local[2]", show_default=True, help="Spark master for spark-submit")
@click.argument("job_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def analytics(ctx: CliContext, job: str, out: str, master: str, job_args: tuple[str, ...]) -> None:
    """Run a Spark analytics job (traffic, lag, health, report, or all) with spark-submit."""
    script = jobs_dir() / f"{job}.py"
    submit = shutil.which("spark-submit", path=os.path.dirname(sys.executable)) or shutil.which("spark-submit")
    if submit is None:
        raise CliError("spark-submit not found: run `make spark-deps`")
    if job == "report":  # pandas over the output directory: no Spark, so no JVM to start
        cmd = [sys.executable, str(script), "--out", out]
    else:
        cmd = [submit, "--master", master, str(script), "--out", out, "--bootstrap", ctx.bootstrap()]
    # GREGOR_DATA_DIR: the health job finds the local cluster's Prometheus in its cluster.json.
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "GREGOR_DATA_DIR": ctx.data_dir}
    rc = subprocess.call(cmd + list(job_args), env=env)
    if rc:
        raise CliError(f"the {job} job exited with {rc}")
