"""GMM EM on Spark: the passes of :func:`~wavetrain.models.passes.fit_mixture` run by the Spark
executor (:class:`~wavetrain.spark.passes.SparkExecutor`), each a map over the part tasks and a
tree aggregation to the driver.

1. the init sample: every task keeps a :class:`~wavetrain.models.mixture.KeyedSample` per label,
   and merging them gives exactly the sample one pass of the local engine keeps;
2. one job per EM pass: every task streams its windows and returns each active label's
   sufficient statistics under the current mixtures (broadcast with the pass); the driver adds
   them and runs the M-step (and SQUAREM) through the same :func:`~wavetrain.models.mixture.em_fit`
   as the local engine, so the model equals the local one up to the order of summation;
3. the training score statistics (mean and sd of each label's window scores).

No task holds more than one recording's gram, its label statistics and the E-step's blocks.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wavetrain.models.gmm import GMMClassifier
from wavetrain.models.mixture import LabelEM
from wavetrain.models.passes import fit_mixture
from wavetrain.progress import progress_counter
from wavetrain.spark.jobs import job_progress
from wavetrain.spark.passes import SparkExecutor
from wavetrain.spark.shards import PartTask
from wavetrain.spark.table import FeatureTable
from wavetrain.windows import Windowing

__all__ = ["fit_gmm"]


def fit_gmm(spark: Any, model: GMMClassifier, table: FeatureTable, tasks: Sequence[PartTask], *,
            labels: list[str], feature_dim: int, rate: int | None, channels: int | None,
            progress: bool = False) -> GMMClassifier:
    """Fit ``model`` on the labelled windows of ``tasks`` (label indices into ``labels``)."""
    data = SparkExecutor(spark, table, tasks, labels=labels, feature_dim=feature_dim, rate=rate, channels=channels,
                         spec=model.feature_spec, windowing=Windowing.from_params(model.params))
    bar = progress_counter(desc=f"{model.name} EM", total=model.params["max_iter"], unit="pass", enable=progress)

    def on_pass(ems: list[LabelEM]) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix(active=sum(not em.done for em in ems))

    try:
        with job_progress(spark.sparkContext, model.name, enable=progress):
            fit_mixture(model, data, on_pass=on_pass)
    finally:
        if bar is not None:
            bar.close()
    model.train_info_.update(tasks=len(tasks))
    return model
