"""Results per group on Spark (local[2]): the same as the local engine's, counted from the
predictions Spark streams back — a classifier's k-fold and a trained detector's."""
import numpy as np
import pytest

from wavetrain.data import load_dataset
from wavetrain.pipeline.jobs import RunOptions, evaluate_kfold, evaluate_model, train_model

GMM = {"components": "1", "max_iter": "5", "clip_ms": "250"}


def test_kfold_classifier_groups_on_spark_are_the_local_ones(job, demo_csv):
    ds = load_dataset([demo_csv])
    opts = RunOptions(group_by="machine")
    local = evaluate_kfold(ds, "state", "gmm", GMM, opts, folds=2)
    on_spark = evaluate_kfold(ds, "state", "gmm", GMM, opts, folds=2, engine=job)
    assert set(on_spark["groups"]) == {"m0", "m1"}
    for g, r in local["groups"].items():
        there = on_spark["groups"][g]
        assert {k: there[k] for k in ("windows", "correct", "recordings")} == \
            {k: r[k] for k in ("windows", "correct", "recordings")}
        assert there["accuracy"] == pytest.approx(r["accuracy"]) and there["macro_f1"] == pytest.approx(r["macro_f1"])


def test_trained_detector_groups_on_spark_are_the_local_ones(job, demo_csv):
    ds = load_dataset([demo_csv])
    model, _ = train_model(ds, "state", "normal-dist", {"clip_ms": "250"}, RunOptions(), normal="healthy")
    opts = RunOptions(group_by="machine,speed")
    local = evaluate_model(model, ds, "state", opts, normal="healthy")
    on_spark = evaluate_model(model, ds, "state", opts, normal="healthy", engine=job)
    assert set(on_spark["groups"]) == set(local["groups"]) and len(local["groups"]) == 4
    for g, r in local["groups"].items():
        there = on_spark["groups"][g]
        for k in ("normal", "anomalous", "recordings", "tp", "fp"):
            assert there[k] == r[k], (g, k)
        np.testing.assert_allclose([there["auc"], there["pauc"]], [r["auc"], r["pauc"]], rtol=1e-6)
