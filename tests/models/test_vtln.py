"""Vocal tract length normalisation: the warped filter bank against Kaldi's formula, and
``vtln=true`` on ``gmm`` and ``hmm`` as exactly "the unwarped model, scored at each warp, the best
one kept" — in memory, from a model file and through the command line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.core.errors import ParameterError, SpecError
from wavetrain.features import extract, parse_spec
from wavetrain.features.filters import mel_edges, mel_filters, vtln_warp
from wavetrain.features.spec import warped_specs
from wavetrain.models import build
from wavetrain.models.modelfile import load_model, save_model
from wavetrain.models.vtln import parse_warps
from wavetrain.train.array_stream import ArrayStream


def kaldi_vtln_warp_freq(low_cutoff, high_cutoff, low_freq, high_freq, warp, freq):
    """Kaldi's ``MelBanks::VtlnWarpFreq`` (feat/mel-computations.cc), transcribed line by line."""
    if freq < low_freq or freq > high_freq:
        return freq
    one = 1.0
    lo = low_cutoff * max(one, warp)
    hi = high_cutoff * min(one, warp)
    scale = 1.0 / warp
    f_low = scale * lo
    f_high = scale * hi
    if freq < lo:
        return low_freq + (f_low - low_freq) * (freq - low_freq) / (lo - low_freq)
    if freq < hi:
        return scale * freq
    return high_freq + (f_high - high_freq) * (freq - high_freq) / (hi - high_freq)


@pytest.mark.parametrize("warp", [0.85, 0.92, 1.0, 1.07, 1.15])
@pytest.mark.parametrize("fmin,fmax", [(0.0, 8000.0), (20.0, 4000.0), (300.0, 3400.0)])
def test_warp_is_kaldis(warp, fmin, fmax):
    freqs = np.linspace(0.0, 9000.0, 451)
    ours = vtln_warp(freqs, fmin, fmax, warp)
    # Kaldi's default cut-offs: 100 Hz above the lowest frequency, 500 Hz below the highest
    ref = [kaldi_vtln_warp_freq(fmin + 100.0, fmax - 500.0, fmin, fmax, warp, f) for f in freqs]
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-9)
    assert np.all(np.diff(ours) >= 0)


def test_unwarped_filter_bank_and_spec_are_unchanged():
    edges = mel_edges(40, 0.0, 8000.0, False)
    assert edges[0] == 0.0 and edges[-1] == pytest.approx(8000.0)
    np.testing.assert_array_equal(mel_filters(16000, 512, 40, 0.0, 8000.0, False, "slaney"),
                                  mel_filters(16000, 512, 40, 0.0, 8000.0, False, "slaney", 1.0))
    # a spec without a warp prints (and keys its stored features) as before warps existed
    assert "warp" not in str(parse_spec("mfcc(coeffs=13)"))
    warped = parse_spec("mfcc(coeffs=13, warp=1.1)")
    assert "warp=1.1" in str(warped) and parse_spec(str(warped)) == warped
    assert warped.key != parse_spec("mfcc(coeffs=13)").key


def test_warped_features_use_the_warped_bank():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(8000).astype(np.float32)
    up, down = extract(x, 16000, "logmel(bands=24, warp=1.1)"), extract(x, 16000, "logmel(bands=24, warp=0.9)")
    assert up.shape == down.shape == extract(x, 16000, "logmel(bands=24)").shape
    # a band's centre moves down with a warp above 1: a tone at a band's centre reads lower there
    tone = np.sin(2 * np.pi * 1000.0 * np.arange(16000) / 16000).astype(np.float32)
    peak = [int(extract(tone, 16000, f"logmel(bands=24, warp={w})").mean(axis=0).argmax()) for w in (0.9, 1.0, 1.1)]
    assert peak[0] <= peak[1] <= peak[2] and peak[0] < peak[2]


def test_warped_specs_and_grid():
    spec = warped_specs("mfcc(coeffs=13) | delta(order=1)", (1.0, 0.9, 1.1))
    assert spec.feature_dim(16000) == 3 * 26
    assert [p.extractor.warp for p in spec.parts] == [1.0, 0.9, 1.1]
    with pytest.raises(SpecError, match="mel-family"):
        warped_specs("fft", (1.0, 1.1))
    assert parse_warps("0.88:1.12:0.04") == (1.0, 0.88, 0.92, 0.96, 1.04, 1.08, 1.12)
    assert parse_warps("0.9,1.1") == (1.0, 0.9, 1.1)
    for bad in ("0.9:", "a,b", "1.2:0.8:0.1", "0.3,1", "0.5:2:0.001"):
        with pytest.raises(ParameterError, match="vtln_warps"):
            parse_warps(bad)
    with pytest.raises(SpecError, match="mel-family"):
        build("gmm", {"vtln": True, "features": "fft(bins=16)"})
    # an ensemble's members read their columns of one set of features, fitted or not
    with pytest.raises(ParameterError, match=r"members\[0\] \(gmm\): with vtln=true"):
        build("ensemble", {"members": '[{"model": "gmm", "vtln": true}, {"model": "knn"}]'})


