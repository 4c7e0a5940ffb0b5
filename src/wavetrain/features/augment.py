"""Audio augmentation: the signal functions (numpy/scipy) and the training-time augmentation
spec, ``augment="noise(snr=5:20) | reverb(rt60=0.1:0.8) | specaugment(time=2, freq=2)"``.

The spec is a chain of stages separated by ``|``, applied in the order written; a parameter is a
number, a range ``low:high`` (drawn uniformly), a word or a quoted string. Every stage takes
``p`` (probability it is applied, default 1). Stages:

* ``noise(snr=10:20, color=white|pink|brown|hum|babble|any, dir=PATH)`` — noise at an SNR (dB)
  against the signal's mean power between its first and last non-zero sample (padding does not
  count): Gaussian white, pink (1/f) or brown (1/f²); ``hum``: mains hum (50 or 60 Hz and its
  harmonics, a little buzz); ``babble``: several talkers' worth of speech-shaped noise, each with
  its own syllable-rate envelope; ``any``: one of those five per draw; or with ``dir`` one random
  segment of one random audio file under that folder (listed once, never loaded);
* ``pad(before=0:300, after=0:300)`` — silence (ms) added before and after, the length grows:
  recordings in the wild are not trimmed to the sound (put it before ``noise``, which then covers
  the padding too);
* ``gain(db=-6:6)``;
* ``shift(ms=0:100)`` — time shift, length kept: positive delays (silence first), negative advances;
* ``freqshift(hz=-50:50)`` — single-sideband frequency shift;
* ``speed(factor=0.9:1.1)`` — resampling: faster is shorter and higher;
* ``pitch(semitones=-2:2)`` — pitch shift, duration kept (phase vocoder);
* ``reverb(rt60=0.1:0.8)`` — convolution with a synthetic room response (seconds of RT60);
* ``bandlimit(low=0:300, high=3000:8000)`` — Butterworth band-pass (Hz; ``low`` 0: no high-pass,
  ``high`` at or above half the rate: no low-pass);
* ``warp(factor=0.9:1.1)`` — at extraction: the mel filter bank of the draw is warped by
  ``factor`` (vocal tract length perturbation, VTLP: the features as of a speaker whose formants
  lie ``factor`` times higher); mel-family features only (``mel``, ``logmel``, ``mfcc``, ``pcen``);
* ``copies(n=2)`` — first: each pass holds ``n`` augmented copies of every recording (draws
  ``draw * n`` to ``draw * n + n - 1``): more variety for the families whose passes must repeat the
  same frames (a GMM's EM passes), longer epochs for the neural ones;
* ``room`` — a preset, the chain :data:`PRESETS` names: ``pad | reverb | bandlimit | noise(color=any)``
  (what a room and a microphone do to a trimmed recording); more stages may follow it;
* ``specaugment(time=2, freq=2, width=8)`` — after extraction: per window, ``time`` masks of up
  to ``width`` frames and ``freq`` masks of up to ``width`` feature columns, set to the window's
  mean. Only ``mixup`` may follow it;
* ``mixup(alpha=0.2)`` — neural models only, last: each mini-batch (with probability ``p``) is
  mixed with a shuffled copy of itself, inputs and one-hot labels alike, by a weight drawn from
  Beta(alpha, alpha) (:func:`mix_batch`).

Every draw comes from a generator seeded by ``(seed, recording content id, draw index, stage)``
(:meth:`Augmenter.apply`): the same three give the same augmented audio.

The signal functions are shared with the offline tool ``wavetrain sound augment``
(:mod:`wavetrain.sound.augment`). scipy is imported when first needed.
"""
from __future__ import annotations

import hashlib
import re
import threading
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError, SpecError
from wavetrain.core.signal import resample
from wavetrain.data.audio import read_frames, read_info

__all__ = ["NOISE_COLORS", "PRESETS", "AugmentError", "Augmenter", "Stage", "active_power", "add_noise",
           "babble_noise", "band_limit", "brown_noise", "freq_shift", "hum_noise", "mix_at_snr", "mix_batch",
           "noise_of", "pad", "parse_augment", "pick_noise_color", "pink_noise", "pitch_shift", "reverb",
           "speed_change", "time_shift", "time_stretch"]

Range = tuple[float, float]

# ---- signal functions ------------------------------------------------------------------------


def power(x: np.ndarray) -> float:
    """Mean power of ``x`` (0 for an empty signal)."""
    return float(np.mean(np.square(x, dtype=np.float64))) if x.size else 0.0


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise with power falling as 1/f (-3 dB per octave), unit variance."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(spec.size, dtype=np.float64)
    f[0] = 1.0
    y = np.fft.irfft(spec / np.sqrt(f), n)
    return y / (np.std(y) or 1.0)


