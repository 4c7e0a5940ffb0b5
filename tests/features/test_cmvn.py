"""The cmvn processor: mean/variance normalisation over a centred sliding window of frames,
against a frame-by-frame reference."""
import numpy as np
import pytest

from wavetrain.core.errors import SpecError
from wavetrain.features import extract, parse_spec
from wavetrain.features.processors import sliding_cmvn


def _reference(x, window, var=True, eps=1e-8):
    """Frame by frame: the mean and population sd of frames t - window // 2 .. t + (window - 1) // 2."""
    x = np.asarray(x, dtype=np.float64)
    t_all = x.shape[-2]
    out = np.empty_like(x)
    for t in range(t_all):
        lo, hi = (0, t_all) if window == 0 else (max(0, t - window // 2), min(t_all, t + (window - 1) // 2 + 1))
        seg = x[..., lo:hi, :]
        out[..., t, :] = x[..., t, :] - seg.mean(axis=-2)
        if var:
            out[..., t, :] /= seg.std(axis=-2) + eps
    return out


@pytest.mark.parametrize("window", [0, 1, 2, 3, 10, 11, 59, 60, 119, 120, 500])
def test_matches_reference(rng, window):
    x = (40 + 7 * rng.standard_normal((3, 60, 5))).astype(np.float32)
    np.testing.assert_allclose(sliding_cmvn(x, window), _reference(x, window), atol=2e-5)
    np.testing.assert_allclose(sliding_cmvn(x, window, var=False), _reference(x, window, var=False), atol=2e-5)


def test_whole_window_is_normalize(rng):
    x = rng.standard_normal((2, 80, 4)).astype(np.float32) * 3 + 1
    whole = parse_spec("mfcc | normalize(axis=time)").build_pipeline().processors[-1].process(x)
    np.testing.assert_allclose(sliding_cmvn(x, 0), whole, atol=1e-6)
    np.testing.assert_allclose(sliding_cmvn(x, 160), whole, atol=1e-5)


def test_precision_of_long_recordings_of_large_values(rng):
    """float64 accumulation after removing the mean: 200k frames around 1e4 keep ~1e-6 accuracy."""
    x = (1e4 + rng.standard_normal((1, 200_000, 2))).astype(np.float32)
    got = sliding_cmvn(x, 301)
    for t in (0, 150, 99_999, 199_999):
        seg = x[0, max(0, t - 150):t + 151].astype(np.float64)
        want = (x[0, t] - seg.mean(axis=0)) / (seg.std(axis=0) + 1e-8)
        np.testing.assert_allclose(got[0, t], want, atol=1e-4)


def test_constant_window_is_zero():
    x = np.full((1, 30, 3), 7.0, np.float32)
    out = sliding_cmvn(x, 5)
    assert np.all(np.isfinite(out)) and np.abs(out).max() < 1e-3


def test_processor_in_a_spec(rng):
    x = rng.standard_normal(16000).astype(np.float32)
    spec = parse_spec("mfcc(coeffs=13) | delta(order=1) | CMVN(window_frames=25)")
    assert str(spec).endswith("| cmvn(window_frames=25, var=true, eps=1e-08)")
    assert parse_spec(str(spec)) == spec
    base = extract(x, 16000, "mfcc(coeffs=13) | delta(order=1)")
    out = extract(x, 16000, spec)
    assert out.shape == base.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, _reference(base, 25), atol=1e-4)
    assert str(parse_spec("mfcc | cmvn")).endswith("cmvn(window_frames=300, var=true, eps=1e-08)")


def test_bad_window():
    with pytest.raises(SpecError, match="cmvn.window_frames"):
        parse_spec("mfcc | cmvn(window_frames=-1)")
