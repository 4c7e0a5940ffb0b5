"""``linear``: scikit-learn's ``LogisticRegression`` (solved to machine precision by Newton's method)
as the oracle of the coefficients, intercepts and probabilities, on synthetic Gaussian classes and on
the MFCCs of generated tones; what a training example is; the passes' sums merged in any order;
the pass budget; the unknown threshold; the exported graph against the model file; hostile inputs."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from tests.conftest import tone
from wavetrain.core.errors import ModelFileError, ParameterError, UserError
from wavetrain.features import extract
from wavetrain.models import build, load_model, save_model
from wavetrain.models.linear import ExampleMoments, LossGradient
from wavetrain.train.array_stream import ArrayStream

#: How close the fit is to scikit-learn's optimum: coefficients, intercepts, probabilities.
ATOL = 1e-4
#: A tolerance that reaches the optimum well within ATOL.
TIGHT = {"tol": 1e-10, "max_passes": 2000}


def oracle(x: np.ndarray, y: np.ndarray, c: float) -> LogisticRegression:
    """scikit-learn's fit of the same objective, to machine precision."""
    return LogisticRegression(C=c, solver="newton-cholesky", tol=1e-14, max_iter=1000).fit(x, y)


def gaussian_windows(k: int = 3, d: int = 6, windows: int = 90, seed: int = 0, scaled: bool = True):
    """Windows of 1-9 frames drawn around one centre per class, features on different scales and
    offsets (as real features are; ``scaled=False``: around 0 with sd 1.5), and the frames stacked
    with their classes."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1.0, (k, d))
    scale, offset = (np.geomspace(0.1, 20, d), np.linspace(-30, 50, d)) if scaled else (np.ones(d), np.zeros(d))
    grams, y = [], []
    for i in range(windows):
        c = i % k
        g = (centres[c] + rng.normal(0, 1.5, (int(rng.integers(1, 10)), d))) * scale + offset
        grams.append(g.astype(np.float32))
        y.append(c)
    x = np.concatenate(grams).astype(np.float64)
    return grams, np.array(y), x, np.repeat(y, [len(g) for g in grams])


def tone_windows(seed: int = 0):
    """MFCC grams of noisy tones of three pitches (one window per recording), their classes."""
    rng = np.random.default_rng(seed)
    grams, y = [], []
    for i in range(18):
        c = i % 3
        sound = tone((300.0, 450.0, 700.0)[c] * rng.uniform(0.9, 1.1), seconds=rng.uniform(0.2, 0.4),
                     amp=rng.uniform(0.1, 0.8))
        sound = sound + rng.normal(0, 0.2, sound.shape).astype(np.float32)
        grams.append(extract(sound, 16000, "mfcc(bands=40, coeffs=13) | delta"))
        y.append(c)
    x = np.concatenate(grams).astype(np.float64)
    return grams, np.array(y), x, np.repeat(y, [len(g) for g in grams])


def fit(grams, y, labels=None, batch_size=16, **params):
    labels = labels or [f"v{k}" for k in range(int(max(y)) + 1)]
    return build("linear", params).fit(ArrayStream(grams, y, labels, batch_size=batch_size))


def rows(x: np.ndarray) -> list[np.ndarray]:
    """Every row as a window of one frame."""
    return [r[None, :].astype(np.float32) for r in x]


def assert_is_oracle(model, ref: LogisticRegression, x: np.ndarray) -> None:
    np.testing.assert_allclose(model.coef_, ref.coef_, atol=ATOL, rtol=0)
    np.testing.assert_allclose(model.intercept_, ref.intercept_, atol=ATOL, rtol=0)
    np.testing.assert_allclose(model.predict_proba(rows(x)), ref.predict_proba(x.astype(np.float32)), atol=ATOL,
                               rtol=0)


def assert_penalty_matters(x: np.ndarray, y: np.ndarray, c: float) -> None:
    """The oracle at c differs from the oracle at 2c or c x examples (a penalty counted twice, or over
    the mean loss instead of the sum) by far more than ATOL: a wrong penalty fails the comparison."""
    ref = oracle(x, y, c)
    for other in (2 * c, c * len(y)):
        assert np.abs(oracle(x, y, other).coef_ - ref.coef_).max() > 100 * ATOL


# -- the oracle -----------------------------------------------------------------------------------
@pytest.mark.parametrize("c", [1.0, 0.01])
def test_three_gaussian_classes_give_scikit_learns_model(c):
    grams, y, x, frame_y = gaussian_windows()
    ref = oracle(x, frame_y, c)
    model = fit(grams, y, c=c, examples="frames", **TIGHT)
    assert model.train_info_["converged"] and model.train_info_["examples"] == len(x)
    assert_is_oracle(model, ref, x)
    assert abs(model.intercept_.sum()) < 1e-9                # centred, as scikit-learn's
    assert_penalty_matters(x, frame_y, c)


def test_without_standardisation_the_optimum_is_the_same_in_more_passes():
    grams, y, x, frame_y = gaussian_windows(scaled=False)
    ref = oracle(x, frame_y, 1.0)
    plain = fit(grams, y, standardize=False, examples="frames", **TIGHT)
    scaled = fit(grams, y, examples="frames", **TIGHT)
    assert plain.train_info_["converged"]
    assert_is_oracle(plain, ref, x)
    assert_is_oracle(scaled, ref, x)
    # features on scales of 0.1 to 20 around offsets of -30 to 50: standardised, far fewer passes
    grams, y, _, _ = gaussian_windows()
    plain, scaled = fit(grams, y, standardize=False, examples="frames"), fit(grams, y, examples="frames")
    assert scaled.train_info_["converged"] and scaled.train_info_["passes"] * 3 < plain.train_info_["passes"]


def test_two_values_give_scikit_learns_binary_model():
    """scikit-learn fits one vector w for two values; the family's rows are -w/2 and w/2."""
    grams, y, x, frame_y = gaussian_windows(k=2, d=4, seed=3)
    ref = oracle(x, frame_y, 0.5)
    model = fit(grams, y, c=0.5, examples="frames", **TIGHT)
    assert ref.coef_.shape == (1, 4)
    np.testing.assert_allclose(model.coef_, np.vstack([-ref.coef_ / 2, ref.coef_ / 2]), atol=ATOL, rtol=0)
    np.testing.assert_allclose(model.intercept_, [-ref.intercept_[0] / 2, ref.intercept_[0] / 2], atol=ATOL, rtol=0)
    np.testing.assert_allclose(model.predict_proba(rows(x)), ref.predict_proba(x.astype(np.float32)), atol=ATOL,
                               rtol=0)
    assert_penalty_matters(x, frame_y, 0.5)


