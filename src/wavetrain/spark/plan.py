"""The Spark engine's memory plan: what one executor's Python worker and the driver hold at their
peaks, from file headers and the model spec (``wavetrain memory --engine spark``).

An executor task holds one recording's gram, a few Arrow rows of the table and its model's
working arrays: nothing that grows with the data set but the recordings of its own task. The
driver holds the data set's description, the table's catalog, the merged init sample and the
model. The JVMs take what their Spark settings give them (``spark.driver.memory``,
``spark.executor.memory``); the Python workers live outside the executor JVM's heap, in its
overhead (``spark.executor.pyspark.memory`` bounds them where the cluster manager enforces it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from wavetrain.core.errors import MemoryLimitError, ParameterError
from wavetrain.pipeline.memory import (
    EXTRACT_BYTES,
    IMPORT_COST,
    MB,
    PER_RECORDING,
    SLACK,
    current_rss,
    data_shape,
    training_augment,
)
from wavetrain.spark.extract import MAX_CHUNK
from wavetrain.spark.session import SparkSettings
from wavetrain.spark.shards import GRAM_CACHE_ENV, configured_cache_bytes
from wavetrain.spark.table import BLOCK_FRAMES, READ_ROWS, WRITE_ROWS

__all__ = ["EXECUTOR_RUNTIME", "SparkPlan", "plan_spark", "plan_within"]

#: An executor's Python worker once it has imported what a task needs (numpy, scipy, soundfile,
#: pyarrow, wavetrain's feature, model and table modules, the FFT backend): 187 MB measured with
#: psutil in a local[2] session on the reference machine (a bare worker: 56 MB).
EXECUTOR_RUNTIME = 190 * MB
#: The driver's imports of pyspark and py4j and its gateway's threads: 90 MB measured (132 MB
#: resident after starting a local[2] session, against 42 MB before).
DRIVER_PYSPARK = 90 * MB
#: Driver bytes per recording beyond its description: its catalog entry (ids, part path) and tasks.
CATALOG_PER_RECORDING = 400
#: A task reading a part file: pyarrow's buffers of one row group and the reader's machinery
#: (measured: 42 MB above the imports, whatever the part file's size).
ARROW_READ_BYTES = 40 * MB
#: JVM memory beyond the heap (metaspace, threads, direct buffers), roughly.
JVM_OVERHEAD = 300 * MB


@dataclass
class SparkPlan:
    executor_mb: dict[str, float]        # one executor Python worker, by component
    executor_peak_mb: float
    driver_mb: dict[str, float]          # the driver's Python process, by component
    driver_peak_mb: float
    jvm_mb: dict[str, float]             # the JVMs' settings (heap) plus overhead
    settings: dict[str, Any]
    data: dict[str, Any]

    def to_json(self) -> dict:
        return asdict(self)

    def format(self) -> str:
        lines = [f"Spark ({self.settings['master']}): predicted peak resident memory"]
        for title, parts, peak in (("executor Python worker (one per core)", self.executor_mb, self.executor_peak_mb),
                                   ("driver Python process", self.driver_mb, self.driver_peak_mb)):
            lines.append(f"{title}: {peak:.0f} MB")
            lines += [f"  {k:<16} {v:8.1f} MB" for k, v in parts.items()]
        lines.append("JVMs (their heap settings plus overhead): "
                     + ", ".join(f"{k} {v:.0f} MB" for k, v in self.jvm_mb.items()))
        lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in self.settings.items()))
        d = self.data
        lines.append(f"data: {d['recordings']} recordings, {d['seconds'] / 3600:.2f} h, longest "
                     f"{d['max_seconds']:.1f} s; nothing above grows with the hours of audio but the driver's "
                     "per-recording entries")
        return "\n".join(lines)


def _size_mb(text: str) -> float:
    """A Spark memory setting (``512m``, ``1g``, ``2048k``, bytes) in MB."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", str(text).lower())
    if not m:
        raise ParameterError(f"Spark memory setting {text!r}: expected e.g. 512m or 2g")
    return float(m[1]) * {"": 1 / MB, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}[m[2]]


