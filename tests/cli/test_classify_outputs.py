"""``wavetrain classify`` output modes on files: --csv, --audacity, --ranked, --compare, with --json."""
from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.data.audacity import read_labels


@pytest.fixture(scope="module")
def setup(demo_csv, tmp_path_factory):
    from wavetrain.data.demo import machine_sound

    root = tmp_path_factory.mktemp("outputs")
    model = root / "clip.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=4",
                 "--clip-ms", "500", "-o", str(model)]) == 0
    x = np.concatenate([machine_sound("healthy", seconds=1.0, rng=np.random.default_rng(1)),
                        machine_sound("bearing", seconds=1.0, rng=np.random.default_rng(2))])
    sf.write(root / "long.wav", x, 16000)
    sf.write(root / "calm.wav", machine_sound("healthy", seconds=1.0, rng=np.random.default_rng(3)), 16000)
    (root / "metadata.csv").write_text("long.wav,state=bearing\ncalm.wav,\n")
    return root, model


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_csv(capsys, setup):
    root, model = setup
    code, out, _ = run(capsys, "classify", "-m", str(model), "--csv", str(root / "long.wav"))
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 4
    assert list(rows[0]) == ["file", "start_ms", "end_ms", "value", "score:bearing", "score:healthy", "score:loose"]
    assert [(r["start_ms"], r["end_ms"]) for r in rows] == [("0", "500"), ("500", "1000"), ("1000", "1500"),
                                                           ("1500", "2000")]
    assert rows[0]["value"] == "healthy" and rows[-1]["value"] == "bearing"
    assert all(max(r[k] for k in r if k.startswith("score:")) for r in rows)


def test_audacity_tracks_merge_adjacent_windows(capsys, setup, tmp_path):
    root, model = setup
    out_dir = tmp_path / "labels" / "new"
    code, out, err = run(capsys, "classify", "-m", str(model), "--audacity", str(out_dir),
                         str(root / "long.wav"), str(root / "calm.wav"))
    assert code == 0 and "wrote 2 Audacity label tracks" in err and len(out.splitlines()) == 6
    assert read_labels(out_dir / "long.txt") == [(0.0, 1.0, "healthy"), (1.0, 2.0, "bearing")]
    assert read_labels(out_dir / "calm.txt") == [(0.0, 1.0, "healthy")]


def test_audacity_tracks_of_segment_rows_and_of_events_are_at_their_times_in_the_file(capsys, setup, tmp_path):
    root, model = setup
    (tmp_path / "segments.csv").write_text(f"{root / 'long.wav'}[1000-2000],state=bearing\n")
    code, _, _ = run(capsys, "classify", "-m", str(model), "--audacity", str(tmp_path / "a"),
                     str(tmp_path / "segments.csv"))
    assert code == 0 and read_labels(tmp_path / "a" / "long.txt") == [(1.0, 2.0, "bearing")]
    x = np.concatenate([np.zeros(16000, np.float32), sf.read(root / "long.wav", dtype="float32")[0][16000:],
                        np.zeros(16000, np.float32)])
    sf.write(tmp_path / "event.wav", x, 16000)
    code, out, _ = run(capsys, "classify", "-m", str(model), "--events", "--audacity", str(tmp_path / "e"),
                       str(tmp_path / "event.wav"))
    ((a, b, v),) = read_labels(tmp_path / "e" / "event.txt")
    assert code == 0 and f"[{round(a * 1000)}-{round(b * 1000)}]: state={v}" in out and abs(a - 1.0) < 0.1


def test_audacity_labels_of_overlapping_windows():
    from wavetrain.cli.classify_cmd import _Tracks

    ws = [(0, 1000, "a"), (500, 1500, "a"), (1000, 2000, "b"), (1500, 2300, "b")]
    assert _Tracks.labels(ws) == [(0, 1000, "a"), (1000, 2300, "b")]


def test_ranked_text_and_json(capsys, setup):
    root, model = setup
    code, out, _ = run(capsys, "classify", "-m", str(model), "--ranked", str(root / "long.wav"))
    first = out.splitlines()[0]
    assert code == 0 and first.startswith(f"{root / 'long.wav'}[0-500]: state ranked: healthy ")
    scores = [float(part.split()[1]) for part in first.split("ranked: ")[1].split(", ")]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3
    code, out, _ = run(capsys, "classify", "-m", str(model), "--ranked", "--json", str(root / "long.wav"))
    rec = json.loads(out.splitlines()[-1])
    assert [r["value"] for r in rec["ranked"]][0] == rec["value"] == "bearing"
    assert [r["score"] for r in rec["ranked"]] == sorted(rec["scores"].values(), reverse=True)


def test_compare(capsys, setup):
    root, model = setup
    code, out, _ = run(capsys, "classify", "-m", str(model), "--compare", "state", str(root / "metadata.csv"))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 7
    assert lines[0].endswith(" wrong (expected bearing)") and lines[3].endswith(" right")
    assert lines[4].endswith(" ?") and lines[5].endswith(" ?")
    assert lines[-1] == "accuracy 0.500 (2 of 4 windows right; 2 windows without a state value)"
    code, out, err = run(capsys, "classify", "-m", str(model), "--compare", "state", "--json",
                         str(root / "metadata.csv"))
    recs = [json.loads(line) for line in out.splitlines()]
    assert [r["correct"] for r in recs] == [False, False, True, True, None, None]
    assert recs[0]["expected"] == "bearing" and "accuracy 0.500" in err
    code, out, err = run(capsys, "classify", "-m", str(model), "--compare", "state", "--csv",
                         str(root / "metadata.csv"))
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["correct"] for r in rows] == ["wrong", "wrong", "right", "right", "?", "?"] and "accuracy" in err
    code, out, _ = run(capsys, "classify", "-m", str(model), "--compare", "machine", str(root / "long.wav"))
    assert out.splitlines()[-1] == ("accuracy: no window has a machine value to compare with; 4 windows without "
                                    "a machine value")


@pytest.mark.parametrize("args, words", [
    (["--csv", "--json"], "--csv and --json"),
    (["--ranked", "-o", "p.csv"], "-o writes every value's score"),
    (["--clip-ms", "200"], "--clip-ms and --clip-shift-ms are for a live stream"),
    (["--audacity", "/proc/nope"], "--audacity /proc/nope"),
])
def test_mode_errors_are_one_line(capsys, setup, args, words):
    root, model = setup
    code, out, err = run(capsys, "classify", "-m", str(model), *args, str(root / "long.wav"))
    assert code == 2 and err.count("\n") == 1 and words in err and out == ""


def test_audacity_name_clash(capsys, setup, tmp_path):
    root, model = setup
    (tmp_path / "x").mkdir()
    sf.write(tmp_path / "x" / "long.wav", np.zeros(16000, np.float32), 16000)
    code, _, err = run(capsys, "classify", "-m", str(model), "--audacity", str(tmp_path / "t"),
                       str(root / "long.wav"), str(tmp_path / "x" / "long.wav"))
    assert code == 2 and "would both write long.txt" in err and not (tmp_path / "t").exists()


def test_help_names_the_modes(capsys):
    assert main(["classify", "--help"]) == 0
    out = capsys.readouterr().out
    for word in ("--csv", "--audacity", "--ranked", "--compare", "latency_ms", "--clip-shift-ms", "arecord"):
        assert word in out
