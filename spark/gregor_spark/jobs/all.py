"""Every job in one Spark application (one JVM start), then the HTML report."""

from __future__ import annotations

import os
from typing import Optional

from gregor_spark.jobs import health, lag, report, traffic
from gregor_spark.jobs.common import parser, session


def main(argv: Optional[list[str]] = None) -> None:
    p = parser("All analytics jobs and the HTML report")
    p.add_argument("--topics", default="[^_].*", help="regular expression of topics for the traffic job")
    p.add_argument("--window", default="1 minute", help="traffic window duration")
    p.add_argument("--prometheus", default=None, help="Prometheus base URL for the health job")
    p.add_argument("--minutes", type=float, default=30.0, help="how far back the health job queries Prometheus")
    a = p.parse_args(argv)
    spark = session("gregor-analytics", a.master)
    traffic.run(spark, os.path.join(a.out, "traffic"), bootstrap=a.bootstrap, pattern=a.topics, window=a.window)
    lag.run(spark, os.path.join(a.out, "lag"), bootstrap=a.bootstrap)
    health.run(spark, os.path.join(a.out, "health"), bootstrap=a.bootstrap, prometheus=a.prometheus,
               minutes=a.minutes)
    spark.stop()
    print(report.write(a.out))


if __name__ == "__main__":
    main()
