"""Contract tests of the dcase family (tiny configurations)."""
import numpy as np
import pytest

from wavetrain.errors import ParameterError
from wavetrain.models import build, load_model, save_model
from wavetrain.train import synthetic_stream

TINY = dict(epochs=2, batch_size=8, frames=12, valid_fraction=0.25, seed=1)


@pytest.fixture(scope="module")
def stream():
    return synthetic_stream(48, 3, features=16)


@pytest.fixture(scope="module")
def fitted(stream):
    return build("dcase", TINY).fit(stream)


def test_defaults():
    m = build("dcase")
    assert m.params["features"] == "logmel(bands=128)" and m.params["dropout"] == 0.5


def test_fit_predict_save_load(fitted, stream, tmp_path):
    p = fitted.predict_proba(stream.grams)
    assert p.shape == (len(stream), 3)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-9)
    assert any("running_mean" in k for k in fitted.state_dict())  # batch-norm statistics are saved
    m2 = load_model(save_model(fitted, tmp_path / "d.wt"))
    np.testing.assert_allclose(m2.predict_proba(stream.grams), p, rtol=1e-6, atol=1e-7)


def test_batch_equals_single(fitted, stream):
    grams = stream.grams[:6]
    np.testing.assert_allclose(fitted.predict_proba(grams), np.vstack([fitted.predict_proba([g]) for g in grams]),
                               rtol=1e-5, atol=1e-6)


def test_rejects_bad_input(fitted):
    with pytest.raises(ParameterError):
        fitted.predict_proba([np.full((10, 16), np.inf, np.float32)])
    with pytest.raises(ParameterError):
        fitted.predict_proba([np.zeros((10, 17), np.float32)])


def test_deterministic(stream):
    a = build("dcase", TINY).fit(stream).state_dict()
    b = build("dcase", TINY).fit(stream).state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
