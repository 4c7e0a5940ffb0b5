"""Splits of a data set that never leak (k-fold test folds, a validation hold-out).

Folds are made of whole recordings (all clips of a recording on one side) and, with
``group_by``, of whole groups (e.g. speakers); recordings with identical content (the same
content hash: copies under other names) always fall on one side, together with their groups."""
from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.data.dataset import Dataset

log = logging.getLogger(__name__)


def _groups(ds: Dataset, group_by: str | None) -> list[str]:
    """Group key of each recording: the ``group_by`` label value, else the audio file (so that
    segments of one file stay together); groups that share a recording's content are merged."""
    groups = _plain_groups(ds, group_by)
    parent: dict[str, str] = {}

    def find(g: str) -> str:
        while parent.get(g, g) != g:
            parent[g] = parent.get(parent[g], parent[g])
            g = parent[g]
        return g

    for same in duplicate_groups(ds):              # union-find: one key per set of groups
        for i in same[1:]:
            a, b = find(groups[same[0]]), find(groups[i])
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [find(g) for g in groups]


def duplicate_groups(ds: Dataset) -> list[list[int]]:
    """Indices of recordings with identical content (the same content hash and segment), one
    list per content that occurs more than once, in data set order.

    Only recordings whose files have the same size (and segment) are hashed: a data set without
    copies is read for headers only."""
    by_size: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(ds):
        by_size[(os.stat(r.path).st_size, r.segment_ms)].append(i)
    out = []
    for candidates in by_size.values():
        if len(candidates) > 1:
            by_id: dict[str, list[int]] = defaultdict(list)
            for i in candidates:
                by_id[ds[i].id].append(i)
            out += [idx for idx in by_id.values() if len(idx) > 1]
    return sorted(out)


def _plain_groups(ds: Dataset, group_by: str | None) -> list[str]:
    if group_by is None:
        return [str(r.path.resolve()) for r in ds]
    if "," in group_by:                            # several labels: their values together
        parts = [_plain_groups(ds, g.strip()) for g in group_by.split(",") if g.strip()]
        return ["/".join(vs) for vs in zip(*parts)]
    key = ds.resolve_label(group_by) if group_by in ds.label_names() or ds.folder_labels else None
    if key is None:
        tags = {k for r in ds for k in r.tags}
        if group_by not in tags:
            raise ParameterError(f"group_by={group_by!r}: no label or tag of that name; labels: "
                            f"{', '.join(ds.label_names())}")
        return [r.tags.get(group_by) or f"?{i}" for i, r in enumerate(ds)]
    missing = [r for r in ds if not r.labels.get(key)]
    if missing:
        raise ParameterError(f"group_by={group_by!r}: {len(missing)} recordings have no value for it "
                        f"(first: {missing[0].name})")
    return [r.labels[key] for r in ds]


def kfold_indices(ds: Dataset, k: int, *, group_by: str | None = None, seed: int = 0,
                  stratify: str | None = None) -> list[np.ndarray]:
    """Split recording indices into ``k`` folds of whole groups (groups sharing identical
    recordings merged).

    Without ``stratify``: the largest groups first, each to the fold with the fewest recordings
    so far (fold sizes balanced; label values are not). With ``stratify`` (a label): folds
    stratified within groups, as scikit-learn's ``StratifiedGroupKFold`` — groups in order of how
    unevenly their recordings spread over the label's values (most uneven first, ties broken by
    ``seed``), each to the fold that keeps every value's share per fold most even (the spread of
    the shares over folds, summed over values), then the fold with fewest recordings.

    Returns a list of ``k`` arrays of test indices (every recording in exactly one fold).
    """
    if k < 2:
        raise ParameterError(f"folds: expected at least 2, got {k}", param="folds")
    groups = _groups(ds, group_by)
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    if len(members) < k:
        what = f"values of {group_by!r}" if group_by else "recordings (audio files, copies counted once)"
        raise ParameterError(f"folds={k}: only {len(members)} {what}; use {max(2, len(members))} folds or fewer",
                             param="folds")
    rng = np.random.default_rng(seed)
    keys = list(members)
    rng.shuffle(keys)
    folds: list[list[int]] = [[] for _ in range(k)]
    if stratify is None:
        # largest groups first, each to the fold that has the fewest recordings so far
        keys.sort(key=lambda g: -len(members[g]))
        for g in keys:
            j = min(range(k), key=lambda f: (len(folds[f]), f))
            folds[j].extend(members[g])
        return [np.array(sorted(f), dtype=np.int64) for f in folds]
    values = ds.values(stratify)
    names = sorted({v or "" for v in values})
    col = {v: c for c, v in enumerate(names)}
    counts = {g: np.bincount([col[values[i] or ""] for i in members[g]], minlength=len(names)) for g in keys}
    total = np.maximum(sum(counts.values()), 1)
    keys.sort(key=lambda g: -float(np.std(counts[g])))          # stable: seed order among equals
    per_fold = np.zeros((k, len(names)))
    for g in keys:
        cost = [(_spread(per_fold, f, counts[g], total), len(folds[f]), f) for f in range(k)]
        j = min(cost)[2]
        per_fold[j] += counts[g]
        folds[j].extend(members[g])
    return [np.array(sorted(f), dtype=np.int64) for f in folds]


