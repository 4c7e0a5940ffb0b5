"""The real-FFT backends (MKL, scipy): same features, librosa parity for each, clear choice."""
import sys

import numpy as np
import pytest

from tests.features.test_extract import CASES, _librosa_logmel, _signal, _spec
from wavetrain.core.errors import ParameterError
from wavetrain.features import extract
from wavetrain.features import fft as fftmod

BACKENDS = ["scipy"] + (["mkl"] if fftmod._mkl_available() else [])


@pytest.fixture
def backend(request, monkeypatch):
    monkeypatch.setenv("WAVETRAIN_FFT", request.param)
    return request.param


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("case", CASES[:2])
def test_each_backend_matches_librosa(rng, backend, case):
    rate = case[0]
    y = _signal(rng, rate)
    ref = _librosa_logmel(y, *case).T
    out = extract(y, rate, _spec("logmel", *case[1:]))
    assert fftmod.fft_backend() == backend
    np.testing.assert_allclose(out, ref, atol=1e-4)


@pytest.mark.skipif("mkl" not in BACKENDS, reason="mkl_fft not installed")
@pytest.mark.parametrize("spec", ["logmel", "mfcc(coeffs=20) | delta", "fft(bins=64, log=true)",
                                  "fft(n_fft=pow2)", "mel(n_fft=none)"])
def test_backends_agree(rng, monkeypatch, spec):
    y = _signal(rng, 22050, seconds=2.0)
    out = {}
    for name in ("scipy", "mkl"):
        monkeypatch.setenv("WAVETRAIN_FFT", name)
        out[name] = extract(y, 22050, spec)
    scale = np.abs(out["scipy"]).max()
    np.testing.assert_allclose(out["mkl"], out["scipy"], atol=1e-5 * max(scale, 1.0))


def test_rfft_functions_agree_with_numpy(rng):
    frames = rng.standard_normal((7, 1800)).astype(np.float32)
    ref = np.fft.rfft(frames[:, :1764].astype(np.float64), n=1800, axis=-1)
    for name in BACKENDS:
        got = fftmod.get_rfft(name)(frames[:, :1764].copy(), 1800)
        assert got.dtype == np.complex64 and got.shape == (7, 901)
        np.testing.assert_allclose(got, ref, atol=1e-3, rtol=1e-4)


def test_unknown_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WAVETRAIN_FFT", "fftw")
    with pytest.raises(ParameterError, match="unknown FFT backend 'fftw'.*auto, mkl, scipy"):
        extract(np.zeros(4000, np.float32), 16000, "logmel")


def test_missing_mkl_falls_back_to_scipy_or_fails_when_asked(monkeypatch):
    monkeypatch.setitem(sys.modules, "mkl_fft", None)  # import mkl_fft -> ImportError
    monkeypatch.setattr(fftmod, "_resolved", {})
    assert fftmod.fft_backend("auto") == "scipy"
    assert fftmod.get_rfft("auto") is fftmod.scipy_rfft
    with pytest.raises(ParameterError, match="mkl_fft does not import.*WAVETRAIN_FFT=scipy"):
        fftmod.fft_backend("mkl")
    monkeypatch.setenv("WAVETRAIN_FFT", "auto")
    y = np.sin(np.arange(16000) * 0.3).astype(np.float32)
    assert np.isfinite(extract(y, 16000, "logmel")).all()


def test_a_bad_backend_setting_is_not_blamed_on_recordings(tmp_path, monkeypatch, capsys):
    import soundfile as sf

    from wavetrain.cli.main import main

    for i in range(3):
        (tmp_path / "a").mkdir(exist_ok=True)
        sf.write(tmp_path / "a" / f"{i}.wav", np.random.default_rng(i).standard_normal(8000) * 0.1, 8000)
    monkeypatch.setenv("WAVETRAIN_FFT", "bogus")
    rc = main(["train", "--data", str(tmp_path), "--label", "class", "--model", "gmm", "--skip-bad",
               "--no-cache", "-o", str(tmp_path / "m.wt")])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown FFT backend 'bogus'" in err and ".wav" not in err
