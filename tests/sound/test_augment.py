"""wavetrain sound augment: SNRs as asked, reproducible with the seed, labels and tags carried."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from tests.sound.conftest import RATE, fails, run, tone
from wavetrain.data.metadata import read_metadata
from wavetrain.sound.augment import NOISE_COLORS, freq_shift, pitch_shift, reverb, speed_change


def _snr(clean: np.ndarray, noisy: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(clean.astype(np.float64) ** 2) / np.mean((noisy - clean) ** 2)))


@pytest.mark.parametrize("color", ["white", "pink", "brown", "hum", "babble", "any"])
def test_noise_snr(tones, tmp_path, capsys, color):
    out = tmp_path / "aug"
    run(capsys, ["sound", "augment", "--data", tones, "--where", "state=low", "--noise", "12", "--noise-color", color,
                 "--copies", "2", "--seed", "1", "-o", out])
    rows = read_metadata(out / "metadata.csv")
    assert len(rows) == 2 * 9
    for r in rows:
        assert r.labels["state"] == "low" and r.tags["aug_noise_snr_db"] == "12.00"
        assert r.tags["aug_noise"] == color if color != "any" else r.tags["aug_noise"] in NOISE_COLORS
        clean, _ = sf.read(tones / r.tags["source"].split("/")[-1], dtype="float64")
        noisy, _ = sf.read(r.path, dtype="float64")
        assert abs(_snr(clean, noisy) - 12) < 0.5


def test_mix_snr_and_ranges(tones, spoken, tmp_path, capsys):
    out = tmp_path / "mix"
    run(capsys, ["sound", "augment", "--data", tones, "--where", "state=high", "--mix", f"{spoken}:3:9",
                 "--seed", "2", "-o", out])
    for r in read_metadata(out / "metadata.csv"):
        snr = float(r.tags["aug_mix_snr_db"])
        assert 3 <= snr <= 9 and r.tags["aug_mix"].endswith(".wav")
        clean, _ = sf.read(tones / r.tags["source"].split("/")[-1], dtype="float64")
        mixed, _ = sf.read(r.path, dtype="float64")
        assert abs(_snr(clean, mixed) - snr) < 0.5


def test_same_seed_same_output(tones, tmp_path, capsys):
    common = ["sound", "augment", "--data", tones, "--where", "state=mid", "--noise", "5:20", "--gain=-6:6",
              "--shift-hz=-30:30", "--speed", "0.9:1.1", "--pitch=-2:2", "--reverb", "0.1:0.5", "--copies", "2"]
    outs = {}
    for name, seed in (("a", "4"), ("b", "4"), ("c", "5")):
        run(capsys, [*common, "--seed", seed, "-o", tmp_path / name])
        outs[name] = [(tmp_path / name / "metadata.csv").read_bytes()] + [
            sf.read(p, dtype="float32")[0].tobytes() for p in sorted((tmp_path / name).glob("*.wav"))]
    assert outs["a"] == outs["b"] != outs["c"]         # (float wavs hold a time stamp: samples compared)
    row = read_metadata(tmp_path / "a" / "metadata.csv")[0]
    for k in ("aug_noise_snr_db", "aug_gain_db", "aug_shift_hz", "aug_speed", "aug_pitch_semitones",
              "aug_reverb_rt60_s"):
        assert k in row.tags
    assert 0.9 <= float(row.tags["aug_speed"]) <= 1.1 and row.tags["copy"] == "1"


def test_dsp():
    x = tone(500, 1.0, seed=0).astype(np.float64)

    def peak(y):
        return np.argmax(np.abs(np.fft.rfft(y * np.hanning(y.size)))) * RATE / y.size

    y = freq_shift(x, 120, RATE)
    assert abs(peak(y) - 620) < 3 and y.size == x.size
    y = speed_change(x, 1.25)
    assert y.size == 12800 and abs(peak(y) - 625) < 3
    y = pitch_shift(x, 12, RATE)
    assert y.size == x.size and abs(peak(y) - 1000) < 5
    assert abs(np.std(y) - np.std(x)) < 0.01
    y = reverb(x, 0.5, RATE, np.random.default_rng(0))
    assert y.size == x.size and abs(np.std(y) - np.std(x)) < 1e-6


@pytest.mark.parametrize("args, expect", [
    (["--noise", "20:5"], "--noise 20:5: the range ends before it starts"),
    (["--gain", "x"], "--gain x: expected LO:HI"),
    (["--speed", "0:2"], "--speed 0:2: expected values >= 0.25"),
    (["--reverb", "0"], "--reverb 0: expected values > 0"),
    ([], "give at least one augmentation"),
    (["--mix", "/nonexistent/noise"], "--mix /nonexistent/noise: no such file"),
    (["--noise", "10", "--where", "state=none"], "no recording left"),
    (["--noise", "10", "--where", "colour=red"], "no label named 'colour'"),
])
def test_errors(tones, tmp_path, capsys, args, expect):
    fails(capsys, ["sound", "augment", "--data", tones, *args, "-o", tmp_path / "x"], expect)
    assert not (tmp_path / "x").exists()


def test_existing_output(tones, tmp_path, capsys):
    argv = ["sound", "augment", "--data", tones, "--where", "state=low", "--gain", "3", "-o", tmp_path / "o"]
    run(capsys, argv)
    fails(capsys, argv, "--overwrite")
    run(capsys, [*argv, "--overwrite"])