@pytest.mark.parametrize("c", [1.0, 0.05])
def test_mfccs_of_tones_give_scikit_learns_model(c):
    grams, y, x, frame_y = tone_windows()
    ref = oracle(x, frame_y, c)
    model = fit(grams, y, c=c, examples="frames", **TIGHT)
    assert_is_oracle(model, ref, x)
    assert_penalty_matters(x, frame_y, c)
    means = np.stack([g.astype(np.float64).mean(axis=0) for g in grams])
    ref = oracle(means, y, c)
    model = fit(grams, y, c=c, **TIGHT)                      # examples=windows
    assert_is_oracle(model, ref, means)
    assert_penalty_matters(means, y, c)


def test_the_default_tolerance_is_close_to_the_optimum():
    grams, y, x, frame_y = tone_windows()
    model = fit(grams, y, examples="frames")
    assert model.train_info_["converged"] and model.train_info_["passes"] <= 100
    np.testing.assert_allclose(model.predict_proba(rows(x)), oracle(x, frame_y, 1.0).predict_proba(x), atol=1e-2)


# -- what a training example is and how a window is scored ------------------------------------------
def test_a_window_is_scored_by_its_mean_frame_the_normalised_geometric_mean_of_its_frames():
    grams, y, x, frame_y = gaussian_windows()
    model = fit(grams, y, examples="frames", **TIGHT)
    ref = oracle(x, frame_y, 1.0)
    means = np.stack([g.astype(np.float64).mean(axis=0) for g in grams])
    p = model.predict_proba(grams)
    np.testing.assert_allclose(p, ref.predict_proba(means), atol=ATOL, rtol=0)
    for g, row in zip(grams[:10], p):
        logp = np.log(model.predict_proba(rows(g.astype(np.float64))))
        geo = np.exp(logp.mean(axis=0))
        np.testing.assert_allclose(row, geo / geo.sum(), rtol=1e-9)


def test_by_default_each_windows_mean_frame_is_one_example():
    grams, y, _, _ = gaussian_windows()
    means = np.stack([g.astype(np.float64).mean(axis=0) for g in grams])
    ref = oracle(means, y, 1.0)
    model = fit(grams, y, **TIGHT)
    assert model.train_info_["examples"] == len(grams)
    np.testing.assert_allclose(model.coef_, ref.coef_, atol=ATOL, rtol=0)
    np.testing.assert_allclose(model.predict_proba(grams), ref.predict_proba(means), atol=ATOL, rtol=0)


def test_pooled_features_one_frame_a_recording_are_one_example_each_either_way():
    grams, y, x, frame_y = gaussian_windows()
    pooled = [g.mean(axis=0, keepdims=True) for g in grams]
    a = fit(pooled, y, examples="frames", **TIGHT)
    b = fit(pooled, y, **TIGHT)
    assert a.train_info_["examples"] == b.train_info_["examples"] == len(grams)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    ref = oracle(np.concatenate(pooled).astype(np.float64), y, 1.0)
    np.testing.assert_allclose(a.coef_, ref.coef_, atol=ATOL, rtol=0)


