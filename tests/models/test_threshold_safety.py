"""Detector thresholds: a gamma fit with few held-out windows whose false-alarm rate is the one
asked for on average, the expected range said at training, NaN scores refused, and k-fold
evaluation reporting each fold's threshold instead of ``nan``."""
import json
import os

import numpy as np
import pytest
from scipy import stats

from wavetrain.cli.main import main
from wavetrain.core.errors import UserError
from wavetrain.evaluation.detection_metrics import (
    fit_threshold,
    format_detection_report,
    gamma_threshold,
    threshold_at_fpr,
)
from wavetrain.models import build
from wavetrain.models.normal_dist import NormalDistDetector
from wavetrain.train.array_stream import ArrayStream

MACHINES = "/work/shared/data/machines"


def test_gamma_threshold_from_few_windows_meets_the_rate_on_average():
    """Over many sets of 12 normal scores (a gamma, shifted), the fitted threshold's true
    false-alarm rate averages about fpr; the plain quantile (the largest of 12) and the plug-in
    gamma quantile average more."""
    rng = np.random.default_rng(0)
    shape, loc, scale = 4.0, 10.0, 1.5
    fitted, largest, plug_in = [], [], []
    for _ in range(40):
        s = loc + rng.gamma(shape, scale, 12)
        f = fit_threshold(s, 0.05, draws=100)
        assert f.method == "gamma" and f.windows == 12 and 0 <= f.fpr_range[0] < 0.05 < f.fpr_range[1] < 0.3
        for t, out in ((f.threshold, fitted), (threshold_at_fpr(s, 0.05), largest),
                       (gamma_threshold(s, 0.05), plug_in)):
            out.append(stats.gamma.sf(t - loc, shape, scale=scale))
    assert 0.035 <= np.mean(fitted) <= 0.065
    assert np.mean(largest) > 0.065 and np.mean(plug_in) > np.mean(fitted)
    normal = [stats.norm.sf(fit_threshold(rng.normal(size=12), 0.05, draws=100).threshold) for _ in range(30)]
    assert 0.005 <= np.mean(normal) <= 0.05          # a lighter tail than a gamma's: on the safe side


def test_many_windows_use_the_quantile_and_negative_scores_are_shifted():
    s = np.random.default_rng(1).normal(size=2000)
    f = fit_threshold(s, 0.05)
    assert f.method == "quantile" and f.threshold == threshold_at_fpr(s, 0.05)
    assert f.fpr_range[0] < 0.05 < f.fpr_range[1] < 0.07
    g = fit_threshold(s[:15] - 100.0, 0.05)           # all negative: shifted to be positive for the fit
    assert g.method == "gamma" and np.isfinite(g.threshold) and g.threshold > (s[:15] - 100.0).mean()
    same = fit_threshold(np.full(10, 3.0), 0.05)       # no spread to fit
    assert same.method == "quantile" and same.threshold == 3.0
    with pytest.raises(ValueError, match="1 of 3 normal scores are not finite"):
        fit_threshold([1.0, np.nan, 2.0], 0.05)


def test_training_says_how_the_threshold_was_set():
    rng = np.random.default_rng(2)
    grams = [rng.normal(0, 1, (20, 4)).astype(np.float32) for _ in range(60)]
    m = build("normal-dist").fit(ArrayStream(grams, [0] * 60, ["normal"], groups=list(range(60))))
    assert m.train_info_["threshold_windows"] == 12 and m.train_info_["threshold_method"] == "gamma"
    lo, hi = m.train_info_["expected_fpr"]
    assert 0 <= lo < 0.05 < hi < 0.3
    assert m.train_info_["threshold_on"] == (f"held-out normal windows (a gamma fit to 12 windows: {100 * lo:.0f}-"
                                             f"{100 * hi:.0f}% false alarms expected)")


class _NaNScores(NormalDistDetector):
    name = "normal-dist"

    def _anomaly_score(self, grams):
        out = super()._anomaly_score(grams)
        out[::3] = np.nan
        return out


def test_nan_scores_at_training_are_refused_in_one_line():
    rng = np.random.default_rng(3)
    grams = [rng.normal(0, 1, (20, 4)).astype(np.float32) for _ in range(30)]
    with pytest.raises(UserError) as e:
        _NaNScores(valid_fraction=0.0).fit(ArrayStream(grams, [0] * 30, ["normal"]))
    assert "10 of 30 training windows score NaN or infinity" in str(e.value) and "\n" not in str(e.value)


def test_kfold_report_names_each_folds_threshold_not_nan():
    res = {"auc": 0.8, "pauc": 0.6, "max_fpr": 0.1, "threshold": float("nan"), "precision": 1.0, "recall": 0.5,
           "f1": 0.67, "fpr": 0.0, "windows": 4, "normal": 2, "anomalous": 2,
           "folds": [{"threshold": 17.25}, {"threshold": 19.5}]}
    line = format_detection_report(res)
    assert "nan" not in line and "at each fold's threshold (17.25-19.5)" in line


@pytest.mark.skipif(not os.path.isdir(MACHINES), reason="needs the machines data set")
def test_kfold_anomaly_gmm_evaluate_has_no_nan_threshold(capsys):
    args = ["evaluate", "--data", MACHINES, "--where", "machine=fan", "--where", "unit=u1", "--where", "split=test",
            "--label", "state", "--model", "anomaly-gmm", "--set", "components=2", "--folds", "4", "--no-cache"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "threshold nan" not in out and "at each fold's threshold (" in out
    assert main(args + ["--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["threshold"] is None and all(np.isfinite(f["threshold"]) for f in res["folds"])
