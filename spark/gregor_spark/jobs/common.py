"""What every analytics job shares: the SparkSession, the `gregor` source, Parquet + PNG output."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

from gregor_spark import GregorDataSource


def session(app: str, master: Optional[str] = None) -> Any:
    """A SparkSession with the gregor source registered (spark-submit's master unless one is given)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app).config("spark.sql.session.timeZone", "UTC") \
        .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
    if master:
        b = b.master(master)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(GregorDataSource)
    return spark


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--bootstrap", default=None, help="any broker host:port (default: GREGOR_BOOTSTRAP or the "
                                                     "local cluster's cluster.json)")
    p.add_argument("--out", default="analytics-out", help="directory for Parquet tables, PNG charts and report.html")
    p.add_argument("--master", default=None, help="Spark master when not run by spark-submit (e.g. local[2])")
    return p


def reader(spark: Any, bootstrap: Optional[str]) -> Any:
    r = spark.read.format("gregor")
    return r.option("bootstrap", bootstrap) if bootstrap else r


def save(df: Any, out: str, name: str, order: list[str]) -> Any:
    """One result table, collected once (results are small aggregates), sorted, written as a Parquet file
    by the driver and returned as pandas: one Spark job per table instead of a write plus a collect."""
    pdf = df.toPandas().sort_values(order, kind="stable").reset_index(drop=True)
    pdf.to_parquet(os.path.join(out, name + ".parquet"), index=False)
    return pdf


def chart(out: str, name: str, draw: Any, title: str) -> str:
    """One PNG chart drawn by draw(ax); returns its file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    draw(ax)
    ax.set_title(title)
    fig.tight_layout()
    path = os.path.join(out, name + ".png")
    fig.savefig(path)
    plt.close(fig)
    return os.path.basename(path)
