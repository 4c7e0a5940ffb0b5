import numpy as np
import pytest
import scipy.fft
from scipy.signal import get_window as sp_get_window

from tests.features.conftest import tone
from wavetrain.core.errors import AudioError, ParameterError, UserError
from wavetrain.features import extract, frame, get_window, parse_spec, resample
from wavetrain.features.base import fft_length

librosa = pytest.importorskip("librosa")

CASES = [  # rate, bands, fmin, fmax, window_ms, shift_pct, htk
    (44100, 64, 0.0, None, 40, 50, False),
    (16000, 40, 50.0, 7000.0, 25, 40, True),
    (22050, 128, 0.0, 8000.0, 46.44, 25, False),
    (8000, 32, 100.0, None, 32, 100, False),
]


def _signal(rng, rate, seconds=1.5):
    t = np.arange(int(rate * seconds)) / rate
    return (0.1 * rng.standard_normal(t.size) + 0.5 * np.sin(2 * np.pi * 440 * t)).astype(
        np.float32)


def _librosa_mel(y, rate, n_fft_setting="fast", bands=64, fmin=0.0, fmax=None, wms=40, sp=50,
                 htk=False):
    """librosa melspectrogram with our framing: window ``size`` long zero-padded to ``n_fft``.

    librosa centres a short window inside the ``n_fft`` frame, so its frame ``t`` starts
    ``(n_fft - size) // 2`` samples before ours: pad the signal by that much on the left (and
    the rest on the right) and the frames coincide exactly."""
    size = round(wms * rate / 1000)
    n_fft = fft_length(n_fft_setting, size)
    hop = max(1, round(size * sp / 100))
    left = (n_fft - size) // 2
    yp = np.pad(y, (left, n_fft - size - left))
    return librosa.feature.melspectrogram(
        y=yp, sr=rate, n_fft=n_fft, hop_length=hop, win_length=size, window="hann",
        center=False, power=2.0, n_mels=bands, fmin=fmin, fmax=fmax, htk=htk, norm="slaney")


def _librosa_logmel(y, rate, bands, fmin, fmax, wms, sp, htk, n_fft="fast"):
    return np.log(_librosa_mel(y, rate, n_fft, bands, fmin, fmax, wms, sp, htk) + 1e-10)


def _spec(name, bands, fmin, fmax, wms, sp, htk, extra=""):
    fm = "none" if fmax is None else fmax
    return (f"{name}({extra}bands={bands}, fmin={fmin}, fmax={fm}, window_ms={wms}, "
            f"shift_pct={sp}, htk={str(htk).lower()})")


@pytest.mark.parametrize("n_fft", [None, "pow2", 2000, 1764])
def test_logmel_n_fft_matches_librosa(rng, n_fft):
    rate = 44100
    y = _signal(rng, rate)
    ref = _librosa_logmel(y, *CASES[0], n_fft=n_fft).T
    text = "none" if n_fft is None else n_fft
    out = extract(y, rate, f"logmel(bands=64, window_ms=40, shift_pct=50, n_fft={text})")
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)


def test_n_fft_lengths_and_errors(rng):
    assert fft_length("fast", 1764) == 1800 and fft_length("fast", 640) == 640
    assert fft_length("fast", 1) == 1 and fft_length("fast", 1001) == 1024
    assert fft_length("pow2", 1764) == 2048 and fft_length("pow2", 1024) == 1024
    assert fft_length(None, 1764) == 1764 and fft_length(2000, 1764) == 2000
    for n in range(1, 3000, 7):  # smallest 5-smooth length >= n
        f = fft_length("fast", n)
        assert f >= n and all(not _smooth(v) for v in range(n, f))
        assert _smooth(f)
    with pytest.raises(ParameterError, match="n_fft=1000"):
        extract(np.zeros(44100, np.float32), 44100, "logmel(n_fft=1000)")
    assert parse_spec("fft(n_fft=none)").feature_dim(44100) == 883
    assert parse_spec("fft").feature_dim(44100) == 901
    assert "n_fft=fast" in str(parse_spec("mel")) and "n_fft" not in str(parse_spec("rms"))


def _smooth(v):
    for p in (2, 3, 5):
        while v % p == 0:
            v //= p
    return v == 1


