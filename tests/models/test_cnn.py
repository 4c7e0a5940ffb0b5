"""Contract tests of the cnn family (tiny configurations)."""
import subprocess
import sys

import numpy as np
import pytest

from wavetrain.errors import NotFittedError, ParameterError
from wavetrain.models import build, load_model, save_model
from wavetrain.train import synthetic_stream

TINY = dict(epochs=2, batch_size=8, frames=12, valid_fraction=0.25, seed=3)


@pytest.fixture(scope="module")
def stream():
    return synthetic_stream(48, 3, features=16)


@pytest.fixture(scope="module")
def fitted(stream):
    return build("cnn", TINY).fit(stream)


def test_import_models_does_not_import_torch():
    code = ("import sys, wavetrain.models, wavetrain.train, wavetrain.models.registry; "
            "import wavetrain.models.cnn, wavetrain.models.dcase; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_params_listed_and_validated():
    names = {p.name for p in build("cnn").param_table()}
    for n in ("epochs", "max_iters", "batch_size", "lr", "optimizer", "schedule", "valid_every_iters", "patience",
              "target_score", "min_loss", "valid_fraction", "shuffle_buffer", "frames", "seed", "dropout", "device"):
        assert n in names
    assert build("cnn", {"epochs": "5"}).params["epochs"] == 5
    with pytest.raises(ParameterError, match="cnn.optimizer"):
        build("cnn", {"optimizer": "rmsprop"})
    with pytest.raises(ParameterError, match="cnn.lr"):
        build("cnn", {"lr": -1})


def test_unfitted_raises():
    with pytest.raises(NotFittedError):
        build("cnn").predict_proba([np.zeros((5, 16), np.float32)])


def test_fit_predict_contract(fitted, stream):
    assert fitted.labels_ == stream.labels and fitted.feature_dim_ == 16
    p = fitted.predict_proba(stream.grams)
    assert p.shape == (len(stream), 3)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-9)
    assert set(fitted.predict(stream.grams[:5])) <= set(stream.labels)
    h = fitted.history_
    assert len(h) == 2 and {"epoch", "iteration", "train_loss", "valid_loss", "top1", "top5", "macro_f1", "lr",
                            "samples_per_s", "seconds"} <= set(h[0])
    assert 0.0 <= fitted.train_info_["data_wait_fraction"] <= 1.0


def test_learns_separable_data(stream):
    m = build("cnn", dict(TINY, epochs=6, valid_fraction=0.0)).fit(stream)
    acc = np.mean(np.array(m.predict(stream.grams)) == np.array([stream.labels[i] for i in stream.y]))
    assert acc >= 0.9


def test_batch_equals_single(fitted, stream):
    grams = stream.grams[:7]  # different lengths
    batch = fitted.predict_proba(grams)
    single = np.vstack([fitted.predict_proba([g]) for g in grams])
    np.testing.assert_allclose(batch, single, rtol=1e-5, atol=1e-6)


def test_any_length_accepted(fitted):
    p = fitted.predict_proba([np.zeros((1, 16), np.float32), np.ones((200, 16), np.float32)])
    assert p.shape == (2, 3)


def test_save_load_keeps_predictions(fitted, stream, tmp_path):
    path = save_model(fitted, tmp_path / "m.wt")
    m2 = load_model(path)
    np.testing.assert_allclose(m2.predict_proba(stream.grams), fitted.predict_proba(stream.grams), rtol=1e-6,
                               atol=1e-7)
    assert m2.history_ == fitted.history_
    assert "norm.mean" in fitted.state_dict() and any(k.startswith("net.") for k in fitted.state_dict())


def test_rejects_nan_and_wrong_feature_count(fitted):
    bad = np.zeros((10, 16), np.float32)
    bad[3, 2] = np.nan
    with pytest.raises(ParameterError):
        fitted.predict_proba([bad])
    with pytest.raises(ParameterError):
        fitted.predict_proba([np.zeros((10, 15), np.float32)])


def test_same_seed_same_model(stream):
    a = build("cnn", TINY).fit(stream)
    b = build("cnn", TINY).fit(stream)
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v, b.state_dict()[k])
    c = build("cnn", dict(TINY, seed=4)).fit(stream)
    assert not np.array_equal(a.state_dict()["net.0.weight"], c.state_dict()["net.0.weight"])
