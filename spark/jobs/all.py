"""spark-submit entry point of the all job (gregor_spark.jobs.all); also `gregor analytics all`."""

from gregor_spark.jobs.all import main

if __name__ == "__main__":
    main()
