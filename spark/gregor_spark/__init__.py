"""Gregor for Apache Spark: the `gregor` data source (Spark's Kafka source schema and options) and
the analytics jobs of spark/jobs/.

    from gregor_spark import GregorDataSource
    spark.dataSource.register(GregorDataSource)
    spark.read.format("gregor").option("subscribe", "orders").load()
"""

from gregor_spark.source import GregorDataSource

__all__ = ["GregorDataSource"]
