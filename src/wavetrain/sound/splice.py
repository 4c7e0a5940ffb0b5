"""Concatenate recordings into one wav file with gaps between them, optionally in background noise.

Every recording is mixed down to mono and resampled to one rate (``rate``, default the highest
rate of the recordings). Each starts on a whole millisecond, so that its segment row
``out.wav[start-end]`` selects exactly its samples (the segment ends on the next whole
millisecond: up to 1 ms of the following gap). Written: the wav file, a metadata csv of the
same name (``out.wav`` -> ``out.csv``) with one segment row per recording (its labels and tags,
plus ``source`` = the original file), a row per gap (and per pad) when ``gap_labels`` are given,
and an Audacity label track (``.txt``) of the same rows.

Randomness, all reproducible from ``seed`` with one independent stream per concern, so that
asking for one does not change what the others draw:

* the order (``shuffle``): a permutation drawn from ``numpy.random.default_rng(seed)``;
* the gaps (``gap_ms`` a range ``(lo, hi)``): each a whole number of ms drawn uniformly from
  ``[lo, hi]``;
* the pads (``pad_ms``): silence before the first and after the last recording, drawn the same way;
* the background (``noise_snr``): one SNR per file drawn uniformly from the range (rounded to
  0.01 dB), and noise of the ``noise_colors`` (:func:`wavetrain.features.augment.noise_of`, each
  colour scaled to unit power, summed) over the whole file, gaps and pads included, scaled so that
  the mean power of the recordings' own samples over the noise's power on those same samples is
  exactly that SNR. Every row gets the tags ``splice_noise`` (the colours joined by ``+``) and
  ``splice_snr_db``.

The file is written as 16-bit wav unless a sample exceeds full scale (then 32-bit float: nothing
is clipped).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.outputs import refuse_inputs
from wavetrain.core.progress import progress_bar
from wavetrain.core.signal import MAX_RATE, MIN_RATE
from wavetrain.data.audacity import write_labels
from wavetrain.data.audio import write_audio
from wavetrain.data.dataset import Dataset, input_paths
from wavetrain.data.metadata import write_metadata
from wavetrain.data.recording import Recording, format_labels
from wavetrain.features.augment import NOISE_COLORS, noise_of, power
from wavetrain.sound.common import parse_range, relative, tag_value

__all__ = ["MAX_GAP_MS", "MAX_RATE", "MIN_RATE", "NOISE_SNR_DB", "SpliceResult", "check_rate", "parse_colors",
           "parse_ms", "splice"]

#: The longest gap or pad, in ms (a day).
MAX_GAP_MS = 86_400_000
#: The SNRs ``--noise`` takes, in dB (those of ``sound augment --noise``).
NOISE_SNR_DB = (-30.0, 120.0)

MsRange = tuple[int, int]


def check_rate(rate: int) -> int:
    """Refuse a ``--rate`` outside :data:`MIN_RATE`..:data:`MAX_RATE` Hz in one line."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ParameterError(f"--rate {rate}: expected a sample rate from {MIN_RATE} to {MAX_RATE} Hz "
                             "(e.g. --rate 16000)")
    return rate


def parse_ms(text: str, option: str) -> MsRange:
    """``'200:1500'`` -> ``(200, 1500)``, ``'500'`` -> ``(500, 500)``: whole milliseconds from 0 to
    :data:`MAX_GAP_MS`, refused in one line naming ``option`` otherwise."""
    lo, hi = parse_range(text, option, low=0)
    if hi > MAX_GAP_MS:
        raise ParameterError(f"{option} {text}: expected at most {MAX_GAP_MS} ms (a day)")
    if lo != int(lo) or hi != int(hi):
        raise ParameterError(f"{option} {text}: expected whole milliseconds (e.g. {option} 200:1500)")
    return int(lo), int(hi)


def parse_colors(text: str) -> tuple[str, ...]:
    """``'pink,hum'`` -> ``('pink', 'hum')``: noise colours of
    :data:`wavetrain.features.augment.NOISE_COLORS`, refused in one line otherwise."""
    colors = tuple(c.strip() for c in str(text).split(","))
    for c in colors:
        if c not in NOISE_COLORS:
            raise ParameterError(f"--noise-color {text}: unknown colour {c!r}; expected one or more of "
                                 f"{', '.join(NOISE_COLORS)} joined by commas (e.g. --noise-color pink,hum)")
    return colors


def _ms_range(value: int | Sequence[int], option: str) -> MsRange:
    """``value`` (a number of ms or a ``(lo, hi)`` range) as a checked range."""
    lo, hi = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    return parse_ms(f"{lo}" if lo == hi else f"{lo}:{hi}", option)


def _draw_ms(rng: np.random.Generator, r: MsRange) -> int:
    return r[0] if r[0] == r[1] else int(rng.integers(r[0], r[1] + 1))


@dataclass
class SpliceResult:
    """What :func:`splice` wrote: the rows, the rate, the length, and the background's colours
    (``+``-joined; empty when none) and SNR."""

    rows: list[Recording]
    rate: int
    seconds: float
    noise: str = ""
    snr_db: float | None = None


def _draw_snr(rng: np.random.Generator, r: Sequence[float]) -> float:
    return round(float(r[0]) if r[0] == r[1] else float(rng.uniform(r[0], r[1])), 2)


