"""The Spark engine: the same jobs as the local engine (features, train, evaluate, classify) on a
Spark cluster, with executor memory that does not grow with the data.

* :mod:`~wavetrain.spark.session` — settings, the Java check and the session;
* :mod:`~wavetrain.spark.table` — the shared feature table (Parquet, keyed like the store);
* :mod:`~wavetrain.spark.jobs` — extraction, GMM EM as map and reduce, neural training through
  ``TorchDistributor``, batch classification;
* :mod:`~wavetrain.spark.standalone` — a standalone master and workers on 127.0.0.1 (tests,
  benchmarks).

Nothing here is imported by the local engine: ``pyspark`` is imported only when a Spark job runs.
"""
