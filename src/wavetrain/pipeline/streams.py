"""The local engine's streams and the settings of a run: a data set's features, windows and
augmentation as a :class:`~wavetrain.stream.feature_stream.FeatureStream` for a model, and the
memory plan that sizes them. The engines (:mod:`~wavetrain.pipeline.engine`) and the jobs
(:mod:`~wavetrain.pipeline.jobs`) build on them.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from wavetrain.core.errors import AudioError, ParameterError, SpecError, UserError
from wavetrain.data.dataset import Dataset
from wavetrain.features import FeatureSpec
from wavetrain.features.augment import Augmenter
from wavetrain.features.spec import warped_specs
from wavetrain.models.base import Classifier
from wavetrain.models.registry import families_with
from wavetrain.pipeline.memory import MB, Plan, plan, training_augment
from wavetrain.store import FeatureStore, MemoryCache, NullStore, Store
from wavetrain.stream.feature_stream import FeatureStream
from wavetrain.stream.scheduler import default_prefetch, default_workers
from wavetrain.stream.source import MAX_UPSAMPLE
from wavetrain.stream.windows import Windowing

__all__ = ["RunOptions", "feature_layout", "make_stream", "plan_run", "prediction_stream", "training_augmenter",
           "warn_upsampled"]

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """Settings of a run that are not model hyper-parameters."""

    store: Store | None = None     # None: a NullStore (nothing kept between runs)
    batch_windows: int = 64
    workers: int | None = 1        # None: scheduler.default_workers for each stream's data (the CLI's default)
    prefetch: int | None = 4       # None: scheduler.default_prefetch(workers)
    skip_bad: bool = False
    progress: bool = False
    device: str = "cpu"
    cache_bytes: int = 64 << 20    # in-memory cost-aware cache of feature grams (a fixed budget)
    frame_cache_bytes: int | None = None  # training frames a family may keep between passes (the plan's grant)
    memory_cache: MemoryCache | None = None   # made on first use and shared by the run's streams
    checkpoint: str | None = None
    resume: str | None = None
    group_by: str | None = None
    seed: int = 0
    devices: tuple = ()            # a device group sharing each training step (neural models)
    balance: str = "throughput"    # how a device group splits each batch
    sync: str = "allreduce"        # how a device group combines its replicas


def make_stream(ds: Dataset, model: Classifier, opts: RunOptions, *, label: str | None,
                labels: list[str] | None = None, layout: tuple[int | None, int | None] | None = None,
                train: bool | None = None) -> FeatureStream:
    """A feature stream of ``ds`` with the model's features and windowing.

    ``layout`` is ``(rate, channels)`` of the features (see :func:`feature_layout`); default: a
    fitted model's own, else the data set's. ``train``: a stream the model learns from, which
    augments as the model's ``augment`` parameter says (its ``seed`` seeding the draws; the
    validation part it holds out stays clean); default: whether the model is not fitted yet
    (a fitted model's streams are predicted, never augmented)."""
    if opts.memory_cache is None and opts.cache_bytes > 0:
        opts.memory_cache = MemoryCache(opts.cache_bytes)
    workers = opts.workers
    if workers is None:                    # chosen for this data set (opts may serve several)
        known = [d for d in (r.known_duration_s() for r in ds) if d is not None]
        workers = default_workers(sum(known) / len(known) if known else None)
    prefetch = default_prefetch(workers) if opts.prefetch is None else opts.prefetch
    if layout is None:
        layout = ((model.feature_rate_, model.channels_) if model.labels_ is not None
                  else feature_layout(ds, model.feature_spec, skip_bad=opts.skip_bad))
    if train is None:
        train = model.labels_ is None
    augment = training_augmenter(model) if train else None
    return FeatureStream(ds, model.feature_spec, label=label, labels=labels,
                         windowing=Windowing.from_params(model.params), store=opts.store or NullStore(),
                         batch_windows=opts.batch_windows, workers=workers, prefetch=prefetch,
                         skip_bad=opts.skip_bad, device=opts.device if opts.device != "auto" else "cpu",
                         cache=opts.memory_cache, rate=layout[0], channels=layout[1],
                         augment=augment or None, augment_seed=int(model.params.get("seed") or 0))


def training_augmenter(model: Classifier) -> Augmenter | None:
    """How the streams ``model`` learns from augment (its ``augment`` parameter; None when empty),
    on either engine. ``mixup`` is refused for a family that does not mix its mini-batches."""
    augment = training_augment(model)
    if augment.mixup is not None and not model.mixes_batches:
        mixers = ", ".join(families_with(mixes_batches=True))
        raise ParameterError(f"{model.name}: mixup mixes the mini-batches of a neural classifier ({mixers}); "
                             "drop it from --set augment for this model", param="augment")
    if augment.warps:
        try:
            warped_specs(model.feature_spec, (1.0,))
        except SpecError:
            raise ParameterError(f"{model.name}: warp(...) warps a mel filter bank, and the features "
                                 f"{model.params['features']!r} have none; drop it from --set augment or use mel, "
                                 "logmel, mfcc or pcen features", param="augment") from None
    return augment or None


def feature_layout(ds: Dataset, spec: FeatureSpec, *, skip_bad: bool = False) -> tuple[int | None, int | None]:
    """``(rate, channels)`` that training features of ``ds`` are computed for (reads headers).

    The rate is the spec's own, else the most common rate of the recordings (the others are
    resampled to it, with a warning); a model records it, and everything it scores later is
    resampled to it. ``channels`` is set for per-axis specs only, whose feature layout depends on
    it: every recording must have the most common channel count (the others are refused, or
    skipped with ``skip_bad``)."""
    rates = Counter(r.info().rate for r in ds)
    if not rates:
        return spec.rate, None
    rate = spec.rate or rates.most_common(1)[0][0]
    # (recordings too far below the rate to be resampled are refused one by one, not listed here)
    others = ", ".join(f"{n} at {r} Hz" for r, n in sorted(rates.items()) if r != rate and r * MAX_UPSAMPLE >= rate)
    if spec.rate is None and others:
        log.warning("the recordings have several sample rates: features are computed at %d Hz (the most "
                    "common) and the others are resampled to it (%s); set rate= in the feature spec to "
                    "choose", rate, others)
    channels = None
    if spec.per_axis:
        counts = Counter(r.info().channels for r in ds)
        channels = counts.most_common(1)[0][0]
        if len(counts) > 1 and not skip_bad:
            odd = next(r for r in ds if r.info().channels != channels)
            layout = ", ".join(f"{n} with {c}" for c, n in sorted(counts.items()))
            raise AudioError(f"{odd.path}: {odd.info().channels} channel(s); per-axis features "
                             f"(per_axis=true) need one channel layout, and the recordings have several "
                             f"({layout}); keep one layout, skip the others as bad recordings, or drop "
                             "per_axis to average the channels")
    return rate, channels


def prediction_stream(model: Classifier, ds: Dataset, opts: RunOptions, *, warn: bool = True) -> FeatureStream:
    """An unlabelled stream of ``ds`` with the model's features, windowing, rate and channels;
    ``warn`` says (once) how many recordings are below the model's rate."""
    stream = make_stream(ds, model, opts, label=None, labels=model.labels_, train=False)
    if warn:
        warn_upsampled(stream, ds)
    if len(ds) and stream.feature_dim != model.feature_dim_:
        raise UserError(f"features of this data have {stream.feature_dim} values per frame, the model expects "
                        f"{model.feature_dim_}; was the model trained with another feature spec?")
    return stream


def warn_upsampled(stream: FeatureStream, ds: Dataset) -> None:
    """Say once how many recordings of ``ds`` are below the stream's rate."""
    low = stream.source.upsampled(ds)
    if low:
        rates = ", ".join(f"{n} at {r} Hz" for r, n in sorted(low.items()))
        log.warning("%d recording(s) have a lower sample rate than the model's %d Hz (%s): they are "
                    "resampled up but hold nothing above %d Hz, so answers on them may be unreliable",
                    sum(low.values()), stream.rate, rates, min(low) // 2)


def plan_run(ds: Dataset, model: Classifier, opts: RunOptions, *, memory_limit: int | None = None) -> Plan:
    """Plan the peak memory of training ``model`` on ``ds`` and set ``opts`` to the settings
    chosen (raises :class:`~wavetrain.core.errors.MemoryLimitError` when ``memory_limit`` bytes cannot
    be met). A fitted ``model`` (classify, evaluate a model file) is planned as if training it
    on ``ds``: an upper bound of what prediction needs. Returns the :class:`~wavetrain.pipeline.memory.Plan`."""
    p = plan(ds, model, memory_limit=memory_limit, workers=opts.workers, batch_windows=opts.batch_windows,
             cache_bytes=opts.cache_bytes, persistent_store=isinstance(opts.store, FeatureStore),
             store_max_bytes=opts.store.max_bytes if opts.store is not None else None)
    opts.batch_windows = p.settings["batch_windows"]
    opts.workers = p.settings["workers"]
    opts.prefetch = p.settings["prefetch"]
    opts.cache_bytes = int(p.settings["cache_mb"] * MB)
    opts.frame_cache_bytes = int(p.settings["frame_cache_mb"] * MB)
    return p