def _speakers(rng, scale: float, n: int, rate: int = 16000):
    """Two 'vowels' (three formant-like resonances each) of a speaker whose formants are
    ``scale`` times the typical ones: ``n`` recordings each, with their labels."""
    formants = {"a": (700.0, 1200.0, 2600.0), "i": (300.0, 2200.0, 3000.0)}
    t = np.arange(int(0.4 * rate)) / rate
    grams, ys = [], []
    for y, (_, fs) in enumerate(sorted(formants.items())):
        for _ in range(n):
            f0 = rng.uniform(100, 140)
            x = sum(np.sin(2 * np.pi * f0 * h * t) / h * sum(np.exp(-((f0 * h - scale * f) / 120.0) ** 2) for f in fs)
                    for h in range(1, int(3500 / f0)))
            x = x + 0.01 * rng.standard_normal(t.size)
            grams.append(np.asarray(x, np.float32))
            ys.append(y)
    return grams, np.array(ys)


SPEC = "mfcc(bands=24, coeffs=12, window_ms=25, shift_pct=40)"


@pytest.mark.parametrize("family,params", [("gmm", {"components": 2}), ("hmm", {"states": 2, "mixtures": 1})])
def test_scores_are_the_plain_models_at_the_best_warp(family, params, tmp_path):
    rng = np.random.default_rng(1)
    audio, ys = _speakers(rng, 1.0, 6)
    test_audio, test_ys = _speakers(rng, 1.15, 3)
    warps = (0.9, 1.0, 1.1)
    plain = build(family, {**params, "features": SPEC})
    vtln = build(family, {**params, "features": SPEC, "vtln": True, "vtln_warps": "0.9,1,1.1"})
    train = [extract(x, 16000, SPEC) for x in audio]
    for m in (plain, vtln):
        m.fit(ArrayStream(train, ys, ["a", "i"]))
    # it learnt from the unwarped features: the same model as without vtln
    assert vtln.feature_dim_ == 3 * plain.feature_dim_
    np.testing.assert_array_equal(vtln.means_, plain.means_)
    stacked = [extract(x, 16000, vtln.feature_spec) for x in test_audio]
    assert stacked[0].shape[1] == vtln.feature_dim_
    per_warp = np.stack([plain.decision_function([extract(x, 16000, SPEC.replace(")", f", warp={w})"))
                                                  for x in test_audio]) for w in (1.0, 0.9, 1.1)])
    best = per_warp.max(axis=2).argmax(axis=0)
    names, scores, details = vtln.predict_scores(stacked)
    np.testing.assert_allclose(scores, per_warp[best, np.arange(len(stacked))], rtol=1e-12)
    np.testing.assert_array_equal(details["warp"], np.array([1.0, 0.9, 1.1])[best])
    assert set(details["warp"]) <= set(warps)
    # the model file keeps the search: same scores after a round trip
    save_model(vtln, tmp_path / "m.wt")
    again = load_model(tmp_path / "m.wt")
    assert again.feature_spec == vtln.feature_spec
    np.testing.assert_allclose(again.predict_scores(stacked)[1], scores, rtol=1e-12)
    assert "warp" not in plain.predict_scores([extract(x, 16000, SPEC) for x in test_audio])[2]


def test_command_line_reports_the_warp(tmp_path, capsys):
    from wavetrain.data.audio import write_audio

    rng = np.random.default_rng(2)
    rows = []
    for scale, who in ((0.95, "s1"), (1.0, "s2"), (1.05, "s3"), (1.2, "new")):
        audio, ys = _speakers(rng, scale, 3)
        for i, (x, y) in enumerate(zip(audio, ys)):
            name = f"{who}_{i}.wav"
            write_audio(tmp_path / name, x / np.abs(x).max() * 0.5, 16000)
            rows.append(f"{name},vowel={'ai'[y]};speaker={who},")
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    model = tmp_path / "m.wt"
    assert main(["train", "--data", str(tmp_path), "--where", "speaker=s1,s2,s3", "--label", "vowel", "--model",
                 "gmm", "--features", SPEC, "--set", "components=2", "--set", "vtln=true", "-o", str(model)]) == 0
    capsys.readouterr()
    assert main(["classify", "-m", str(model), str(tmp_path / "new_0.wav"), "--json"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert out and all(o["warp"] in parse_warps("0.88:1.12:0.04") for o in out)
    assert main(["evaluate", "-m", str(model), "--data", str(tmp_path), "--where", "speaker=new", "--label",
                 "vowel", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] >= 0.5
    assert main(["train", "--data", str(tmp_path), "--label", "vowel", "--model", "gmm", "--features", "fft",
                 "--set", "vtln=true", "-o", str(tmp_path / "bad.wt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mel-family" in err[0]