@pytest.mark.parametrize("case", CASES)
def test_logmel_matches_librosa(rng, case):
    rate = case[0]
    y = _signal(rng, rate)
    ref = _librosa_logmel(y, *case).T
    out = extract(y, rate, _spec("logmel", *case[1:]))
    assert out.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", CASES[:3])
def test_mfcc_matches_librosa(rng, case):
    rate = case[0]
    y = _signal(rng, rate)
    logmel = _librosa_logmel(y, *case)
    ref = librosa.feature.mfcc(S=logmel, n_mfcc=13, dct_type=2, norm="ortho").T
    out = extract(y, rate, _spec("mfcc", *case[1:], extra="coeffs=13, "))
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)
    np.testing.assert_allclose(
        out, scipy.fft.dct(logmel, type=2, norm="ortho", axis=0)[:13].T, atol=1e-4, rtol=0)


def test_mel_power_matches_librosa(rng):
    y = _signal(rng, 16000)
    ref = librosa.feature.melspectrogram(y=y, sr=16000, n_fft=640, hop_length=320,
                                         center=False, n_mels=40).T  # 640 is 5-smooth
    out = extract(y, 16000, "mel(bands=40)")
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-6 * ref.max())


def test_windows_are_periodic():
    for name in ("hann", "hamming"):
        np.testing.assert_allclose(get_window(name, 400), sp_get_window(name, 400, fftbins=True),
                                   atol=1e-7)


