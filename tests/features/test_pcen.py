"""The pcen extractor: librosa.pcen of our mel power spectrogram, its start-up, parameters, spec
and the torch paths."""
import numpy as np
import pytest

from wavetrain.core.errors import SpecError
from wavetrain.features import extract, parse_spec
from wavetrain.features.extractors import pcen, pcen_smoothing
from wavetrain.features.spec import describe_specs

librosa = pytest.importorskip("librosa")

RATE = 16000
GEOM = "bands=40, window_ms=25, shift_pct=40"  # 400-sample window, 160-sample hop


@pytest.fixture
def speechy(rng):
    """4 s of noise whose level steps up and down (what PCEN is for)."""
    x = 0.05 * rng.standard_normal(4 * RATE)
    x[RATE:2 * RATE] *= 10
    x[3 * RATE:] += 0.3 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)
    return x.astype(np.float32)


def _librosa(mel, zi=None, **kw):
    return librosa.pcen(mel.T.astype(np.float64), sr=RATE, hop_length=160, zi=zi, **kw).T


def test_pcen_equals_librosa_started_at_the_first_frame(speechy):
    mel = extract(speechy, RATE, f"mel({GEOM})")
    ours = extract(speechy, RATE, f"pcen({GEOM})")
    b = pcen_smoothing(0.4, 160 / RATE)
    ref = _librosa(mel, zi=(1 - b) * mel.T[:, :1].astype(np.float64))
    assert ours.shape == mel.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_pcen_equals_librosa_default_after_the_start_up(speechy):
    """librosa starts the smoother as if the power had been 1.0 before the first frame; the
    difference decays as (1 - b)^t (b = 0.025 here: below 1e-6 relative after ~600 frames)."""
    mel = extract(speechy, RATE, f"mel({GEOM})")
    ours = extract(speechy, RATE, f"pcen({GEOM})")
    ref = _librosa(mel)
    assert not np.allclose(ours[:20], ref[:20], rtol=1e-2)
    np.testing.assert_allclose(ours[700:], ref[700:], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("params", [dict(time_constant=0.06, gain=0.8, bias=10.0, power=0.25, eps=1e-9),
                                    dict(power=0.0), dict(bias=0.0, power=0.3), dict(gain=0.0)])
def test_pcen_parameters_match_librosa(speechy, params):
    args = ", ".join(f"{k}={v!r}" for k, v in params.items())
    mel = extract(speechy, RATE, f"mel({GEOM})")
    ours = extract(speechy, RATE, f"pcen({GEOM}, {args})")
    b = pcen_smoothing(params.get("time_constant", 0.4), 160 / RATE)
    ref = _librosa(mel, zi=(1 - b) * mel.T[:, :1].astype(np.float64), **params)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_pcen_normalises_the_level():
    """A stationary sound at any level settles to the same PCEN (gain 1, bias 0, power 1: S/M = 1)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(2 * RATE).astype(np.float32)
    a = extract(0.01 * x, RATE, f"pcen({GEOM}, gain=1, bias=0, power=1, eps=1e-12)")
    b = extract(0.5 * x, RATE, f"pcen({GEOM}, gain=1, bias=0, power=1, eps=1e-12)")
    np.testing.assert_allclose(a, b, rtol=1e-3)


def test_blocks_carry_the_smoother_state(speechy):
    """pcen(zi=the previous block's zf) of consecutive blocks equals pcen of the whole."""
    mel = extract(speechy, RATE, f"mel({GEOM})")[None]
    b = pcen_smoothing(0.4, 0.01)
    whole, _ = pcen(mel, b)
    first, zf = pcen(mel[:, :150], b)
    rest, _ = pcen(mel[:, 150:], b, zi=zf)
    np.testing.assert_allclose(np.concatenate([first, rest], axis=1), whole, rtol=1e-6)


def test_batch_rows_are_independent(speechy):
    batch = np.stack([speechy, 0.1 * speechy[::-1]])
    out = extract(batch, RATE, f"pcen({GEOM})")
    # (equal up to the float32 FFT's rounding, which depends on how frames are chunked)
    np.testing.assert_allclose(out[0], extract(batch[0], RATE, f"pcen({GEOM})"), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], extract(batch[1], RATE, f"pcen({GEOM})"), rtol=1e-5, atol=1e-6)


def test_whole_clip_is_one_unsmoothed_frame(speechy):
    out = extract(speechy[:RATE], RATE, "pcen(bands=16, whole=true)")
    mel = extract(speechy[:RATE], RATE, "mel(bands=16, whole=true)").astype(np.float64)
    ref = 2 ** 0.5 * (np.sqrt(1 + mel / (1e-6 + mel) ** 0.98 / 2) - 1)
    assert out.shape == (1, 16)
    np.testing.assert_allclose(out, ref, rtol=1e-5)


def test_spec_is_canonical_and_listed():
    spec = parse_spec("PCEN(bands=40, time_constant=0.1)")
    assert str(spec).startswith("pcen(bands=40, fmin=0, fmax=none, htk=false, norm=slaney, time_constant=0.1, "
                                "gain=0.98, bias=2, power=0.5, eps=1e-06, window_ms=40")
    assert parse_spec(str(spec)) == spec
    assert spec.feature_dim(RATE) == 40
    stage = next(s for s in describe_specs() if s["name"] == "pcen")
    assert stage["kind"] == "extractor"
    assert [p["name"] for p in stage["params"]][6:11] == ["time_constant", "gain", "bias", "power", "eps"]


@pytest.mark.parametrize("bad, where", [("time_constant=0", "pcen.time_constant"), ("eps=0", "pcen.eps"),
                                        ("gain=-1", "pcen.gain"), ("power=-0.5", "pcen.power"),
                                        ("bias=-1", "pcen.bias")])
def test_bad_parameters(bad, where):
    with pytest.raises(SpecError, match=where):
        parse_spec(f"pcen({bad})")


def test_processors_follow_pcen(speechy):
    out = extract(speechy, RATE, f"pcen({GEOM}) | delta(order=1)")
    np.testing.assert_array_equal(out[:, :40], extract(speechy, RATE, f"pcen({GEOM})"))


def test_torch_paths_match_numpy(speechy):
    torch = pytest.importorskip("torch")
    from wavetrain.features.torch_backend import _extract_unfold

    ref = extract(speechy, RATE, f"pcen({GEOM})")
    np.testing.assert_allclose(extract(speechy, RATE, f"pcen({GEOM})", device="cpu-torch"), ref,
                               rtol=1e-3, atol=1e-4)
    ext = parse_spec(f"pcen({GEOM})").build_extractor()   # the cuda path (mel in torch, smoother in numpy)
    out = _extract_unfold(torch, ext, speechy[None], RATE, torch.device("cpu"))[0]
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4)


def test_dct_processor_makes_cepstra(speechy):
    """dct over the bands: logmel | dct = mfcc; pcen | dct is a PCEN cepstrum."""
    np.testing.assert_allclose(extract(speechy, RATE, f"logmel({GEOM}) | dct(coeffs=13)"),
                               extract(speechy, RATE, f"mfcc({GEOM}, coeffs=13)"), atol=1e-5)
    scipy_fft = pytest.importorskip("scipy.fft")
    p = extract(speechy, RATE, f"pcen({GEOM})")
    ref = scipy_fft.dct(p.astype(np.float64), type=2, norm="ortho", axis=-1)[:, :20]
    np.testing.assert_allclose(extract(speechy, RATE, f"pcen({GEOM}) | dct(coeffs=20)"), ref, atol=1e-5)
    assert parse_spec(f"pcen({GEOM}) | dct(coeffs=20) | delta").feature_dim(RATE) == 60
    with pytest.raises(Exception, match="dct.coeffs: expected at most the 40 features"):
        parse_spec(f"pcen({GEOM}) | dct(coeffs=41)").feature_dim(RATE)
