"""Analytics jobs over a Gregor cluster's topics and metrics (run by spark/jobs/*.py, `gregor analytics JOB`
and `make analytics`). Each job writes Parquet tables and PNG charts under an output directory; report.py
puts them into one HTML page."""