# -- passes ----------------------------------------------------------------------------------------
def _pass_result(p, parts):
    states = [p.add(p.new(), [g for g, _ in part], np.array([c for _, c in part]), list(range(len(part))))
              for part in parts]
    out = states[0]
    for s in states[1:]:
        out = p.merge(out, s)
    return out


def test_the_passes_merge_in_any_order_to_the_sums_of_one_part():
    grams, y, _, _ = gaussian_windows(d=4)
    windows = list(zip(grams, y))
    rng = np.random.default_rng(1)
    whole = [windows]
    split = [windows[:7], windows[7:40], windows[40:]]
    p = LossGradient("frames", rng.normal(size=4), rng.uniform(0.5, 2, 4), rng.normal(size=(3, 4)), rng.normal(size=3))
    a, b, c = _pass_result(p, whole), _pass_result(p, split), _pass_result(p, split[::-1])
    for other in (b, c):
        assert other.n == a.n
        assert other.loss == pytest.approx(a.loss, rel=1e-12)
        np.testing.assert_allclose(other.coef, a.coef, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(other.intercept, a.intercept, rtol=1e-10, atol=1e-10)
    m = ExampleMoments(3, "frames")
    a, b = _pass_result(m, whole), _pass_result(m, split[::-1])
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_allclose(b.moments.mean, a.moments.mean, rtol=1e-12)
    np.testing.assert_allclose(b.moments.m2, a.moments.m2, rtol=1e-10)


def test_the_gradient_of_a_pass_is_the_gradient_of_its_loss():
    grams, y, _, _ = gaussian_windows(d=3, windows=12)
    rng = np.random.default_rng(2)
    mean, scale = rng.normal(size=3), rng.uniform(1, 30, 3)
    coef, intercept = rng.normal(size=(3, 3)) * 0.1, rng.normal(size=3)
    got = _pass_result(LossGradient("frames", mean, scale, coef, intercept), [list(zip(grams, y))])
    eps = 1e-6
    for i in range(3):
        for j in range(3):
            bumped = coef.copy()
            bumped[i, j] += eps
            up = _pass_result(LossGradient("frames", mean, scale, bumped, intercept), [list(zip(grams, y))]).loss
            bumped[i, j] -= 2 * eps
            down = _pass_result(LossGradient("frames", mean, scale, bumped, intercept), [list(zip(grams, y))]).loss
            assert got.coef[i, j] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-6)


def test_batches_of_any_size_give_the_same_model():
    grams, y, _, _ = gaussian_windows()
    a, b = fit(grams, y, batch_size=1), fit(grams, y, batch_size=90)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-7, atol=1e-9)
    assert [h["train_loss"] for h in a.history_] == pytest.approx([h["train_loss"] for h in b.history_])


def test_max_passes_bounds_the_passes_and_says_it_did_not_converge(caplog):
    grams, y, _, _ = gaussian_windows()
    with caplog.at_level(logging.WARNING):
        model = fit(grams, y, max_passes=3, tol=0)
    assert len(model.history_) == 3 and model.train_info_["passes"] == 4
    assert not model.train_info_["converged"] and "raise max_passes" in caplog.text
    assert np.isfinite(model.coef_).all()
    # the model kept is the best point it evaluated
    assert model.train_info_["objective"] == pytest.approx(min(h["train_loss"] for h in model.history_), abs=1e-8)


def test_history_records_the_objective_of_every_pass():
    grams, y, _, _ = gaussian_windows()
    model = fit(grams, y)
    h = model.history_
    assert [e["epoch"] for e in h] == list(range(1, len(h) + 1)) and len(h) == model.train_info_["passes"] - 1
    assert h[-1]["train_loss"] < h[0]["train_loss"] and all(e["cross_entropy"] <= e["train_loss"] for e in h)


# -- unknown ---------------------------------------------------------------------------------------
def test_unknown_fpr_calibrates_a_top_probability_threshold_on_held_out_windows(tmp_path):
    grams, y, _, _ = gaussian_windows(windows=300, seed=5)
    model = fit(grams, y, unknown_fpr=0.2, valid_fraction=0.3)
    t = model.unknown_threshold_
    assert 1 / 3 < t < 1 and model.unknown_rule() == {"rule": "top_below", "value": t}
    names, p = model.predict_with_proba(grams)
    low = p.max(axis=1) < t
    assert low.any() and all((n == "unknown") == lo for n, lo in zip(names, low))
    again = load_model(save_model(model, tmp_path / "m.wt"))
    assert again.unknown_threshold_ == t and again.predict(grams) == names
    assert fit(grams, y).unknown_rule() is None