def brown_noise(n: int, rng: np.random.Generator, rate: int = 16000, floor_hz: float = 20.0) -> np.ndarray:
    """Gaussian noise with power falling as 1/f² (-6 dB per octave) above ``floor_hz`` and flat
    below it (so that it is not mostly sub-audible drift), unit variance."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.fft.rfftfreq(n, 1.0 / rate), floor_hz)
    y = np.fft.irfft(spec / f, n)
    return y / (np.std(y) or 1.0)


def hum_noise(n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """Mains hum, unit variance: 50 or 60 Hz (±0.5%) and its harmonics below 4 kHz with random
    amplitudes falling about as 1/k and random phases, plus a little white buzz."""
    f0 = float(rng.choice((50.0, 60.0))) * rng.uniform(0.995, 1.005)
    t = np.arange(n) / rate
    y = 0.05 * rng.standard_normal(n)
    for k in range(1, int(min(4000.0, rate / 2) // f0) + 1):
        y += rng.uniform(0.3, 1.0) / k * np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 2 * np.pi))
    return y / (np.std(y) or 1.0)


def babble_noise(n: int, rate: int, rng: np.random.Generator, talkers: tuple[int, int] = (3, 8)) -> np.ndarray:
    """Babble, unit variance: a sum of talkers, each speech-shaped noise (pink, band 100–4000 Hz)
    under its own syllable-rate envelope (a 2–6 Hz smoothed random process, half-wave rectified)."""
    if n == 0:
        return np.zeros(0)
    f = np.fft.rfftfreq(n, 1.0 / rate)
    shape = np.where((f >= 100.0) & (f <= 4000.0), 1.0 / np.sqrt(np.maximum(f, 100.0) / 100.0), 0.0)
    y = np.zeros(n)
    for _ in range(int(rng.integers(talkers[0], talkers[1] + 1))):
        voice = np.fft.irfft(np.fft.rfft(rng.standard_normal(n)) * shape, n)
        env_spec = np.fft.rfft(rng.standard_normal(n))
        env_spec[f > rng.uniform(2.0, 6.0)] = 0.0
        env = np.fft.irfft(env_spec, n)
        env = np.maximum(env - 0.2 * np.std(env), 0.0)
        y += voice * env * rng.uniform(0.5, 1.0)
    return y / (np.std(y) or 1.0)


NOISE_COLORS = ("white", "pink", "brown", "hum", "babble")


def pick_noise_color(color: str, rng: np.random.Generator) -> str:
    """``color``, or for ``any`` one of :data:`NOISE_COLORS` drawn from ``rng``."""
    return NOISE_COLORS[int(rng.integers(len(NOISE_COLORS)))] if color == "any" else color


def noise_of(color: str, n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of unit-variance noise of ``color`` (:data:`NOISE_COLORS`, or ``any``:
    :func:`pick_noise_color`)."""
    color = pick_noise_color(color, rng)
    if color == "pink":
        return pink_noise(n, rng)
    if color == "brown":
        return brown_noise(n, rng, rate)
    if color == "hum":
        return hum_noise(n, rate, rng)
    if color == "babble":
        return babble_noise(n, rate, rng)
    if color != "white":
        raise ValueError(f"unknown noise color {color!r}; expected one of {', '.join(NOISE_COLORS)}, any")
    return rng.standard_normal(n)


def active_power(x: np.ndarray) -> float:
    """Mean power of ``x`` between its first and last non-zero sample (0 for silence)."""
    nz = np.flatnonzero(x)
    return power(x[nz[0]:nz[-1] + 1]) if nz.size else 0.0


def add_noise(x: np.ndarray, snr_db: float, rng: np.random.Generator, color: str = "white",
              rate: int = 16000) -> np.ndarray:
    """``x`` plus noise of ``color`` (:func:`noise_of`) whose power is exactly
    ``active_power(x) / 10 ** (snr_db / 10)``."""
    p = active_power(x)
    if p == 0.0:
        return x.copy()
    noise = noise_of(color, x.size, rate, rng)
    noise *= np.sqrt(p / 10 ** (snr_db / 10) / (power(noise) or 1.0))
    return x + noise


def pad(x: np.ndarray, before_ms: float, after_ms: float, rate: int) -> np.ndarray:
    """``x`` with ``before_ms`` of silence before it and ``after_ms`` after it."""
    b, a = (max(0, int(round(ms * rate / 1000.0))) for ms in (before_ms, after_ms))
    return np.concatenate([np.zeros(b, x.dtype), x, np.zeros(a, x.dtype)])


