import dataclasses
import subprocess
import sys

import pytest

from wavetrain.core.errors import SpecError, UserError
from wavetrain.features import FeatureSpec, describe_specs, parse_spec

SPECS = [
    "logmel(bands=64, window_ms=40, shift_pct=50)",
    "mfcc(coeffs=13) | delta(order=2)",
    "logmel(bands=128, fmax=8000, rate=16000)",
    "fft(bins=128, fmin=0, fmax=4000, log=true)",
    "stats(window_ms=100, shift_pct=100) | normalize(axis=features)",
    "rms(whole=true)",
    "identity(window_ms=10, rate=8000) | lp(p=1, over=time) | lpnorm",
    "mel(htk=true, norm=none, window=hamming, per_axis=true) | l1",
]


@pytest.mark.parametrize("text", SPECS)
def test_round_trip(text):
    spec = parse_spec(text)
    assert parse_spec(str(spec)) == spec
    assert str(parse_spec(str(spec))) == str(spec)
    assert hash(parse_spec(str(spec))) == hash(spec)
    assert len(spec.key) == 16 and int(spec.key, 16) >= 0


def test_canonical_includes_defaults_and_normalises():
    a = parse_spec("logmel")
    b = parse_spec("LOGMEL( bands = 64 , window_ms=40.0, shift_pct=50, window='HANN', )")
    assert a == b and str(a) == str(b) and a.key == b.key
    assert "bands=64" in str(a) and "fmax=none" in str(a) and "window=hann" in str(a)
    assert parse_spec("logmel(window_ms=0)") == parse_spec("logmel(whole=true)")


def test_parse_spec_returns_spec_as_is():
    spec = parse_spec("mfcc")
    assert parse_spec(spec) is spec


def test_frozen():
    spec = parse_spec("mfcc")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.extractor = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.extractor.bands = 3


def test_key_stable_across_processes():
    text = "mfcc(coeffs=13) | delta(order=2)"
    code = ("import wavetrain.features as f; "
            f"print(f.parse_spec({text!r}).key)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == parse_spec(text).key


def test_properties_and_geometry():
    spec = parse_spec("logmel(bands=128, fmax=8000, rate=16000)")
    assert spec.rate == 16000 and spec.per_axis is False
    assert spec.feature_dim(44100) == 128
    # 1 s at 44.1 kHz -> 16000 samples at 16 kHz -> 640-sample windows, 320 shift
    assert spec.n_frames(44100, 44100) == 1 + (16000 - 640) // 320
    assert spec.frame_shift_s(44100) == pytest.approx(0.02)
    d = parse_spec("mfcc(coeffs=13) | delta(order=2)")
    assert d.feature_dim(16000) == 39
    assert parse_spec("fft(bins=10, per_axis=true)").feature_dim(16000, channels=3) == 30
    assert parse_spec("logmel").n_frames(10, 16000) == 0
    assert parse_spec("stats | lp(over=time)").n_frames(16000, 16000) == 1


@pytest.mark.parametrize("text,col,words", [
    ("logmel(band=64)", 8, "unknown parameter 'band' for logmel (expected one of: bands, fmin"),
    ("logmel(bands=0)", 14, "logmel.bands: expected an integer >= 1, got 0"),
    ("logmel(bands=64", 16, "expected ',' or ')'"),
    ("logmell", 1, "unknown extractor 'logmell'"),
    ("delta", 1, "processor"),
    ("mfcc | mfcc", 8, "unknown processor"),
    ("", 1, "empty spec"),
    ("logmel(bands=64) delta", 18, "expected '|'"),
    ("logmel(bands=64, bands=32)", 18, "given twice"),
    ("logmel(bands 64)", 14, "expected '='"),
    ("logmel(bands=)", 14, "expected a value"),
    ("logmel(bands=6.5)", 14, "an integer"),
    ("fft(fmin=500, fmax=100)", 20, "fft.fmax: expected above fmin=500, got 100"),
    ("logmel(window=kaiser)", 15, "logmel.window: expected one of hann, hamming, rect, got 'kaiser'"),
    ("mfcc(coeffs=80)", 13, "mfcc.coeffs: expected at most bands=64, got 80"),
    ("logmel(bands=64) | ", 20, "expected a processor name"),
    ("logmel(bands=64; x)", 16, "unexpected character ';'"),
])
def test_error_positions(text, col, words):
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    msg = str(info.value)
    assert msg.startswith(f"invalid spec at column {col}:"), msg
    assert words in msg
    assert "\n" not in msg
    assert isinstance(info.value, UserError)


def test_non_string():
    with pytest.raises(SpecError):
        parse_spec(42)
    with pytest.raises(SpecError):
        FeatureSpec("logmel")


def test_describe_specs():
    items = {d["name"]: d for d in describe_specs()}
    assert {"fft", "mel", "logmel", "mfcc", "identity", "rms", "stats"} <= set(items)
    assert {"delta", "normalize", "lp", "l1", "lpnorm"} <= set(items)
    assert items["logmel"]["kind"] == "extractor" and items["delta"]["kind"] == "processor"
    params = {p["name"]: p for p in items["logmel"]["params"]}
    assert params["bands"]["default"] == 64 and params["window_ms"]["default"] == 40.0
    assert all(p["doc"] for d in items.values() for p in d["params"])
    assert all(d["doc"] for d in items.values())
