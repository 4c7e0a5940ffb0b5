"""The shared classifier contract, run over every registered model family."""
import subprocess
import sys

import numpy as np
import pytest

from wavetrain.core.errors import NotFittedError, ParameterError
from wavetrain.models import build, family, family_names, load_model, save_model
from wavetrain.train.array_stream import ArrayStream

#: Tiny configurations so the suite stays fast.
TINY = {
    "gmm": {"components": 2, "features": "logmel(bands=8)"},
    "cnn": {"epochs": 2, "batch_size": 8, "features": "logmel(bands=16)"},
    "dcase": {"epochs": 2, "batch_size": 8, "features": "logmel(bands=16)"},
    "rescnn": {"epochs": 8, "batch_size": 4, "width": 8, "lr": 0.01, "features": "logmel(bands=16)"},
    "anomaly-gmm": {"components": 2, "features": "logmel(bands=8)"},
    "knn": {"capacity": 50, "k": 3, "features": "logmel(bands=8)"},
    "knn-anomaly": {"capacity": 50, "k": 3, "features": "logmel(bands=8)"},
    "autoencoder": {"epochs": 5, "batch_size": 32, "hidden": 16, "layers": 2, "features": "logmel(bands=16)"},
    "ensemble": {"members": '[{"model": "gmm", "features": "logmel(bands=3)"}, {"model": "gmm", "features": "mfcc"}]'},
}


def _data(d):
    rng = np.random.default_rng(0)
    grams, y = [], []
    for i in range(24):
        c = i % 2
        g = rng.normal(0, 1, (20 + (i % 3), d)).astype(np.float32)
        g[:, : d // 2] += 2.0 * c
        grams.append(g)
        y.append(c)
    return grams, y


def _fit(name):
    """A tiny fitted model: classifiers learn values a and b; anomaly detectors learn a alone
    (b is the anomaly)."""
    declared = {p.name for p in family(name).param_table()}
    model = build(name, {k: v for k, v in TINY.get(name, {}).items() if k in declared})
    grams, y = _data(16 if name != "gmm" else 8)
    if model.detector:
        normal = [g for g, c in zip(grams, y) if c == 0]
        returned = model.fit(ArrayStream(normal, [0] * len(normal), ["a"], batch_size=8))
    else:
        returned = model.fit(ArrayStream(grams, y, ["a", "b"], batch_size=8))
    return model, returned, grams, y


def _width(model) -> int:
    """Columns of predict_proba: the values the model knows."""
    return 1 if model.detector else 2


@pytest.fixture(params=family_names(), scope="module")
def fitted(request):
    model, returned, grams, y = _fit(request.param)
    assert returned is model, f"{request.param}.fit must return the model itself"
    return request.param, model, grams, y


def test_unfitted_predict_raises():
    for name in family_names():
        with pytest.raises(NotFittedError):
            build(name).predict_proba([np.zeros((5, 8), np.float32)])


def test_fit_returns_self(fitted):
    name, model, grams, y = fitted
    declared = {p.name for p in family(name).param_table()}
    fresh = build(name, {k: v for k, v in TINY.get(name, {}).items() if k in declared})
    if fresh.detector:
        assert fresh.fit(ArrayStream(grams[::2], [0] * len(grams[::2]), ["a"], batch_size=8)) is fresh
    else:
        assert fresh.fit(ArrayStream(grams, y, ["a", "b"], batch_size=8)) is fresh


def test_learns_and_proba_sums_to_one(fitted):
    name, model, grams, y = fitted
    p = model.predict_proba(grams)
    assert p.shape == (len(grams), _width(model))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-5)
    values = ["a", "anomaly"] if model.detector else ["a", "b"]
    acc = np.mean(np.array(model.predict(grams)) == np.array(values)[y])
    assert acc >= 0.75, f"{name} failed to learn an easy problem (accuracy {acc})"


def test_save_load_keeps_predictions(fitted, tmp_path):
    name, model, grams, _ = fitted
    path = save_model(model, tmp_path / "m.wt")
    again = load_model(path)
    np.testing.assert_allclose(again.predict_proba(grams), model.predict_proba(grams), atol=1e-6)
    np.testing.assert_allclose(again.predict_scores(grams)[1], model.predict_scores(grams)[1], atol=1e-6)
    assert again.predict(grams) == model.predict(grams)
    assert again.labels_ == model.labels_ and again.get_params() == model.get_params()
    assert again.history_ == model.history_ and again.feature_dim_ == model.feature_dim_


def test_a_fitted_model_pickles_and_predicts_the_same(fitted):
    """The Spark engine sends fitted models to its executors pickled: every family's round trip
    keeps its answers (a network built from classes local to a function travels as its weights)."""
    import pickle

    _, model, grams, _ = fitted
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_allclose(again.predict_scores(grams)[1], model.predict_scores(grams)[1], atol=1e-6)
    assert again.predict(grams) == model.predict(grams)


def test_batch_predict_equals_single(fitted):
    _, model, grams, _ = fitted
    batch = model.predict_scores(grams[:5])[1]
    single = np.concatenate([model.predict_scores([g])[1] for g in grams[:5]])
    np.testing.assert_allclose(batch, single, atol=1e-5)


def test_any_window_length_accepted(fitted):
    _, model, grams, _ = fitted
    d = grams[0].shape[1]
    _, p, _ = model.predict_scores([np.ones((1, d), np.float32), np.ones((300, d), np.float32)])
    assert p.shape == (2, _width(model)) and np.isfinite(p).all()


def test_same_data_and_seed_give_the_same_model(fitted):
    name, model, _, _ = fitted
    again, _, _, _ = _fit(name)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, again.state_dict()[k], err_msg=f"{name}: {k}")


def test_nan_and_wrong_feature_count_rejected(fitted):
    _, model, grams, _ = fitted
    bad = grams[0].copy()
    bad[0, 0] = np.nan
    with pytest.raises(ParameterError, match="NaN"):
        model.predict_proba([bad])
    with pytest.raises(ParameterError, match="expected windows of shape"):
        model.predict_proba([np.zeros((10, grams[0].shape[1] + 1), np.float32)])


def test_declared_limits_reject_bad_values():
    for name in family_names():
        for p in family(name).param_table():
            if p.type in (int, float) and p.low is not None:
                with pytest.raises(ParameterError, match=f"{name}.{p.name}: expected"):
                    build(name, {p.name: p.low - 1})
            if p.choices:
                with pytest.raises(ParameterError, match=f"{name}.{p.name}: expected one of"):
                    build(name, {p.name: "not-a-choice"})
        with pytest.raises(ParameterError, match="unknown parameter"):
            build(name, {"no_such_parameter": 1})


def test_importing_models_does_not_import_torch():
    code = "import sys, wavetrain.models, wavetrain.models.gmm, wavetrain.cli.main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
