"""Classification metrics: accuracy, per-value precision/recall/F1, micro and macro means,
confusion matrix, their mean ± sd over folds (and over repeated cross-validations), and top-k
accuracy.

Macro means (and :func:`macro_f1`) average over the values with support — those that occur
among the true values — as ``evaluate`` reports them everywhere (training validation included).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def confusion(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str]) -> np.ndarray:
    """Counts ``(len(labels), len(labels) + 1)``: rows true value, columns predicted value; the
    extra last column counts predictions outside ``labels`` (e.g. 'unknown')."""
    idx = {v: i for i, v in enumerate(labels)}
    cm = np.zeros((len(labels), len(labels) + 1), dtype=np.int64)
    for t, p in zip(y_true, y_pred):
        if t in idx:
            cm[idx[t], idx.get(p, len(labels))] += 1
    return cm


def scores(cm: np.ndarray, labels: Sequence[str]) -> dict:
    """Metrics from a confusion matrix as returned by :func:`confusion`."""
    k = len(labels)
    tp = np.diag(cm[:, :k]).astype(float)
    support = cm.sum(axis=1).astype(float)
    predicted = cm[:, :k].sum(axis=0).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = np.where(predicted > 0, tp / predicted, 0.0)
        rec = np.where(support > 0, tp / support, 0.0)
        f1 = np.where(prec + rec > 0, 2 * prec * rec / (prec + rec), 0.0)
    total = support.sum()
    acc = float(tp.sum() / total) if total else 0.0
    present = support > 0
    micro_p = float(tp.sum() / predicted.sum()) if predicted.sum() else 0.0
    micro_r = acc
    micro_f1 = 2 * micro_p * micro_r / (micro_p + micro_r) if micro_p + micro_r else 0.0
    return {
        "accuracy": acc,
        "windows": int(total),
        "per_value": {v: {"precision": float(prec[i]), "recall": float(rec[i]), "f1": float(f1[i]),
                          "support": int(support[i])} for i, v in enumerate(labels)},
        "micro": {"precision": micro_p, "recall": micro_r, "f1": micro_f1},
        "macro": {"precision": float(prec[present].mean()) if present.any() else 0.0,
                  "recall": float(rec[present].mean()) if present.any() else 0.0,
                  "f1": float(f1[present].mean()) if present.any() else 0.0},
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
    }


#: Name of the confusion matrix's last column: predictions outside the label values (e.g. a
#: GMM's ``unknown``).
OTHER = "(other)"


def report(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str]) -> dict:
    """:func:`scores` plus the confusion matrix with the names of its rows (true values) and
    columns (predicted values, then :data:`OTHER`)."""
    return confusion_report(confusion(y_true, y_pred, labels), labels)


def confusion_report(cm: np.ndarray, labels: Sequence[str]) -> dict:
    """:func:`report` of a confusion matrix (rows: true values; columns: predicted, then
    :data:`OTHER`) — e.g. one summed over the parts of a distributed evaluation."""
    out = scores(cm, labels)
    out.update(labels=list(labels), confusion=cm.tolist(), confusion_rows=list(labels),
               confusion_columns=list(labels) + [OTHER])
    return out


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """:func:`scores`'s ``macro_f1`` of integer class indices: the mean F1 over the classes present
    in ``y_true`` (a class only ever predicted lowers the others' precision, not the mean's count)."""
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    if y_true.size == 0:
        return 0.0
    k = int(max(y_true.max(), y_pred.max(initial=0))) + 1
    cm = np.zeros((k, k + 1), dtype=np.int64)
    np.add.at(cm, (y_true, y_pred), 1)
    return float(scores(cm, [str(c) for c in range(k)])["macro_f1"])


def topk_accuracy(proba: np.ndarray, y: np.ndarray, k: int) -> float:
    """Fraction of rows of ``proba`` [shape=(n, K)] whose true class ``y`` is among the top ``k``."""
    k = min(k, proba.shape[1])
    top = np.argpartition(-proba, k - 1, axis=1)[:, :k]
    return float((top == y[:, None]).any(axis=1).mean())


def fold_spread(fold_scores: list[dict]) -> dict:
    """Mean and sd over folds of accuracy, macro and micro F1/precision/recall."""
    def ms(values):
        a = np.asarray(values, dtype=float)
        return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if len(a) > 1 else 0.0}

    out = {"accuracy": ms([s["accuracy"] for s in fold_scores])}
    for avg in ("macro", "micro"):
        out[avg] = {m: ms([s[avg][m] for s in fold_scores]) for m in ("precision", "recall", "f1")}
    return out


def repeat_summary(repeats: Sequence[dict], metrics: Sequence[str]) -> dict:
    """Mean and sd (ddof 1; 0 for one repeat) over repeated cross-validations of each of
    ``metrics`` (e.g. ``accuracy``, ``macro_f1``; ``auc``, ``pauc``): ``{metric: {mean, sd}}``.
    Repeats where a figure is NaN (an AUC without both kinds of window) are left out of it."""
    out = {}
    for m in metrics:
        a = np.asarray([r[m] for r in repeats], dtype=float)
        a = a[np.isfinite(a)]
        out[m] = ({"mean": float("nan"), "sd": float("nan")} if a.size == 0 else
                  {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if a.size > 1 else 0.0})
    return out


_REPEAT_NAMES = {"accuracy": "accuracy", "macro_f1": "macro-F1", "auc": "AUC", "pauc": "pAUC"}


def format_repeat_summary(result: dict) -> str:
    """The mean ± sd over the repeated cross-validations, then one line per repeat (empty without
    ``repeats``)."""
    repeats = result.get("repeats")
    if not repeats:
        return ""
    summary = result["repeat_summary"]
    lines = [f"over {len(repeats)} repeats: " + "  ".join(
        f"{_REPEAT_NAMES.get(m, m)} {v['mean']:.4f} ± {v['sd']:.4f}" for m, v in summary.items())]
    for r in repeats:
        figures = "  ".join(f"{_REPEAT_NAMES.get(m, m)} {r[m]:.4f}" for m in summary)
        seeds = f"seed {r['seed']}" + (f", model seed {r['model_seed']}" if r.get("model_seed") is not None else "")
        lines.append(f"repeat {r['repeat']} ({seeds}): {figures}")
    return "\n".join(lines)


def format_report(result: dict, *, show_cm: bool = False) -> str:
    """Human-readable evaluation report."""
    labels = result["labels"]
    lines = []
    spread = result.get("folds_summary")
    acc = f"{result['accuracy']:.4f}"
    if spread:
        acc += f"   (per fold {spread['accuracy']['mean']:.4f} ± {spread['accuracy']['sd']:.4f})"
    lines.append(f"accuracy  {acc}   windows={result['windows']}")
    w = max(len("macro mean"), max(len(v) for v in labels))       # (the mean rows' names fit the column)
    lines.append(f"{'value':<{w}}  precision  recall     f1  support")
    for v in labels:
        s = result["per_value"][v]
        lines.append(f"{v:<{w}}  {s['precision']:9.4f}  {s['recall']:6.4f}  {s['f1']:5.4f}  {s['support']:7d}")
    for avg in ("micro", "macro"):
        s = result[avg]
        extra = ""
        if spread:
            extra = f"   (f1 per fold {spread[avg]['f1']['mean']:.4f} ± {spread[avg]['f1']['sd']:.4f})"
        lines.append(f"{avg + ' mean':<{w}}  {s['precision']:9.4f}  {s['recall']:6.4f}  {s['f1']:5.4f}{extra}")
    if show_cm:
        cm = np.asarray(result["confusion"])
        cols = list(labels) + ([OTHER] if cm[:, -1].any() else [])
        cw = max(6, max(len(c) for c in cols))
        lines.append("confusion (rows: true, columns: predicted)")
        lines.append(" " * w + "  " + " ".join(f"{c:>{cw}}" for c in cols))
        for i, v in enumerate(labels):
            lines.append(f"{v:<{w}}  " + " ".join(f"{int(x):>{cw}}" for x in cm[i, :len(cols)]))
    return "\n".join(lines)