def _background(audio: np.ndarray, spans: list[tuple[int, int]], snr_db: float, colors: Sequence[str],
                rate: int, rng: np.random.Generator) -> np.ndarray:
    """``audio`` plus noise of ``colors`` over all of it at ``snr_db``, measured over the samples
    ``spans`` (the recordings) of both."""
    count = sum(b - a for a, b in spans)

    def mean_power(x: np.ndarray) -> float:
        return sum(power(x[a:b]) * (b - a) for a, b in spans) / count if count else 0.0

    signal = mean_power(audio)
    if signal == 0.0:
        raise UserError("--noise: the recordings are silent; an SNR needs a signal (splice without --noise)")
    noise = np.zeros(audio.size)
    for color in colors:
        part = noise_of(color, audio.size, rate, rng)
        noise += part / np.sqrt(power(part) or 1.0)
    noise *= np.sqrt(signal / 10 ** (snr_db / 10) / (mean_power(noise) or 1.0))
    return (audio + noise).astype(np.float32)


def splice(ds: Dataset, wav: Path, csv: Path, txt: Path, *, gap_ms: int | Sequence[int] = 1000,
           pad_ms: int | Sequence[int] = 0, gap_labels: dict[str, str] | None = None, shuffle: bool = False,
           seed: int = 0, rate: int | None = None, noise_snr: Sequence[float] | None = None,
           noise_colors: Sequence[str] = ("white",), progress: bool = False) -> SpliceResult:
    """Write ``wav`` (the recordings of ``ds`` with gaps between them), ``csv`` (segment rows) and
    ``txt`` (an Audacity label track).

    Parameters
    ----------
    gap_ms, pad_ms : int or (int, int)
        The gap between two recordings and the silence before the first and after the last, in
        whole ms: a fixed value, or a range each one is drawn from.
    gap_labels : dict, optional
        The labels of a row given to each gap and pad (none when None).
    shuffle : bool
        Random order instead of the data set's.
    seed : int
        Seed (>= 0) of the order, the gaps, the pads and the background, one stream each.
    rate : int, optional
        Sample rate (default the highest of the recordings).
    noise_snr : (float, float), optional
        The SNR range (dB) of a background of ``noise_colors`` over the whole file (none when None).
    noise_colors : sequence of str
        Colours of :data:`wavetrain.features.augment.NOISE_COLORS`, summed at unit power each.
    """
    refuse_inputs([wav, csv, txt], input_paths((), ds), option="", files=True)     # never over what it reads
    gaps, pads = _ms_range(gap_ms, "--gap-ms"), _ms_range(pad_ms, "--pad-ms")
    if seed < 0:
        raise ParameterError(f"--seed {seed}: expected an integer >= 0")
    colors = parse_colors(",".join(noise_colors))
    snr = None if noise_snr is None else parse_range(":".join(str(v) for v in noise_snr), "--noise",
                                                     low=NOISE_SNR_DB[0], high=NOISE_SNR_DB[1])
    order = list(range(len(ds)))
    if shuffle:
        np.random.default_rng(seed).shuffle(order)
    gap_rng, pad_rng, noise_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    if rate is None:
        rate = max(r.info().rate for r in ds)
    else:
        check_rate(rate)
    lead, trail = _draw_ms(pad_rng, pads), _draw_ms(pad_rng, pads)
    snr_db = None if snr is None else _draw_snr(noise_rng, snr)
    noise = "" if snr is None else "+".join(colors)
    extra = {} if snr_db is None else {"splice_noise": noise, "splice_snr_db": f"{snr_db:.2f}"}
    pieces: list[np.ndarray] = []
    rows: list[Recording] = []
    spans: list[tuple[int, int]] = []             # the recordings' samples in the file
    pos_ms = 0
    total = 0                                     # samples written so far

    def silence(ms: int) -> None:
        nonlocal pos_ms
        if ms and gap_labels:
            rows.append(Recording(wav, gap_labels, {"gap": "true", **extra}, (pos_ms, pos_ms + ms)))
        pos_ms += ms

    silence(lead)
    for n, i in enumerate(progress_bar(order, desc="splicing", unit="file", enable=progress)):
        r = ds[i]
        if n:
            silence(_draw_ms(gap_rng, gaps))
        x, _ = r.load(rate, mono=True)
        start = int(round(pos_ms * rate / 1000))
        end_ms = pos_ms + int(np.ceil(len(x) * 1000 / rate))
        pieces.append(np.zeros(start - total, dtype=np.float32))
        pieces.append(x.astype(np.float32, copy=False))
        total = start + len(x)
        spans.append((start, total))
        tags = dict(r.tags)
        tags["source"] = tag_value(relative(r.path, csv.parent))
        if r.segment_ms is not None:
            tags["source_ms"] = f"{r.segment_ms[0]}-{r.segment_ms[1]}"
        tags.update(extra)
        rows.append(Recording(wav, r.labels, tags, (pos_ms, end_ms)))
        pos_ms = end_ms
    silence(trail)
    last = int(round(pos_ms * rate / 1000))
    pieces.append(np.zeros(max(0, last - total), dtype=np.float32))
    audio = np.concatenate(pieces)
    if snr_db is not None:
        audio = _background(audio, spans, snr_db, colors, rate, noise_rng)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    write_audio(wav, audio, rate, subtype="FLOAT" if peak > 1.0 else "PCM_16")
    write_metadata(csv, rows)
    write_labels(txt, [(r.segment_ms[0] / 1000.0, r.segment_ms[1] / 1000.0, format_labels(r.labels))
                       for r in rows if r.segment_ms is not None])
    return SpliceResult(rows, rate, len(audio) / rate, noise, snr_db)
