"""Anomaly-detection metrics: ROC curve, ROC AUC, partial AUC, the figures at a threshold, a
threshold for a target false-alarm rate, and the report ``evaluate`` prints for a detector.

Scores are "higher = more anomalous"; ``y`` is 1 for an anomalous window and 0 for a normal one.
The partial AUC is the one of the DCASE machine-sound task's evaluator (scikit-learn's
``roc_auc_score(max_fpr=p)``): the area under the ROC curve for FPR ≤ p, standardised by McClish's
correction so that a random detector scores 0.5 and a perfect one 1.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    a wide spread; :func:`fit_threshold` then fits a distribution instead."""
    s = np.asarray(normal_scores, dtype=np.float64)
    if s.size == 0:
        raise ValueError("no normal scores to set a threshold on")
    return float(np.quantile(s, 1.0 - fpr, method="higher"))


#: Fewer held-out windows than this many per expected false alarm (windows × fpr < this): the
#: threshold comes from a gamma distribution fitted to the scores, not from their quantile.
GAMMA_BELOW_ALARMS = 10
#: Central share of the expected false-alarm range reported at training (10th to 90th percentile).
RANGE_COVERAGE = 0.8


@dataclass(frozen=True)
class ThresholdFit:
    """A threshold set on normal windows' scores, and what to expect of it.

    Attributes
    ----------
    threshold : float
        Scores above it are anomalous.
    method : {'quantile', 'gamma', 'sigmas'}
        The scores' ``1 - fpr`` quantile, or the ``1 - fpr`` quantile of a gamma distribution
        fitted to them (shifted to be positive), as the DCASE baseline does (``sigmas``: a
        boundary given, ``normal-dist``; its range is the share of the windows above it).
    windows : int
        Scores it was set on.
    fpr_range : (float, float)
        The false-alarm rate expected on new normal windows, 10th to 90th percentile (from the
        spread of the estimate with this few windows).
    """

    threshold: float
    method: str
    windows: int
    fpr_range: tuple[float, float]

    def describe(self) -> str:
        """``a gamma fit to 12 windows: 2-11% expected`` (percent, the expected range)."""
        lo, hi = (100 * v for v in self.fpr_range)
        if self.method == "sigmas":
            return f"the sigmas boundary: {lo:.0f}% of the {self.windows} windows above it"
        how = "a gamma fit to" if self.method == "gamma" else "the quantile of"
        return f"{how} {self.windows} windows: {lo:.0f}-{hi:.0f}% false alarms expected"


def _gamma_shift(s: np.ndarray) -> float:
    """What is subtracted from scores before a gamma (location 0) is fitted to them: the lowest
    score less one standard deviation, so that they are positive and the fit's location follows
    theirs (a score far from 0 with a small spread would otherwise be fitted by a narrow,
    nearly normal gamma with too light a tail)."""
    return float(s.min()) - max(float(s.std()), 1e-12)


def _gamma_params(s: np.ndarray) -> tuple[float, float]:
    from scipy import stats

    a, _, scale = stats.gamma.fit(s, floc=0.0)
    return float(a), float(scale)


def gamma_threshold(normal_scores: Sequence[float] | np.ndarray, fpr: float) -> float:
    """The ``1 - fpr`` quantile of a gamma distribution fitted (maximum likelihood, location 0)
    to ``normal_scores`` shifted to start one standard deviation above 0, shifted back: a smooth threshold from few
    scores (the DCASE baseline's ``scipy.stats.gamma.fit`` and ``ppf(1 - fpr)``). It is a plug-in
    estimate: new normal windows exceed it more often than ``fpr`` on average
    (:func:`fit_threshold` corrects for that)."""
    from scipy import stats

    s = np.asarray(normal_scores, dtype=np.float64)
    shift = _gamma_shift(s)
    a, scale = _gamma_params(s - shift)
    return float(stats.gamma.ppf(1.0 - fpr, a, scale=scale) + shift)


def _calibrated_gamma(s: np.ndarray, fpr: float, draws: int, seed: int) -> tuple[float, np.ndarray]:
    """A gamma threshold whose false-alarm rate is ``fpr`` on average over the uncertainty of a
    fit to ``s.size`` scores, and the rates of the draws.

    Samples of ``n`` scores are drawn from the gamma fitted to ``s`` and fitted again; the
    quantile level ``1 - f`` is found (bisection on ``f``) at which their thresholds flag, on
    average, ``fpr`` of the first fit's distribution; the threshold is that quantile of the
    first fit. Returns the threshold (in score units) and the draws' false-alarm rates there.
    """
    from scipy import stats

    shift = _gamma_shift(s)
    a, scale = _gamma_params(s - shift)
    rng = np.random.default_rng(seed)
    fits = np.array([_gamma_params(stats.gamma.rvs(a, scale=scale, size=s.size, random_state=rng))
                     for _ in range(draws)])

    def rates(f: float) -> np.ndarray:
        return stats.gamma.sf(stats.gamma.ppf(1.0 - f, fits[:, 0], scale=fits[:, 1]), a, scale=scale)

    lo, hi = fpr * 1e-3, fpr
    if rates(hi).mean() > fpr:
        for _ in range(30):
            mid = float(np.sqrt(lo * hi))
            lo, hi = (lo, mid) if rates(mid).mean() > fpr else (mid, hi)
    return float(stats.gamma.ppf(1.0 - lo, a, scale=scale) + shift), rates(lo)


