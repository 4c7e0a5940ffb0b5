"""Ensembles on the Spark engine (local[2]): an ensemble learns by its members, each on its own
columns of the executor's windows (a view), each its own way — passes of statistics as jobs,
gradient steps as distributed ranks — so it trains wherever its members do; its combine weights
and unknown threshold come from passes over the held-out part, as locally."""
import json

import numpy as np
import pytest

from tests.spark.test_engine import _same_gmm
from wavetrain.data import load_dataset
from wavetrain.pipeline.jobs import RunOptions, evaluate_kfold, train_model

STATISTIC = {"members": json.dumps([{"model": "gmm", "components": 2, "features": "mfcc(coeffs=13)"},
                                    {"model": "knn", "features": "logmel(bands=16)", "capacity": 4096}]),
             "combine": "weighted", "unknown_fpr": "0.1", "valid_fraction": "0.3", "seed": "4"}


def test_an_ensemble_of_statistic_members_on_spark_equals_the_local_fit(job, demo_csv):
    ds = load_dataset([demo_csv])
    local, _ = train_model(ds, "state", "ensemble", STATISTIC, RunOptions())
    on_spark, prep = train_model(ds, "state", "ensemble", STATISTIC, RunOptions(), engine=job)
    assert len(prep.tasks()) > 1
    np.testing.assert_array_equal(on_spark.columns_, local.columns_)
    _same_gmm(on_spark.members_[0], local.members_[0])
    knn_s, knn_l = on_spark.members_[1], local.members_[1]
    order_s, order_l = (np.lexsort(m.vectors_.T[::-1]) for m in (knn_s, knn_l))
    np.testing.assert_array_equal(knn_s.vectors_[order_s], knn_l.vectors_[order_l])
    np.testing.assert_array_equal(knn_s.weights_[order_s], knn_l.weights_[order_l])
    np.testing.assert_allclose(on_spark.weights_, local.weights_, rtol=1e-12)
    assert on_spark.unknown_threshold_ == pytest.approx(local.unknown_threshold_, rel=1e-6)
    grams = [prep.source.gram(r)[:40] for r in ds[:6]]
    np.testing.assert_allclose(on_spark.predict_proba(grams), local.predict_proba(grams), rtol=1e-6, atol=1e-9)


def test_an_ensemble_with_a_neural_member_trains_it_on_distributed_ranks(job, demo_csv):
    ds = load_dataset([demo_csv])
    members = [{"model": "gmm", "components": 2, "features": "logmel(bands=16)"},
               {"model": "cnn", "features": "logmel(bands=16)", "epochs": 1, "batch_size": 8, "valid_fraction": 0.2}]
    model, prep = train_model(ds, "state", "ensemble", {"members": json.dumps(members), "clip_ms": "500"},
                              RunOptions(), engine=job)
    gmm, cnn = model.members_
    assert cnn.train_info_["processes"] == 2 and gmm.train_info_["em_passes"] >= 1
    assert model.predict([prep.source.gram(ds[0])[:20]])[0] in model.labels_


def test_k_fold_of_an_ensemble_on_spark_gives_the_local_results(job, demo_csv):
    ds = load_dataset([demo_csv])
    local = evaluate_kfold(ds, "state", "ensemble", STATISTIC, RunOptions(), folds=2)
    on_spark = evaluate_kfold(ds, "state", "ensemble", STATISTIC, RunOptions(), folds=2, engine=job)
    assert on_spark["confusion"] == local["confusion"]
    assert [f["accuracy"] for f in on_spark["folds"]] == [f["accuracy"] for f in local["folds"]]