def mix_at_snr(x: np.ndarray, other: np.ndarray, snr_db: float) -> np.ndarray:
    """``x`` plus ``other`` (same length) scaled to ``snr_db`` below ``x``."""
    p, q = power(x), power(other)
    if p == 0.0 or q == 0.0:
        return x.copy()
    return x + other * np.sqrt(p / 10 ** (snr_db / 10) / q)


def freq_shift(x: np.ndarray, hz: float, rate: int) -> np.ndarray:
    """Shift every frequency component by ``hz`` (single-sideband modulation of the analytic signal)."""
    if hz == 0 or x.size == 0:
        return x.copy()
    from scipy import signal

    t = np.arange(x.size) / rate
    return np.real(signal.hilbert(x) * np.exp(2j * np.pi * hz * t))


def speed_ratio(factor: float) -> tuple[int, int]:
    """``factor`` as a small fraction ``(num, den)`` (the resampling ratio actually applied)."""
    f = Fraction(factor).limit_denominator(200)
    return f.numerator, f.denominator


def speed_change(x: np.ndarray, factor: float) -> np.ndarray:
    """Play ``factor`` times faster (length / factor, frequencies * factor) by resampling."""
    if factor == 1.0 or x.size == 0:
        return x.copy()
    from scipy import signal

    num, den = speed_ratio(factor)
    return signal.resample_poly(x, den, num)


def time_stretch(x: np.ndarray, rate_factor: float, n_fft: int = 1024) -> np.ndarray:
    """Phase-vocoder time stretch: ``rate_factor`` > 1 is shorter (length / rate_factor), pitch kept."""
    if rate_factor == 1.0 or x.size == 0:
        return x.copy()
    from scipy import signal

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


def fit_length(y: np.ndarray, n: int) -> np.ndarray:
    """``y`` cut or zero-padded to ``n`` samples."""
    return y[:n] if y.size >= n else np.pad(y, (0, n - y.size))


def pitch_shift(x: np.ndarray, semitones: float, rate: int) -> np.ndarray:
    """Shift the pitch by ``semitones`` keeping the duration: resample, then stretch back."""
    if semitones == 0 or x.size == 0:
        return x.copy()
    factor = 2.0 ** (semitones / 12.0)
    n_fft = max(256, 1 << int(round(np.log2(1024 * rate / 16000))))
    y = fit_length(time_stretch(speed_change(x, factor), 1.0 / factor, n_fft=n_fft), x.size)
    p = power(y)
    return y * np.sqrt(power(x) / p) if p > 0 else y      # the vocoder's level loss undone


def reverb(x: np.ndarray, rt60_s: float, rate: int, rng: np.random.Generator) -> np.ndarray:
    """Convolve with a synthetic room response of reverberation time ``rt60_s`` (60 dB decay)."""
    if rt60_s <= 0 or x.size == 0:
        return x.copy()
    from scipy import signal

    n = max(2, int(rt60_s * rate))
    t = np.arange(n) / rate
    tail = rng.standard_normal(n) * np.exp(-6.907755 * t / rt60_s)   # ln(1000): -60 dB at rt60
    tail[0] = 0.0
    tail /= np.sqrt(np.sum(tail ** 2)) or 1.0                       # tail energy = direct energy
    tail[0] = 1.0
    y = signal.fftconvolve(x, tail)[:x.size]
    p = power(y)
    return y * np.sqrt(power(x) / p) if p > 0 else y


def time_shift(x: np.ndarray, ms: float, rate: int) -> np.ndarray:
    """Delay (``ms`` > 0: silence first) or advance (``ms`` < 0) keeping the length."""
    n = int(round(ms * rate / 1000.0))
    if n == 0 or x.size == 0:
        return x.copy()
    out = np.zeros_like(x)
    if abs(n) < x.size:
        if n > 0:
            out[n:] = x[:x.size - n]
        else:
            out[:x.size + n] = x[-n:]
    return out


def band_limit(x: np.ndarray, low_hz: float, high_hz: float, rate: int, order: int = 4) -> np.ndarray:
    """Butterworth band-pass ``[low_hz, high_hz]`` (no high-pass when ``low_hz`` <= 0, no
    low-pass when ``high_hz`` is at or above 0.99 of half the rate)."""
    nyq = rate / 2.0
    lo = low_hz if low_hz > 0 else None
    hi = high_hz if high_hz < 0.99 * nyq else None
    if x.size == 0 or (lo is None and hi is None) or (lo is not None and hi is not None and lo >= hi):
        return x.copy()
    from scipy import signal

    if lo is not None and hi is not None:
        sos = signal.butter(order, [lo, hi], btype="bandpass", fs=rate, output="sos")
    elif lo is not None:
        sos = signal.butter(order, min(lo, 0.99 * nyq), btype="highpass", fs=rate, output="sos")
    else:
        sos = signal.butter(order, hi, btype="lowpass", fs=rate, output="sos")
    return signal.sosfilt(sos, x)