def _spread(per_fold: np.ndarray, f: int, add: np.ndarray, total: np.ndarray) -> float:
    """How unevenly each value spreads over the folds (sum over values of the sd of its shares)
    if ``add`` went to fold ``f``."""
    trial = per_fold.copy()
    trial[f] += add
    return float(np.std(trial / total, axis=0).sum())


def holdout_split(ds: Dataset, fraction: float, *, seed: int = 0, group_by: str | None = None,
                  strata: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, valid)`` with about ``fraction`` of the recordings (whole groups) held out.

    With too few groups for that (one group more than twice ``fraction`` of them: fewer than 5
    groups for 0.1) recordings are held out instead, with a warning: holding out one of two
    speakers would train on half the data, and on one voice.

    ``strata``: label names; about ``fraction`` of the groups of each combination of their values
    is held out (at least one of a combination with two or more groups, none of one with a single
    group), so that every combination with two or more groups has held-out recordings."""
    if not 0 < fraction < 1:
        raise UserError(f"validation fraction: expected in (0, 1), got {fraction}")
    groups = _groups(ds, group_by)
    if group_by is not None and len(set(groups)) * 2 * fraction < 1:
        log.warning("only %d values of %r: holding out %.0f%% of the recordings for validation, not whole groups",
                    len(set(groups)), group_by, 100 * fraction)
        groups = _groups(ds, None)
    keys = sorted(set(groups))
    rng = np.random.default_rng(seed)
    rng.shuffle(keys)
    if strata:
        columns = [ds.values(name) for name in strata]
        stratum: dict[object, tuple[str, ...]] = {}
        for i, g in enumerate(groups):
            stratum.setdefault(g, tuple(c[i] or "" for c in columns))
        held: set = set()
        for s in dict.fromkeys(stratum[g] for g in keys):
            members = [g for g in keys if stratum[g] == s]
            if len(members) > 1:
                held.update(members[:max(1, int(round(len(members) * fraction)))])
        if not held:
            raise UserError(f"cannot hold out {fraction:.0%} for validation: no value of {', '.join(strata)} has "
                            "two groups")
    else:
        n_valid = max(1, int(round(len(keys) * fraction)))
        if n_valid >= len(keys):
            raise UserError(f"cannot hold out {fraction:.0%} for validation: only {len(keys)} groups")
        held = set(keys[:n_valid])
    valid = np.array([i for i, g in enumerate(groups) if g in held], dtype=np.int64)
    train = np.array([i for i, g in enumerate(groups) if g not in held], dtype=np.int64)
    return train, valid


def rare_values(ds: Dataset, label: str, k: int, group_by: str | None = None) -> dict[str, int]:
    """Label values with fewer than ``k`` recordings (or groups): they cannot appear in every fold."""
    key = ds.resolve_label(label)
    groups = _groups(ds, group_by)
    per_value: dict[str, set] = defaultdict(set)
    for r, g in zip(ds, groups):
        v = r.labels.get(key)
        if v:
            per_value[v].add(g)
    return {v: len(gs) for v, gs in per_value.items() if len(gs) < k}
