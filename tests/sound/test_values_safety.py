"""from-audacity reads regular files only and writes only what a metadata.csv gives back; splice
bounds --rate."""
from __future__ import annotations

import os
import signal

import pytest
import soundfile as sf

from tests.sound.conftest import RATE, fails, run, tone
from wavetrain.data.metadata import read_metadata


@pytest.fixture
def bounded():
    """Turn a blocked read into a failure after 20 s instead of a hung test run."""
    def stop(signum, frame):
        raise TimeoutError("blocked")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def wav(tmp_path):
    path = tmp_path / "a.wav"
    sf.write(path, tone(440.0, 1.0), RATE)
    return path


def _from(txt, wav, out, *extra):
    return ["sound", "from-audacity", txt, "--wav", wav, "-o", out, *extra]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_from_audacity_refuses_named_pipes(bounded, wav, tmp_path, capsys):
    fifo = tmp_path / "labels.txt"
    os.mkfifo(fifo)
    fails(capsys, _from(fifo, wav, tmp_path / "o.csv", "--label", "state"), "not a regular file")
    txt = tmp_path / "ok.txt"
    txt.write_text("0.1\t0.4\tlow\n")
    wav_fifo = tmp_path / "pipe.wav"
    os.mkfifo(wav_fifo)
    fails(capsys, _from(txt, wav_fifo, tmp_path / "o.csv", "--label", "state"), "not a regular file")
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.parametrize("text, says", [
    ("lo\0w", "control character"),
    ("state=lo\0w", "control character"),
    ("low;high", "holds ';'"),
    ("x" * 200_000, "a metadata.csv cell holds at most"),
    ("state=" + "x" * 200_000, "a metadata.csv cell holds at most"),
])
def test_from_audacity_refuses_values_metadata_cannot_carry(wav, tmp_path, capsys, text, says):
    txt = tmp_path / "labels.txt"
    txt.write_text(f"0.1\t0.4\tlow\n0.5\t0.9\t{text}\n")
    out = tmp_path / "o.csv"
    fails(capsys, _from(txt, wav, out, "--label", "state"), says)
    assert not out.exists()


def test_from_audacity_refuses_a_bad_label_name(wav, tmp_path, capsys):
    txt = tmp_path / "labels.txt"
    txt.write_text("0.1\t0.4\tlow\n")
    fails(capsys, _from(txt, wav, tmp_path / "o.csv", "--label", "a;b"), "--label: labels name")
    fails(capsys, _from(txt, wav, tmp_path / "o.csv", "--label", "st\x01ate"), "control character")


def test_from_audacity_output_reads_back(wav, tmp_path, capsys):
    txt = tmp_path / "labels.txt"
    txt.write_text("0.1\t0.4\tlow , quiet\n0.5\t0.9\tstate=high;who=x=y\n")
    out = tmp_path / "o.csv"
    run(capsys, _from(txt, wav, out, "--label", "state"))
    rows = read_metadata(out)
    assert [(r.segment_ms, r.labels) for r in rows] == [((100, 400), {"state": "low , quiet"}),
                                                        ((500, 900), {"state": "high", "who": "x=y"})]


@pytest.mark.parametrize("rate", ["1", "999", "768001", "10000000"])
def test_splice_rate_is_bounded(wav, tmp_path, capsys, rate):
    out = tmp_path / "s.wav"
    fails(capsys, ["sound", "splice", "--data", wav, "--rate", rate, "-o", out],
          "expected a sample rate from 1000 to 768000 Hz")
    assert not out.exists()


def test_splice_accepts_rates_within_bounds_and_refuses_a_bad_gap_label(wav, tmp_path, capsys):
    run(capsys, ["sound", "splice", "--data", wav, wav, "--rate", "1000", "-o", tmp_path / "s.wav"])
    assert sf.info(str(tmp_path / "s.wav")).samplerate == 1000
    fails(capsys, ["sound", "splice", "--data", wav, wav, "--gap-label", "a;b", "-o", tmp_path / "g.wav",
                   "--overwrite"],
          "--gap-label")
