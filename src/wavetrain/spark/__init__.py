"""The Spark engine: the jobs of :mod:`wavetrain.pipeline.jobs` (train, evaluate, k-fold,
classify) on a Spark cluster, with executor memory that does not grow with the data. This package
holds what is Spark's — the session, the table, task plumbing, the plan — and defines no job.

* :mod:`~wavetrain.spark.engine` — :class:`~wavetrain.spark.engine.SparkEngine`, the engine the jobs run on;
* :mod:`~wavetrain.spark.session` — settings, the master and Java checks, the session;
* :mod:`~wavetrain.spark.table` — the shared feature table (Parquet, keyed like the store);
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
