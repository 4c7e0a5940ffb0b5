"""Anomaly-detection metrics: ROC curve, ROC AUC, partial AUC, the figures at a threshold, a
threshold for a target false-alarm rate, and the report ``evaluate`` prints for a detector.

Scores are "higher = more anomalous"; ``y`` is 1 for an anomalous window and 0 for a normal one.
The partial AUC is the one of the DCASE machine-sound task's evaluator (scikit-learn's
``roc_auc_score(max_fpr=p)``): the area under the ROC curve for FPR ≤ p, standardised by McClish's
correction so that a random detector scores 0.5 and a perfect one 1.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The false-positive rate up to which the partial AUC is taken (DCASE's p = 0.1).
PAUC_MAX_FPR = 0.1


def roc_curve(y: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fpr, tpr, thresholds)`` at every distinct score (a window is flagged when its score is
    ≥ the threshold), starting at (0, 0) with threshold +inf; ties move both rates at once."""
    y = np.asarray(y, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s)), s.size - 1]      # the last row of each distinct score
    tp = np.cumsum(y)[last]
    fp = (last + 1) - tp
    pos, neg = max(int(y.sum()), 1), max(int(y.size - y.sum()), 1)
    return (np.r_[0.0, fp / neg], np.r_[0.0, tp / pos], np.r_[np.inf, s[last]])


def roc_auc(y, scores) -> float:
    """Area under the ROC curve: the probability that an anomalous window scores above a normal
    one (ties count half). NaN unless both kinds are present."""
    y = np.asarray(y, dtype=np.int64)
    if y.size == 0 or y.min() == y.max():
        return float("nan")
    fpr, tpr, _ = roc_curve(y, scores)
    return float(np.trapezoid(tpr, fpr))


def partial_auc(y, scores, max_fpr: float = PAUC_MAX_FPR) -> float:
    """Standardised partial AUC for FPR ≤ ``max_fpr`` (McClish; as scikit-learn's
    ``roc_auc_score(max_fpr=...)`` and the DCASE evaluator). NaN unless both kinds are present."""
    y = np.asarray(y, dtype=np.int64)
    if y.size == 0 or y.min() == y.max():
        return float("nan")
    fpr, tpr, _ = roc_curve(y, scores)
    stop = int(np.searchsorted(fpr, max_fpr, side="right"))
    x, t = fpr[:stop], tpr[:stop]
    if stop < fpr.size:                                          # interpolate the curve at max_fpr
        x = np.r_[x, max_fpr]
        t = np.r_[t, np.interp(max_fpr, fpr[stop - 1:stop + 1], tpr[stop - 1:stop + 1])]
    area = float(np.trapezoid(t, x))
    lo, hi = max_fpr ** 2 / 2, max_fpr
    return 0.5 * (1 + (area - lo) / (hi - lo))


def threshold_at_fpr(normal_scores: Sequence[float] | np.ndarray, fpr: float) -> float:
    """The threshold that flags about ``fpr`` of ``normal_scores`` (a score above it is
    anomalous): their (1 − fpr) quantile, rounded up to a score. With few scores it is coarse:
    with 12, the 0.95 quantile is the largest, which about one normal window in 13 exceeds, with
    a wide spread (fitting a normal or gamma distribution to so few scores, as DCASE's baseline
    does, measured no steadier)."""
    s = np.asarray(normal_scores, dtype=np.float64)
    if s.size == 0:
        raise ValueError("no normal scores to set a threshold on")
    return float(np.quantile(s, 1.0 - fpr, method="higher"))


def at_threshold(y, scores, threshold: float) -> dict:
    """Precision, recall (true-positive rate), F1 and false-positive rate of flagging the windows
    whose score exceeds ``threshold``."""
    y = np.asarray(y, dtype=np.int64)
    flagged = np.asarray(scores, dtype=np.float64) > threshold
    tp = int((flagged & (y == 1)).sum())
    fp = int((flagged & (y == 0)).sum())
    fn = int((~flagged & (y == 1)).sum())
    tn = int((~flagged & (y == 0)).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "fpr": fp / (fp + tn) if fp + tn else 0.0,
            "tp": tp, "fp": fp, "fn": fn, "tn": tn}


def detection_report(y, scores, threshold: float, groups: Sequence[str] | None = None) -> dict:
    """AUC, pAUC and the figures at ``threshold``, overall and (with ``groups``, one name per
    window) per group; ``normal``/``anomalous`` count the windows of each kind."""
    y = np.asarray(y, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)

    def one(mask: np.ndarray) -> dict:
        out = {"auc": roc_auc(y[mask], s[mask]), "pauc": partial_auc(y[mask], s[mask]),
               "normal": int((y[mask] == 0).sum()), "anomalous": int((y[mask] == 1).sum())}
        out.update(at_threshold(y[mask], s[mask], threshold))
        return out

    res = one(np.ones(y.size, dtype=bool))
    res.update(threshold=float(threshold), windows=int(y.size), max_fpr=PAUC_MAX_FPR)
    if groups is not None:
        g = np.asarray(groups, dtype=object)
        res["groups"] = {str(v): one(g == v) for v in sorted(set(g.tolist()))}
    return res


def _fmt(x: float) -> str:
    return "   n/a" if not np.isfinite(x) else f"{x:.4f}"


def format_detection_report(result: dict) -> str:
    """Human-readable detector evaluation: overall, then one line per group."""
    lines = [f"AUC {_fmt(result['auc'])}  pAUC {_fmt(result['pauc'])} (FPR <= {result['max_fpr']})   "
             f"at threshold {result['threshold']:.4g}: precision {result['precision']:.4f}  recall "
             f"{result['recall']:.4f}  F1 {result['f1']:.4f}  false alarms {result['fpr']:.4f}   "
             f"windows={result['windows']} ({result['normal']} normal, {result['anomalous']} anomalous)"]
    spread = result.get("folds_summary")
    if spread:
        lines.append(f"per fold: AUC {spread['auc']['mean']:.4f} ± {spread['auc']['sd']:.4f}  pAUC "
                     f"{spread['pauc']['mean']:.4f} ± {spread['pauc']['sd']:.4f}")
    groups = result.get("groups") or {}
    if groups:
        w = max(5, max(len(g) for g in groups))
        lines.append(f"{'group':<{w}}     AUC    pAUC  precision  recall      F1  normal  anomalous")
        for g, r in groups.items():
            lines.append(f"{g:<{w}}  {_fmt(r['auc'])}  {_fmt(r['pauc'])}  {r['precision']:9.4f}  {r['recall']:6.4f}  "
                         f"{r['f1']:6.4f}  {r['normal']:6d}  {r['anomalous']:9d}")
    return "\n".join(lines)


def fold_mean_sd(values: Sequence[float]) -> dict:
    """Mean and sd (ddof 1) of per-fold figures, NaN folds left out."""
    a = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if a.size == 0:
        return {"mean": float("nan"), "sd": float("nan")}
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if a.size > 1 else 0.0}
