"""The memory planner: predict the peak resident memory of a run before it starts, pick settings
(batch size, workers, cache size) that fit a limit, or refuse at once with what would fit.

The prediction is a sum of components, each a formula of the configuration and the data's size
(read from file headers only) — less the smaller of ``audio + extraction`` and ``model`` when a
feature store holds every gram, since extraction then ends before fitting starts:

* ``runtime``: the interpreter and the libraries imported so far (measured), plus the libraries
  the run will still import (constants measured on the reference machine: scipy.signal for
  resampling, torch for neural models);
* ``audio``: per worker, the largest recording decoded as float32 (all channels, then mono and
  resampled copies) — or one block of it: recordings over a minute are decoded 30 s at a time
  when no resampling is needed;
* ``extraction``: per worker, the feature extractor's chunk buffers;
* ``batches``: grams in the prefetch queue and the batch being built;
* ``memory_cache``: the in-memory gram cache (bounded; never more than all features);
* ``model``: the model's own state and per-batch working arrays (``Classifier.memory_estimate``);
* ``frame_cache``: training frames a family keeps between passes when the plan grants what it
  asks (:meth:`~wavetrain.models.base.Classifier.frame_cache_request`, a GMM's EM): granted up to
  64 MB, or, when the passes augment (and so would decode and augment every recording again), up
  to a quarter of the machine's memory; under ``--memory-limit`` it goes right after the memory
  cache;
* ``per_hour``: what grows with the amount of data (recording descriptions: ~3 KB each);
* ``augment`` (training with a model ``augment`` that changes the audio): per worker, the
  augmentation's float64 working copies of the longest recording (decoded whole, never in
  blocks); such a run decodes and extracts every recording again on every pass, while the
  model fits (the plan says so in its notes), so the phases are not counted apart;
* ``slack``: allocator fragmentation and small objects (a fixed fraction of all but ``runtime``).

Features themselves are streamed from the disk store and never held in full, so nothing but the
recording list grows with hours of data.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from wavetrain.core.errors import MemoryLimitError, ParameterError
from wavetrain.features.augment import Augmenter
from wavetrain.features.fft import backend_module
from wavetrain.models.base import FRAME_CACHE_DEFAULT
from wavetrain.store import HEADER_BYTES
from wavetrain.stream import scheduler
from wavetrain.stream.scheduler import default_prefetch, default_workers
from wavetrain.stream.source import LONG_RECORDING_S

MB = 1 << 20
#: Extra resident memory of imports a run performs later (measured with psutil on the reference
#: 2-vCPU Linux machine, Python 3.11, numpy 2.4, scipy 1.17, torch 2.13 CPU; the FFT backends
#: measured after wavetrain's data, features, store and models modules, as at planning time:
#: import plus a first 72 x 1800 transform; torch: import 186 MB plus 16 MB at its first
#: convolution forward/backward).
IMPORT_COST = {"scipy.signal": 54 * MB, "torch": 200 * MB, "scipy.fft": 21 * MB, "soundfile": 3 * MB,
               "sqlite3": 2 * MB, "mkl_fft": 13 * MB}
#: Bytes per recording description kept in memory (Recording, header info, content hash and the
#: file facts memo): 2.8 KB measured with tracemalloc on spoken words (two labels per file).
PER_RECORDING = 3072
#: Extraction working memory per worker (the extractor's chunk buffers and their temporaries).
EXTRACT_BYTES = 6 * MB
#: A whole-clip spec's working memory in float32 values per sample of the recording (the frame
#: buffer padded to the FFT length, the complex spectrum, its power and temporaries).
WHOLE_CLIP_FACTOR = 8
#: Fraction added for allocator fragmentation and small objects.
SLACK = 0.08
#: Largest batch the planner lets a stream build, in bytes of feature grams.
MAX_BATCH_BYTES = 8 * MB


def physical_memory() -> int:
    """The machine's memory in bytes (0 when the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass
class DataShape:
    """What the planner needs to know of a data set (from headers only)."""

    recordings: int
    seconds: float
    max_seconds: float
    max_channels: int
    rate: int            # the most common native sample rate
    needs_resample: bool


