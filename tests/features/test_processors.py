import numpy as np
import pytest

from wavetrain.core.errors import NotFittedError, ParameterError
from wavetrain.features import DatasetNormalizer, extract, parse_spec
from wavetrain.features.processors import delta

librosa = pytest.importorskip("librosa")


def _ramp(t=20, f=3, slope=2.0):
    return (slope * np.arange(t, dtype=np.float32)[:, None] * np.ones(f, np.float32))[None]


@pytest.mark.parametrize("weights", ["linear", "uniform"])
def test_delta_of_ramp_is_slope(weights):
    d = delta(_ramp(), half=3, weights=weights)
    np.testing.assert_allclose(d[0, 3:-3], 2.0, rtol=1e-6)


def test_delta_matches_librosa_interior(rng):
    x = rng.standard_normal((1, 30, 5)).astype(np.float32)
    ref = librosa.feature.delta(x[0].T, width=5, order=1, mode="nearest").T
    np.testing.assert_allclose(delta(x, half=2)[0], ref, atol=1e-5)


def test_delta_processor_layout(rng):
    x = rng.standard_normal(8000).astype(np.float32)
    base = extract(x, 8000, "mfcc(coeffs=13)")
    out = extract(x, 8000, "mfcc(coeffs=13) | delta(order=2, half=2)")
    assert out.shape == (base.shape[0], 39)
    np.testing.assert_array_equal(out[:, :13], base)
    np.testing.assert_allclose(out[:, 13:26], delta(base[None], half=2)[0], atol=1e-6)
    np.testing.assert_allclose(out[:, 26:], delta(delta(base[None])[0][None])[0], atol=1e-6)
    only = extract(x, 8000, "mfcc(coeffs=13) | delta(order=1, keep=false)")
    assert only.shape == (base.shape[0], 13)


def test_normalize(rng):
    x = (5 + 3 * rng.standard_normal(8000)).astype(np.float32)
    t = extract(x, 8000, "logmel(bands=20) | normalize")
    np.testing.assert_allclose(t.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(t.std(0), 1, atol=1e-3)
    f = extract(x, 8000, "logmel(bands=20) | normalize(axis=features)")
    np.testing.assert_allclose(f.mean(1), 0, atol=1e-4)
    np.testing.assert_allclose(f.std(1), 1, atol=1e-3)
    m = extract(x, 8000, "logmel(bands=20) | normalize(std=false)")
    np.testing.assert_allclose(m.mean(0), 0, atol=1e-4)


def test_lp_reductions(rng):
    x = rng.standard_normal(8000).astype(np.float32)
    base = extract(x, 8000, "stats")
    l2 = extract(x, 8000, "stats | lp")
    np.testing.assert_allclose(l2[:, 0], np.linalg.norm(base, axis=1), rtol=1e-5)
    l1 = extract(x, 8000, "stats | l1")
    np.testing.assert_allclose(l1[:, 0], np.abs(base).sum(1), rtol=1e-5)
    np.testing.assert_allclose(extract(x, 8000, "stats | lp(p=1)"), l1, rtol=1e-6)
    over_time = extract(x, 8000, "stats | lp(p=3, over=time)")
    assert over_time.shape == (1, 4)
    np.testing.assert_allclose(over_time[0], (np.abs(base) ** 3).sum(0) ** (1 / 3), rtol=1e-5)
    assert parse_spec("stats | lp(over=time)").feature_dim(8000) == 4


def test_lpnorm(rng):
    x = rng.standard_normal(8000).astype(np.float32)
    out = extract(x, 8000, "logmel(bands=10) | lpnorm(p=2)")
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1, rtol=1e-5)
    out1 = extract(x, 8000, "logmel(bands=10) | lpnorm(p=1, over=time)")
    np.testing.assert_allclose(np.abs(out1).sum(0), 1, rtol=1e-5)


def test_pipeline_order(rng):
    x = rng.standard_normal(8000).astype(np.float32)
    a = extract(x, 8000, "logmel(bands=10) | delta(order=1) | normalize")
    b = extract(x, 8000, "logmel(bands=10) | normalize | delta(order=1)")
    assert a.shape == b.shape == (49, 20)
    assert not np.allclose(a, b)
    np.testing.assert_allclose(a.mean(0), 0, atol=1e-4)


def test_dataset_normalizer_streaming(rng):
    chunks = [rng.standard_normal((n, 7, 4)).astype(np.float32) * 3 + 2 for n in (5, 1, 20)]
    norm = DatasetNormalizer()
    for c in chunks:
        assert norm.partial_fit(c) is norm
    data = np.concatenate([c.reshape(-1, 4) for c in chunks]).astype(np.float64)
    np.testing.assert_allclose(norm.mean_, data.mean(0), rtol=1e-6)
    np.testing.assert_allclose(norm.var_, data.var(0), rtol=1e-5)
    assert norm.count_ == data.shape[0]
    out = norm.transform(chunks[2])
    assert out.dtype == np.float32 and out.shape == chunks[2].shape
    full = norm.transform(data)
    np.testing.assert_allclose(full.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(full.std(0), 1, atol=1e-5)
    state = norm.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    again = DatasetNormalizer.from_state_dict(state)
    np.testing.assert_array_equal(again.transform(chunks[0]), norm.transform(chunks[0]))


def test_dataset_normalizer_errors():
    norm = DatasetNormalizer()
    with pytest.raises(NotFittedError):
        norm.transform(np.zeros((2, 3)))
    norm.partial_fit(np.zeros((2, 3)))
    with pytest.raises(ParameterError):
        norm.partial_fit(np.zeros((2, 4)))
    with pytest.raises(ParameterError):
        norm.partial_fit(np.array([[np.nan, 0, 0]]))
    with pytest.raises(ParameterError):
        norm.transform(np.zeros((2, 5)))
    with pytest.raises(ParameterError):
        DatasetNormalizer.from_state_dict({"mean": np.zeros(3)})