# -- export ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [(), ("--features", "mfcc(coeffs=13)", "--clip-ms", "400")],
                         ids=["recordings", "clips"])
def test_the_exported_graph_answers_as_the_model_file(demo_csv, tmp_path, args):
    """(Clips: features computed frame by frame, as a graph of one clip sees the same frames.)"""
    pytest.importorskip("onnxruntime")
    from wavetrain.cli.main import main
    from wavetrain.data.audio import read_audio
    from wavetrain.data.demo import make_demo_dataset
    from wavetrain.pipeline.prediction import classify_samples

    wt, graph = tmp_path / "m.wt", tmp_path / "m.onnx"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "linear", *args,
                 "--set", "unknown_fpr=0.1", "-o", str(wt)]) == 0
    assert main(["export", "-m", str(wt), "-o", str(graph)]) == 0
    model, onnx_model = load_model(wt), load_model(graph)
    assert onnx_model.fitted_labels == model.fitted_labels and onnx_model.unknown_rule() == model.unknown_rule()
    held = make_demo_dataset(tmp_path / "held", per_combo=1, speeds=(20.0,), snrs=(5.0,), seconds=1.3, seed=7)
    clips = [read_audio(p)[:2] for p in sorted((tmp_path / "held").glob("*.wav"))]
    assert held and clips
    for x, rate in clips:
        a, b = classify_samples(model, x, rate), classify_samples(onnx_model, x, rate)
        assert [q.label for q in b] == [p.label for p in a]
        for p, q in zip(a, b):
            np.testing.assert_allclose(q.scores, p.scores, rtol=1e-4, atol=1e-6)


# -- hostile inputs --------------------------------------------------------------------------------
def test_a_value_without_examples_is_refused_in_one_line():
    grams, y, _, _ = gaussian_windows()
    with pytest.raises(UserError, match=r"^linear: no training examples of v3; every label value needs some$"):
        build("linear").fit(ArrayStream(grams, y, ["v0", "v1", "v2", "v3"]))


def test_features_normalised_over_time_are_refused_in_one_line(demo_csv, capsys):
    """Windows centred over time all have the mean frame 0: the optimum's coefficients are 0 (every
    value's frames have the same mean) and every window would get the same answer."""
    grams, y, _, _ = gaussian_windows()
    centred = [g - g.mean(axis=0) for g in grams]
    for examples in ("frames", "windows"):
        with pytest.raises(UserError, match="^linear: every training window has the same mean frame"):
            fit(centred, y, examples=examples)
    from wavetrain.cli.main import main

    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "linear", "--features",
                 "mfcc(coeffs=13) | normalize(axis=time)", "-o", "never.wt"])
    err = capsys.readouterr().err
    assert code == 2 and "every training window has the same mean frame" in err and "Traceback" not in err


class _Shrinking(ArrayStream):
    """A stream that loses a window after its first pass."""

    def batches(self):
        out = list(super().batches())
        self.grams, self.y = self.grams[:-1], self.y[:-1]
        return iter(out)


def test_training_data_that_changes_between_passes_is_refused():
    grams, y, _, _ = gaussian_windows()
    with pytest.raises(UserError, match="training data changed while it was read"):
        build("linear", {"frame_cache_mb": 0}).fit(_Shrinking(list(grams), y, ["a", "b", "c"]))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "x"])
def test_c_must_be_a_positive_number(value):
    with pytest.raises(ParameterError, match=r"^linear\.c: expected a number > 0, got"):
        build("linear", {"c": value})


@pytest.mark.parametrize("threshold", [[1.5], [-0.1], [0.5, 0.5]])
def test_a_model_file_with_an_impossible_unknown_threshold_is_refused(tmp_path, threshold):
    grams, y, _, _ = gaussian_windows()
    path = save_model(fit(grams, y), tmp_path / "m.wt")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["w/unknown_threshold"] = np.array(threshold)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(ModelFileError, match="unknown_threshold must be one probability between 0 and 1"):
        load_model(path)


# -- the scikit-learn estimator ------------------------------------------------------------------
def test_the_scikit_learn_estimator_trains_linear_with_its_parameters():
    from sklearn.base import clone

    from tests.test_sklearn_api import clips
    from wavetrain.sklearn import SoundClassifier

    train, test = clips(6, seed=0), clips(6, seed=1)
    est = SoundClassifier("linear", c=0.1).fit(*train)
    assert est.score(*test) >= 0.8                          # chance: 1/3
    assert clone(est).get_params()["c"] == 0.1
    with pytest.raises(ParameterError, match=r"linear\.c: expected a number > 0"):
        SoundClassifier("linear", c=0).fit(*train)
