"""Statistic families on the Spark engine (local[2]): one fit path, written against the executor
protocol, gives the local model — the hold-out split, the moments, the mixture, the threshold, an
hmm's Baum-Welch passes — and a detector's evaluation gives the local AUC."""
import json

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.core.errors import UserError
from wavetrain.data import load_dataset
from wavetrain.models import build
from wavetrain.models.modelfile import load_model
from wavetrain.models.passes import Moments
from wavetrain.pipeline.jobs import RunOptions, evaluate_kfold, evaluate_model, train_model
from wavetrain.spark import engine
from wavetrain.spark.support import spark_support

SPARK = ("--engine", "spark", "--master", "local[2]")


@pytest.fixture(scope="module")
def normal_ds(demo_csv):
    """The demo's healthy recordings: a detector's normal sound."""
    return load_dataset([demo_csv]).filter(lambda r: r.labels.get("state") == "healthy")


def _same_threshold(a, b):
    assert a.train_info_["threshold_windows"] == b.train_info_["threshold_windows"]
    assert a.train_info_["threshold_method"] == b.train_info_["threshold_method"]
    for name in ("threshold_", "normal_score_mean_", "normal_score_sd_"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-6, abs=1e-9), name


@pytest.mark.parametrize("params", [{}, {"compress": "none", "valid_fraction": "0"},
                                    {"clip_ms": "300", "clip_shift_ms": "200"}], ids=["holdout", "frames", "clips"])
