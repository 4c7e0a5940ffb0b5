"""Results per group of recordings (each value of ``evaluate --group-by``: a speaker, a machine
unit): a classifier's accuracy and a detector's recording counts per group, counted from the
windows of an evaluation, and the table ``evaluate`` prints of them, weakest group first.

A window's group is its recording's; ``places`` name each window's recording by its place in
the data set, so that a group's recordings are counted once however many windows they have.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from wavetrain.evaluation.metrics import confusion, scores


def window_groups(places: Sequence[int], names: Sequence[str]) -> list[str]:
    """Each window's group: ``names[place]`` of its recording's place."""
    return [names[p] for p in places]


def recordings_per_group(groups: Sequence[str], places: Sequence[int]) -> dict[str, int]:
    """How many recordings (distinct ``places``) have windows in each group, by group name."""
    seen: dict[str, set[int]] = defaultdict(set)
    for g, p in zip(groups, places):
        seen[g].add(p)
    return {g: len(seen[g]) for g in sorted(seen)}


def classifier_groups(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str],
                      groups: Sequence[str], places: Sequence[int]) -> dict[str, dict]:
    """A classifier's figures per group, by group name (sorted).

    Parameters
    ----------
    y_true, y_pred : sequence of str
        Each window's true and predicted value.
    labels : sequence of str
        The values the pooled report counts (:func:`~wavetrain.evaluation.metrics.confusion`).
    groups : sequence of str
        Each window's group.
    places : sequence of int
        Each window's recording (its place in the data set).

    Returns
    -------
    dict
        ``{group: {"accuracy", "macro_f1", "windows", "correct", "recordings"}}``: the share of
        the group's windows answered right, the mean F1 over the values its windows have,
        its windows, those answered right and its recordings.
    """
    rows: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        rows[g].append(i)
    counts = recordings_per_group(groups, places)
    out = {}
    for g in sorted(rows):
        idx = rows[g]
        cm = confusion([y_true[i] for i in idx], [y_pred[i] for i in idx], labels)
        s = scores(cm, labels)
        out[g] = {"accuracy": s["accuracy"], "macro_f1": s["macro_f1"], "windows": s["windows"],
                  "correct": int(np.trace(cm[:, :len(labels)])), "recordings": counts[g]}
    return out


def weakest_first(groups: dict[str, dict], metric: str) -> list[str]:
    """The group names ordered by ``metric``, lowest first, ties by name; groups where it is NaN
    (a detector's group without both kinds of window) last."""
    def key(g: str) -> tuple[bool, float, str]:
        v = float(groups[g][metric])
        return (not np.isfinite(v), v if np.isfinite(v) else 0.0, g)

    return sorted(groups, key=key)


def _missing_kind(r: dict) -> str:
    """Why a detector's group has no AUC: ``only normal windows`` (or anomalous, or none)."""
    if r["normal"] and not r["anomalous"]:
        return "only normal windows"
    if r["anomalous"] and not r["normal"]:
        return "only anomalous windows"
    return "no windows"


def _fmt(x: float) -> str:
    return "   n/a" if not np.isfinite(x) else f"{x:.4f}"


def format_groups(result: dict) -> str:
    """The per-group table of an evaluation result (empty without ``groups``): weakest group
    first — a classifier's by accuracy, a detector's by AUC, with its groups that lack normal or
    anomalous windows (no AUC) last, saying which they lack."""
    groups = result.get("groups") or {}
    if not groups:
        return ""
    by = str(result.get("group_by") or "group").replace(",", "/")
    w = max(len(by), max(len(g) for g in groups))
    if result.get("detector"):
        lines = [f"per {by}, weakest AUC first:",
                 f"{by:<{w}}     AUC    pAUC  precision  recall      F1  normal  anomalous  recordings"]
        for g in weakest_first(groups, "auc"):
            r = groups[g]
            line = (f"{g:<{w}}  {_fmt(r['auc'])}  {_fmt(r['pauc'])}  {r['precision']:9.4f}  {r['recall']:6.4f}  "
                    f"{r['f1']:6.4f}  {r['normal']:6d}  {r['anomalous']:9d}  {r.get('recordings', 0):10d}")
            if not np.isfinite(r["auc"]):
                line += f"  (no AUC: {_missing_kind(r)})"
            lines.append(line)
        return "\n".join(lines)
    lines = [f"per {by}, weakest first:",
             f"{by:<{w}}  accuracy  macro-F1  windows  recordings"]
    for g in weakest_first(groups, "accuracy"):
        r = groups[g]
        lines.append(f"{g:<{w}}  {r['accuracy']:8.4f}  {r['macro_f1']:8.4f}  {r['windows']:7d}  {r['recordings']:10d}")
    return "\n".join(lines)
