"""Distributed feature extraction into the shared feature table.

The driver lists the recordings the table lacks (reading only its ``rec`` columns) and hands
them out in chunks (a part file that cannot be read is removed first, so its recordings are among
them); each task extracts its chunk's grams one recording at a time (long ones a
block at a time, as the local engine) and writes them as one part file (see
:mod:`wavetrain.spark.table` for why a re-run is harmless). A recording that cannot be read is
reported back, never a failed task: the driver raises it, or skips it with ``skip_bad``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wavetrain.core.errors import AudioError
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import Recording
from wavetrain.features import FeatureSpec
from wavetrain.spark.jobs import checked, job_progress, on_executor
from wavetrain.spark.table import FeatureTable
from wavetrain.stream.source import FeatureSource

__all__ = ["ExtractResult", "extract_missing"]

#: Recordings per task: at most this many, and at least enough tasks to keep every core busy.
MAX_CHUNK = 256


@dataclass
class ExtractResult:
    extracted: int = 0                                  # recordings extracted by this run
    present: int = 0                                    # recordings the table already had
    bad: list[tuple[Recording, str]] = field(default_factory=list)
    dim: int | None = None                              # features per frame (of what was extracted)


def _extract_chunk(table: FeatureTable, spec: FeatureSpec, rate: int | None, channels: int | None, device: str,
                   chunk: list[Recording]) -> dict[str, Any]:
    """On an executor: extract and write one chunk; returns what happened, not the grams."""
    source = FeatureSource(spec, rate=rate, channels=channels, device=device)
    bad: list[tuple[int, str]] = []
    dims: list[int] = []
    by_key: dict[str, list[int]] = {}
    for j, rec in enumerate(chunk):
        try:
            by_key.setdefault(source.spec_for(rec)[1], []).append(j)
        except AudioError as e:
            bad.append((j, str(e)))

    def grams(members: list[int]):
        for j in members:
            rec = chunk[j]
            try:
                g = source.gram(rec)
            except AudioError as e:
                bad.append((j, str(e)))
                continue
            dims.append(int(g.shape[1]))
            r = source.rate_of(rec)
            yield rec.id, g, r, source.frame_shift(r), int(round(rec.duration_s * 1000))

    for key, members in by_key.items():
        table.write_part(key, grams(members), [chunk[j].id for j in members])
    return {"bad": bad, "dims": sorted(set(dims)), "extracted": len(chunk) - len(bad)}


def extract_missing(spark: Any, table: FeatureTable, ds: Dataset, source: FeatureSource, *,
                    progress: bool = False) -> ExtractResult:
    """Extract into ``table`` the recordings of ``ds`` it lacks (features of ``source``: its spec,
    rate and channels). Bad recordings are listed in the result, not raised.

    Temporary files of runs that died are swept first, and part files that cannot be read are
    removed (see :meth:`FeatureTable.catalog`): their recordings are extracted again. Recording
    identities come from the table's manifest of file facts where a file is unchanged
    (:meth:`FeatureTable.remember_files`), else from hashing the file once."""
    table.sweep()
    table.remember_files()
    res = ExtractResult()
    keys: dict[tuple[str, str], Recording] = {}
    for rec in ds:
        try:
            keys.setdefault((rec.id, source.spec_for(rec)[1]), rec)
        except AudioError as e:
            res.bad.append((rec, str(e)))
    have = table.catalog(k for _, k in keys)
    todo = [rec for k, rec in keys.items() if k not in have]
    res.present = len(keys) - len(todo)
    if not todo:
        return res
    sc = spark.sparkContext
    n_tasks = max(-(-len(todo) // MAX_CHUNK), min(len(todo), 4 * sc.defaultParallelism))
    bounds = np.linspace(0, len(todo), n_tasks + 1).astype(int)      # contiguous: parts keep the data set's order
    chunks = [todo[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    spec, rate, channels, device = source.spec, source.rate, source.channels, source.device
    with job_progress(sc, "features", enable=progress):
        out = checked(sc.parallelize(chunks, len(chunks)).map(on_executor(
            lambda c: _extract_chunk(table, spec, rate, channels, device, c))).collect())   # one summary per task
    for chunk, summary in zip(chunks, out):
        res.bad += [(chunk[j], msg) for j, msg in summary["bad"]]
        res.extracted += summary["extracted"]
        if summary["dims"]:
            res.dim = summary["dims"][0]
    return res
