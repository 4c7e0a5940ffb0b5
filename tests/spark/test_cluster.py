"""The Spark engine on a real standalone cluster (a master and two one-core workers on
127.0.0.1): a small cnn trains on two DDP ranks, one per worker; a GMM trained there equals the
local one, also when a worker is killed in the middle of its EM jobs (Spark re-runs the lost
tasks on the other worker). The cnn runs first: after the kill one worker is left."""
from __future__ import annotations

import threading
import time

import pytest

from tests.spark.test_engine import _same_gmm
from wavetrain.data import load_dataset
from wavetrain.pipeline.jobs import RunOptions, train_model
from wavetrain.spark import engine
from wavetrain.spark.session import SparkSettings, spark_session
from wavetrain.spark.standalone import StandaloneCluster
from wavetrain.spark.table import FeatureTable

#: Enough EM passes (tol 0: every one of max_iter) that a worker dies in the middle of them.
GMM = {"components": "3", "tol": "0", "max_iter": "25"}


@pytest.fixture(scope="module")
def cluster_job(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    with StandaloneCluster(workers=2, work_dir=str(work / "cluster")) as cluster, \
            spark_session(SparkSettings(cluster.url, {"spark.executor.memory": "512m", "spark.cores.max": "2"})
                          ) as spark:
        yield cluster, engine.SparkJob(spark, FeatureTable(str(work / "table")))


def test_a_small_cnn_trains_on_two_ranks_of_the_cluster(cluster_job, demo_csv):
    _, job = cluster_job
    ds = load_dataset([demo_csv])
    model, prep = engine.train(job, ds, "state", "cnn", {"features": "logmel(bands=16)", "clip_ms": "500",
                                                         "epochs": "2", "batch_size": "8", "valid_fraction": "0"})
    assert model.train_info_["processes"] == 2 and model.train_info_["attempts"] == 1
    assert [h["epoch"] for h in model.history_ if "epoch" in h][-1] == 2
    assert model.predict([prep.source.gram(ds[0])[:20]])[0] in model.labels_


def test_a_gmm_trained_on_the_cluster_equals_the_local_one_after_a_worker_dies(cluster_job, demo_csv):
    cluster, job = cluster_job
    ds = load_dataset([demo_csv])
    local, _ = train_model(ds, "state", "gmm", GMM, RunOptions())
    sc = job.spark.sparkContext
    assert sc.master == cluster.url and sc.defaultParallelism == 2
    engine.extract_features(job, ds, local.params["features"])
    seen: dict = {}

    def kill_during_em() -> None:
        tracker, first = sc.statusTracker(), None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            jobs = tracker.getActiveJobsIds()
            if jobs:
                first = jobs[0] if first is None else first
                if jobs[0] >= first + 4:                  # the init sample and a few EM passes done
                    seen["rss"] = cluster.executor_python_rss()
                    seen["killed_during"] = jobs[0]
                    cluster.kill_worker(0)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_during_em, daemon=True)
    killer.start()
    on_cluster, _ = engine.train(job, ds, "state", "gmm", GMM)
    killer.join(timeout=5)
    assert "killed_during" in seen, "no worker was killed during the EM jobs"
    assert len(cluster.worker_pids()) == 1
    assert all(v > 0 for v in seen["rss"].values())       # executors' Python workers were running
    assert on_cluster.train_info_["em_passes"] == 25
    _same_gmm(on_cluster, local)
