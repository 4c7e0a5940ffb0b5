"""The Spark engine on a real standalone cluster (a master and two one-core workers on
127.0.0.1): a small cnn trains on two DDP ranks, one per worker, and finishes when one executor
dies after the first epoch's checkpoint (the worker starts a new executor, the training stage
runs again from the checkpoint); a GMM trained there equals the local one, also when a worker is
killed in the middle of its EM jobs (Spark re-runs the lost tasks on the other worker). The cnn
tests run first, in this order: after the worker's kill one worker is left. Without the cluster:
the driver's retries wait for the task slots of a lost executor, and only for those."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

import pytest

from tests.spark.test_engine import _same_gmm
from wavetrain.core.errors import UserError
from wavetrain.data import load_dataset
from wavetrain.pipeline.jobs import RunOptions, train_model
from wavetrain.spark import engine, neural
from wavetrain.spark import passes as spark_passes
from wavetrain.spark.session import SparkSettings, spark_session
from wavetrain.spark.standalone import StandaloneCluster
from wavetrain.spark.table import FeatureTable
from wavetrain.train.callbacks import Callback
from wavetrain.train.checkpoint import checkpoint_path, load_checkpoint

#: Enough EM passes (tol 0: every one of max_iter) that a worker dies in the middle of them.
GMM = {"components": "3", "tol": "0", "max_iter": "25"}
CNN = {"features": "logmel(bands=16)", "clip_ms": "500", "batch_size": "8", "valid_fraction": "0"}
#: Seconds a wait of the executor-kill test lasts at most (the checkpoint, the kill, the hold).
WAIT_S = 180.0


@pytest.fixture(scope="module")
def cluster_job(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    with StandaloneCluster(workers=2, work_dir=str(work / "cluster")) as cluster, \
            spark_session(SparkSettings(cluster.url, {"spark.executor.memory": "512m", "spark.cores.max": "2"})
                          ) as spark:
        yield cluster, engine.SparkEngine(spark, FeatureTable(str(work / "table")))


def test_a_small_cnn_trains_on_two_ranks_of_the_cluster(cluster_job, demo_csv):
    _, job = cluster_job
    ds = load_dataset([demo_csv])
    model, prep = train_model(ds, "state", "cnn", dict(CNN, epochs="2"), RunOptions(), engine=job)
    assert model.train_info_["processes"] == 2 and model.train_info_["attempts"] == 1
    assert [h["epoch"] for h in model.history_ if "epoch" in h][-1] == 2
    assert model.predict([prep.source.gram(ds[0])[:20]])[0] in model.labels_


class _Stages:
    """Stands in for ``TorchDistributor``: each run raises the next of ``outcomes`` (an exception)
    or returns it; ``runs`` counts the runs."""

    def __init__(self, outcomes: list):
        self.outcomes, self.runs = list(outcomes), 0

    def __call__(self, **kw):
        stages = self

        class Distributor:
            logger = logging.getLogger("test-distributor")

            def run(self, fn, *args):
                stages.runs += 1
                out = stages.outcomes.pop(0)
                if isinstance(out, Exception):
                    raise out
                return out

        return Distributor()


SLOTS = RuntimeError(f"org.apache.spark.scheduler.{neural.SLOTS_CHECK_FAILED}: [BARRIER_...]")
LOST = RuntimeError("Could not recover from a failed barrier ResultStage: ExecutorLostFailure")


@pytest.mark.parametrize("outcomes, attempts, error", [
    ([LOST, SLOTS, SLOTS, {"ok": 1}], 2, None),       # waits for a lost executor's replacement
    ([SLOTS], None, "need 2 Spark task slots at once and the cluster has fewer"),     # never had them
    ([LOST, SLOTS, SLOTS], None, "has had fewer for 0 s since an executor was lost"),
])
def test_a_stage_waits_for_the_slots_of_a_lost_executor_only(monkeypatch, tmp_path, outcomes, attempts, error):
    from pyspark.ml.torch import distributor

    stages = _Stages(outcomes)
    monkeypatch.setattr(distributor, "TorchDistributor", stages)
    monkeypatch.setattr(neural, "SLOTS_POLL_S", 0.0)
    if error and "lost" in error:
        monkeypatch.setattr(neural, "SLOTS_WAIT_S", 0.0)
    job = neural.RankJob(None, None, [], [], [], 1, None, None, str(tmp_path))
    if error:
        with pytest.raises(UserError, match=error):
            neural._run_ranks(job, 2, 5, None)
        assert not stages.outcomes
    else:
        assert neural._run_ranks(job, 2, 5, None) == ({"ok": 1}, attempts)
        assert stages.runs == 4


class HoldAfterFirstEpoch(Callback):
    """On every rank: note the iteration of this process's first step in ``starts``; on rank 1,
    after the first epoch's validation (rank 0 writes its checkpoint then), wait until the file
    ``released`` exists (at most ``WAIT_S``), so that the executor dies between epochs 1 and 2
    whatever the speed of the machine."""

    def __init__(self, starts: str, released: str):
        self.starts, self.released, self.started = starts, released, False

    def on_step(self, loop, loss: float, n: int) -> None:
        import torch.distributed as dist

        if not self.started:
            self.started = True
            with open(self.starts, "a") as f:
                f.write(f"{dist.get_rank()} {loop.iteration}\n")

    def on_validation(self, loop, entry: dict) -> None:
        import torch.distributed as dist

        if dist.get_rank() == 1 and loop.epoch == 1:
            deadline = time.monotonic() + WAIT_S
            while not os.path.exists(self.released) and time.monotonic() < deadline:
                time.sleep(0.05)


@pytest.mark.slow   # ~80 s; the retry from a checkpoint runs by default in tests/spark/test_neural.py
def test_a_cnn_finishes_from_its_checkpoint_when_an_executor_dies(cluster_job, demo_csv, tmp_path, monkeypatch):
    from pyspark import cloudpickle

    cluster, job = cluster_job
    ds = load_dataset([demo_csv])
    ck, starts, released = tmp_path / "ck", tmp_path / "starts", tmp_path / "released"
    hold = HoldAfterFirstEpoch(str(starts), str(released))
    monkeypatch.setattr(spark_passes, "fit_neural",          # the ranks run the holding callback too
                        lambda *a, **k: neural.fit_neural(*a, **{**k, "callbacks": (hold,)}))
    seen: dict = {}

    def kill_after_first_checkpoint() -> None:
        deadline = time.monotonic() + WAIT_S
        try:
            while time.monotonic() < deadline:
                if checkpoint_path(ck).is_file():
                    seen["history"] = load_checkpoint(ck)["history"]
                    seen["killed"] = cluster.kill_executor(0)
                    return
                time.sleep(0.05)
        finally:
            released.touch()                        # the held rank goes on (into a dead peer) in any case

    cloudpickle.register_pickle_by_value(sys.modules[__name__])     # executors cannot import this module
    killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    killer.start()
    try:
        model, prep = train_model(ds, "state", "cnn",
                                   dict(CNN, epochs="3"), RunOptions(checkpoint=str(ck)), engine=job)
    finally:
        released.touch()
        killer.join(timeout=10)
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert seen.get("killed"), "no executor was killed after the first checkpoint"
    assert [h["epoch"] for h in seen["history"]] == [1.0]
    assert model.train_info_["processes"] == 2 and model.train_info_["attempts"] >= 2
    history = model.history_
    assert [h["epoch"] for h in history] == [1.0, 2.0, 3.0]
    assert history[0] == seen["history"][0]       # epoch 1 as the checkpoint recorded it: not trained again
    per_epoch = history[0]["iteration"]
    # every rank of the first attempt started at step 1, every later one after epoch 1's checkpoint
    first_steps = sorted(tuple(map(int, line.split())) for line in starts.read_text().splitlines())
    assert [s for s in first_steps if s[1] == 1] == [(0, 1), (1, 1)]
    resumed = [s for s in first_steps if s[1] != 1]
    assert {r for r, _ in resumed} == {0, 1} and {it for _, it in resumed} == {per_epoch + 1}
    assert set(cluster.executor_pids(0)).isdisjoint(seen["killed"]), "worker 0 runs no new executor"
    assert len(cluster.worker_pids()) == 2
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
    on_cluster, _ = train_model(ds, "state", "gmm", GMM, RunOptions(), engine=job)
    killer.join(timeout=5)
    assert "killed_during" in seen, "no worker was killed during the EM jobs"
    assert len(cluster.worker_pids()) == 1
    assert all(v > 0 for v in seen["rss"].values())       # executors' Python workers were running
    assert on_cluster.train_info_["em_passes"] == 25
    _same_gmm(on_cluster, local)
