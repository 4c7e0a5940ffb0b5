"""``wavetrain evaluate -m MODEL --data REF --events [SETTINGS]``: each audio file of REF through the
event detector once, whole, and its events scored against REF's rows — the same figures as
:mod:`wavetrain.evaluation.event_metrics` gives for the detector's events and the rows by hand —
and the one-line refusals."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.evaluation.event_metrics import Event, event_scores
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.events import EventOptions, recording_events

RATE = 16000
TONES = (("low", 300.0), ("mid", 1000.0), ("high", 3000.0))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def refused(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wavetrain: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def tones(tmp_path_factory):
    """``tones/``: 15 recordings of three harmonic tones (5 each, 0.5-0.9 s, 150 ms of faint noise
    before and after, as recorded sounds have), ``model.wt``: a gmm trained on them."""
    root = tmp_path_factory.mktemp("events")
    rng = np.random.default_rng(0)
    rows = []
    (root / "tones").mkdir()
    for value, f0 in TONES:
        for k in range(5):
            n = int(RATE * rng.uniform(0.5, 0.9))
            t = np.arange(n) / RATE
            f = f0 * rng.uniform(0.95, 1.05)
            x = (0.4 * np.sin(2 * np.pi * f * t) + 0.2 * np.sin(4 * np.pi * f * t)) * np.minimum(
                1.0, np.minimum(t, t[::-1]) / 0.01)
            pad = np.zeros(int(0.15 * RATE))
            y = np.concatenate([pad, x, pad])
            y += 0.003 * rng.standard_normal(y.size)
            sf.write(root / "tones" / f"{value}{k}.wav", y.astype(np.float32), RATE)
            rows.append(f"{value}{k}.wav,tone={value}")
    (root / "tones" / "metadata.csv").write_text("\n".join(rows) + "\n")
    assert main(["train", "--data", str(root / "tones"), "--label", "tone", "--model", "gmm", "--set",
                 "components=2", "-o", str(root / "model.wt")]) == 0
    return root


@pytest.fixture(scope="module")
def spliced(tones):
    """``long/long.wav``: the 15 recordings spliced in random order with 400-900 ms gaps and
    500 ms pads, ``long/long.csv`` its segment rows, and gap rows (``tone=gap``, tagged
    ``gap=true``) for the gaps and pads."""
    out = tones / "long" / "long.wav"
    assert main(["sound", "splice", "--data", str(tones / "tones"), "--gap-ms", "400:900", "--pad-ms", "500",
                 "--gap-label", "gap", "--shuffle", "--seed", "1", "-o", str(out)]) == 0
    return out


def _by_hand(model_path: Path, csv_path: Path, options: EventOptions | None = None) -> dict:
    """The scores from the detector's events and the csv's rows, without the command."""
    model = load_model(model_path)
    reference, files = [], []
    with open(csv_path, newline="") as f:
        for name, labels, *tags in csv.reader(f):
            file = (csv_path.parent / name.split("[")[0]).resolve()
            if file not in files:
                files.append(file)
            if "gap=true" in tags:
                continue
            start, end = (int(v) for v in name[name.index("[") + 1:-1].split("-"))
            reference.append(Event(str(file), start, end, labels.split("=")[1]))
    estimate = [Event(str(file), p.start_ms, p.end_ms, p.label)
                for file in files for p in recording_events(model, str(file), options)]
    return event_scores(reference, estimate)


SCORES = ("f1", "precision", "recall", "error_rate", "substitutions", "deletions", "insertions", "matched")


def _assert_same(res: dict, expected: dict) -> None:
    for part in ("event_based", "segment_based"):
        for kind in ("class_aware", "detection"):
            for key in SCORES:           # JSON keeps a float exactly
                assert res[part][kind][key] == expected[part][kind][key], (part, kind, key)
            assert res[part][kind]["class_wise"] == expected[part][kind]["class_wise"]
    for key in ("reference_events", "estimated_events", "files"):
        assert res[key] == expected[key]


def test_the_scores_are_those_of_the_detectors_events_against_the_rows(capsys, tones, spliced):
    csv_path = spliced.with_suffix(".csv")
    out, _ = run(capsys, "evaluate", "-m", tones / "model.wt", "--data", csv_path, "--label", "tone",
                 "--events", "--json")
    res = json.loads(out)
    expected = _by_hand(tones / "model.wt", csv_path)
    _assert_same(res, expected)
    # the gap rows are not events; the one file is read once
    assert res["reference_events"] == 15 and res["files"] == 1
    assert res["model"] == "gmm" and res["label"] == "tone" and res["event_settings"]["gap_ms"] == EventOptions().gap_ms
    # tones in quiet gaps: the detector finds nearly every one where it is
    assert res["event_based"]["detection"]["f1"] >= 0.8
    assert set(res["event_based"]["class_aware"]["class_wise"]) >= {"low", "mid", "high"}

    # the text report prints the same figures
    text, _ = run(capsys, "evaluate", "-m", tones / "model.wt", "--data", csv_path, "--label", "tone", "--events")
    assert "events: 15 in the reference" in text and "in 1 file" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("  detection only")]
    for row, part in zip(rows, ("event_based", "segment_based"), strict=True):
        r = res[part]["detection"]
        assert row[2:6] == [f"{r[k]:.4f}" for k in ("f1", "precision", "recall", "error_rate")]


def test_detector_settings_change_the_events_and_are_passed_on(capsys, tones, spliced):
    csv_path = spliced.with_suffix(".csv")
    settings = "gap_ms=2000,pad_ms=0"        # gaps under 2 s close no event: neighbours merge
    out, _ = run(capsys, "evaluate", "-m", tones / "model.wt", "--data", csv_path, "--events", settings, "--json")
    res = json.loads(out)
    _assert_same(res, _by_hand(tones / "model.wt", csv_path, EventOptions.parse(settings)))
    assert res["event_settings"]["gap_ms"] == 2000 and res["label"] == "tone"      # the model's label by default
    default, _ = run(capsys, "evaluate", "-m", tones / "model.wt", "--data", csv_path, "--events", "--json")
    assert res["estimated_events"] < json.loads(default)["estimated_events"]


def test_a_row_without_a_segment_is_an_event_spanning_its_file(capsys, tones):
    """The training set itself: each file one event from 0 to its end, each file read once."""
    out, _ = run(capsys, "evaluate", "-m", tones / "model.wt", "--data", tones / "tones", "--events", "--json")
    res = json.loads(out)
    assert res["files"] == 15 and res["reference_events"] == 15
    reference, estimate = [], []
    model = load_model(tones / "model.wt")
    for path in sorted((tones / "tones").glob("*.wav")):
        f = str(path.resolve())
        reference.append(Event(f, 0, round(1000 * sf.info(path).frames / RATE), path.stem.rstrip("0123456789")))
        estimate += [Event(f, p.start_ms, p.end_ms, p.label) for p in recording_events(model, str(path))]
    _assert_same(res, event_scores(reference, estimate))


def test_rows_of_several_files_are_scored_file_by_file(capsys, tones, spliced, tmp_path):
    """Two spliced files in one data set: each file's events are compared with its own rows only."""
    other = tmp_path / "other.wav"
    assert main(["sound", "splice", "--data", str(tones / "tones"), "--gap-ms", "600", "--pad-ms", "500",
                 "--seed", "2", "--shuffle", "-o", str(other)]) == 0
    capsys.readouterr()
    both = tmp_path / "both.csv"
    rows = []
    for csv_path in (spliced.with_suffix(".csv"), other.with_suffix(".csv")):
        for line in csv_path.read_text().splitlines():
            name, rest = line.split(",", 1)
            rows.append(f"{csv_path.parent / name},{rest}")
    both.write_text("\n".join(rows) + "\n")
    out, _ = run(capsys, "evaluate", "-m", tones / "model.wt", "--data", both, "--events", "--json")
    res = json.loads(out)
    assert res["files"] == 2 and res["reference_events"] == 30
    _assert_same(res, _by_hand(tones / "model.wt", both))


