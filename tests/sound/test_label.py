"""wavetrain sound label: a model's windows merged into segment rows."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from tests.sound.conftest import FREQS, RATE, fails, run, tone
from wavetrain.data.metadata import read_metadata
from wavetrain.sound.label import merge_windows


@pytest.fixture
def models(tones, tmp_path, capsys):
    out = {}
    for family, extra in (("knn", []), ("gmm", ["--set", "components=2"])):
        out[family] = tmp_path / f"{family}.wt"
        run(capsys, ["train", "--data", tones, "--label", "state", "--model", family, "--clip-ms", "250", *extra,
                     "-o", out[family]])
    return out


@pytest.fixture
def long_wav(tmp_path):
    """low 1 s, high 1 s, low 1 s (then mid 0.5 s in a second file)."""
    folder = tmp_path / "long"
    folder.mkdir()
    x = np.concatenate([tone(FREQS["low"], seed=1), tone(FREQS["high"], seed=2), tone(FREQS["low"], seed=3)])
    sf.write(folder / "a.wav", x, RATE)
    sf.write(folder / "b.wav", tone(FREQS["mid"], 0.5, seed=4), RATE)
    return folder


@pytest.mark.parametrize("family", ["knn", "gmm"])
def test_segments_merged(models, long_wav, tmp_path, capsys, family):
    csv = tmp_path / f"{family}.csv"
    # each window's own answer (--unknown off: the clicks where the tones are joined are unlike the
    # training tones, and auto answers the windows holding them unknown)
    text = run(capsys, ["sound", "label", "-m", models[family], "--data", long_wav, "--unknown", "off", "-o", csv])
    assert "label: 4 segments of 2 recordings" in text
    rows = read_metadata(csv)
    got = [(r.path.name, r.segment_ms, r.labels["state"], r.tags["windows"]) for r in rows]
    assert got == [("a.wav", (0, 1000), "low", "4"), ("a.wav", (1000, 2000), "high", "4"),
                   ("a.wav", (2000, 3000), "low", "4"), ("b.wav", (0, 500), "mid", "2")]
    assert ("confidence" in rows[0].tags) == (family == "knn")


def test_label_makes_its_output_folder_as_partition_does(models, long_wav, tmp_path, capsys):
    csv = tmp_path / "new" / "deeper" / "labels.csv"
    assert "label: 4 segments" in run(capsys, ["sound", "label", "-m", models["gmm"], "--data", long_wav,
                                               "--unknown", "off", "-o", csv])
    assert len(read_metadata(csv)) == 4
    (tmp_path / "afile").write_text("x")
    fails(capsys, ["sound", "label", "-m", models["gmm"], "--data", long_wav, "-o", tmp_path / "afile" / "l.csv"],
          "not a folder")


def test_clip_override_and_min_confidence(models, long_wav, tmp_path, capsys):
    csv = tmp_path / "o.csv"
    run(capsys, ["sound", "label", "-m", models["knn"], "--data", long_wav, "--clip-ms", "500", "--clip-shift-ms",
                 "250", "--min-confidence", "0.5", "--unknown", "off", "-o", csv])
    rows = read_metadata(csv)
    assert [r.labels["state"] for r in rows] == ["low", "high", "low", "mid"]
    a = [r.segment_ms for r in rows if r.path.name == "a.wav"]
    assert all(s[1] <= t[0] for s, t in zip(a, a[1:]))         # never overlapping
    assert a[0][0] == 0 and a[-1][1] == 3000
    fails(capsys, ["sound", "label", "-m", models["gmm"], "--data", long_wav, "--min-confidence", "0.5",
                   "-o", tmp_path / "g.csv"], "not probabilities")
    fails(capsys, ["sound", "label", "-m", models["knn"], "--data", long_wav, "--min-confidence", "2",
                   "-o", tmp_path / "g.csv"], "between 0 and 1")
    fails(capsys, ["sound", "label", "-m", models["knn"], "--data", long_wav, "-o", csv], "--overwrite")
    fails(capsys, ["sound", "label", "-m", tmp_path / "none.wt", "--data", long_wav, "-o", tmp_path / "g.csv"],
          "none.wt")
    assert not (tmp_path / "g.csv").exists()


class _P:
    def __init__(self, rec, s, e, label, conf):
        self.recording, self.start_ms, self.end_ms, self.label, self.confidence = rec, s, e, label, conf


def test_merge_windows_rules():
    a, b = object(), object()
    preds = [_P(a, 0, 500, "x", 0.9), _P(a, 250, 750, "x", 0.8), _P(a, 500, 1000, "y", 0.9),
             _P(a, 750, 1250, "y", 0.2), _P(a, 1000, 1500, "y", 0.9), _P(b, 0, 500, "y", 0.9)]
    segs, dropped = merge_windows(preds, 0.5)
    assert dropped == 1
    assert [(s.start_ms, s.end_ms, s.value, s.windows) for s in segs] == [
        (0, 625, "x", 2), (625, 1500, "y", 2), (0, 500, "y", 1)]
    segs, dropped = merge_windows([_P(a, 0, 500, "x", 0.9), _P(a, 500, 1000, "x", 0.1), _P(a, 1000, 1500, "x", 0.9)],
                                  0.5)
    assert dropped == 1 and [(s.start_ms, s.end_ms) for s in segs] == [(0, 500), (1000, 1500)]


def test_label_segment_rows_of_a_splice(models, tones, tmp_path, capsys):
    """Recordings that are segments of a file: the answers' times are times in the file."""
    out = tmp_path / "sp"
    out.mkdir()
    run(capsys, ["sound", "splice", "--data", tones, "--where", "speaker=s0", "--gap-ms", "500", "-o", out / "s.wav"])
    given = read_metadata(out / "s.csv")
    run(capsys, ["sound", "label", "-m", models["knn"], "--data", out / "s.csv", "-o", tmp_path / "l.csv"])
    rows = read_metadata(tmp_path / "l.csv")
    assert len(rows) == len(given)
    for r, g in zip(rows, given):
        assert r.labels["state"] == g.labels["state"] and r.path == g.path
        assert g.segment_ms[0] == r.segment_ms[0] and r.segment_ms[1] <= g.segment_ms[1]