@pytest.mark.parametrize("freq", [440.0, 1010.0, 3217.0])
def test_fft_tone_bin(freq):
    rate = 16000
    y = tone(freq, rate)
    out = extract(y, rate, "fft(window_ms=64)")  # 1024-point FFT, 15.625 Hz bins
    assert out.shape[1] == 513
    assert np.all(out.argmax(axis=1) == round(freq * 1024 / rate))
    resized = extract(y, rate, "fft(bins=128, fmin=0, fmax=4000, log=true)")
    assert resized.shape[1] == 128
    assert np.all(resized.argmax(axis=1) == int(freq // (4000 / 128)))


def test_fft_native_range_and_norm():
    y = tone(1000.0, 16000)
    out = extract(y, 16000, "fft(window_ms=64, fmin=500, fmax=2000, norm=max)")
    freqs = np.fft.rfftfreq(1024, 1 / 16000)  # 1024 samples: already a fast length
    assert out.shape[1] == np.count_nonzero((freqs >= 500) & (freqs <= 2000))
    np.testing.assert_allclose(out.max(axis=1), 1.0, rtol=1e-6)
    l2 = extract(y, 16000, "fft(norm=l2)")
    np.testing.assert_allclose(np.linalg.norm(l2, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("spec", ["logmel", "mfcc | delta", "fft(bins=50)", "identity", "rms",
                                  "stats", "mel(whole=true)", "logmel(shift_pct=100)"])
def test_batch_equals_stacked_singles(rng, spec):
    x = rng.standard_normal((3, 8000)).astype(np.float32)
    batch = extract(x, 8000, spec)
    singles = np.stack([extract(row, 8000, spec) for row in x])
    # equal up to BLAS blocking order of the filter-bank matmul
    np.testing.assert_allclose(batch, singles, rtol=1e-5, atol=1e-5)
    assert batch.shape[:2] == (3, parse_spec(spec).n_frames(8000, 8000))
    assert batch.shape[2] == parse_spec(spec).feature_dim(8000) or "whole" in spec


def test_chunking_does_not_change_results(rng, monkeypatch):
    from wavetrain.features import base
    x = rng.standard_normal((2, 16000)).astype(np.float32)
    ref = extract(x, 16000, "logmel")
    monkeypatch.setattr(base, "CHUNK_BYTES", 640 * 4 * 3)  # 3 frames per chunk, spans signals
    np.testing.assert_array_equal(extract(x, 16000, "logmel"), ref)


def test_frame_is_a_view():
    x = np.arange(100, dtype=np.float32)
    f = frame(x, 10, 5)
    assert f.shape == (19, 10) and np.shares_memory(f, x)
    np.testing.assert_array_equal(f[3], x[15:25])
    xb = np.arange(300, dtype=np.float64).reshape(3, 100)[:, ::2]  # strided input
    fb = frame(xb, 8, 8)
    assert fb.shape == (3, 6, 8) and np.shares_memory(fb, xb)
    np.testing.assert_array_equal(fb[1, 2], xb[1, 16:24])


def test_frame_counts_and_shifts():
    spec = parse_spec("rms(window_ms=100, shift_pct=100)")  # rolling
    assert extract(np.ones(10000, np.float32), 10000, spec).shape == (10, 1)
    assert spec.frame_shift_s(10000) == pytest.approx(0.1)
    sliding = parse_spec("rms(window_ms=100, shift_pct=25)")
    assert extract(np.ones(10000, np.float32), 10000, sliding).shape == (37, 1)
    whole = extract(np.ones(12345, np.float32), 10000, "stats(whole=true)")
    assert whole.shape == (1, 4)


def test_time_domain_extractors(rng):
    x = rng.standard_normal(4000).astype(np.float32)
    frames = x.reshape(10, 400)
    np.testing.assert_array_equal(extract(x, 10000, "identity(shift_pct=100)"), frames)
    np.testing.assert_allclose(extract(x, 10000, "rms(shift_pct=100)")[:, 0],
                               np.sqrt((frames.astype(np.float64) ** 2).mean(1)), rtol=1e-6)
    st = extract(x, 10000, "stats(shift_pct=100)")
    a = np.abs(frames.astype(np.float64))
    ref = np.stack([a.mean(1), a.min(1), a.max(1), a.std(1)], axis=1)
    np.testing.assert_allclose(st, ref, rtol=1e-5, atol=1e-6)


def test_per_axis(rng):
    x = rng.standard_normal((8000, 3)).astype(np.float32)
    out = extract(x, 8000, "logmel(bands=20, per_axis=true)")
    parts = [extract(np.ascontiguousarray(x[:, c]), 8000, "logmel(bands=20)") for c in range(3)]
    np.testing.assert_array_equal(out, np.concatenate(parts, axis=1))
    assert out.shape[1] == parse_spec("logmel(bands=20, per_axis=true)").feature_dim(8000,
                                                                                      channels=3)
    xb = np.stack([x, x[::-1]])
    outb = extract(xb, 8000, "stats(per_axis=true)")
    assert outb.shape == (2, 49, 12)
    np.testing.assert_array_equal(outb[0], extract(x, 8000, "stats(per_axis=true)"))
    with pytest.raises(UserError):  # (n, C) without per_axis reads as C-sample batch items
        extract(x, 8000, "logmel")
    with pytest.raises(ParameterError, match="per_axis"):
        extract(xb, 8000, "logmel")


def test_resample(rng):
    y = tone(440.0, 44100)
    r = resample(y, 44100, 16000)
    assert r.dtype == np.float32 and r.shape == (16000,)
    np.testing.assert_allclose(r[1000:-1000], tone(440.0, 16000)[1000:-1000], atol=2e-3)
    b = resample(np.stack([y, 2 * y]), 44100, 16000)
    assert b.shape == (2, 16000)
    np.testing.assert_allclose(b[1], 2 * r, rtol=1e-5, atol=1e-6)
    assert resample(y, 16000, 16000).shape == y.shape
    with pytest.raises(ParameterError):
        resample(y, 0, 16000)
    # extract resamples to spec.rate first
    spec = "logmel(bands=40, rate=16000)"
    np.testing.assert_allclose(extract(y, 44100, spec), extract(r, 16000, spec), atol=1e-5)


@pytest.mark.parametrize("spec", ["logmel", "mfcc(coeffs=20)", "mel", "fft(bins=64, log=true)",
                                  "fft(norm=l2)", "identity", "rms", "stats",
                                  "logmel(window=hamming, per_axis=true)"])
def test_torch_cpu_matches_numpy(rng, spec):
    pytest.importorskip("torch")
    shape = (2, 8000, 2) if "per_axis" in spec else (2, 8000)
    x = rng.standard_normal(shape).astype(np.float32)
    a = extract(x, 8000, spec)
    b = extract(x, 8000, spec, device="cpu-torch")
    assert b.dtype == np.float32 and b.shape == a.shape
    tol = 1e-3 * max(1.0, float(np.abs(a).max())) if spec == "mel" else 1e-3
    np.testing.assert_allclose(b, a, atol=tol, rtol=1e-4)


@pytest.mark.parametrize("spec", ["logmel", "mfcc", "fft(bins=64)", "fft(n_fft=pow2)",
                                  "mel(n_fft=none)"])
def test_torch_unfold_path_matches_numpy_with_padding(rng, spec):
    """The all-torch (CUDA) path, run on the CPU, zero-pads to n_fft like the numpy path."""
    torch = pytest.importorskip("torch")
    from wavetrain.features.torch_backend import _extract_unfold
    x = rng.standard_normal((2, 44100)).astype(np.float32)  # 40 ms = 1764 -> n_fft 1800
    ext = parse_spec(spec).build_extractor()
    a = ext.extract_batch(x, 44100)
    b = _extract_unfold(torch, ext, x, 44100, torch.device("cpu"))
    np.testing.assert_allclose(b, a, atol=1e-3 * max(1.0, float(np.abs(a).max())), rtol=1e-4)


def test_cuda_unavailable_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ParameterError, match="CUDA"):
        extract(np.zeros(8000, np.float32), 8000, "logmel", device="cuda")


@pytest.mark.parametrize("bad,match", [
    (np.array([0.0, np.nan] * 4000, np.float32), "NaN or infinite"),
    (np.array([0.0, np.inf] * 4000, np.float32), "NaN or infinite"),
    (np.zeros(0, np.float32), "empty"),
    (np.zeros(100, np.float32), "shorter than one logmel sub-window"),
    (np.array(["a"] * 8000), "real numbers"),
])
def test_bad_samples(bad, match):
    with pytest.raises(AudioError, match=match) as info:
        extract(bad, 8000, "logmel")
    assert isinstance(info.value, UserError) and "\n" not in str(info.value)


def test_bad_arguments():
    y = np.zeros(8000, np.float32)
    with pytest.raises(ParameterError):
        extract(y, 0, "logmel")
    with pytest.raises(ParameterError):
        extract(y, 8000, "logmel", device="tpu")
    with pytest.raises(ParameterError, match="Nyquist"):
        extract(y, 8000, "logmel(fmax=8000)")
    with pytest.raises(ParameterError, match="shorter than one sample"):
        extract(y, 8000, "rms(window_ms=0.01)")
    with pytest.raises(AudioError, match="not finite"):
        extract(np.full(8000, 1e30, np.float32), 8000, "mel")


def test_integer_and_float64_input(rng):
    y = rng.standard_normal(8000)
    np.testing.assert_allclose(extract(y, 8000, "logmel"),
                               extract(y.astype(np.float32), 8000, "logmel"), atol=1e-4)
    assert extract((y * 1000).astype(np.int16), 8000, "rms").dtype == np.float32


@pytest.mark.parametrize("spec", ["logmel(bands=32)", "mfcc(coeffs=13) | delta(order=2) | normalize(axis=time)",
                                  "fft(bins=64, log=true)", "stats(window_ms=20, shift_pct=100)"])
def test_blockwise_extraction_equals_whole(spec):
    from wavetrain.features import extract_blocks

    rng = np.random.default_rng(3)
    x = rng.standard_normal(16000 * 3 + 123).astype(np.float32) * 0.1
    reads = []

    def read(a, b):
        reads.append((a, b))
        return x[a:b]

    got = extract_blocks(read, len(x), 16000, spec, block_s=0.37)
    np.testing.assert_allclose(got, extract(x, 16000, spec), rtol=1e-5, atol=1e-5)
    assert len(reads) > 5 and max(b - a for a, b in reads) < 0.5 * 16000


def test_blockwise_extraction_declines_what_needs_the_whole_signal():
    from wavetrain.features import extract_blocks

    x = np.zeros(16000, np.float32)
    assert extract_blocks(lambda a, b: x[a:b], len(x), 16000, "logmel(rate=8000)") is None
    assert extract_blocks(lambda a, b: x[a:b], len(x), 16000, "stats(whole=true)") is None


def test_finiteness_check_has_no_false_alarm_on_huge_finite_values():
    from wavetrain.features.api import _all_finite

    big = np.full(1000, 1e30, np.float32)              # its dot product overflows to inf
    assert _all_finite(big)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.zeros(1000, np.float32)
        x[500] = bad
        assert not _all_finite(x) and not _all_finite(x.astype(np.float64))
