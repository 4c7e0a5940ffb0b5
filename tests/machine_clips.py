"""Data sets of machine clips for the detector tests: units of one line (each at its own shaft
speed), in halls of their own noise, healthy or faulty, each clip 1 s at 16 kHz."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import soundfile as sf

from wavetrain.data.demo import machine_sound

RATE = 16000


def write_clips(root: Path, clips: Iterable[tuple[str, str, float, Sequence[int], float, Mapping[str, str]]]
                ) -> Path:
    """Write each ``(name, state, shaft_hz, seed, snr_db, labels)`` clip as ``root/NAME.wav``
    (``state`` ``normal`` is the healthy machine sound; ``labels`` get ``state`` added) and the
    ``metadata.csv`` listing them; returns the metadata's path."""
    rows = []
    for name, state, hz, seed, snr, labels in clips:
        x = machine_sound("healthy" if state == "normal" else state, seconds=1.0, shaft_hz=hz, snr_db=snr,
                          rng=np.random.default_rng(list(seed)))
        sf.write(root / f"{name}.wav", x, RATE)
        rows.append(f"{name}.wav," + ";".join(f"{k}={v}" for k, v in {**labels, "state": state}.items()))
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    return root / "metadata.csv"