# ---- noise files --------------------------------------------------------------------------------
class AugmentError(ParameterError):
    """A fault of the augmentation's own inputs (an empty noise folder, an unreadable noise file):
    a setting of the run, never blamed on the recording being augmented."""

    def __init__(self, message: str):
        super().__init__(message, param="augment")


AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".aiff", ".aif", ".mp3")


class NoiseFiles:
    """The audio files under a folder (listed once, on first use); :meth:`segment` reads one
    random stretch of one of them, never the folder."""

    def __init__(self, folder: str):
        self.folder = Path(folder).expanduser()
        self._files: list[Path] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Pickled (to a Spark task) and copied as its folder and listing, without its lock."""
        return {"folder": self.folder, "_files": self._files}

    def __setstate__(self, state: dict) -> None:
        self.folder, self._files = state["folder"], state["_files"]
        self._lock = threading.Lock()

    def files(self) -> list[Path]:
        with self._lock:
            if self._files is None:
                files = sorted(p for p in self.folder.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
                if not files:
                    raise AugmentError(f"augment: noise(dir={self.folder}): no audio files "
                                       f"({', '.join(AUDIO_SUFFIXES)}) in that folder")
                self._files = files
            return self._files

    def segment(self, n: int, rate: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` samples at ``rate`` Hz from a random offset of a random file (looped when short)."""
        files = self.files()
        path = files[int(rng.integers(len(files)))]
        try:
            info = read_info(path)
            need = int(np.ceil(n * info.rate / rate)) + 1
            if info.frames >= need:
                off = int(rng.integers(0, info.frames - need + 1))
                x = read_frames(path, off, off + need, info=info)
            else:
                x = read_frames(path, 0, info.frames, info=info)
                if x.size == 0:
                    return np.zeros(n)
                x = np.tile(x, int(np.ceil(need / x.size)))
                x = np.roll(x, -int(rng.integers(0, info.frames)))[:need]
        except AudioError as e:
            raise AugmentError(f"augment: noise file {e}") from None
        if info.rate != rate:
            x = resample(x, info.rate, rate)
        return fit_length(np.asarray(x, dtype=np.float64), n)


# ---- the spec -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _P:
    """One stage parameter: kind ``range`` (a number or low:high), ``int``, ``choice`` or ``path``."""

    kind: str
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()


_PROB = _P("range", (1.0, 1.0), 0.0, 1.0)
#: Stage name -> its parameters (``p`` is added to each).
STAGES: dict[str, dict[str, _P]] = {
    "noise": {"snr": _P("range", (10.0, 20.0), -30.0, 100.0),
              "color": _P("choice", "white", choices=(*NOISE_COLORS, "any")), "dir": _P("path", None)},
    "pad": {"before": _P("range", (0.0, 300.0), 0.0, 60000.0), "after": _P("range", (0.0, 300.0), 0.0, 60000.0)},
    "gain": {"db": _P("range", (-6.0, 6.0), -60.0, 60.0)},
    "shift": {"ms": _P("range", (0.0, 100.0), -60000.0, 60000.0)},
    "freqshift": {"hz": _P("range", (-50.0, 50.0), -20000.0, 20000.0)},
    "speed": {"factor": _P("range", (0.9, 1.1), 0.25, 4.0)},
    "pitch": {"semitones": _P("range", (-2.0, 2.0), -24.0, 24.0)},
    "reverb": {"rt60": _P("range", (0.1, 0.8), 0.0, 10.0)},
    "bandlimit": {"low": _P("range", (0.0, 300.0), 0.0, 1e6), "high": _P("range", (3000.0, 8000.0), 1.0, 1e6)},
    "warp": {"factor": _P("range", (0.9, 1.1), 0.5, 2.0)},
    "specaugment": {"time": _P("int", 2, 0, 100), "freq": _P("int", 2, 0, 100), "width": _P("int", 8, 1, 10000)},
    "mixup": {"alpha": _P("range", (0.2, 0.2), 0.001, 100.0)},
    "copies": {"n": _P("int", 2, 1, 1000)},
}
#: Stages that change the feature grams, not the audio.
GRAM_STAGES = frozenset({"specaugment"})
#: Stages that change how the audio is turned into features (each draw is extracted again, as
#: after an audio stage).
EXTRACT_STAGES = frozenset({"warp"})
#: Stages that change a neural model's mini-batches (after the grams).
BATCH_STAGES = frozenset({"mixup"})
#: Stages that change neither audio nor grams.
NON_AUDIO_STAGES = GRAM_STAGES | BATCH_STAGES | {"copies"}
#: Named chains: a preset's name in a spec stands for its stages (``"room | pitch(semitones=-1:1)"``).
#: ``room``: what a room and a microphone do to a trimmed recording: silence around it, reverb,
#: band limits, then noise of any colour over all of it.
PRESETS = {
    "room": "pad(before=0:450, after=0:450) | reverb(rt60=0.1:0.8, p=0.5) | "
            "bandlimit(low=0:300, high=3000:8000, p=0.5) | noise(snr=0:20, color=any)",
}
#: A bare name up to the next ``|`` or the end: a preset's place in a spec.
_PRESET_NAME = re.compile(r"\s*([A-Za-z_]\w*)\s*(?=\||$)")


