"""wavetrain sound cut and splice."""
from __future__ import annotations

import numpy as np
import soundfile as sf

from tests.sound.conftest import RATE, fails, run, tone
from wavetrain.data import load_dataset
from wavetrain.data.audacity import read_labels
from wavetrain.data.metadata import read_metadata


def test_cut_counts_durations_and_samples(tones, tmp_path, capsys):
    out = tmp_path / "clips"
    text = run(capsys, ["sound", "cut", "--data", tones, "--clip-ms", "300", "--clip-shift-ms", "200", "-o", out])
    assert "cut: 100 clips" in text                    # 25 one-second files x starts 0, 200, 400, 600
    rows = read_metadata(out / "metadata.csv")
    assert len(rows) == 100
    for r in rows[:8]:
        info = sf.info(str(r.path))
        assert info.frames == int(0.3 * RATE) and info.samplerate == RATE
        assert r.labels["state"] and r.tags["source"].endswith(".wav")
        src = tones / r.tags["source"].split("/")[-1]
        x, _ = sf.read(src, dtype="float32")
        y, _ = sf.read(r.path, dtype="float32")
        start = int(r.tags["offset_ms"]) * RATE // 1000
        np.testing.assert_allclose(y, x[start:start + y.size], atol=1 / 32768)
    assert sorted({r.tags["offset_ms"] for r in rows}) == ["0", "200", "400", "600"]


def test_cut_segments_and_spoken(spoken, tmp_path, capsys):
    out = tmp_path / "c"
    run(capsys, ["sound", "cut", "--data", spoken, "--clip-ms", "200", "-o", out])
    ds = load_dataset(spoken, check=False)
    expected = sum(int(r.info().frames // (0.2 * r.info().rate)) for r in ds)
    rows = read_metadata(out / "metadata.csv")
    assert len(rows) == expected
    assert all(sf.info(str(r.path)).duration == 0.2 for r in rows[:10])


def test_cut_errors(tones, tmp_path, capsys):
    fails(capsys, ["sound", "cut", "--data", tones, "--clip-ms", "5000", "-o", tmp_path / "x"], "every recording is "
          "shorter")
    fails(capsys, ["sound", "cut", "--data", tones, "--clip-ms", "0", "-o", tmp_path / "x"], "--clip-ms")
    fails(capsys, ["sound", "cut", "--data", tones, "--where", "state=none", "--clip-ms", "100", "-o", tmp_path / "x"],
          "no recording left")
    run(capsys, ["sound", "cut", "--data", tones, "--clip-ms", "500", "-o", tmp_path / "y"])
    fails(capsys, ["sound", "cut", "--data", tones, "--clip-ms", "500", "-o", tmp_path / "y"], "--overwrite")


def test_splice_rows_reproduce_sources(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    sf.write(src / "a.wav", tone(440, 0.5013), RATE)          # not a whole number of ms
    sf.write(src / "b.wav", tone(700, 0.3, rate=8000), 8000)   # resampled to 16 kHz
    sf.write(src / "c.wav", tone(1500, 0.25), RATE)
    (src / "metadata.csv").write_text("a.wav,k=a\nb.wav,k=b;other=1,t=x\nc.wav,k=c\n")
    out = tmp_path / "out"                                      # created, as partition's -o
    run(capsys, ["sound", "splice", "--data", src, "--gap-ms", "250", "--gap-label", "gap", "-o", out / "all.wav"])
    assert sorted(p.name for p in out.iterdir()) == ["all.csv", "all.txt", "all.wav"]   # only what -o names
    rows = read_metadata(out / "all.csv")
    words = [r for r in rows if "gap" not in r.tags]
    gaps = [r for r in rows if "gap" in r.tags]
    assert [r.labels["k"] for r in words] == ["a", "b", "c"] and len(gaps) == 2
    assert all(g.labels == {"k": "gap", "other": "gap"} for g in gaps)
    assert words[1].tags["t"] == "x" and words[1].tags["source"] == "../src/b.wav"
    ds = load_dataset(src)
    for row, orig in zip(words, ds):
        y, rate = row.load()
        x, _ = orig.load(RATE)
        assert rate == RATE and 0 <= y.size - x.size < RATE // 1000 + 1
        np.testing.assert_allclose(y[:x.size], x, atol=2 / 32768)
        assert not np.any(y[x.size:])
    for g in gaps:
        assert g.segment_ms[1] - g.segment_ms[0] == 250 and not np.any(g.load()[0])
    track = read_labels(out / "all.txt")
    assert len(track) == 5 and track[0][2] == "k=a"
    fails(capsys, ["sound", "splice", "--data", src, "-o", out / "all.wav"], "--overwrite")
    # a data set's metadata.csv in the folder of -o is not touched: the rows go to OUT.csv
    run(capsys, ["sound", "splice", "--data", src / "metadata.csv", "-o", src / "joined.wav"])
    assert (src / "metadata.csv").read_text() == "a.wav,k=a\nb.wav,k=b;other=1,t=x\nc.wav,k=c\n"
    assert len(load_dataset(src / "joined.csv")) == 3
    fails(capsys, ["sound", "splice", "--data", src, "-o", out / "all.mp3"], ".wav")
    fails(capsys, ["sound", "splice", "--data", src, "--where", "k=zz", "-o", tmp_path / "n.wav"], "no recording left")


def test_splice_shuffle_seeded(spoken, tmp_path, capsys):
    orders = []
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        seed = "5" if name != "c" else "6"
        run(capsys, ["sound", "splice", "--data", spoken, "--shuffle", "--seed", seed, "--gap-ms", "100",
                     "-o", tmp_path / name / "s.wav"])
        orders.append([r.tags["source"] for r in read_metadata(tmp_path / name / "s.csv")])
    assert orders[0] == orders[1] != orders[2] and sorted(orders[0]) == sorted(orders[2])
    rows = read_metadata(tmp_path / "a" / "s.csv")
    for row in rows[:5]:
        orig = next(r for r in load_dataset(spoken, check=False) if r.path.name == row.tags["source"].split("/")[-1])
        x, _ = orig.load()
        y, _ = row.load()
        np.testing.assert_allclose(y[:x.size], x, atol=2 / 32768)
