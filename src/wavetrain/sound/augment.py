"""Augmented copies of recordings, numpy/scipy only.

Each copy draws every asked augmentation's parameter uniformly from its range, with a random
generator seeded by ``(seed, recording index, copy)``: the same seed gives the same files. They
are applied in this order, and recorded as tags of the copy's row (``aug_speed``,
``aug_pitch_semitones``, ``aug_shift_hz``, ``aug_reverb_rt60_s``, ``aug_mix``, ``aug_mix_snr_db``,
``aug_noise``, ``aug_noise_snr_db``, ``aug_gain_db``):

* ``speed`` (factor): resampling (``scipy.signal.resample_poly``): a factor 1.1 is 10 % faster,
  shorter and higher;
* ``pitch`` (semitones): resampling by ``2 ** (semitones / 12)`` and a phase-vocoder time stretch
  back to the original duration (STFT 1024/256 at 16 kHz scaled with the rate; phase advanced per
  bin; level restored to the input's RMS; some "phasiness", no formant preservation);
* ``shift_hz``: frequency shift of every component by the same Hz (single-sideband: the analytic
  signal from ``scipy.signal.hilbert`` times ``exp(2πi f t)``; not harmonic-preserving);
* ``reverb`` (RT60, seconds): convolution with a synthetic impulse response — a direct path plus
  exponentially decaying Gaussian noise that falls 60 dB in RT60, tail energy equal to the
  direct path's — rescaled to the input's RMS;
* ``mix`` (SNR dB): a randomly chosen recording of another data set (random offset, looped when
  shorter), scaled to the SNR against the signal;
* ``noise`` (SNR dB): white or pink (1/f power) Gaussian noise scaled to exactly the SNR against
  the signal's mean power;
* ``gain`` (dB): scaling last (it keeps the SNRs).

The signal functions live in :mod:`wavetrain.features.augment` (shared with training-time
augmentation, ``--set augment=...``) and are re-exported here.

Copies are mono at the recording's rate, written as 16-bit wav unless a sample exceeds full scale
(then 32-bit float: nothing is clipped).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.core.outputs import refuse_inputs
from wavetrain.core.progress import progress_bar
from wavetrain.data.audio import write_audio
from wavetrain.data.dataset import Dataset, input_paths
from wavetrain.data.metadata import write_metadata
from wavetrain.data.recording import Recording
from wavetrain.features.augment import (
    NOISE_COLORS,
    add_noise,
    freq_shift,
    mix_at_snr,
    pick_noise_color,
    pink_noise,
    pitch_shift,
    reverb,
    speed_change,
    speed_ratio,
    time_stretch,
)
from wavetrain.sound.common import UniqueNames, relative, safe_name, tag_value

__all__ = ["NOISE_COLORS", "Augmentations", "add_noise", "augment", "augment_one", "freq_shift", "mix_at_snr",
           "pink_noise", "pitch_shift", "reverb", "speed_change", "time_stretch"]

Range = tuple[float, float]


@dataclass
class Augmentations:
    """The ranges to draw from (None: not applied)."""

    noise: Range | None = None
    noise_color: str = "white"
    gain: Range | None = None
    shift_hz: Range | None = None
    speed: Range | None = None
    pitch: Range | None = None
    reverb: Range | None = None
    mix: Dataset | None = None
    mix_snr: Range = (10.0, 10.0)
    _mix_cache: dict = field(default_factory=dict, repr=False)

    def any(self) -> bool:
        return any(v is not None for v in (self.noise, self.gain, self.shift_hz, self.speed, self.pitch,
                                           self.reverb, self.mix))


def _draw(rng: np.random.Generator, r: Range) -> float:
    return float(r[0]) if r[0] == r[1] else float(rng.uniform(r[0], r[1]))


def _mix_source(aug: Augmentations, n: int, rate: int, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    assert aug.mix is not None
    j = int(rng.integers(len(aug.mix)))
    key = (j, rate)
    if key not in aug._mix_cache:
        if len(aug._mix_cache) > 64:
            aug._mix_cache.clear()
        aug._mix_cache[key] = aug.mix[j].load(rate, mono=True)[0].astype(np.float64)
    other = aug._mix_cache[key]
    if other.size < n:
        other = np.tile(other, int(np.ceil(n / other.size)) + 1)
    off = int(rng.integers(other.size - n + 1))
    return other[off:off + n], aug.mix[j].path.name


def augment_one(x: np.ndarray, rate: int, aug: Augmentations, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """One augmented copy of mono samples ``x`` and the tags that say what was done."""
    y = x.astype(np.float64)
    tags: dict[str, str] = {}
    if aug.speed is not None:
        f = _draw(rng, aug.speed)
        num, den = speed_ratio(f)
        y = speed_change(y, num / den)
        tags["speed"] = f"{num / den:.4g}"
    if aug.pitch is not None:
        s = _draw(rng, aug.pitch)
        y = pitch_shift(y, s, rate)
        tags["pitch_semitones"] = f"{s:.3f}"
    if aug.shift_hz is not None:
        hz = _draw(rng, aug.shift_hz)
        y = freq_shift(y, hz, rate)
        tags["shift_hz"] = f"{hz:.2f}"
    if aug.reverb is not None:
        rt = _draw(rng, aug.reverb)
        y = reverb(y, rt, rate, rng)
        tags["reverb_rt60_s"] = f"{rt:.3f}"
    if aug.mix is not None:
        snr = _draw(rng, aug.mix_snr)
        other, name = _mix_source(aug, y.size, rate, rng)
        y = mix_at_snr(y, other, snr)
        tags.update(mix=tag_value(name), mix_snr_db=f"{snr:.2f}")
    if aug.noise is not None:
        snr = _draw(rng, aug.noise)
        color = pick_noise_color(aug.noise_color, rng)
        y = add_noise(y, snr, rng, color, rate)
        tags.update(noise=color, noise_snr_db=f"{snr:.2f}")
    if aug.gain is not None:
        g = _draw(rng, aug.gain)
        y = y * 10 ** (g / 20)
        tags["gain_db"] = f"{g:.2f}"
    return y.astype(np.float32), {f"aug_{k}": v for k, v in tags.items()}


def augment(ds: Dataset, out: Path, aug: Augmentations, *, copies: int = 1, seed: int = 0,
            progress: bool = False) -> int:
    """Write ``copies`` augmented copies of every recording of ``ds`` into ``out`` with a
    metadata.csv (labels carried over; tags: the original's, ``source``, ``copy`` and the
    augmentation's parameters, ``aug_*``). Returns the number of files written."""
    mixed = input_paths((), aug.mix) if aug.mix is not None else []
    refuse_inputs([out], input_paths((), ds) + mixed, option="")     # never over what it reads
    if copies < 1:
        raise ParameterError(f"--copies {copies}: expected at least 1")
    if not aug.any():
        raise ParameterError("augment: give at least one augmentation (--noise, --gain, --shift-hz, --speed, "
                             "--pitch, --reverb or --mix)")
    names = UniqueNames()
    names("metadata", ".csv")
    rows: list[Recording] = []
    for i, r in enumerate(progress_bar(ds.recordings, desc="augmenting", unit="file", enable=progress)):
        x, rate = r.load(mono=True)
        stem = safe_name(r.path.stem, "copy")
        for c in range(copies):
            rng = np.random.default_rng([seed, i, c])
            y, tags = augment_one(x, rate, aug, rng)
            name = names(f"{stem}_aug{c + 1}", ".wav")
            peak = float(np.max(np.abs(y))) if y.size else 0.0
            write_audio(out / name, y, rate, subtype="FLOAT" if peak > 1.0 else "PCM_16")
            all_tags = dict(r.tags)
            all_tags["source"] = tag_value(relative(r.path, out))
            if r.segment_ms is not None:
                all_tags["source_ms"] = f"{r.segment_ms[0]}-{r.segment_ms[1]}"
            all_tags["copy"] = str(c + 1)
            all_tags.update(tags)
            rows.append(Recording(out / name, r.labels, all_tags))
    write_metadata(out / "metadata.csv", rows)
    return len(rows)
