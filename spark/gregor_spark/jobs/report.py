"""One HTML page from the jobs' output directory: every PNG chart, then every Parquet table (first rows)."""

from __future__ import annotations

import datetime
import glob
import html
import os
from typing import Optional

ROWS_SHOWN = 40  # rows of each table in the page; the Parquet files hold all of them

SECTIONS = (("traffic", "Topic traffic"), ("lag", "Consumer lag"), ("health", "Cluster health"))


def write(out: str, title: str = "Gregor analytics") -> str:
    import pandas as pd

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><p>generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC "
             f"from {html.escape(os.path.abspath(out))}</p>"]
    for sub, heading in SECTIONS:
        d = os.path.join(out, sub)
        if not os.path.isdir(d):
            continue
        parts.append(f"<h2>{heading}</h2>")
        for png in sorted(glob.glob(os.path.join(d, "*.png"))):
            parts.append(f"<p><img src='{sub}/{os.path.basename(png)}' alt='{os.path.basename(png)}'></p>")
        for table in sorted(glob.glob(os.path.join(d, "*.parquet"))):
            df = pd.read_parquet(table)
            name = os.path.basename(table)[:-len(".parquet")]
            parts.append(f"<h3>{name} ({len(df)} rows)</h3>" + df.head(ROWS_SHOWN).to_html(index=False))
    parts.append("</body></html>")
    path = os.path.join(out, "report.html")
    with open(path, "w") as f:
        f.write("\n".join(parts))
    return path


def main(argv: Optional[list[str]] = None) -> None:
    from gregor_spark.jobs.common import parser

    a = parser("The HTML report of the jobs' output directory").parse_args(argv)
    print(write(a.out))


if __name__ == "__main__":
    main()
