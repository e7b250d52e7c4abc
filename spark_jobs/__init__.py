"""Tributary's data pipeline on Spark: the ``tributary`` data source and the jobs built on it.

* :mod:`spark_jobs.source` -- ``spark.read/readStream.format("tributary")`` and the writers of
  :mod:`spark_jobs.sink`; options in :mod:`spark_jobs.options` (named like Spark's Kafka source).
* :mod:`spark_jobs.loader` -- the offline loader: topic -> Parquet by date/hour, exactly once.
* :mod:`spark_jobs.audit` -- the paper's audit: producers' per-window counts
  (:mod:`spark_jobs.audit_events`) checked against what was loaded.
* :mod:`spark_jobs.pageviews` -- a streaming job: page views per minute, continuously.
* :mod:`spark_jobs.pipeline` -- the main job: produce, load, audit, report.

Every job runs with ``python -m spark_jobs.<job> --help`` or ``spark-submit``. Needs pyspark >=
4.2 (``latestOffset(start, limit)`` and read limits of the Python data source API) and pyarrow.
"""

MIN_PYSPARK = (4, 2)


def register(spark) -> None:
    """Register ``format("tributary")`` with ``spark`` (Python data sources are per session)."""
    import pyspark

    version = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
    if version < MIN_PYSPARK:
        raise RuntimeError(f"the tributary data source needs pyspark >= 4.2, found {pyspark.__version__}")
    from spark_jobs.source import TributaryDataSource

    spark.dataSource.register(TributaryDataSource)