@dataclass(frozen=True)
class Stage:
    """One parsed stage: its name and every parameter's value (ranges as ``(low, high)``)."""

    name: str
    params: tuple[tuple[str, Any], ...]

    def __getitem__(self, key: str) -> Any:
        return dict(self.params)[key]

    @property
    def key(self) -> str:
        def fmt(v: Any) -> str:
            if isinstance(v, tuple):
                return f"{v[0]:g}" if v[0] == v[1] else f"{v[0]:g}:{v[1]:g}"
            if isinstance(v, float):
                return f"{v:g}"
            return repr(v) if isinstance(v, str) and not re.fullmatch(r"[\w.\-]+", v) else str(v)

        return f"{self.name}({', '.join(f'{k}={fmt(v)}' for k, v in self.params if v is not None)})"


def _fail(text: str, col: int, msg: str) -> SpecError:
    return SpecError(f"invalid augment spec at column {col}: {msg} (in {text!r})")


_NUM = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_RANGE = re.compile(rf"\s*({_NUM})\s*(?::\s*({_NUM})\s*)?")


def _coerce(text: str, col: int, stage: str, name: str, spec: _P, raw: str, quoted: bool) -> Any:
    where = f"{stage}({name}=...)"
    if spec.kind == "path":
        if not raw:
            raise _fail(text, col, f"{where}: expected a folder")
        if not Path(raw).expanduser().is_dir():
            raise _fail(text, col, f"{where}: {raw!r} is not a folder")
        return str(Path(raw).expanduser().resolve())
    if spec.kind == "choice":
        v = raw.lower()
        if v not in spec.choices:
            raise _fail(text, col, f"{where}: expected one of {', '.join(spec.choices)}, got {raw!r}")
        return v
    m = None if quoted else _RANGE.fullmatch(raw)
    if m is None or (spec.kind == "int" and m.group(2) is not None):
        want = "an integer" if spec.kind == "int" else "a number or a range low:high"
        raise _fail(text, col, f"{where}: expected {want}, got {raw!r}")
    lo = float(m.group(1))
    hi = float(m.group(2)) if m.group(2) is not None else lo
    if spec.kind == "int" and lo != int(lo):
        raise _fail(text, col, f"{where}: expected an integer, got {raw!r}")
    if hi < lo:
        raise _fail(text, col, f"{where}: range {raw!r} has low > high")
    assert spec.low is not None and spec.high is not None
    if lo < spec.low or hi > spec.high:
        raise _fail(text, col, f"{where}: {raw!r} is outside [{spec.low:g}, {spec.high:g}]")
    return int(lo) if spec.kind == "int" else (lo, hi)