def test_label_spoken(spoken, tmp_path, capsys):
    model = tmp_path / "sw.wt"
    run(capsys, ["train", "--data", spoken, "--label", "word", "--model", "knn", "-o", model])
    run(capsys, ["sound", "label", "-m", model, "--data", spoken, "-o", tmp_path / "sw.csv"])
    rows = read_metadata(tmp_path / "sw.csv")
    truth = {r.path.name: r.labels["word"] for r in read_metadata(spoken)}
    assert len(rows) == len(truth)
    assert sum(truth[r.path.name] == r.labels["word"] for r in rows) >= 0.9 * len(rows)


def test_label_windows_follow_the_one_windowing_rule(tones, long_wav, tmp_path, capsys, monkeypatch):
    """A whole-recording model asked for 1 s windows labels a 0.5 s recording as the file is
    classified (its short last window kept as it is, not padded with silence), says that the windows
    differ from the training windows, and the model file's own windows are unchanged."""
    from wavetrain.cli.main import main
    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline import prediction
    from wavetrain.pipeline.prediction import classify_samples

    monkeypatch.setattr(prediction, "_WARNED_WINDOWS", set())      # the warning is given once a process

    model_path = tmp_path / "whole.wt"
    run(capsys, ["train", "--data", tones, "--label", "state", "--model", "gmm", "--set", "components=2",
                 "-o", model_path])
    csv = tmp_path / "w.csv"
    capsys.readouterr()
    assert main(["sound", "label", "-m", str(model_path), "--data", str(long_wav / "b.wav"), "--clip-ms", "1000",
                 "-o", str(csv)]) == 0
    assert "trained on whole recordings (clip_ms=0) and is asked for 1000 ms windows" in capsys.readouterr().err
    rows = read_metadata(csv)
    model = load_model(model_path)
    x, rate = sf.read(long_wav / "b.wav", dtype="float32")
    (whole,) = classify_samples(model, x, rate)                    # the file: one window
    assert [(r.segment_ms, r.labels["state"]) for r in rows] == [((0, 500), whole.label)] == [((0, 500), "mid")]
    assert model.params["clip_ms"] == 0


def test_smooth_and_hold_merge_a_short_blip(models, tmp_path, capsys):
    """A 250 ms blip of another tone is a segment of its own window by window; smoothed and held,
    the recording is one long segment after the answer first holds (before it: undecided)."""
    folder = tmp_path / "blip"
    folder.mkdir()
    x = np.concatenate([tone(FREQS["low"], 2.0, seed=1), tone(FREQS["high"], 0.25, seed=2),
                        tone(FREQS["low"], 2.0, seed=3)])
    sf.write(folder / "a.wav", x, RATE)
    own, live = tmp_path / "own.csv", tmp_path / "live.csv"
    run(capsys, ["sound", "label", "-m", models["gmm"], "--data", folder, "--unknown", "off", "-o", own])
    run(capsys, ["sound", "label", "-m", models["gmm"], "--data", folder, "--unknown", "off", "--smooth", "3",
                 "--hold", "500", "-o", live])
    got = {name: [(r.segment_ms, r.labels["state"]) for r in read_metadata(path)]
           for name, path in (("own", own), ("live", live))}
    assert got["own"] == [((0, 2000), "low"), ((2000, 2250), "high"), ((2250, 4250), "low")]
    assert got["live"] == [((0, 500), "undecided"), ((500, 4250), "low")]
    assert [r.tags["windows"] for r in read_metadata(live)] == ["2", "15"]


def test_label_says_once_how_to_match_the_training_windows(models, long_wav, tmp_path, capsys, monkeypatch):
    from wavetrain.cli.main import main
    from wavetrain.pipeline import prediction

    monkeypatch.setattr(prediction, "_WARNED_WINDOWS", set())
    capsys.readouterr()
    assert main(["sound", "label", "-m", str(models["knn"]), "--data", str(long_wav), "--clip-ms", "500",
                 "-o", str(tmp_path / "l.csv")]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "trained on" in ln]
    assert lines == ["WARNING wavetrain.pipeline.prediction: knn was trained on 250 ms windows every 250 ms and is "
                     "asked for 500 ms windows every 500 ms: its scores may differ from those on its own windows; to "
                     "match, leave --clip-ms and --clip-shift-ms out or pass --clip-ms 250"]
