"""The Spark engine: the same jobs as the local engine (features, train, evaluate, classify) on a
Spark cluster, with executor memory that does not grow with the data.

* :mod:`~wavetrain.spark.session` — settings, the master and Java checks, the session;
* :mod:`~wavetrain.spark.table` — the shared feature table (Parquet, keyed like the store);
* :mod:`~wavetrain.spark.engine` — the jobs: train, evaluate (k-fold or a model file), classify;
* :mod:`~wavetrain.spark.jobs` — what every Spark job shares (tasks on executors, errors);
* :mod:`~wavetrain.spark.extract`, :mod:`~wavetrain.spark.shards` — extraction, and the work of a task;
* :mod:`~wavetrain.spark.passes` — a model's passes of statistics, each a Spark job;
* :mod:`~wavetrain.spark.neural` — distributed training through ``TorchDistributor``;
* :mod:`~wavetrain.spark.support`, :mod:`~wavetrain.spark.plan` — what Spark trains (from the tags)
  and the executors' memory;
* :mod:`~wavetrain.spark.standalone` — a standalone master and workers on 127.0.0.1 (tests,
  benchmarks).

Nothing here is imported by the local engine: ``pyspark`` is imported only when a Spark job runs.
"""