def _stage(text: str, pos: int) -> tuple[Stage, int]:
    """Parse one stage starting at ``pos``; returns it and the position after it."""
    n = len(text)
    while pos < n and text[pos].isspace():
        pos += 1
    m = re.compile(r"[A-Za-z_]\w*").match(text, pos)
    if m is None:
        found = "end of spec" if pos >= n else repr(text[pos])
        raise _fail(text, pos + 1, f"expected a stage name ({', '.join(STAGES)}), found {found}")
    name = m.group().lower()
    if name in PRESETS:
        raise _fail(text, pos + 1, f"{name} is a preset and takes no parameters; to change them write its "
                    f"stages out: {PRESETS[name]}")
    if name not in STAGES:
        raise _fail(text, pos + 1, f"unknown stage {m.group()!r} (expected one of: {', '.join(STAGES)}, or a "
                    f"preset: {', '.join(PRESETS)})")
    table = dict(STAGES[name], p=_PROB)
    given: dict[str, Any] = {}
    pos = m.end()
    while pos < n and text[pos].isspace():
        pos += 1
    if pos < n and text[pos] == "(":
        pos += 1
        while True:
            while pos < n and text[pos].isspace():
                pos += 1
            if pos < n and text[pos] == ")":
                pos += 1
                break
            pm = re.compile(r"[A-Za-z_]\w*").match(text, pos)
            if pm is None:
                found = "end of spec" if pos >= n else repr(text[pos])
                raise _fail(text, pos + 1, f"expected a parameter name or ')' in {name}(...), found {found}")
            pname = pm.group().lower()
            if pname not in table:
                raise _fail(text, pos + 1, f"unknown parameter {pm.group()!r} for {name} "
                            f"(expected one of: {', '.join(table)})")
            if pname in given:
                raise _fail(text, pos + 1, f"parameter {pname!r} given twice for {name}")
            pos = pm.end()
            while pos < n and text[pos].isspace():
                pos += 1
            if pos >= n or text[pos] != "=":
                raise _fail(text, pos + 1, f"expected '=' after {pname}")
            pos += 1
            while pos < n and text[pos].isspace():
                pos += 1
            vcol = pos + 1
            if pos < n and text[pos] in "'\"":
                end = text.find(text[pos], pos + 1)
                if end < 0:
                    raise _fail(text, vcol, "unterminated string")
                raw, quoted, pos = text[pos + 1:end], True, end + 1
            else:
                end = pos
                while end < n and text[end] not in ",)":
                    end += 1
                raw, quoted, pos = text[pos:end].strip(), False, end
            if not raw and not quoted:
                raise _fail(text, vcol, f"expected a value for {pname}")
            given[pname] = _coerce(text, vcol, name, pname, table[pname], raw, quoted)
            while pos < n and text[pos].isspace():
                pos += 1
            if pos < n and text[pos] == ",":
                pos += 1
            elif pos >= n or text[pos] != ")":
                found = "end of spec" if pos >= n else repr(text[pos])
                raise _fail(text, pos + 1, f"expected ',' or ')' in {name}(...), found {found}")
    params = tuple((k, given.get(k, p.default)) for k, p in table.items())
    stage = Stage(name, params)
    if name == "bandlimit" and stage["low"][1] >= stage["high"][0]:
        raise _fail(text, m.start() + 1, "bandlimit: every low must be below every high (low's range ends at "
                    f"{stage['low'][1]:g} Hz, high's starts at {stage['high'][0]:g} Hz)")
    return stage, pos


def parse_augment(spec: str | Augmenter | None) -> Augmenter:
    """Parse an augmentation spec (empty or None: no augmentation).

    Raises
    ------
    SpecError
        One line with the 1-based column, e.g. ``invalid augment spec at column 7: unknown
        parameter 'snrr' for noise (expected one of: snr, color, dir, p)``.
    """
    if isinstance(spec, Augmenter):
        return spec
    text = spec or ""
    if not isinstance(text, str):
        raise SpecError(f"an augment spec must be a string, got {type(spec).__name__}")
    stages: list[Stage] = []
    pos, n = 0, len(text)
    if text.strip():
        while True:
            start = pos
            preset = _PRESET_NAME.match(text, pos)
            if preset is not None and preset.group(1).lower() in PRESETS:
                new, pos = parse_augment(PRESETS[preset.group(1).lower()]).stages, preset.end()
            else:
                stage, pos = _stage(text, pos)
                new = (stage,)
            col = start + 1 + (len(text[start:]) - len(text[start:].lstrip()))
            if stages and new[0].name == "copies":
                raise _fail(text, col, "copies says how many augmented copies of each recording a pass holds "
                            "and must come first")
            if new[0].name == "copies" and new[0]["p"] != (1.0, 1.0):
                raise _fail(text, col, "copies takes no p")
            if stages and stages[-1].name in BATCH_STAGES:
                raise _fail(text, col, "mixup mixes the mini-batches and must come last")
            if stages and stages[-1].name in GRAM_STAGES and new[0].name not in GRAM_STAGES | BATCH_STAGES:
                raise _fail(text, col, f"{new[0].name} changes the audio and must come before specaugment (which "
                            "masks the features)")
            stages.extend(new)
            while pos < n and text[pos].isspace():
                pos += 1
            if pos >= n:
                break
            if text[pos] != "|":
                raise _fail(text, pos + 1, f"expected '|' or end of spec, found {text[pos]!r}")
            pos += 1
    return Augmenter(tuple(stages))


def _id_words(content_id: str) -> list[int]:
    try:
        h = bytes.fromhex(content_id) if len(content_id) % 2 == 0 else b""
    except ValueError:
        h = b""
    if not h:
        h = hashlib.sha1(content_id.encode()).digest()
    return [int.from_bytes(h[i:i + 4], "little") for i in range(0, len(h), 4)]


_SALT_AUDIO, _SALT_MASK = 0xA0D10, 0x5BEC


