"""The demo's data: synthetic machine sounds, and a small set of spoken words shipped with the package.

Three machine states, each at several shaft speeds and noise levels:

* ``healthy``: a motor hum (shaft rate harmonics plus mains hum) with broadband noise;
* ``bearing``: the same hum plus periodic impulses at the bearing's outer-race defect rate
  (3.6 × shaft rate) that ring a 3 kHz structural resonance;
* ``loose``: the hum plus irregular rattle bursts (random times, 600–1500 Hz, short decay).

The words (:func:`copy_demo_words`) are 240 synthesized utterances of *zero* … *nine*, one by each of
24 voices (16 kHz flac, 2 MB; labels ``word`` and ``speaker``), for speech models and folds by speaker.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from wavetrain.core.outputs import copy_atomic
from wavetrain.data.audio import write_audio
from wavetrain.data.metadata import write_metadata
from wavetrain.data.recording import Recording

STATES = ("healthy", "bearing", "loose")


def machine_sound(state: str, *, rate: int = 16000, seconds: float = 2.0, shaft_hz: float = 25.0,
                  snr_db: float = 20.0, rng: np.random.Generator | None = None) -> np.ndarray:
    """One recording of a machine in ``state`` as float32 in [-1, 1], shape ``(rate * seconds,)``."""
    rng = rng or np.random.default_rng()
    n = int(rate * seconds)
    t = np.arange(n) / rate
    phase = rng.uniform(0, 2 * np.pi, 8)
    x = np.zeros(n)
    for h, a in enumerate((1.0, 0.5, 0.3, 0.2, 0.12, 0.08), start=1):
        x += a * np.sin(2 * np.pi * h * shaft_hz * t + phase[h])
    x += 0.3 * np.sin(2 * np.pi * 50 * t + phase[0]) + 0.1 * np.sin(2 * np.pi * 100 * t + phase[7])
    if state == "bearing":
        period = 1.0 / (3.6 * shaft_hz)
        ring = np.exp(-np.arange(int(0.01 * rate)) / (0.0015 * rate)) * np.sin(
            2 * np.pi * 3000 * np.arange(int(0.01 * rate)) / rate)
        for t0 in np.arange(rng.uniform(0, period), seconds, period):
            i = int(t0 * rate)
            seg = ring[: n - i] * rng.uniform(0.8, 1.2) * 1.5
            x[i:i + len(seg)] += seg
    elif state == "loose":
        for _ in range(rng.poisson(6 * seconds)):
            i = int(rng.integers(0, n))
            f = rng.uniform(600, 1500)
            m = int(0.03 * rate)
            burst = rng.normal(0, 1, m) * np.exp(-np.arange(m) / (0.005 * rate)) + \
                np.sin(2 * np.pi * f * np.arange(m) / rate) * np.exp(-np.arange(m) / (0.008 * rate))
            seg = burst[: n - i] * rng.uniform(0.8, 1.6)
            x[i:i + len(seg)] += seg
    elif state != "healthy":
        raise ValueError(f"unknown machine state {state!r}; expected one of {STATES}")
    p_signal = np.mean(x ** 2)
    x += rng.normal(0, np.sqrt(p_signal / 10 ** (snr_db / 10)), n)
    return (0.9 * x / np.max(np.abs(x))).astype(np.float32)


def make_demo_dataset(folder: str | os.PathLike, *, per_combo: int = 4, rate: int = 16000, seconds: float = 2.0,
                      speeds=(15.0, 25.0, 40.0), snrs=(5.0, 10.0, 20.0), seed: int = 0) -> Path:
    """Write wav files and a metadata.csv (labels ``state``, ``speed``, ``snr``; tag ``machine``).

    Each machine (``m0``, ``m1``, ...) contributes one recording per state, speed and noise
    level, so evaluation can group by machine. Returns the csv path.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    recs = []
    for m in range(per_combo):
        for state in STATES:
            for speed in speeds:
                for snr in snrs:
                    jitter = speed * rng.uniform(0.95, 1.05)
                    x = machine_sound(state, rate=rate, seconds=seconds, shaft_hz=jitter, snr_db=snr, rng=rng)
                    path = folder / f"{state}_{int(speed)}hz_{int(snr)}db_m{m}.wav"
                    write_audio(path, x, rate)
                    recs.append(Recording(path, {"state": state, "speed": f"{int(speed)}", "machine": f"m{m}"},
                                          {"snr": f"{int(snr)}"}))
    csv = folder / "metadata.csv"
    write_metadata(csv, recs)
    return csv


#: The shipped word set: flac files and their metadata.csv.
WORDS = Path(__file__).resolve().parent / "words"


def copy_demo_words(folder: str | os.PathLike) -> Path:
    """Copy the shipped spoken words (:data:`WORDS`) into ``folder``; returns its metadata.csv."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for f in sorted(WORDS.iterdir()):
        if f.suffix in (".flac", ".csv"):      # a new file renamed into place: never through a planted link
            copy_atomic(f, folder / f.name, what="demo audio", sync=False)
    return folder / "metadata.csv"
