"""The feature front-end as an ONNX graph equals :func:`wavetrain.features.extract`: every
extractor and processor, combined specs, several rates and lengths, one sub-window, silence."""
from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from wavetrain.core.errors import ParameterError  # noqa: E402
from wavetrain.core.graph import FLOAT, Graph  # noqa: E402
from wavetrain.features import extract, parse_spec  # noqa: E402
from wavetrain.features.graph import check_exportable, min_samples, spec_graph  # noqa: E402

SPECS = [
    "logmel(bands=64)",
    "mfcc(bands=40, coeffs=13, window_ms=25, shift_pct=40) | delta(order=2)",
    "fft(bins=32, log=true, norm=max)",
    "fft(fmin=100, fmax=2000, norm=l2, window=hamming, n_fft=pow2)",
    "mel(bands=24, htk=true, norm=none, window=rect, n_fft=none)",
    "pcen(bands=40)",
    "pcen(bands=16, power=0) | delta(order=1, weights=uniform, keep=false)",
    "rms(window_ms=10)",
    "stats(whole=true)",
    "identity(window_ms=2)",
    "mfcc | normalize(axis=time)",
    "logmel(bands=32) | cmvn(window_frames=11)",
    "logmel(bands=32) | cmvn(window_frames=0, var=false)",
    "logmel(bands=20) | dct(coeffs=10) | normalize(axis=features, std=false)",
    "logmel(bands=16) | lp(over=time, p=3)",
    "logmel(bands=16) | l1",
    "logmel(bands=16) | lpnorm(p=1, over=time)",
    "mfcc(coeffs=13, window_ms=25, shift_pct=40) + logmel(bands=32, window_ms=50, shift_pct=50)",
    "rms(window_ms=20) + stats(whole=true) + logmel(bands=8) | lp(over=time)",
]


def _session(spec, rate: int):
    g = Graph()
    out = spec_graph(g, "audio", spec, rate)
    g.output("gram", out)
    model = g.model([("audio", FLOAT, ["n"])], [("gram", FLOAT, ["t", "d"])])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts)


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape
    # float32 rounding of a DFT by matrix product against an FFT: ~1e-4 of a feature's scale (a
    # DCT spreads a frame's largest value's rounding over every coefficient)
    a = np.abs(ref)
    scale = np.maximum(np.maximum(a, 1e-2 * a.max(axis=0, keepdims=True)), 1e-4 * a.max() + 1e-3)
    assert np.max(np.abs(got - ref) / scale) < 2e-3


@pytest.mark.parametrize("text", SPECS)
def test_graph_equals_extract(text):
    spec = parse_spec(text)
    rng = np.random.default_rng(1)
    for rate, n in [(16000, 16000), (8000, 3001), (44100, 30000)]:
        sess = _session(spec, rate)
        t = np.arange(n) / rate
        signals = [(0.3 * np.sin(2 * np.pi * 440 * t) * np.exp(-t) + 0.05 * rng.standard_normal(n)).astype(np.float32),
                   np.zeros(n, np.float32)]
        shortest = min_samples(spec, rate)
        signals.append((0.1 * rng.standard_normal(shortest)).astype(np.float32))     # one sub-window exactly
        for x in signals:
            ref = extract(x, rate, spec)
            got = sess.run(None, {"audio": x})[0]
            if not x.any() and any(getattr(p, "std", False) or getattr(p, "var", False) for p in spec.processors):
                assert np.isfinite(got).all()   # constant features over their sd: rounding noise / eps, in both
                continue
            _close(got, ref)


def test_unexportable_specs_are_one_line():
    for text, words in [("logmel(per_axis=true)", "per_axis"), ("fft(whole=true, bins=8)", "whole=true")]:
        with pytest.raises(ParameterError, match=words) as e:
            check_exportable(parse_spec(text))
        assert "\n" not in str(e.value)