class Augmenter:
    """A parsed augmentation spec: :meth:`apply` to audio, :meth:`mask` to a window's gram.

    Attributes
    ----------
    stages : tuple of Stage
    key : str
        The canonical spec (every parameter written out).
    waveform : bool
        Whether some stage changes the audio (then augmented grams are extracted on every pass).
    masks : bool
        Whether ``specaugment`` masks windows.
    """

    def __init__(self, stages: tuple[Stage, ...] = ()):
        self.stages = tuple(stages)
        self.key = " | ".join(s.key for s in self.stages)
        self.wave_stages = tuple(s for s in self.stages if s.name not in NON_AUDIO_STAGES)
        self.gram_stages = tuple(s for s in self.stages if s.name in GRAM_STAGES)
        self.waveform = bool(self.wave_stages)
        self.masks = bool(self.gram_stages)
        #: Augmented copies of each recording in one pass (draws ``draw * copies + k``).
        self.copies = next((s["n"] for s in self.stages if s.name == "copies"), 1)
        # the stages that draw, numbered for their generators (copies draws nothing: with or without
        # it, the same stages draw alike)
        self._drawn = tuple(s for s in self.stages if s.name != "copies")
        mix = [s for s in self.stages if s.name == "mixup"]
        #: ``(alpha, p)`` of the mixup stage (None: none).
        self.mixup: tuple[float, float] | None = None
        if mix:
            alpha, prob = mix[0]["alpha"], mix[0]["p"]
            if alpha[0] != alpha[1] or prob[0] != prob[1]:
                raise SpecError("invalid augment spec: mixup takes one alpha and one p, not ranges")
            self.mixup = (alpha[0], prob[0])
        self._noise: dict[str, NoiseFiles] = {}
        for s in self.stages:
            if s.name == "noise" and s["dir"] is not None:
                self._noise[s["dir"]] = NoiseFiles(s["dir"])

    def __bool__(self) -> bool:
        return bool(self.stages)

    def __repr__(self) -> str:
        return f"Augmenter({self.key!r})"

    @staticmethod
    def rng(seed: int, content_id: str, draw: int, *extra: int) -> np.random.Generator:
        """The generator of one ``(seed, recording content id, draw index, ...)``."""
        words = [int(seed) & 0xFFFFFFFF, *_id_words(content_id), int(draw) & 0xFFFFFFFFFFFF]
        return np.random.default_rng(words + [int(e) for e in extra])

    @staticmethod
    def _value(r: Range, rng: np.random.Generator) -> float:
        return float(r[0]) if r[0] == r[1] else float(rng.uniform(r[0], r[1]))

    def apply(self, x: np.ndarray, rate: int, *, seed: int, content_id: str, draw: int) -> np.ndarray:
        """The augmented copy (float32) of samples ``x`` ``(n,)`` or ``(n, channels)`` at ``rate`` Hz;
        each stage draws from its own generator of ``(seed, content_id, draw, stage index)``, so
        a stage's draws do not depend on whether the ones before it were applied."""
        cols = [x.astype(np.float64)] if x.ndim == 1 else [x[:, c].astype(np.float64) for c in range(x.shape[1])]
        for k, st in enumerate(self._drawn):
            if st.name in NON_AUDIO_STAGES | EXTRACT_STAGES:
                continue
            rng = self.rng(seed, content_id, draw, _SALT_AUDIO, k)
            if rng.random() >= self._value(st["p"], rng):
                continue
            cols = self._stage(st, cols, rate, rng)
        y = cols[0] if x.ndim == 1 else np.stack(cols, axis=1)
        return np.ascontiguousarray(y, dtype=np.float32)

    def _stage(self, st: Stage, cols: list[np.ndarray], rate: int, rng: np.random.Generator) -> list[np.ndarray]:
        v = self._value
        name = st.name
        if name == "noise":
            snr = v(st["snr"], rng)
            if st["dir"] is not None:
                noise = self._noise[st["dir"]]
                return [mix_at_snr(y, noise.segment(y.size, rate, rng), snr) for y in cols]
            return [add_noise(y, snr, rng, st["color"], rate) for y in cols]
        if name == "pad":
            before, after = v(st["before"], rng), v(st["after"], rng)
            return [pad(y, before, after, rate) for y in cols]
        if name == "gain":
            g = 10 ** (v(st["db"], rng) / 20)
            return [y * g for y in cols]
        if name == "shift":
            ms = v(st["ms"], rng)
            return [time_shift(y, ms, rate) for y in cols]
        if name == "freqshift":
            hz = v(st["hz"], rng)
            return [freq_shift(y, hz, rate) for y in cols]
        if name == "speed":
            num, den = speed_ratio(v(st["factor"], rng))
            return [speed_change(y, num / den) for y in cols]
        if name == "pitch":
            s = v(st["semitones"], rng)
            return [pitch_shift(y, s, rate) for y in cols]
        if name == "reverb":
            rt = v(st["rt60"], rng)
            return [reverb(y, rt, rate, rng) for y in cols]
        if name == "bandlimit":
            lo, hi = v(st["low"], rng), v(st["high"], rng)
            return [band_limit(y, lo, hi, rate) for y in cols]
        raise AssertionError(name)  # pragma: no cover - every wave stage is handled above

    @property
    def warps(self) -> bool:
        """Whether a ``warp`` stage warps the mel filter bank of each draw."""
        return any(s.name == "warp" for s in self.stages)

    def warp_factor(self, *, seed: int, content_id: str, draw: int) -> float | None:
        """The mel filter bank warp of one draw (the ``warp`` stage's, from its own generator as
        an audio stage's), or None: no warp stage, or not applied to this draw."""
        for k, st in enumerate(self._drawn):
            if st.name == "warp":
                rng = self.rng(seed, content_id, draw, _SALT_AUDIO, k)
                if rng.random() >= self._value(st["p"], rng):
                    return None
                return self._value(st["factor"], rng)
        return None

    def mask(self, window: np.ndarray, *, seed: int, content_id: str, draw: int, index: int) -> np.ndarray:
        """A masked copy of one window's gram ``(frames, features)`` (``specaugment`` stages; the
        window itself when none applies); ``index`` is the window's place in its recording."""
        out = window
        for k, st in enumerate(self._drawn):
            if st.name not in GRAM_STAGES:
                continue
            rng = self.rng(seed, content_id, draw, _SALT_MASK, k, index)
            if rng.random() >= self._value(st["p"], rng):
                continue
            if out is window:
                out = np.array(window, dtype=np.float32)
            if out.size == 0:
                continue
            fill = float(out.mean())
            frames, dim = out.shape
            width = st["width"]
            for _ in range(st["time"]):
                w = int(rng.integers(0, min(width, frames) + 1))
                t0 = int(rng.integers(0, frames - w + 1))
                out[t0:t0 + w, :] = fill
            for _ in range(st["freq"]):
                w = int(rng.integers(0, min(width, dim) + 1))
                f0 = int(rng.integers(0, dim - w + 1))
                out[:, f0:f0 + w] = fill
        return out

    def pass_seconds(self, seconds: float, recordings: int) -> float:
        """An upper bound of the audio seconds one augmented pass holds, for recordings of
        ``seconds`` in all: every copy at its slowest speed and longest padding."""
        stretch, padded = 1.0, 0.0
        for s in self.wave_stages:
            if s.name == "pad":
                padded += (s["before"][1] + s["after"][1]) / 1000.0
            if s.name == "speed":
                stretch = max(stretch, 1.0 / s["factor"][0])
        return self.copies * (seconds * stretch + recordings * padded)

    def work_bytes(self, samples: int, rate: int = 16000) -> int:
        """Working memory (bytes) of :meth:`apply` on ``samples`` samples (one channel) at ``rate``:
        float64 copies of the signal (with its longest padding), the noise or room response, scipy's
        temporaries."""
        if not self.waveform:
            return 0
        factor = 4
        for s in self.wave_stages:
            if s.name == "pad":
                samples += int((s["before"][1] + s["after"][1]) * rate / 1000.0) + 2
            if s.name in ("pitch", "freqshift", "reverb") or (s.name == "noise" and s["color"] in ("babble", "any")):
                factor = max(factor, 8)          # complex spectra, the STFT of the vocoder, FFT convolution
            if s.name == "speed":
                factor = max(factor, int(4 + 4 / s["factor"][0]))
        return factor * 8 * samples


def mix_batch(x: np.ndarray, y: np.ndarray, n_classes: int, alpha: float, p: float,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Mixup of one mini-batch: ``x`` ``(batch, ...)`` float32 and integer labels ``y`` ->
    ``(lam * x + (1 - lam) * x[perm], lam * onehot(y) + (1 - lam) * onehot(y[perm]))`` with
    ``lam`` ~ Beta(alpha, alpha) and ``perm`` a permutation of the batch; with probability
    ``1 - p`` the batch as it is, its labels one-hot. The targets are float32 ``(batch, n_classes)``
    rows summing to 1."""
    onehot = np.eye(n_classes, dtype=np.float32)[y]
    if rng.random() >= p or len(y) < 2:
        return x, onehot
    lam = np.float32(rng.beta(alpha, alpha))
    perm = rng.permutation(len(y))
    return lam * x + (1 - lam) * x[perm], lam * onehot + (1 - lam) * onehot[perm]
