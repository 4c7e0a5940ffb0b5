"""wavetrain sound splice: gaps drawn from a range, pads at the edges, a background of noise."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.sound.conftest import RATE, fails, run, tone
from wavetrain.data import load_dataset
from wavetrain.data.metadata import read_metadata
from wavetrain.data.recording import Recording


@pytest.fixture
def words(tmp_path) -> Path:
    """Eight short tones of lengths that are no whole number of ms, one at 8 kHz (resampled)."""
    src = tmp_path / "words"
    src.mkdir()
    lines = []
    for i in range(8):
        rate = 8000 if i == 3 else RATE
        sf.write(src / f"w{i}.wav", tone(300 + 170 * i, 0.2013 + 0.037 * i, rate=rate, seed=i), rate)
        lines.append(f"w{i}.wav,k=w{i}\n")
    (src / "metadata.csv").write_text("".join(lines))
    return src


def splice(capsys, words: Path, out: Path, *options) -> list[Recording]:
    run(capsys, ["sound", "splice", "--data", words, *options, "-o", out])
    return read_metadata(out.with_suffix(".csv"))


def split(rows: list[Recording]) -> tuple[list[Recording], list[Recording]]:
    return [r for r in rows if "gap" not in r.tags], [r for r in rows if "gap" in r.tags]


def lengths(rows: list[Recording]) -> list[int]:
    assert all(r.segment_ms is not None for r in rows)
    return [r.segment_ms[1] - r.segment_ms[0] for r in rows if r.segment_ms is not None]


def spans(words: Path, rows: list[Recording]) -> list[tuple[int, int]]:
    """The samples of the file that hold each spliced recording (its row's start, its length at RATE)."""
    originals = {r.path.name: r.load(RATE)[0].size for r in load_dataset(words)}
    out = []
    for row in split(rows)[0]:
        assert row.segment_ms is not None
        start = int(round(row.segment_ms[0] * RATE / 1000))
        out.append((start, start + originals[row.tags["source"].split("/")[-1]]))
    return out


def assert_rows_read_back_sources(words: Path, rows: list[Recording]) -> None:
    """Each recording's row reads back its samples, then at most 1 ms of silence; each gap row is silent."""
    originals = {r.path.name: r for r in load_dataset(words)}
    recordings, gaps = split(rows)
    assert len(recordings) == len(originals)
    for row in recordings:
        x, _ = originals[row.tags["source"].split("/")[-1]].load(RATE)
        y, rate = row.load()
        assert rate == RATE and 0 <= y.size - x.size <= RATE // 1000
        np.testing.assert_allclose(y[:x.size], x, atol=2 / 32768)
        assert not np.any(y[x.size:])
    for g in gaps:
        assert not np.any(g.load()[0])


def power(x: np.ndarray) -> float:
    return float(np.mean(np.square(x, dtype=np.float64)))


def test_gaps_are_drawn_from_the_range_and_reproducible(words, tmp_path, capsys):
    a = splice(capsys, words, tmp_path / "a.wav", "--gap-ms", "100:400", "--seed", "3", "--gap-label", "gap")
    b = splice(capsys, words, tmp_path / "b.wav", "--gap-ms", "100:400", "--seed", "3", "--gap-label", "gap")
    c = splice(capsys, words, tmp_path / "c.wav", "--gap-ms", "100:400", "--seed", "4", "--gap-label", "gap")
    gaps = lengths(split(a)[1])
    assert len(gaps) == 7 and all(100 <= g <= 400 for g in gaps) and len(set(gaps)) > 1
    assert [r.segment_ms for r in a] == [r.segment_ms for r in b] != [r.segment_ms for r in c]
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    # the recordings sit between the gaps: each row starts where the gap before it ends
    recordings, gap_rows = split(a)
    for gap, nxt in zip(gap_rows, recordings[1:]):
        assert gap.segment_ms is not None and nxt.segment_ms is not None
        assert gap.segment_ms[1] == nxt.segment_ms[0]
    assert_rows_read_back_sources(words, a)


def test_random_gaps_leave_the_shuffled_order_alone(words, tmp_path, capsys):
    fixed = splice(capsys, words, tmp_path / "f.wav", "--shuffle", "--seed", "5", "--gap-ms", "100")
    drawn = splice(capsys, words, tmp_path / "d.wav", "--shuffle", "--seed", "5", "--gap-ms", "0:900")
    assert [r.tags["source"] for r in fixed] == [r.tags["source"] for r in drawn]
    assert [r.tags["source"] for r in fixed] != sorted(r.tags["source"] for r in fixed)
    starts = np.diff([r.segment_ms[0] for r in drawn if r.segment_ms is not None]) - lengths(drawn)[:-1]
    assert len(set(starts.tolist())) > 1 and all(0 <= s <= 900 for s in starts)
    assert_rows_read_back_sources(words, drawn)


def test_pads_before_and_after(words, tmp_path, capsys):
    out = tmp_path / "p.wav"
    rows = splice(capsys, words, out, "--pad-ms", "300:600", "--gap-ms", "50:150", "--seed", "2",
                  "--gap-label", "gap")
    recordings, gaps = split(rows)
    first, last = rows[0], rows[-1]
    assert first in gaps and last in gaps and len(gaps) == 9
    assert first.segment_ms is not None and last.segment_ms is not None
    lead, trail = first.segment_ms[1] - first.segment_ms[0], last.segment_ms[1] - last.segment_ms[0]
    assert first.segment_ms[0] == 0 and 300 <= lead <= 600 and 300 <= trail <= 600
    assert recordings[0].segment_ms is not None and recordings[0].segment_ms[0] == lead
    assert sf.info(str(out)).frames == last.segment_ms[1] * RATE // 1000
    assert_rows_read_back_sources(words, rows)
    # the pads are drawn apart from the gaps: the same seed gives the same gaps with or without them
    unpadded = splice(capsys, words, tmp_path / "u.wav", "--gap-ms", "50:150", "--seed", "2", "--gap-label", "gap")
    assert lengths(split(unpadded)[1]) == lengths(gaps[1:-1])
    # a fixed pad
    fixed = splice(capsys, words, tmp_path / "x.wav", "--pad-ms", "250", "--gap-ms", "100")
    assert fixed[0].segment_ms is not None and fixed[0].segment_ms[0] == 250
    assert sf.info(str(tmp_path / "x.wav")).frames == (fixed[-1].segment_ms[1] + 250) * RATE // 1000
    assert_rows_read_back_sources(words, fixed)


@pytest.mark.parametrize("colors, snr, subtype", [("pink,hum", "8:15", "PCM_16"), ("white", "12", "PCM_16"),
                                                  ("babble,brown,white", "-6:-4", "FLOAT")])
def test_noise_at_the_drawn_snr_over_the_recordings(words, tmp_path, capsys, colors, snr, subtype):
    options = ["--gap-ms", "100:300", "--pad-ms", "200", "--seed", "4", "--gap-label", "gap"]
    clean = splice(capsys, words, tmp_path / "clean.wav", *options)
    noisy = splice(capsys, words, tmp_path / "noisy.wav", *options, f"--noise={snr}", "--noise-color", colors)
    assert [r.segment_ms for r in clean] == [r.segment_ms for r in noisy]       # the same layout
    assert {r.tags["splice_noise"] for r in noisy} == {colors.replace(",", "+")}
    drawn = {r.tags["splice_snr_db"] for r in noisy}
    assert len(drawn) == 1
    lo, hi = (float(v) for v in (snr.split(":") * 2)[:2])
    snr_db = float(drawn.pop())
    assert lo <= snr_db <= hi
    x, _ = sf.read(tmp_path / "clean.wav", dtype="float64")
    y, _ = sf.read(tmp_path / "noisy.wav", dtype="float64")
    assert sf.info(str(tmp_path / "noisy.wav")).subtype == subtype and x.size == y.size
    noise = y - x
    where = spans(words, noisy)
    inside = np.concatenate([noise[a:b] for a, b in where])
    outside = np.ones(x.size, bool)
    for a, b in where:
        outside[a:b] = False
    signal_power = power(np.concatenate([x[a:b] for a, b in where]))
    assert 10 * np.log10(signal_power / power(inside)) == pytest.approx(snr_db, abs=0.1)
    # the background covers the gaps and pads too, at about the same level
    assert not np.any(x[outside]) and power(noise[outside]) > 0.2 * power(inside)
    for g in split(noisy)[1]:
        assert power(g.load()[0]) > 0
    # reproducible
    again = splice(capsys, words, tmp_path / "again.wav", *options, f"--noise={snr}", "--noise-color", colors)
    assert [r.tags for r in again] == [r.tags for r in noisy]
    assert (tmp_path / "again.wav").read_bytes() == (tmp_path / "noisy.wav").read_bytes()


def test_noise_snr_differs_with_the_seed_and_defaults_to_white(words, tmp_path, capsys):
    a = splice(capsys, words, tmp_path / "a.wav", "--noise", "0:30", "--seed", "1")
    b = splice(capsys, words, tmp_path / "b.wav", "--noise", "0:30", "--seed", "2")
    assert a[0].tags["splice_noise"] == "white"
    assert a[0].tags["splice_snr_db"] != b[0].tags["splice_snr_db"]
    text = run(capsys, ["sound", "splice", "--data", words, "--noise", "10", "-o", tmp_path / "c.wav"])
    assert "white noise at 10.00 dB SNR" in text


def test_splice_refusals(words, tmp_path, capsys):
    out = tmp_path / "out" / "s.wav"
    for options, expect in [(["--gap-ms", "400:100"], "--gap-ms 400:100: the range ends before it starts"),
                            (["--gap-ms=-5"], "--gap-ms -5: expected values >= 0"),
                            (["--gap-ms=-5:10"], "--gap-ms -5:10: expected values >= 0"),
                            (["--gap-ms", "1e12"], "--gap-ms 1e12: expected at most 86400000 ms"),
                            (["--gap-ms", "1:2:3"], "expected LO:HI or one number"),
                            (["--pad-ms", "10.5"], "--pad-ms 10.5: expected whole milliseconds"),
                            (["--pad-ms", "300:200"], "--pad-ms 300:200: the range ends before it starts"),
                            (["--pad-ms", "nan"], "--pad-ms nan: expected finite numbers"),
                            (["--noise", "20:10"], "--noise 20:10: the range ends before it starts"),
                            (["--noise", "5:500"], "--noise 5:500: expected values <= 120"),
                            (["--noise", "5:10", "--noise-color", "pink,red"], "unknown colour 'red'"),
                            (["--noise", "5:10", "--noise-color", "pink,"], "unknown colour ''"),
                            (["--noise-color", "pink"], "--noise-color pink: needs --noise"),
                            (["--shuffle", "--seed", "-1"], "--seed")]:
        fails(capsys, ["sound", "splice", "--data", words, *options, "-o", out], expect)
        assert not out.parent.exists()                  # refused before anything is written
    silent = tmp_path / "silent"
    silent.mkdir()
    sf.write(silent / "z.wav", np.zeros(1600, np.float32), RATE)
    (silent / "metadata.csv").write_text("z.wav,k=z\n")
    fails(capsys, ["sound", "splice", "--data", silent, "--noise", "10", "-o", out], "recordings are silent")
    assert not out.exists()