@dataclass
class Plan:
    """A predicted peak and the settings chosen to reach it."""

    components_mb: dict[str, float]
    settings: dict
    predicted_peak_mb: float
    limit_mb: float | None = None
    data: dict = field(default_factory=dict)
    #: audio + extraction and model counted as the larger of the two (they are not resident
    #: together when grams go to a feature store and fitting starts after extraction)
    phased: bool = True
    #: What the figures do not show (e.g. that augmented passes decode every recording again).
    notes: list = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def format(self) -> str:
        lines = [f"predicted peak resident memory: {self.predicted_peak_mb:.0f} MB"
                 + (f" (limit {size_text(self.limit_mb * MB)})" if self.limit_mb else "")]
        for k, v in self.components_mb.items():
            lines.append(f"  {k:<14} {v:8.1f} MB")
        if self.phased:
            lines.append("  (audio + extraction run before fitting and model during it: the peak "
                         "counts the larger)")
        lines += [f"  ({n})" for n in self.notes]
        lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in self.settings.items()))
        d = self.data
        if d:
            lines.append(f"data: {d['recordings']} recordings, {d['seconds'] / 3600:.2f} h, longest "
                         f"{d['max_seconds']:.1f} s, {d['rate']} Hz")
        return "\n".join(lines)


def data_shape(ds, spec, rate: int | None = None) -> DataShape:
    """Sizes of ``ds`` from headers; ``rate`` is the rate features are computed at when the spec
    has none (a trained model's; default: the most common rate, as for training)."""
    from collections import Counter

    rates: Counter = Counter()
    total = longest = 0.0
    channels = 1
    for r in ds:
        info = r.info()
        d = r.duration_s
        total += d
        longest = max(longest, d)
        channels = max(channels, info.channels)
        rates[info.rate] += 1
    common = rates.most_common(1)[0][0] if rates else 16000
    target = spec.rate or rate or common
    return DataShape(len(ds), total, longest, channels, common, any(k != target for k in rates))


