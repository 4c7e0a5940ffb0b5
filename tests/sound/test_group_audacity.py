"""wavetrain sound group, from-audacity and to-audacity."""
from __future__ import annotations

import soundfile as sf

from tests.sound.conftest import RATE, fails, run, tone
from wavetrain.data import load_dataset
from wavetrain.data.audacity import read_labels, write_labels
from wavetrain.data.metadata import read_metadata


def test_group_relative_and_copy(tones, tmp_path, capsys):
    out = tmp_path / "g"
    text = run(capsys, ["sound", "group", "--data", tones, "--label", "state", "-o", out])
    assert "3 folders (25 recordings)" in text
    assert sorted(p.name for p in out.iterdir()) == ["high", "low", "mid"]
    low = load_dataset(out / "low")
    assert len(low) == 9 and {r.labels["state"] for r in low} == {"low"}
    assert (out / "low" / "metadata.csv").read_text().startswith("../../tones/")
    copies = tmp_path / "gc"
    run(capsys, ["sound", "group", "--data", tones, "--label", "state", "--copy", "-o", copies])
    mid = load_dataset(copies / "mid")
    assert len(mid) == 8 and all(r.path.parent == copies / "mid" for r in mid)
    assert (copies / "mid" / "mid0.wav").read_bytes() == (tones / "mid0.wav").read_bytes()
    # the folder of folders is a data set again: every group's recordings, as the input has them
    whole = load_dataset(out)
    assert len(whole) == 25 and sorted(r.labels["state"] for r in whole) == sorted(
        r.labels["state"] for r in load_dataset(tones))
    assert "25 recordings" in run(capsys, ["info", out]) and len(load_dataset(copies)) == 25
    fails(capsys, ["sound", "group", "--data", tones, "--label", "state", "-o", out], "--overwrite")
    fails(capsys, ["sound", "group", "--data", tones, "--label", "colour", "-o", tmp_path / "n"], "no label named")
    assert not (tmp_path / "n").exists()


def test_group_spoken(spoken, tmp_path, capsys):
    run(capsys, ["sound", "group", "--data", spoken, "--label", "word", "-o", tmp_path / "w"])
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["one", "three", "two", "zero"]


def test_audacity_round_trip(tmp_path, capsys):
    wav = tmp_path / "long.wav"
    sf.write(wav, tone(300, 4.0), RATE)
    txt = tmp_path / "labels.txt"
    write_labels(txt, [(0.5, 1.25, "healthy"), (2.0, 2.0, "click"), (2.5, 3.75, "state=bearing;load=high"),
                       (3.8, 3.9, "")])
    csv = tmp_path / "out" / "metadata.csv"
    csv.parent.mkdir()
    text = run(capsys, ["sound", "from-audacity", txt, "--wav", wav, "--label", "state", "-o", csv])
    assert "2 segments" in text and "1 point labels" in text and "1 empty labels" in text
    rows = read_metadata(csv)
    assert [(r.segment_ms, dict(r.labels)) for r in rows] == [
        ((500, 1250), {"state": "healthy"}), ((2500, 3750), {"state": "bearing", "load": "high"})]
    assert csv.read_text().startswith("../long.wav[500-1250]")
    tracks = tmp_path / "tracks"
    run(capsys, ["sound", "to-audacity", "--data", csv, "--label", "state", "-o", tracks])
    assert read_labels(tracks / "long.txt") == [(0.5, 1.25, "healthy"), (2.5, 3.75, "bearing")]
    fails(capsys, ["sound", "from-audacity", txt, "--wav", wav, "--label", "state", "-o", csv], "--overwrite")
    fails(capsys, ["sound", "from-audacity", txt, "--wav", wav, "-o", tmp_path / "x.csv"], "give --label")
    fails(capsys, ["sound", "from-audacity", tmp_path / "none.txt", "--wav", wav, "--label", "s", "-o",
                   tmp_path / "x.csv"], "no such label file")
    fails(capsys, ["sound", "to-audacity", "--data", csv, "--label", "colour", "-o", tmp_path / "t2"], "no label named")
    write_labels(tmp_path / "late.txt", [(9.0, 9.5, "x")])
    fails(capsys, ["sound", "from-audacity", tmp_path / "late.txt", "--wav", wav, "--label", "s", "-o",
                   tmp_path / "x.csv"], "after the end")
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "t2").exists()


def test_to_audacity_whole_files(tones, tmp_path, capsys):
    run(capsys, ["sound", "to-audacity", "--data", tones, "-o", tmp_path / "t"])
    rows = read_labels(tmp_path / "t" / "low0.txt")
    assert rows == [(0.0, 1.0, "state=low;speaker=s0")]
    assert len(list((tmp_path / "t").glob("*.txt"))) == 25
