"""Extraction of a :class:`~wavetrain.features.spec.CombinedSpec` (``SPEC_A + SPEC_B [+ ...]``):
one decode, each part extracted from the same samples, the parts' frames aligned onto the first
part's frame grid, concatenated along the feature axis.

Alignment rule: with the signal's ``n`` samples at the extraction rate, frame ``j`` of a part
with sub-window ``size`` and step ``step`` is centred at sample ``j * step + size / 2``
(``whole=true``: one frame of the whole clip, centred at ``n / 2``; a part whose processors reduce
over time to ``T`` frames: ``T`` frames spread evenly over the clip, ``(j + 1/2) n / T``).  Output
frame ``t`` (the first part's frame ``t``) takes, from every other part, the frame whose centre is
nearest to its own centre, clipped to the part's frames; a tie goes to the later frame.  Parts
with the same sub-window and shift therefore line up frame by frame.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wavetrain.features.spec import CombinedSpec, FeatureSpec

__all__ = ["align_parts", "extract_blocks_combined", "frame_centres2", "nearest_frames", "part_rows"]


def _geometry(part: FeatureSpec, n: int, rate: int) -> tuple[int, int, int, bool]:
    """``(size, step, frames out, on the extractor's grid)`` of a part for ``n`` samples at
    ``rate`` (the extraction rate)."""
    ext = part.build_extractor()
    size = ext.frame_size(rate, n)
    step = ext.frame_step(rate, size)
    t_ext = ext.n_frames(n, rate)
    t_out = part.build_pipeline().n_frames(t_ext) if t_ext else 0
    return size, step, t_out, t_out == t_ext


def frame_centres2(part: FeatureSpec, n: int, rate: int) -> np.ndarray:
    """Twice the centre (in samples, so integers) of each output frame of ``part`` for ``n``
    samples at ``rate`` (see the module's alignment rule)."""
    size, step, t, on_grid = _geometry(part, n, rate)
    j = np.arange(t, dtype=np.int64)
    if on_grid:   # (a clip padded to a minimum length is padded on both sides: frames start before 0)
        left = (part.build_extractor().pad_to(n, rate) - n) // 2
        return 2 * j * step + size - 2 * left
    return (2 * j + 1) * n // max(t, 1)


def nearest_frames(grid: FeatureSpec, part: FeatureSpec, n: int, rate: int) -> np.ndarray:
    """For each output frame of ``grid``, the index of ``part``'s frame whose centre is nearest
    (ties: the later frame), for ``n`` samples at ``rate``."""
    c2 = frame_centres2(grid, n, rate)
    size, step, t, on_grid = _geometry(part, n, rate)
    if t <= 1:
        return np.zeros(len(c2), dtype=np.int64)
    if on_grid:
        # nearest j to (c - size/2) / step, i.e. floor((2c - size + step) / (2 step))
        idx = (c2 - size + step) // (2 * step)
    else:
        # centres (2j + 1) n / (2t): nearest j = floor(c t / n)
        idx = (c2 * t) // (2 * n)
    return np.clip(idx, 0, t - 1)


def align_parts(spec: CombinedSpec, grams: list[np.ndarray], n: int, rate: int) -> np.ndarray:
    """Concatenate the parts' grams ``(..., frames_k, features_k)`` of one signal (or a batch) of
    ``n`` samples at ``rate`` onto the first part's frame grid: ``(..., frames_0, sum features)``,
    float32."""
    first = grams[0]
    t0 = first.shape[-2]
    cols = [first]
    for part, g in zip(spec.parts[1:], grams[1:]):
        if g.shape[-2] == t0 and _same_grid(spec.parts[0], part, n, rate):
            cols.append(g)
            continue
        idx = nearest_frames(spec.parts[0], part, n, rate)
        cols.append(np.take(g, idx, axis=-2))
    return np.concatenate(cols, axis=-1).astype(np.float32, copy=False)


def part_rows(spec: CombinedSpec, k: int, frames: int, rate: int) -> np.ndarray | None:
    """Rows of a combined gram with ``frames`` rows that give back part ``k``'s own frames, each
    once (the first row aligned to each of them), or None when every row is a frame of its own
    (part ``k`` on the first part's grid, or finer).  A part on a coarser grid - e.g. ``logmel``
    at 20 ms beside ``mfcc`` at 10 ms - is repeated by the alignment; these rows undo that.  The
    signal's length is taken as the shortest that gives ``frames`` frames, so a part frame that
    only the last row holds may be left out."""
    if k == 0 or frames <= 1:
        return None
    size, step, _, on_grid = _geometry(spec.parts[0], 1 << 20, rate)
    if not on_grid:
        return None
    first = np.unique(nearest_frames(spec.parts[0], spec.parts[k], size + (frames - 1) * step, rate),
                      return_index=True)[1]
    return None if len(first) == frames else first


def _same_grid(a: FeatureSpec, b: FeatureSpec, n: int, rate: int) -> bool:
    ga, gb = _geometry(a, n, rate), _geometry(b, n, rate)
    return ga[:3] == gb[:3] and ga[3] and gb[3]


def extract_blocks_combined(read: Callable[[int, int], np.ndarray], n: int, rate: int, spec: CombinedSpec,
                            block_s: float, check: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | None:
    """Features of a long mono signal under a combined spec, decoded a block at a time: each
    block of samples is read once and every part extracts the frames that start in it (blocks
    overlap by the longest sub-window).  ``None`` when a part needs the whole signal at once
    (resampling, per-axis or whole-clip parts).  ``check`` validates each block's samples."""
    if spec.rate not in (None, rate) or spec.per_axis:
        return None
    exts = [p.build_extractor() for p in spec.parts]
    if any(getattr(e.config, "whole", False) or e.pad_to(n, rate) > n for e in exts):
        return None
    sizes = [e.frame_size(rate) for e in exts]
    steps = [e.frame_step(rate, s) for e, s in zip(exts, sizes)]
    if n < max(sizes):
        return None  # the caller extracts it whole (and raises the usual error when too short)
    totals = [1 + (n - s) // st for s, st in zip(sizes, steps)]
    hop = max(int(block_s * rate), max(steps))
    outs: list[np.ndarray | None] = [None] * len(exts)
    for a in range(0, n, hop):
        if all(-(-a // st) >= tot for st, tot in zip(steps, totals)):
            break
        x = check(read(a, min(n, a + hop + max(sizes))))
        for k, (ext, size, step, total) in enumerate(zip(exts, sizes, steps, totals)):
            j0, j1 = -(-a // step), min(total, -(-(a + hop) // step))
            if j0 >= j1:
                continue
            g = ext.extract_batch(x[None, j0 * step - a:(j1 - 1) * step + size - a], rate)[0]
            out = outs[k]
            if out is None:
                out = outs[k] = np.empty((total, g.shape[1]), dtype=np.float32)
            out[j0:j1] = g
    grams = []
    for part, out in zip(spec.parts, outs):
        assert out is not None  # every part has >= 1 frame (n >= its size) and frame 0 starts in block 0
        grams.append(part.build_pipeline().process(out[None])[0] if part.processors else out)
    return align_parts(spec, grams, n, rate)
