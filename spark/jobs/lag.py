"""spark-submit entry point of the lag job (gregor_spark.jobs.lag); also `gregor analytics lag`."""

from gregor_spark.jobs.lag import main

if __name__ == "__main__":
    main()
