"""spark-submit entry point of the report job (gregor_spark.jobs.report); also `gregor analytics report`."""

from gregor_spark.jobs.report import main

if __name__ == "__main__":
    main()