@pytest.mark.parametrize("extra, message", [
    (("--folds", "3"), "--folds does not apply to --events"),
    (("--repeat", "2"), "--repeat does not apply to --events"),
    (("--group-by", "tone"), "--group-by does not apply to --events"),
    (("--cm",), "--cm does not apply to --events"),
    (("--events", "gap_ms=bogus"), "gap_ms"),
    (("--events", "nosuch=1"), "nosuch"),
])
def test_settings_that_do_not_apply_are_refused_in_one_line(capsys, tones, spliced, extra, message):
    argv = ["evaluate", "-m", tones / "model.wt", "--data", spliced.with_suffix(".csv"), "--events", *extra]
    assert message in refused(capsys, *argv)


def test_events_need_a_trained_model(capsys, spliced):
    line = refused(capsys, "evaluate", "--data", spliced.with_suffix(".csv"), "--label", "tone", "--events")
    assert "-m MODEL.wt" in line


def test_a_reference_without_the_label_or_an_event_row_without_a_value_is_refused(capsys, tones, spliced):
    csv_path = spliced.with_suffix(".csv")
    assert "no label named 'speaker'" in refused(capsys, "evaluate", "-m", tones / "model.wt", "--data", csv_path,
                                                 "--label", "speaker", "--events")
    # a row that is no gap and has no value: which event is it?
    rows = [r.split(",") for r in csv_path.read_text().splitlines()]
    first = next(r for r in rows if "gap=true" not in r)
    first[1] = "other=x"
    bad = spliced.parent / "bad.csv"
    bad.write_text("\n".join(",".join(r) for r in rows) + "\n")
    line = refused(capsys, "evaluate", "-m", tones / "model.wt", "--data", bad, "--label", "tone", "--events")
    assert "no value for label 'tone'" in line and "gap=true" in line


def test_evaluate_without_events_still_needs_a_label(capsys, tones, spliced):
    line = refused(capsys, "evaluate", "-m", tones / "model.wt", "--data", spliced.with_suffix(".csv"))
    assert "--label" in line