def fit_threshold(normal_scores: Sequence[float] | np.ndarray, fpr: float, *, method: str = "auto",
                  draws: int = 200, seed: int = 0) -> ThresholdFit:
    """The threshold for a target false-alarm rate from normal windows' scores.

    Parameters
    ----------
    normal_scores : array-like [shape=(n,)]
        Anomaly scores of normal windows (held out from training); all finite.
    fpr : float
        Target false-alarm rate, in (0, 1).
    method : {'auto', 'quantile', 'gamma'}, default='auto'
        ``auto``: ``gamma`` when ``n * fpr`` < :data:`GAMMA_BELOW_ALARMS` (a quantile of so few
        scores is coarse), else ``quantile``. ``gamma`` fits a gamma distribution to the scores
        (shifted to be positive) and takes the quantile at which, over the spread of such a fit
        to ``n`` scores, new normal windows raise ``fpr`` false alarms on average (a plain
        ``ppf(1 - fpr)`` of so few scores raises more). Scores that are all equal use the
        quantile.
    draws : int, default=200
        Samples of ``n`` scores drawn from the fit to calibrate it and estimate the range.
    seed : int, default=0

    Returns
    -------
    ThresholdFit

    Raises
    ------
    ValueError
        No scores, or non-finite ones.
    """
    from scipy import stats

    s = np.asarray(normal_scores, dtype=np.float64).ravel()
    if s.size == 0:
        raise ValueError("no normal scores to set a threshold on")
    if not np.isfinite(s).all():
        raise ValueError(f"{int((~np.isfinite(s)).sum())} of {s.size} normal scores are not finite")
    n = s.size
    q = (1 - RANGE_COVERAGE) / 2
    if method == "auto":
        method = "gamma" if n * fpr < GAMMA_BELOW_ALARMS else "quantile"
    if method == "gamma" and n > 2 and s.std() > 1e-9 * max(1.0, abs(float(s.mean()))):
        t, rates = _calibrated_gamma(s, fpr, draws, seed)
        lo, hi = np.quantile(rates, [q, 1 - q])
        return ThresholdFit(t, "gamma", n, (float(lo), float(hi)))
    # the k-th smallest of n scores: the share of new normal windows above it is Beta(n - k + 1, k)
    k = int(np.ceil((1.0 - fpr) * (n - 1))) + 1
    lo, hi = stats.beta.ppf([q, 1 - q], n - k + 1, k)
    return ThresholdFit(threshold_at_fpr(s, fpr), "quantile", n, (float(lo), float(hi)))


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


def pooled_fold_report(y, scores, flags, groups: Sequence[str] | None, folds: list[dict]) -> dict:
    """The k-fold report of a detector: ROC AUC and pAUC over every fold's pooled scores, the
    figures at a threshold from each fold's own decisions (``flags``: 1.0 where a window scored
    above its fold's threshold), per group too, and each fold's AUC, pAUC and F1 as mean ± sd."""
    res = detection_report(y, scores, float("inf"), groups or None)
    at = detection_report(y, flags, 0.5, groups or None)      # decisions already made: 0.5 on the 0/1 flags
    for part, flagged in [(res, at)] + [(res["groups"][k], at["groups"][k]) for k in res.get("groups", {})]:
        for m in ("precision", "recall", "f1", "fpr", "tp", "fp", "fn", "tn"):
            part[m] = flagged[m]
    res.update(detector=True, folds=folds, threshold=float("nan"),
               folds_summary={m: fold_mean_sd([fi[m] for fi in folds]) for m in ("auc", "pauc", "f1")})
    return res


def _fmt(x: float) -> str:
    return "   n/a" if not np.isfinite(x) else f"{x:.4f}"


def _at_threshold(result: dict) -> str:
    """``at threshold 18.9``, or for a k-fold evaluation (each fold's own threshold)
    ``at each fold's threshold (17.2-19.4)``."""
    t = result.get("threshold")
    if t is not None and np.isfinite(t):
        return f"at threshold {t:.4g}"
    ts = [f["threshold"] for f in result.get("folds") or [] if np.isfinite(f.get("threshold", np.nan))]
    if ts:
        return f"at each fold's threshold ({min(ts):.4g}-{max(ts):.4g})"
    return "at threshold n/a"


def format_detection_report(result: dict) -> str:
    """Human-readable detector evaluation, pooled (the table per group:
    :func:`~wavetrain.evaluation.group_results.format_groups`)."""
    lines = [f"AUC {_fmt(result['auc'])}  pAUC {_fmt(result['pauc'])} (FPR <= {result['max_fpr']})   "
             f"{_at_threshold(result)}: precision {result['precision']:.4f}  recall "
             f"{result['recall']:.4f}  F1 {result['f1']:.4f}  false alarms {result['fpr']:.4f}   "
             f"windows={result['windows']} ({result['normal']} normal, {result['anomalous']} anomalous)"]
    spread = result.get("folds_summary")
    if spread:
        lines.append(f"per fold: AUC {spread['auc']['mean']:.4f} ± {spread['auc']['sd']:.4f}  pAUC "
                     f"{spread['pauc']['mean']:.4f} ± {spread['pauc']['sd']:.4f}")
    return "\n".join(lines)


def fold_mean_sd(values: Sequence[float]) -> dict:
    """Mean and sd (ddof 1) of per-fold figures, NaN folds left out."""
    a = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if a.size == 0:
        return {"mean": float("nan"), "sd": float("nan")}
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if a.size > 1 else 0.0}
