"""Anomaly detectors: the metrics, the threshold, normal-dist and anomaly-gmm."""
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from wavetrain.core.errors import UserError
from wavetrain.evaluation.detection_metrics import (
    at_threshold,
    detection_report,
    partial_auc,
    roc_auc,
    threshold_at_fpr,
)
from wavetrain.models import build
from wavetrain.models.gmm import GMMClassifier
from wavetrain.train.array_stream import ArrayStream


def _normal(n=60, d=6, frames=30, seed=0, shift=0.0):
    rng = np.random.default_rng(seed)
    return [rng.normal(shift, 1.0, (frames, d)).astype(np.float32) * np.linspace(0.5, 2, d).astype(np.float32)
            for _ in range(n)]


def _stream(grams, value="normal"):
    return ArrayStream(grams, [0] * len(grams), [value], batch_size=7)


@pytest.mark.parametrize("seed", range(20))
def test_auc_and_pauc_equal_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 80)
    y[:2] = (0, 1)
    s = np.round(rng.normal(y * 0.8, 1.0), 1)            # ties on purpose
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert partial_auc(y, s) == pytest.approx(roc_auc_score(y, s, max_fpr=0.1), abs=1e-12)
    assert partial_auc(y, s, 0.3) == pytest.approx(roc_auc_score(y, s, max_fpr=0.3), abs=1e-12)


def test_auc_extremes_and_one_kind_only():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0 and partial_auc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert roc_auc([0, 0, 1, 1], [0.9, 0.8, 0.2, 0.1]) == 0.0
    assert np.isnan(roc_auc([0, 0], [1.0, 2.0])) and np.isnan(partial_auc([1, 1], [1.0, 2.0]))


def test_threshold_flags_about_fpr_of_normal_scores():
    s = np.random.default_rng(0).normal(size=10000)
    t = threshold_at_fpr(s, 0.05)
    assert np.mean(s > t) == pytest.approx(0.05, abs=0.002)
    r = at_threshold([0, 0, 1, 1, 1], [0.1, 0.9, 0.8, 0.95, 0.2], 0.5)
    assert (r["tp"], r["fp"], r["fn"], r["tn"]) == (2, 1, 1, 1)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3) and r["fpr"] == 0.5
    rep = detection_report([0, 1, 0, 1], [0.1, 0.9, 0.2, 0.8], 0.5, groups=["a", "a", "b", "b"])
    assert rep["auc"] == 1.0 and set(rep["groups"]) == {"a", "b"} and rep["groups"]["a"]["normal"] == 1


@pytest.mark.parametrize("compress", ["none", "time", "feature", "both"])
def test_normal_dist_moments_equal_numpy(compress):
    grams = _normal()
    m = build("normal-dist", {"compress": compress, "valid_fraction": 0}).fit(_stream(grams))
    if compress == "none":
        v = np.concatenate(grams).astype(np.float64)
    elif compress == "time":
        v = np.stack([g.mean(axis=0, dtype=np.float64) for g in grams])
    elif compress == "feature":
        v = np.concatenate([g.astype(np.float64).mean(axis=1, keepdims=True) for g in grams])
    else:
        v = np.array([[g.astype(np.float64).mean()] for g in grams])
    np.testing.assert_allclose(m.mean_, v.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(m.var_, v.var(axis=0), rtol=1e-9)
    assert m.count_ == v.shape[0] and m.train_info_["threshold_on"].startswith("training windows (")


def test_normal_dist_separates_a_shift_and_holds_out_for_the_threshold():
    normal, test_normal, shifted = _normal(200, seed=0), _normal(200, seed=1), _normal(200, seed=2, shift=1.0)
    m = build("normal-dist").fit(ArrayStream(normal, [0] * 200, ["normal"], groups=list(range(200))))
    assert m.train_info_["threshold_on"].startswith("held-out normal windows (a gamma fit to 40 windows: ")
    assert m.train_info_["threshold_windows"] == 40 and m.train_info_["threshold_method"] == "gamma"
    s0, s1 = m.anomaly_score(test_normal), m.anomaly_score(shifted)
    assert roc_auc(np.r_[np.zeros(200), np.ones(200)], np.r_[s0, s1]) > 0.99
    assert np.mean(s0 > m.threshold_) < 0.15                  # about fpr=0.05 of normal windows flagged
    names, scores, details = m.predict_scores(shifted[:3])
    assert names == ["anomaly"] * 3 and scores.shape == (3, 1) and (details["threshold"] == m.threshold_).all()


def test_normal_dist_sigmas_is_the_boundary():
    m = build("normal-dist", {"sigmas": 3.0}).fit(_stream(_normal()))
    assert m.threshold_ == 3.0
    far = [np.full((5, 6), 100.0, np.float32)]
    assert m.predict(far) == ["anomaly"] and m.predict(_normal(1, seed=5)) == ["normal"]


def test_normal_dist_adapts_to_slow_drift_when_asked():
    train, rng = _normal(seed=0), np.random.default_rng(3)
    scale = np.linspace(0.5, 2, 6)
    drifting = [((rng.normal(0, 1, (30, 6)) + 1.5 * i / 600) * scale).astype(np.float32) for i in range(600)]
    still = build("normal-dist", {"valid_fraction": 0}).fit(_stream(train))
    moving = build("normal-dist", {"valid_fraction": 0, "adapt": 20}).fit(_stream(train))
    a, b = still.anomaly_score(drifting), moving.anomaly_score(drifting)
    assert np.mean(a[-100:] > still.threshold_) > 0.9          # the fixed model flags the drifted machine
    assert np.mean(b[-100:] > moving.threshold_) < 0.2         # the adapting one has followed it
    np.testing.assert_array_equal(still.anomaly_score(drifting[:5]), a[:5])   # the fixed one does not move


def test_detector_refuses_several_values():
    grams = _normal(10)
    with pytest.raises(UserError, match="normal recordings only"):
        build("normal-dist").fit(ArrayStream(grams, [0, 1] * 5, ["ok", "broken"]))


def test_anomaly_gmm_is_the_one_value_gmm():
    grams = _normal(40)
    det = build("anomaly-gmm", {"components": 3, "valid_fraction": 0}).fit(_stream(grams, "ok"))
    ref = GMMClassifier(components=3, features="logmel(bands=64)")
    ref.min_labels = 1
    ref.fit(_stream(grams, "ok"))
    np.testing.assert_allclose(det.anomaly_score(grams[:5]), -ref.decision_function(grams[:5])[:, 0], rtol=1e-10)
    assert det.labels_ == ["ok"] and det.predict(grams[:1])[0] in ("ok", "anomaly")
