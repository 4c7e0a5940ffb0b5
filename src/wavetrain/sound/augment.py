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

Copies are mono at the recording's rate, written as 16-bit wav unless a sample exceeds full scale
(then 32-bit float: nothing is clipped).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
from scipy import signal

from wavetrain.data.audio import write_audio
from wavetrain.data.dataset import Dataset
from wavetrain.data.metadata import write_metadata
from wavetrain.data.recording import Recording
from wavetrain.errors import ParameterError
from wavetrain.progress import progress_bar
from wavetrain.sound.common import UniqueNames, relative, safe_name, tag_value

__all__ = ["Augmentations", "add_noise", "augment", "augment_one", "freq_shift", "mix_at_snr", "pink_noise",
           "pitch_shift", "reverb", "speed_change", "time_stretch"]

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


def _power(x: np.ndarray) -> float:
    return float(np.mean(np.square(x, dtype=np.float64))) if x.size else 0.0


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise with power falling as 1/f (-3 dB per octave), unit variance."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(spec.size, dtype=np.float64)
    f[0] = 1.0
    y = np.fft.irfft(spec / np.sqrt(f), n)
    return y / (np.std(y) or 1.0)


def add_noise(x: np.ndarray, snr_db: float, rng: np.random.Generator, color: str = "white") -> np.ndarray:
    """``x`` plus noise whose power is exactly ``power(x) / 10 ** (snr_db / 10)``."""
    p = _power(x)
    if p == 0.0:
        return x.copy()
    noise = pink_noise(x.size, rng) if color == "pink" else rng.standard_normal(x.size)
    noise *= np.sqrt(p / 10 ** (snr_db / 10) / (_power(noise) or 1.0))
    return x + noise


def mix_at_snr(x: np.ndarray, other: np.ndarray, snr_db: float) -> np.ndarray:
    """``x`` plus ``other`` (same length) scaled to ``snr_db`` below ``x``."""
    p, q = _power(x), _power(other)
    if p == 0.0 or q == 0.0:
        return x.copy()
    return x + other * np.sqrt(p / 10 ** (snr_db / 10) / q)


def freq_shift(x: np.ndarray, hz: float, rate: int) -> np.ndarray:
    """Shift every frequency component by ``hz`` (single-sideband modulation of the analytic signal)."""
    if hz == 0 or x.size == 0:
        return x.copy()
    t = np.arange(x.size) / rate
    return np.real(signal.hilbert(x) * np.exp(2j * np.pi * hz * t))


def _ratio(factor: float) -> tuple[int, int]:
    f = Fraction(factor).limit_denominator(200)
    return f.numerator, f.denominator


def speed_change(x: np.ndarray, factor: float) -> np.ndarray:
    """Play ``factor`` times faster (length / factor, frequencies * factor) by resampling."""
    if factor == 1.0:
        return x.copy()
    num, den = _ratio(factor)
    return signal.resample_poly(x, den, num)


def time_stretch(x: np.ndarray, rate_factor: float, n_fft: int = 1024) -> np.ndarray:
    """Phase-vocoder time stretch: ``rate_factor`` > 1 is shorter (length / rate_factor), pitch kept."""
    if rate_factor == 1.0 or x.size == 0:
        return x.copy()
    hop = n_fft // 4
    pad = np.pad(x, (n_fft, n_fft))
    _, _, z = signal.stft(pad, nperseg=n_fft, noverlap=n_fft - hop, boundary=None, padded=True)
    steps = np.arange(0, z.shape[1] - 1, rate_factor)
    omega = 2 * np.pi * hop * np.arange(z.shape[0]) / n_fft
    phase = np.angle(z[:, 0])
    out = np.empty((z.shape[0], steps.size), dtype=np.complex128)
    for k, t in enumerate(steps):
        i = int(t)
        a, b = z[:, i], z[:, i + 1]
        frac = t - i
        out[:, k] = ((1 - frac) * np.abs(a) + frac * np.abs(b)) * np.exp(1j * phase)
        d = np.angle(b) - np.angle(a) - omega
        d -= 2 * np.pi * np.round(d / (2 * np.pi))
        phase = phase + omega + d
    with warnings.catch_warnings():        # the first and last samples lie under a zero window
        warnings.simplefilter("ignore", UserWarning)
        _, y = signal.istft(out, nperseg=n_fft, noverlap=n_fft - hop, boundary=False)
    start = int(round(n_fft / rate_factor))
    return y[start:start + int(round(x.size / rate_factor))]


def pitch_shift(x: np.ndarray, semitones: float, rate: int) -> np.ndarray:
    """Shift the pitch by ``semitones`` keeping the duration: resample, then stretch back."""
    if semitones == 0 or x.size == 0:
        return x.copy()
    factor = 2.0 ** (semitones / 12.0)
    n_fft = max(256, 1 << int(round(np.log2(1024 * rate / 16000))))
    y = _fit(time_stretch(speed_change(x, factor), 1.0 / factor, n_fft=n_fft), x.size)
    p = _power(y)
    return y * np.sqrt(_power(x) / p) if p > 0 else y      # the vocoder's level loss undone


def reverb(x: np.ndarray, rt60_s: float, rate: int, rng: np.random.Generator) -> np.ndarray:
    """Convolve with a synthetic room response of reverberation time ``rt60_s`` (60 dB decay)."""
    if rt60_s <= 0 or x.size == 0:
        return x.copy()
    n = max(2, int(rt60_s * rate))
    t = np.arange(n) / rate
    tail = rng.standard_normal(n) * np.exp(-6.907755 * t / rt60_s)   # ln(1000): -60 dB at rt60
    tail[0] = 0.0
    tail /= np.sqrt(np.sum(tail ** 2)) or 1.0                       # tail energy = direct energy
    tail[0] = 1.0
    y = signal.fftconvolve(x, tail)[:x.size]
    p = _power(y)
    return y * np.sqrt(_power(x) / p) if p > 0 else y


def _fit(y: np.ndarray, n: int) -> np.ndarray:
    return y[:n] if y.size >= n else np.pad(y, (0, n - y.size))


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
        num, den = _ratio(f)
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
        y = add_noise(y, snr, rng, aug.noise_color)
        tags.update(noise=aug.noise_color, noise_snr_db=f"{snr:.2f}")
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
