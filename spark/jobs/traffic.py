"""spark-submit entry point of the traffic job (gregor_spark.jobs.traffic); also `gregor analytics traffic`."""

from gregor_spark.jobs.traffic import main

if __name__ == "__main__":
    main()
