"""The autoencoder on the Spark engine (local[2]): it learns by gradient steps, so the Spark
executor trains it as two distributed-data-parallel ranks through its own fit (the normaliser over
every rank's share, equal steps per rank), and the detector's threshold is set on the driver
from the held-out recordings' scores, as locally."""
import numpy as np
import pytest

from wavetrain.data import load_dataset
from wavetrain.models import family
from wavetrain.pipeline.jobs import RunOptions, evaluate_model, train_model
from wavetrain.spark.support import spark_support

PARAMS = {"features": "logmel(bands=16)", "stack": "2", "hidden": "16", "bottleneck": "4", "layers": "1",
          "epochs": "3", "batch_size": "64", "valid_fraction": "0.3", "seed": "2"}


@pytest.fixture(scope="module")
def normal_ds(demo_csv):
    return load_dataset([demo_csv]).filter(lambda r: r.labels.get("state") == "healthy")


def test_the_spark_engine_trains_the_autoencoder():
    assert spark_support(family("autoencoder")) is None


def test_an_autoencoder_on_two_ranks_learns_the_local_normaliser_and_sets_its_threshold_on_held_out_windows(
        job, normal_ds, demo_csv):
    local, _ = train_model(normal_ds, "state", "autoencoder", PARAMS, RunOptions())
    on_spark, prep = train_model(normal_ds, "state", "autoencoder", PARAMS, RunOptions(), engine=job)
    assert on_spark.train_info_["processes"] == 2 and on_spark.train_info_["attempts"] == 1
    assert [h["epoch"] for h in on_spark.history_ if "epoch" in h][-1] == 3
    # the normaliser is computed over both ranks' shares: the local one
    np.testing.assert_allclose(on_spark.norm_mean_, local.norm_mean_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(on_spark.norm_sd_, local.norm_sd_, rtol=1e-5, atol=1e-6)
    # the threshold is set on the driver, on the same held-out windows as locally
    assert np.isfinite(on_spark.threshold_)
    assert on_spark.train_info_["threshold_windows"] == local.train_info_["threshold_windows"]
    assert on_spark.train_info_["threshold_on"].startswith("held-out normal windows")
    everything = load_dataset([demo_csv])
    ours = evaluate_model(on_spark, everything, "state", RunOptions(), normal="healthy", engine=job)
    theirs = evaluate_model(local, everything, "state", RunOptions(), normal="healthy")
    assert ours["auc"] > 0.5 and abs(ours["auc"] - theirs["auc"]) < 0.25
