"""``hmm`` on the Spark engine (local[2]): its Baum-Welch passes, written against the executor
protocol, give the local model (sums in another order: equal to rounding)."""
import numpy as np

from wavetrain.data import load_dataset
from wavetrain.pipeline.jobs import RunOptions, train_model
from wavetrain.spark import engine


def test_hmm_on_spark_equals_the_local_fit(job, demo_csv):
    ds = load_dataset([demo_csv])
    params = {"states": "3", "mixtures": "2", "max_iter": "4"}
    local, _ = train_model(ds, "state", "hmm", params, RunOptions())
    on_spark, prep = engine.train(job, ds, "state", "hmm", params)
    assert len(prep.tasks()) > 1
    assert on_spark.labels_ == local.labels_
    assert [h["mean_loglik"] for h in on_spark.history_] == [h["mean_loglik"] for h in local.history_]
    for name in ("log_trans_", "weights_", "means_", "variances_"):
        np.testing.assert_allclose(getattr(on_spark, name), getattr(local, name), rtol=1e-7, atol=1e-9, err_msg=name)