def size_text(n: float) -> str:
    """Bytes as a --memory-limit value a user can type back: ``'256M'``, ``'1.5G'``, ``'1K'``."""
    for unit, size in (("G", 1 << 30), ("M", MB), ("K", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{unit}"
    return f"{int(n)}"


#: A window (clip) more than this many times the longest recording is refused in training:
#: every window would be mostly padding, and its memory grows with the clip, not the data.
MAX_PADDING_RATIO = 4.0


def check_windows(shape: DataShape, clip_ms: int, pad: str) -> None:
    """Refuse, in one line, windows that no recording fills: with ``pad=none`` no recording
    yields a window; with padding every window would be mostly padding (more than
    :data:`MAX_PADDING_RATIO` times the longest recording)."""
    clip_s = clip_ms / 1000.0
    if not clip_ms or shape.recordings == 0 or clip_s <= shape.max_seconds:
        return
    longest = f"the longest recording lasts {shape.max_seconds:.3g} s"
    if pad == "none":
        raise ParameterError(f"clip_ms={clip_ms}: no recording is as long as one window ({longest}) and "
                             "pad=none drops short windows; use a shorter clip_ms, 0 for whole recordings, "
                             "or pad=zero")
    if clip_s > MAX_PADDING_RATIO * shape.max_seconds:
        fit = max(1, int(MAX_PADDING_RATIO * shape.max_seconds * 1000))
        raise ParameterError(f"clip_ms={clip_ms}: every window would be mostly padding ({longest}); use "
                             f"clip_ms={fit} or less, or 0 for whole recordings")


def current_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    """Peak resident bytes of this process since it started (``VmHWM``).

    ``getrusage().ru_maxrss`` is not used: on Linux it carries over the high-water mark of the
    process that forked this one (exec folds the old address space's peak into it), so a small
    child of a big parent reports the parent's size."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _pending_imports(model, shape: DataShape) -> int:
    import sys

    mods = list(model.runtime_imports)
    mods += [backend_module(), "soundfile", "sqlite3"]
    if shape.needs_resample or training_augment(model).waveform:
        mods.append("scipy.signal")
    return sum(IMPORT_COST.get(m, 0) for m in set(mods) if m not in sys.modules)


@dataclass
class _Budget:
    """The sizes a plan is made of (bytes), computed once from the data shape and the model; the
    settings (workers, batch windows, cache) vary around them."""

    model: Any
    n_labels: int
    shape: DataShape
    dim: int
    gram_row: float               # bytes of one frame of features
    total_features: float         # bytes of every gram
    longest_gram: float           # bytes of one prefetched group
    window: float                 # bytes of one window (padded ones included)
    runtime: float
    audio_per_worker: float
    extract_per_worker: float
    phased: bool
    augment_per_worker: float = 0.0
    frame_cache: int = 0          # what the model asks to keep between passes, when granted
    notes: tuple = ()

    def components(self, w: int, bw: int, cache: int, frames: int = 0) -> dict[str, float]:
        """Each component's bytes with ``w`` workers, ``bw`` windows per batch, ``cache`` bytes
        of memory cache, ``frames`` bytes of frame cache."""
        model_b = self.model.memory_estimate(self.dim, n_labels=self.n_labels,
                                             batch_frames=int(bw * self.window / self.gram_row),
                                             total_frames=int(self.total_features / self.gram_row),
                                             window_frames=int(self.window / self.gram_row))
        # a second worker measured 12-37 MB more than one (60 s 44.1 kHz files, 1-8 h) where one
        # worker's audio and extraction buffers are 16 MB: each extra worker counts twice its audio
        parts = {"runtime": self.runtime, "audio": (w + max(w - 1, 0)) * self.audio_per_worker,
                 "extraction": w * self.extract_per_worker,
                 "batches": default_prefetch(w) * self.longest_gram + bw * self.window,
                 "memory_cache": min(cache, self.total_features), "model": model_b,
                 "per_hour": self.shape.recordings * PER_RECORDING}
        if self.augment_per_worker:
            parts["augment"] = w * self.augment_per_worker
        if frames:
            parts["frame_cache"] = frames
        parts["slack"] = SLACK * (self.peak(parts) - self.runtime)
        return parts

    def peak(self, parts: dict[str, float]) -> float:
        """The components resident at the same time, at the worse of the two phases."""
        total = sum(parts.values())
        if self.phased:
            total -= min(parts["audio"] + parts["extraction"], parts["model"])
        return total

    def plan(self, parts: dict[str, float], w: int, bw: int, cache: int, limit: int | None) -> Plan:
        settings = {"batch_windows": bw, "workers": w, "prefetch": default_prefetch(w),
                    "cache_mb": round(cache / MB, 1),  # the budget; it holds min(budget, all features)
                    "frame_cache_mb": math.ceil(parts.get("frame_cache", 0) / MB * 10) / 10}  # never below the grant
        return Plan({k: round(v / MB, 1) for k, v in parts.items()}, settings, round(self.peak(parts) / MB, 1),
                    limit / MB if limit else None, asdict(self.shape), self.phased, list(self.notes))


def _budget(ds: Any, model: Any, *, baseline_rss: int | None, persistent_store: bool,
            store_max_bytes: int | None) -> _Budget:
    spec = model.feature_spec
    shape = data_shape(ds, spec, model.feature_rate_)
    rate = spec.rate or model.feature_rate_ or shape.rate
    dim = spec.feature_dim(rate) * (shape.max_channels if spec.per_axis else 1)
    shift = spec.frame_shift_s(rate)
    whole = shift == 0.0               # one frame per recording (whole=true, window_ms=0)
    fps = 0.0 if whole else 1.0 / shift
    row = dim * 4
    total = shape.recordings * row if whole else shape.seconds * fps * row
    # one prefetched group: up to GROUP_S seconds of recordings, or the longest one
    longest = (max(1.0, scheduler.GROUP_S / max(shape.max_seconds, 1e-3)) * row if whole
               else max(shape.max_seconds, scheduler.GROUP_S) * fps * row)
    clip_ms, pad = int(model.params.get("clip_ms") or 0), model.params.get("pad", "zero")
    if model.labels_ is None:          # training: the user chose the windows for this data
        check_windows(shape, clip_ms, pad)
    # a padded window is as long as the clip, however short the recording
    clip_s = clip_ms / 1000.0 if clip_ms and pad != "none" else min(clip_ms / 1000.0 or shape.max_seconds,
                                                                    shape.max_seconds)
    store_need = total + shape.recordings * HEADER_BYTES  # float32 entries
    aug = training_augment(model)
    blockwise = not (shape.needs_resample or spec.per_axis or whole or aug.waveform) and rate == shape.rate
    decoded_s = min(shape.max_seconds, LONG_RECORDING_S) if blockwise else shape.max_seconds
    n_native, n_rate = decoded_s * shape.rate, decoded_s * rate
    audio = n_native * shape.max_channels * 4 + n_native * 4 * (shape.max_channels > 1) + (
        n_rate * 4 * shape.needs_resample)
    n_labels = max(2, len(_label_values(ds, model)))
    # every frame of a pass (augmented: each copy at its slowest speed and longest padding)
    frames = (shape.recordings * aug.copies if whole else aug.pass_seconds(shape.seconds, shape.recordings) * fps) \
        if aug.waveform else total / row
    asked = model.frame_cache_request(dim, n_labels, int(frames))
    granted = asked if asked <= (physical_memory() // 4 if aug.waveform else FRAME_CACHE_DEFAULT) else 0
    return _Budget(
        model=model, n_labels=n_labels, shape=shape, dim=dim, gram_row=row,
        total_features=total, longest_gram=longest, window=row if whole else max(row, clip_s * fps * row),
        runtime=(baseline_rss if baseline_rss is not None else current_rss()) + _pending_imports(model, shape),
        audio_per_worker=audio,
        # a whole-clip spec transforms the whole recording at once: its FFT buffers grow with it
        extract_per_worker=max(EXTRACT_BYTES, WHOLE_CLIP_FACTOR * n_rate * 4 if whole else 0),
        phased=persistent_store and (store_max_bytes is None or store_max_bytes >= store_need) and not aug.waveform,
        augment_per_worker=aug.work_bytes(int(n_rate) * (shape.max_channels if spec.per_axis else 1), rate),
        frame_cache=granted,
        notes=(f"augment: every training pass decodes and extracts each recording again from augmented audio "
               f"({shape.seconds * aug.copies / 3600:.2f} h of audio per pass"
               f"{f', {aug.copies} copies of each recording' if aug.copies > 1 else ''}; augmented features are "
               "never stored)",)
        if aug.waveform else ())


def training_augment(model: Any) -> Augmenter:
    """The augmentation a model trains with (none for a fitted model: its streams are predicted)."""
    if model.labels_ is not None:
        return Augmenter()
    return model.augmenter


def plan(ds: Any, model: Any, *, memory_limit: int | None = None, workers: int | None = 1, batch_windows: int = 64,
         cache_bytes: int = 64 * MB, baseline_rss: int | None = None,
         persistent_store: bool = True, store_max_bytes: int | None = None) -> Plan:
    """Predict the peak RSS of training ``model`` on ``ds`` and choose settings.

    Parameters
    ----------
    ds : Dataset
    model : Classifier (its params give the features and windowing; a fitted one is planned as
        if training it: an upper bound of what prediction needs)
    memory_limit : int or None, bytes
        When given, settings are reduced to fit it, or :class:`MemoryLimitError` is raised.
    workers, batch_windows, cache_bytes : the requested settings (upper bounds); ``workers=None``
        means :func:`wavetrain.stream.scheduler.default_workers` for the data set's mean duration.
    baseline_rss : int or None
        Resident bytes already in use; default: this process's current RSS.
    persistent_store : bool, default=True
        Whether grams go to a feature store.  Then every recording is extracted once before
        fitting starts and later passes only read the store, so the decoding and extraction
        buffers (``audio``, ``extraction``) and the model's working memory (``model``) are never
        resident together: the peak counts the larger of the two.  Without a store, passes may
        extract again while the model is fitting: all are counted.
    store_max_bytes : int or None
        The store's size bound.  A store that cannot hold every gram evicts during the run and
        later passes extract again while fitting: then all are counted too.
    """
    b = _budget(ds, model, baseline_rss=baseline_rss, persistent_store=persistent_store,
                store_max_bytes=store_max_bytes)
    shape = b.shape
    bw = max(1, min(batch_windows, int(MAX_BATCH_BYTES // b.window) or 1))
    if workers is None:
        workers = default_workers(shape.seconds / shape.recordings if shape.recordings else None)
    w, cache, frames = max(1, workers), cache_bytes, b.frame_cache
    parts = b.components(w, bw, cache, frames)
    if memory_limit is None:
        return b.plan(parts, w, bw, cache, None)
    while b.peak(parts) > memory_limit and (w > 1 or bw > 8 or cache > 0 or frames > 0):
        if cache > 0:                  # first the memory cache, the frame cache, then workers, then batch size
            cache = max(0, int(min(cache, b.total_features) - (b.peak(parts) - memory_limit) * 1.1))
            if cache < 4 * MB:
                cache = 0
        elif frames > 0:               # all frames or none: a part of them saves no pass
            frames = 0
        elif w > 1:
            w -= 1
        else:
            bw = max(8, bw // 2)
        parts = b.components(w, bw, cache, frames)
    need = b.peak(parts)
    if need > memory_limit:
        raise MemoryLimitError(
            f"this run needs about {need / MB:.0f} MB ({', '.join(f'{k} {v / MB:.0f}' for k, v in parts.items())}"
            f" MB), more than the memory limit of {size_text(memory_limit)}; it would fit with a limit of "
            f"{int(need / MB) + 1}M (or use shorter recordings, windows or fewer features)",
            plan=b.plan(parts, w, bw, cache, memory_limit))
    return b.plan(parts, w, bw, cache, memory_limit)


def _label_values(ds, model) -> set:
    """The label values the model learns: a fitted model's, else those of ``ds`` (none known
    when the model has no label name or the data set no such label)."""
    if model.labels_ is not None:
        return set(model.labels_)
    name = model.label_name_
    if not name or not (ds.folder_labels or name in ds.label_names()):
        return set()
    return {v for v in ds.values(name) if v}