def plan_spark(ds: Any, model: Any, settings: SparkSettings) -> SparkPlan:
    """Predict the peaks of training ``model`` on ``ds`` with the Spark engine."""
    parallelism = settings.cores()
    spec = model.feature_spec
    shape = data_shape(ds, spec, model.feature_rate_)
    rate = spec.rate or model.feature_rate_ or shape.rate
    dim = spec.feature_dim(rate) * (shape.max_channels if spec.per_axis else 1)
    shift = spec.frame_shift_s(rate)
    fps = 0.0 if shift == 0 else 1.0 / shift
    row = dim * 4
    longest_gram = max(row, shape.max_seconds * fps * row)
    total_frames = shape.seconds * fps if fps else shape.recordings
    tasks = max(-(-shape.recordings // MAX_CHUNK), min(shape.recordings, 4 * parallelism), 1)
    labels = max(2, len({v for v in ds.values(model.label_name_)} - {None, ""}) if model.label_name_ else 2)
    audio = shape.max_seconds * shape.rate * 4 * (shape.max_channels + (shape.max_channels > 1)
                                                  + shape.needs_resample)
    imports = sum(IMPORT_COST.get(m, 0) for m in model.runtime_imports)
    block = min(BLOCK_FRAMES, max(1.0, longest_gram / row)) * row
    parts = {"runtime": EXECUTOR_RUNTIME + imports,
             # extraction tasks: the decoded recording, the extractor's buffers, rows before a row group
             "extraction": audio + EXTRACT_BYTES + WRITE_ROWS * block,
             # reading tasks: Arrow rows (their bytes and arrays) and one recording's gram joined from them
             "table_read": ARROW_READ_BYTES + 2 * READ_ROWS * block + 2 * longest_gram}
    parts["model"] = model.task_memory(dim, labels, batch_frames=int(64 * longest_gram / row),
                                       task_frames=total_frames / tasks, total_frames=int(total_frames),
                                       window_frames=int(longest_gram / row))
    # grams kept between passes: at most the bound, and at most every gram of the table (a worker
    # keeps those of whichever tasks it runs, and Spark gives a list of tasks no locality)
    conf = settings.resolved_conf()
    cache = configured_cache_bytes(conf)
    parts["gram_cache"] = min(cache, total_frames * row)
    aug = training_augment(model)
    if aug.waveform:
        # an augmenting pass's task decodes each recording whole, augments and extracts it again
        samples = int(shape.max_seconds * rate) * (shape.max_channels if spec.per_axis else 1)
        parts["augment"] = audio + aug.work_bytes(samples, rate) + EXTRACT_BYTES + longest_gram
    # extraction and reading are different tasks: the peak counts the larger (the cache fills as reading tasks run)
    reading = parts["table_read"] + parts["model"] + parts["gram_cache"] + parts.get("augment", 0.0)
    peak = sum(parts.values()) - min(parts["extraction"], reading)
    parts["slack"] = SLACK * (peak - parts["runtime"])
    peak += parts["slack"]
    driver = {"runtime": current_rss() + DRIVER_PYSPARK,
              "recordings": shape.recordings * (PER_RECORDING + CATALOG_PER_RECORDING),
              "init_sample": model.merged_memory(dim, labels, total_frames),
              "model": labels * model.params.get("components", 0) * (2 * dim + 1) * 8 * 4}
    driver["slack"] = SLACK * (sum(driver.values()) - driver["runtime"])
    jvm = {"driver": _size_mb(conf["spark.driver.memory"]) + JVM_OVERHEAD / MB,
           "executor": _size_mb(conf["spark.executor.memory"]) + JVM_OVERHEAD / MB}
    chosen = {"master": settings.master, "spark.executor.memory": conf["spark.executor.memory"],
              "spark.driver.memory": conf["spark.driver.memory"],
              "spark.python.worker.memory": conf["spark.python.worker.memory"],
              "arrow_rows_per_batch": READ_ROWS, "frames_per_row": BLOCK_FRAMES, "tasks": tasks,
              "gram_cache_mb": round(cache / MB, 1)}
    return SparkPlan({k: round(v / MB, 1) for k, v in parts.items()}, round(peak / MB, 1),
                     {k: round(v / MB, 1) for k, v in driver.items()}, round(sum(driver.values()) / MB, 1),
                     {k: round(v, 0) for k, v in jvm.items()}, chosen, asdict(shape))


def plan_within(ds: Any, model: Any, settings: SparkSettings, limit: int) -> tuple[SparkPlan, SparkSettings]:
    """The plan of :func:`plan_spark` with each Python process — an executor's worker, the driver
    — at most ``limit`` bytes at its peak: the executors' gram cache is what the limit leaves an
    executor's worker (at most the bound ``--spark-conf`` gives it; :func:`plan_spark` counts no
    more than the table's grams), and the settings that say so are
    returned with the plan. A cache that holds the grams a worker reads saves every EM pass after
    the first its Parquet reads.

    Raises
    ------
    MemoryLimitError
        The driver, or an executor's worker without a gram cache, needs more than ``limit``.
    """
    key = f"spark.executorEnv.{GRAM_CACHE_ENV}"

    def with_cache(n: float) -> SparkSettings:
        return SparkSettings(settings.master, {**settings.conf, key: str(max(0, int(n)))})

    bare = plan_spark(ds, model, with_cache(0))
    room = (limit - bare.executor_peak_mb * MB) / (1 + SLACK)
    given = configured_cache_bytes(settings.conf) if key in settings.conf else None
    chosen = with_cache(min(room, given) if given is not None else room)
    plan = plan_spark(ds, model, chosen) if room > 0 else bare
    for what, peak in (("an executor's Python worker needs", plan.executor_peak_mb),
                       ("the driver's Python process needs", plan.driver_peak_mb)):
        if peak * MB > limit:
            raise MemoryLimitError(f"--memory-limit {limit / MB:.0f} MB: on Spark {what} {peak:.0f} MB at its "
                                   "peak, with no gram cache (see `wavetrain memory --engine spark`)")
    return plan, chosen if room > 0 else with_cache(0)