def test_normal_dist_on_spark_equals_the_local_fit(job, normal_ds, params):
    local, _ = train_model(normal_ds, "state", "normal-dist", params, RunOptions())
    on_spark, prep = train_model(normal_ds, "state", "normal-dist", params, RunOptions(), engine=job)
    assert len(prep.tasks()) > 1
    assert on_spark.labels_ == local.labels_ == ["healthy"] and on_spark.count_ == local.count_
    np.testing.assert_allclose(on_spark.mean_, local.mean_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(on_spark.var_, local.var_, rtol=1e-6, atol=1e-9)
    _same_threshold(on_spark, local)


def test_the_hold_out_keeps_whole_groups_as_locally(spark, tmp_path, normal_ds):
    from wavetrain.spark.table import FeatureTable

    job = engine.SparkEngine(spark, FeatureTable(str(tmp_path / "table")))
    params = {"valid_fraction": "0.5"}
    local, _ = train_model(normal_ds, "state", "normal-dist", params, RunOptions(group_by="machine"))
    on_spark, _ = train_model(normal_ds, "state", "normal-dist", params, RunOptions(group_by="machine"), engine=job)
    # two machines: one is held out whole (each recording is one window with compress=time)
    assert on_spark.count_ == local.count_ == on_spark.train_info_["threshold_windows"] == len(normal_ds) // 2
    _same_threshold(on_spark, local)


def test_anomaly_gmm_on_spark_equals_the_local_fit(job, normal_ds):
    params = {"components": "2", "init_frames": "300"}
    local, _ = train_model(normal_ds, "state", "anomaly-gmm", params, RunOptions())
    on_spark, _ = train_model(normal_ds, "state", "anomaly-gmm", params, RunOptions(), engine=job)
    a, b = local.mixture_, on_spark.mixture_
    assert a.train_info_["em_passes"] == b.train_info_["em_passes"]
    for name in ("weights_", "means_", "variances_", "score_mean_", "score_sd_"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-6, atol=1e-9, err_msg=name)
    _same_threshold(on_spark, local)


def test_a_detectors_evaluation_on_spark_gives_the_local_auc(job, demo_csv, normal_ds):
    model, _ = train_model(normal_ds, "state", "normal-dist", {}, RunOptions())
    ds = load_dataset([demo_csv])
    local = evaluate_model(model, ds, "state", RunOptions())
    on_spark = evaluate_model(model, ds, "state", RunOptions(), engine=job)
    assert on_spark["normal_value"] == local["normal_value"] == "healthy"
    for key in ("auc", "pauc", "tp", "fp", "fn", "tn", "normal", "anomalous"):
        assert on_spark[key] == pytest.approx(local[key], rel=1e-9), key
    assert on_spark["recordings"] == local["recordings"] == len(ds)


def test_an_adapting_detector_is_refused_for_evaluation_on_spark(job, demo_csv, normal_ds):
    model, _ = train_model(normal_ds, "state", "normal-dist", {"adapt": "10"}, RunOptions())
    with pytest.raises(Exception, match="run it with --engine local"):
        evaluate_model(model, load_dataset([demo_csv]), "state", RunOptions(), engine=job)


def test_knn_anomaly_on_spark_has_the_local_summary_while_it_fits_its_buffer(job, normal_ds):
    local, _ = train_model(normal_ds, "state", "knn-anomaly", {}, RunOptions())
    on_spark, _ = train_model(normal_ds, "state", "knn-anomaly", {}, RunOptions(), engine=job)
    assert local.train_info_["vectors_seen"] <= 2 * local.params["capacity"]
    assert {k: on_spark.train_info_[k] for k in ("vectors_seen", "summary_vectors", "merges")} == \
        {k: local.train_info_[k] for k in ("vectors_seen", "summary_vectors", "merges")}
    rows = [m.vectors_[np.lexsort(m.vectors_.T[::-1])] for m in (local, on_spark)]
    np.testing.assert_allclose(rows[1], rows[0], rtol=1e-9)
    _same_threshold(on_spark, local)


@pytest.mark.parametrize("params", [{}, {"unknown_fpr": "0.1"}], ids=["summary", "unknown-threshold"])
def test_knn_classifier_on_spark_learns_through_its_own_fit_and_answers_as_locally(job, demo_csv, params):
    """The knn classifier's fit is written against the executor (no Spark path of its own): the
    summary's vectors (in another row order while they fit the buffer), the held-out unknown
    threshold and every answer are the local ones."""
    ds = load_dataset([demo_csv])
    local, prep = train_model(ds, "state", "knn", dict(params), RunOptions())
    stream = prep.stream
    on_spark, _ = train_model(ds, "state", "knn", dict(params), RunOptions(), engine=job)
    assert local.train_info_["vectors_seen"] <= 2 * local.params["capacity"]
    rows = [m.vectors_[np.lexsort(m.vectors_.T[::-1])] for m in (local, on_spark)]
    np.testing.assert_allclose(rows[1], rows[0], rtol=1e-9)
    if params:
        assert on_spark.unknown_threshold_ == pytest.approx(local.unknown_threshold_, rel=1e-9)
    grams = [g for b in stream.batches() for g in b.grams]
    np.testing.assert_allclose(on_spark.predict_proba(grams), local.predict_proba(grams), rtol=1e-9, atol=1e-12)


def test_every_detector_trains_on_spark():
    for name in ("normal-dist", "anomaly-gmm", "knn-anomaly", "autoencoder"):   # the last by gradient steps
        assert spark_support(build(name)) is None


class _Failing(Moments):
    def add(self, state, grams, ys, ordinals):
        raise UserError("a bad window")


def test_an_error_in_a_pass_comes_back_as_the_same_one_line_error(job, normal_ds):
    model = build("normal-dist")
    prep = job.prepare(normal_ds, model, RunOptions())
    data = job.executor(prep, model, RunOptions(), label=None, labels=["healthy"])
    assert data.run(Moments(model._vectors)).n > 0
    with pytest.raises(UserError, match="^a bad window$"):
        data.run(_Failing(model._vectors))


def test_train_and_evaluate_a_detector_on_spark_from_the_command_line(spark, demo_csv, tmp_path, capsys):
    # --normal picks the normal recordings of a data set of every state, on either engine
    common = ("--data", demo_csv, "--label", "state", "--normal", "healthy", "--model", "normal-dist")
    assert main(["train", *map(str, common), "-o", str(tmp_path / "local.wt")]) == 0
    code = main(["train", *map(str, common), "-o", str(tmp_path / "spark.wt"), "--table", str(tmp_path / "t"), *SPARK])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "normal recordings (state=healthy)" in out and "on Spark (local[2])" in out, out
    local, on_spark = load_model(tmp_path / "local.wt"), load_model(tmp_path / "spark.wt")
    np.testing.assert_allclose(on_spark.mean_, local.mean_, rtol=1e-6)
    np.testing.assert_allclose(on_spark.var_, local.var_, rtol=1e-6)
    assert on_spark.threshold_ == pytest.approx(local.threshold_, rel=1e-6)
    results = []
    for extra in ((), ("--table", str(tmp_path / "t"), *SPARK)):
        code = main(["evaluate", "-m", str(tmp_path / "spark.wt"), "--data", str(demo_csv), "--label", "state",
                     "--normal", "healthy", "--json", *extra])
        out, err = capsys.readouterr()
        assert code == 0, err
        results.append(json.loads(out))
    assert results[1]["auc"] == pytest.approx(results[0]["auc"], rel=1e-9)


def test_a_detectors_kfold_on_spark_gives_the_local_folds(job, demo_csv):
    ds = load_dataset([demo_csv])
    local = evaluate_kfold(ds, "state", "normal-dist", {}, RunOptions(), folds=2, normal="healthy")
    on_spark = evaluate_kfold(ds, "state", "normal-dist", {}, RunOptions(), folds=2, normal="healthy", engine=job)
    assert on_spark["detector"] and on_spark["normal_value"] == "healthy"
    for a, b in zip(local["folds"], on_spark["folds"]):
        assert (a["train_recordings"], a["test_recordings"]) == (b["train_recordings"], b["test_recordings"])
        for key in ("auc", "pauc", "f1", "threshold"):
            assert b[key] == pytest.approx(a[key], rel=1e-6), key
    for key in ("auc", "pauc", "tp", "fp", "fn", "tn"):
        assert on_spark[key] == pytest.approx(local[key], rel=1e-9), key


class _Order:
    """A pass whose merge depends on the order: the ordinals of the windows, in merge order."""

    def new(self):
        return []

    def add(self, state, grams, ys, ordinals):
        return state + [int(o) for o in dict.fromkeys(ordinals)]

    def merge(self, a, b):
        return a + b


def test_passes_merge_along_the_task_order_whatever_the_scheduling(job, normal_ds):
    model = build("normal-dist")
    prep = job.prepare(normal_ds, model, RunOptions())
    data = job.executor(prep, model, RunOptions(), label=None, labels=["healthy"])
    assert len(data.tasks) >= 4
    in_task_order = [o for _, occurrences in data.tasks for o in sorted(v[0][0] for v in occurrences.values())]
    for _ in range(3):
        assert data.run(_Order()) == in_task_order


def test_hmm_on_spark_equals_the_local_fit(job, demo_csv):
    """``hmm``'s Baum-Welch passes, written against the executor protocol, give the local model
    (sums in another order: equal to rounding)."""
    ds = load_dataset([demo_csv])
    params = {"states": "3", "mixtures": "2", "max_iter": "3"}
    local, _ = train_model(ds, "state", "hmm", params, RunOptions())
    on_spark, prep = train_model(ds, "state", "hmm", params, RunOptions(), engine=job)
    assert len(prep.tasks()) > 1
    assert on_spark.labels_ == local.labels_
    assert [h["mean_loglik"] for h in on_spark.history_] == [h["mean_loglik"] for h in local.history_]
    for name in ("log_trans_", "weights_", "means_", "variances_"):
        np.testing.assert_allclose(getattr(on_spark, name), getattr(local, name), rtol=1e-7, atol=1e-9, err_msg=name)


def test_a_warp_searching_model_trains_and_evaluates_on_spark_as_locally(job, demo_csv):
    """``vtln=true``: Spark learns from the unwarped features and scores every warp side by side,
    as the local engine does (same mixtures, same answers)."""
    ds = load_dataset([demo_csv])
    params = {"components": "2", "vtln": "true", "vtln_warps": "0.9,1.1"}
    local, _ = train_model(ds, "state", "gmm", params, RunOptions())
    on_spark, _ = train_model(ds, "state", "gmm", params, RunOptions(), engine=job)
    assert on_spark.feature_dim_ == local.feature_dim_ == 3 * local.means_.shape[2]
    np.testing.assert_allclose(on_spark.means_, local.means_, rtol=1e-7, atol=1e-9)
    here = evaluate_model(on_spark, ds, "state", RunOptions())
    there = evaluate_model(on_spark, ds, "state", RunOptions(), engine=job)
    assert there["confusion"] == here["confusion"] and there["accuracy"] == here["accuracy"]


@pytest.mark.parametrize("params", [{"examples": "frames"}, {"clip_ms": "300", "clip_shift_ms": "200"}],
                         ids=["frames", "window-means"])
def test_linear_on_spark_equals_the_local_fit(job, demo_csv, params):
    """``linear``'s passes of loss and gradient sums, written against the executor protocol: the
    same examples, objective at every pass (sums in another order: equal to rounding) and model."""
    ds = load_dataset([demo_csv])
    local, prep = train_model(ds, "state", "linear", dict(params), RunOptions())
    on_spark, spark_prep = train_model(ds, "state", "linear", dict(params), RunOptions(), engine=job)
    assert len(spark_prep.tasks()) > 1
    assert on_spark.labels_ == local.labels_
    assert on_spark.train_info_["examples"] == local.train_info_["examples"]
    assert on_spark.train_info_["passes"] == local.train_info_["passes"] and local.train_info_["converged"]
    assert [h["train_loss"] for h in on_spark.history_] == pytest.approx([h["train_loss"] for h in local.history_],
                                                                          rel=1e-9)
    np.testing.assert_allclose(on_spark.coef_, local.coef_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(on_spark.intercept_, local.intercept_, rtol=1e-6, atol=1e-8)
    grams = [g for b in prep.stream.batches() for g in b.grams]
    np.testing.assert_allclose(on_spark.predict_proba(grams), local.predict_proba(grams), rtol=1e-6, atol=1e-9)
