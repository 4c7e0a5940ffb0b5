"""The feature source: one recording -> its feature gram, from the in-memory cache, else the
feature store, else extracted (and then kept in both).

A source computes features at one rate (:attr:`FeatureSource.rate`): the spec's own, else the
rate a model was trained at (or the training data's most common one). A recording at another
rate is resampled to it under a spec that says so, which keys the store separately. Per-axis
features need every recording to have :attr:`FeatureSource.channels` channels.

With an augmenter (:class:`~wavetrain.features.augment.Augmenter`, a training stream's), a
gram asked for with a ``draw`` index is the augmented one: decoded and extracted again each time
from the audio changed by the draw, never read from or written to the store or the memory cache
(those hold clean grams only). An augmenter with ``specaugment`` alone leaves the audio, hence
the gram, clean: the stream masks the windows.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from wavetrain import models  # noqa: F401  (registers the model-file reader of embedding features)
from wavetrain.core.errors import AudioError, UserError
from wavetrain.data.recording import Recording
from wavetrain.features import FeatureSpec, extract, extract_blocks, parse_spec
from wavetrain.features.augment import Augmenter, AugmentError
from wavetrain.features.fft import BackendError, check_backend
from wavetrain.features.spec import replace, warped_specs
from wavetrain.store import MemoryCache, NullStore, Store

__all__ = ["LONG_RECORDING_S", "MAX_UPSAMPLE", "FeatureSource", "check_layout"]

#: Recordings longer than this (s) are decoded in blocks of half of it (see ``extract_blocks``).
LONG_RECORDING_S = 60.0
#: A recording sampled more than this many times below the features' rate is refused: it holds
#: at most 1/16 of the band the features describe (an 8 kHz phone recording for a 16 kHz model,
#: 2-fold, is resampled with a warning).
MAX_UPSAMPLE = 16


def check_layout(where: str, audio_rate: int, audio_channels: int, *, rate: int | None,
                 channels: int | None) -> None:
    """Raise :class:`AudioError` naming ``where`` when audio at ``audio_rate`` Hz with
    ``audio_channels`` channels cannot give features computed at ``rate`` Hz for ``channels``
    per-axis channels (None: any): another channel count, or a rate so far below that resampling
    would invent nearly all of the band (more than :data:`MAX_UPSAMPLE` times)."""
    if channels is not None and audio_channels != channels:
        raise AudioError(f"{where}: {audio_channels} channel(s), but the features are per axis (per_axis=true) "
                         f"for {channels}-channel recordings; give {channels}-channel audio")
    if rate is not None and audio_rate * MAX_UPSAMPLE < rate:
        raise AudioError(f"{where}: sampled at {audio_rate} Hz, but the features are computed at {rate} Hz: "
                         f"resampling up {rate / audio_rate:.0f}-fold would invent nearly all of the band; give "
                         f"recordings at {-(-rate // MAX_UPSAMPLE)} Hz or more (or set rate= in the feature spec)")


class FeatureSource:
    """Feature grams of recordings under one spec.

    Parameters
    ----------
    spec : FeatureSpec or str
    rate : int or None
        Rate (Hz) features are computed at when the spec has none; None: each recording's own.
    channels : int or None
        Channels every recording must have (used only by per-axis specs).
    store : Store or None
        Where computed grams are kept; None = :class:`~wavetrain.store.NullStore`.
    cache : MemoryCache or None
        In-memory, cost-aware cache of grams in front of the store.
    device : str
        Extraction device (``cpu``, ``cpu-torch``, ``cuda``).
    stats : object, optional
        Counts ``extracted`` (grams computed), ``store_reads`` (grams the store had) and
        ``augmented`` (augmented grams computed) are added to its attributes of those names.
    augment : Augmenter or None
        Augmentation of the grams asked for with a ``draw`` index (see :meth:`gram`).
    augment_seed : int
        Seed of the augmentation draws (with the recording's content id and the draw index).

    Attributes
    ----------
    extracted, store_reads, augmented : int
        When no ``stats`` object is given.
    """

    def __init__(self, spec: FeatureSpec | str, *, rate: int | None = None, channels: int | None = None,
                 store: Store | None = None, cache: MemoryCache | None = None, device: str = "cpu",
                 stats: Any = None, augment: Augmenter | None = None, augment_seed: int = 0):
        check_backend()  # an unusable WAVETRAIN_FFT fails here, not as a "bad recording"
        self.spec = parse_spec(spec)
        self.spec_key = self.spec.key  # computed once: the canonical string is not free
        self.rate = self.spec.rate or rate
        self._resampling: tuple[FeatureSpec, str] | None = None
        if self.spec.rate is None and rate is not None:
            rs = replace(self.spec, rate=int(rate))
            self._resampling = (rs, rs.key)
        self.channels = channels if self.spec.per_axis else None
        self.store: Store = store if store is not None else NullStore()
        self.cache = cache
        self.device = device
        self.stats: Any = stats if stats is not None else self
        self.extracted = self.store_reads = self.augmented = 0
        self.augment = augment if augment else None
        self.augment_seed = int(augment_seed)
        self._shift: dict[int, float] = {}
        self._lock = threading.Lock()

    # -- what a recording's features are ----------------------------------------------------------
    def rate_of(self, rec: Recording) -> int:
        """The rate this recording's features are computed at."""
        return self.rate or rec.info().rate

    def spec_for(self, rec: Recording) -> tuple[FeatureSpec, str]:
        """``(spec, store key)`` of this recording: the source's, or the resampling one when the
        recording's rate differs from :attr:`rate`."""
        if self._resampling is not None and rec.info().rate != self.rate:
            return self._resampling
        return self.spec, self.spec_key

    def frame_shift(self, rate: int) -> float:
        """Seconds between frames at ``rate`` (computed once per rate)."""
        shift = self._shift.get(rate)
        if shift is None:
            shift = self._shift[rate] = self.spec.frame_shift_s(rate)
        return shift

    def check_recording(self, rec: Recording) -> None:
        """Raise :class:`AudioError` when the recording cannot give these features (see
        :func:`check_layout`)."""
        info = rec.info()
        check_layout(str(rec.path), info.rate, info.channels, rate=self.rate, channels=self.channels)

    def upsampled(self, recordings: Iterable[Recording]) -> dict[int, int]:
        """Recordings below :attr:`rate`, by native rate: they are resampled up and hold nothing
        above half their own rate (reads headers only; those refused are not counted)."""
        out: dict[int, int] = {}
        if self.rate is not None:
            for rec in recordings:
                r = rec.info().rate
                if r < self.rate <= r * MAX_UPSAMPLE:
                    out[r] = out.get(r, 0) + 1
        return out

    # -- grams -----------------------------------------------------------------------------------
    def augments_audio(self, draw: int | None) -> bool:
        """Whether a gram asked for with ``draw`` is extracted from augmented audio."""
        return draw is not None and self.augment is not None and self.augment.waveform

    def in_memory(self, rec: Recording, draw: int | None = None) -> np.ndarray | None:
        """The recording's gram when the memory cache holds it (no I/O); never an augmented one."""
        if self.cache is None or self.augments_audio(draw):
            return None
        return self.cache.get((rec.id, self.spec_for(rec)[1]))

    def gram(self, rec: Recording, draw: int | None = None) -> np.ndarray:
        """The feature gram ``(frames, features)`` of a whole recording: from the memory cache, the
        store, or computed (then kept in both). With ``draw`` and an augmenter that changes the
        audio: the gram of draw ``draw`` of the augmented audio, computed now and kept nowhere."""
        self.check_recording(rec)
        if self.augments_audio(draw):
            assert draw is not None
            return self.extract(rec, self.spec_for(rec)[0], draw=draw)
        spec, key = self.spec_for(rec)
        if self.cache is None:
            return self._from_store(rec, spec, key)
        g = self.cache.get((rec.id, key))
        if g is None:
            t0 = time.perf_counter()
            g = self._from_store(rec, spec, key)
            # keep plain float32 arrays, never memory maps (each pins a file descriptor)
            g = np.array(g, dtype=np.float32) if isinstance(g, np.memmap) else np.asarray(g, dtype=np.float32)
            g.flags.writeable = False
            self.cache.put((rec.id, key), g, cost_s=time.perf_counter() - t0)
        return g

    def _from_store(self, rec: Recording, spec: FeatureSpec, key: str) -> np.ndarray:
        computed: list[bool] = []

        def compute() -> np.ndarray:
            g = self.extract(rec, spec)
            computed.append(True)
            return g

        g = self.store.get_or_compute(rec.id, key, compute)
        if not computed:
            self._count("store_reads")
        return g

    def extract(self, rec: Recording, spec: FeatureSpec, draw: int | None = None) -> np.ndarray:
        """Decode and extract one recording (long ones a block at a time; with ``draw``, its
        augmented audio, whole); any fault of the recording is an :class:`AudioError` naming it."""
        augmented = self.augments_audio(draw)
        try:
            g = None
            if augmented:
                assert self.augment is not None and draw is not None
                x, sr = rec.load(spec.rate, mono=not spec.per_axis)
                x = self.augment.apply(x, sr, seed=self.augment_seed, content_id=rec.id, draw=draw)
                warp = self.augment.warp_factor(seed=self.augment_seed, content_id=rec.id, draw=draw)
                g = extract(x, sr, spec if warp is None else warped_specs(spec, (warp,)), device=self.device)
            elif self.device == "cpu" and rec.duration_s > LONG_RECORDING_S:
                read, n, sr = rec.block_reader()  # decode a block at a time, not the whole file
                g = extract_blocks(read, n, sr, spec, block_s=LONG_RECORDING_S / 2)
            if g is None:
                x, sr = rec.load(spec.rate, mono=not spec.per_axis)
                g = extract(x, sr, spec, device=self.device)
        except AudioError as e:
            raise AudioError(str(e) if str(rec.path) in str(e) else f"{rec.path}: {e}") from None
        except (BackendError, AugmentError):
            raise  # a setting of the run, not a fault of this recording
        except UserError as e:
            raise AudioError(f"{rec.path}: {e}") from None
        self._count("augmented" if augmented else "extracted")
        return g

    def _count(self, name: str) -> None:
        """Add one to the counter ``name`` of ``stats``, and of the stats it reports to (``also``:
        the stream a subset was taken from)."""
        with self._lock:
            stats = self.stats
            while stats is not None:
                setattr(stats, name, getattr(stats, name) + 1)
                stats = getattr(stats, "also", None)
