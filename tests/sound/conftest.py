"""Fixtures of the ``wavetrain sound`` tests: generated tone data sets (always there) and a slice
of the spoken-words data set (skipped when /work/shared/data is absent)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.conftest import SPOKEN
from wavetrain.cli.main import main

RATE = 16000
STATES = ("low", "mid", "high")
FREQS = {"low": 300.0, "mid": 900.0, "high": 2500.0}


def tone(freq: float, seconds: float = 1.0, rate: int = RATE, seed: int = 0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    noise = 0.01 * np.random.default_rng(seed).normal(size=t.size)
    return (amp * np.sin(2 * np.pi * freq * t) + noise).astype(np.float32)


@pytest.fixture
def tones(tmp_path) -> Path:
    """``tones/metadata.csv``: 24 one-second tones, 8 per state, 6 speakers (s0..s5, 4 each) and a
    copy of ``low0.wav`` under another name (same speaker label as... a different speaker)."""
    root = tmp_path / "tones"
    root.mkdir()
    rows = []
    for s, state in enumerate(STATES):
        for i in range(8):
            name = f"{state}{i}.wav"
            sf.write(root / name, tone(FREQS[state] + 11 * i, seed=10 * s + i), RATE)
            rows.append(f"{name},state={state};speaker=s{(i + 2 * s) % 6}\n")
    shutil.copyfile(root / "low0.wav", root / "copy_of_low0.wav")
    rows.append("copy_of_low0.wav,state=low;speaker=s5\n")
    (root / "metadata.csv").write_text("".join(rows))
    return root


@pytest.fixture
def spoken(tmp_path) -> Path:
    """A metadata.csv of 120 rows of spoken-words (4 words, every speaker), referencing the originals."""
    if not (SPOKEN / "metadata.csv").is_file():
        pytest.skip("spoken-words data set absent")
    keep = [line for line in (SPOKEN / "metadata.csv").read_text().splitlines()
            if line.split(",")[0].split("_")[0] in ("zero", "one", "two", "three")][:120]
    root = tmp_path / "spoken"
    root.mkdir()
    (root / "metadata.csv").write_text("".join(f"{SPOKEN}/{line}\n" for line in keep))
    return root / "metadata.csv"


def run(capsys, argv: list[str]) -> str:
    """Run ``wavetrain`` with ``argv``; assert success; return stdout."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def fails(capsys, argv: list[str], expect: str) -> str:
    """Run ``argv``; assert the bad-input contract (exit 2, one line, no traceback, ``expect`` in it)."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, f"exit code {code}, stderr: {err!r}"
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("wavetrain: error:"), err
    assert expect in lines[0], lines[0]
    return lines[0]
