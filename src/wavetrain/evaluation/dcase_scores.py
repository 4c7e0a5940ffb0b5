"""Scores per machine type, section and domain as the DCASE anomalous-sound task reports them,
and its official score.

The DCASE 2023 task 2 evaluator scores one anomaly score per recording (clip). For each machine
type and section it computes

* the AUC in each domain (``source``, ``target``): the normal recordings of that domain against
  every anomalous recording of the section, of either domain;
* the pAUC (FPR ≤ 0.1, McClish-standardised as scikit-learn's ``roc_auc_score(max_fpr=0.1)``)
  over all the section's recordings, both domains;

and the official score is the harmonic mean of all of them — every section's AUC source, AUC
target and pAUC, over all sections and machine types — each figure floored at the float epsilon
(``scipy.stats.hmean(numpy.maximum(x, eps))``). A figure that cannot be computed here (its
recordings lack normal or anomalous ones) is ``None`` and left out of the means.

A detector scores windows; a recording's score is the mean of its windows' anomaly scores
(:func:`recording_scores`), as the DCASE baseline averages its frames' errors.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from wavetrain.evaluation.detection_metrics import PAUC_MAX_FPR, partial_auc, roc_auc, roc_curve

#: The floor of every figure in a harmonic mean (the evaluator's ``sys.float_info.epsilon``).
EPSILON = sys.float_info.epsilon
#: The domain names of the DCASE task, in its order.
DCASE_DOMAINS = ("source", "target")


def recording_scores(window_scores: Sequence[float] | np.ndarray, places: Sequence[int] | np.ndarray,
                     recordings: int) -> np.ndarray:
    """Each recording's score: the mean of its windows' scores.

    Parameters
    ----------
    window_scores : array-like [shape=(n,)]
        Each window's anomaly score.
    places : array-like of int [shape=(n,)]
        Each window's recording, ``0 .. recordings - 1``.
    recordings : int
        How many recordings there are.

    Returns
    -------
    numpy.ndarray [shape=(recordings,)]
        The mean score of each recording's windows; NaN for a recording without windows.
    """
    s = np.asarray(window_scores, dtype=np.float64).ravel()
    p = np.asarray(places, dtype=np.int64).ravel()
    if s.size != p.size:
        raise ValueError(f"{s.size} window scores but {p.size} window places")
    total = np.bincount(p, weights=s, minlength=recordings)
    count = np.bincount(p, minlength=recordings)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def domain_order(values: Sequence[str]) -> tuple[str, str]:
    """The two domains of a data set, source first: ``("source", "target")`` when those are its
    values, else its two values sorted. Raises ValueError unless there are exactly two."""
    distinct = sorted(set(values))
    if len(distinct) != 2:
        raise ValueError(f"expected two domains, got {len(distinct)}: {', '.join(distinct) or '(none)'}")
    if set(distinct) == set(DCASE_DOMAINS):
        return DCASE_DOMAINS
    return distinct[0], distinct[1]


def domain_mask(y: np.ndarray, domain: np.ndarray, which: str) -> np.ndarray:
    """The recordings the AUC of domain ``which`` is taken over: its normal recordings and every
    anomalous recording (the evaluator's ``(y_domain == d) | (y_true != 0)``)."""
    return (domain == which) | (y == 1)


def _figure(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def section_scores(y, scores, domain, domains: tuple[str, str]) -> dict:
    """One section's figures (its recordings only).

    Parameters
    ----------
    y : array-like of int [shape=(n,)]
        1 for an anomalous recording, 0 for a normal one.
    scores : array-like [shape=(n,)]
        Each recording's anomaly score (higher = more anomalous).
    domain : array-like of str [shape=(n,)]
        Each recording's domain.
    domains : (str, str)
        The source and target domain.

    Returns
    -------
    dict
        ``auc``: ``{domain: AUC}``, ``pauc``, ``normal`` and ``anomalous``: ``{domain: recordings}``,
        ``recordings``; a figure without both kinds of recording is None.
    """
    y = np.asarray(y, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    d = np.asarray(domain, dtype=object)
    auc = {}
    for which in domains:
        m = domain_mask(y, d, which)
        auc[which] = _figure(roc_auc(y[m], s[m]))
    return {"auc": auc, "pauc": _figure(partial_auc(y, s, PAUC_MAX_FPR)),
            "normal": {w: int(((d == w) & (y == 0)).sum()) for w in domains},
            "anomalous": {w: int(((d == w) & (y == 1)).sum()) for w in domains},
            "recordings": int(y.size)}


def harmonic_mean(values: Sequence[float | None]) -> float | None:
    """The harmonic mean of the figures that are not None, each floored at :data:`EPSILON` (as
    the evaluator does); None when there are none."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if v.size == 0:
        return None
    return float(v.size / np.sum(1.0 / np.maximum(v, EPSILON)))


def group_figures(group: dict, domains: tuple[str, str]) -> list[float | None]:
    """A section's figures in the official score: AUC of each domain, then pAUC."""
    return [group["auc"][w] for w in domains] + [group["pauc"]]


def dcase_report(y, scores, section, domain, *, domains: tuple[str, str] | None = None,
                 machine=None) -> dict:
    """The figures of every machine type and section, and the official score.

    Parameters
    ----------
    y : array-like of int [shape=(n,)]
        Per recording, 1 = anomalous, 0 = normal.
    scores : array-like [shape=(n,)]
        Per recording, its anomaly score (:func:`recording_scores`); recordings whose score is
        NaN (no windows) are left out and counted in ``unscored``.
    section, domain : array-like of str [shape=(n,)]
        Per recording, its section and its domain.
    domains : (str, str), optional
        Source and target (default: :func:`domain_order` of ``domain``).
    machine : array-like of str [shape=(n,)], optional
        Per recording, its machine type; without it every section is of one type (``None``).

    Returns
    -------
    dict
        ``domains``, ``max_fpr``, ``groups`` (a list, by machine type then section:
        ``machine``, ``section`` and :func:`section_scores`), ``machines`` (with ``machine``:
        per type the harmonic means over its sections of each figure and ``score``, that of all
        its figures), ``harmonic_mean`` (of each figure over every section), ``official_score``
        (the harmonic mean of every section's AUCs and pAUC), ``figures`` (how many are in it),
        ``left_out`` (``"fan s03: AUC target"`` for each figure without both kinds of recording),
        ``recordings`` (scored) and ``unscored``.
    """
    y = np.asarray(y, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    sec = np.asarray(section, dtype=object)
    dom = np.asarray(domain, dtype=object)
    mac = np.full(y.size, None, dtype=object) if machine is None else np.asarray(machine, dtype=object)
    if not (y.size == s.size == sec.size == dom.size == mac.size):
        raise ValueError(f"per-recording arrays of different lengths: y {y.size}, scores {s.size}, "
                         f"section {sec.size}, domain {dom.size}, machine {mac.size}")
    if domains is None:
        domains = domain_order([str(v) for v in dom])
    scored = np.isfinite(s)
    y, s, sec, dom, mac = y[scored], s[scored], sec[scored], dom[scored], mac[scored]
    keys = sorted({(m, str(x)) for m, x in zip(mac.tolist(), sec.tolist())}, key=lambda k: (str(k[0]), k[1]))
    groups, left_out = [], []
    names = (f"AUC {domains[0]}", f"AUC {domains[1]}", "pAUC")
    for m, x in keys:
        idx = (mac == m) & (sec == x)
        g = {"machine": m, "section": x, **section_scores(y[idx], s[idx], dom[idx], domains)}
        groups.append(g)
        where = f"{m} {x}" if m is not None else x
        left_out += [f"{where}: {n}" for n, v in zip(names, group_figures(g, domains)) if v is None]
    figures = [v for g in groups for v in group_figures(g, domains)]
    res: dict = {"domains": list(domains), "max_fpr": PAUC_MAX_FPR, "groups": groups,
                 "harmonic_mean": {"auc": {w: harmonic_mean([g["auc"][w] for g in groups]) for w in domains},
                                   "pauc": harmonic_mean([g["pauc"] for g in groups])},
                 "official_score": harmonic_mean(figures),
                 "figures": sum(v is not None for v in figures), "left_out": left_out,
                 "recordings": int(y.size), "unscored": int((~scored).sum())}
    if machine is not None:
        per_type: dict[str, dict] = {}
        for m in sorted({g["machine"] for g in groups}, key=str):
            own = [g for g in groups if g["machine"] == m]
            per_type[str(m)] = {
                "auc": {w: harmonic_mean([g["auc"][w] for g in own]) for w in domains},
                "pauc": harmonic_mean([g["pauc"] for g in own]),
                "score": harmonic_mean([v for g in own for v in group_figures(g, domains)])}
        res["machines"] = per_type
    return res


def section_roc(y, scores, domain, which: str) -> tuple[np.ndarray, np.ndarray]:
    """``(fpr, tpr)`` of the ROC curve of domain ``which`` (:func:`domain_mask`'s recordings);
    empty arrays without both kinds."""
    y = np.asarray(y, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    m = domain_mask(y, np.asarray(domain, dtype=object), which)
    if not (0 < int(y[m].sum()) < int(m.sum())):
        return np.empty(0), np.empty(0)
    fpr, tpr, _ = roc_curve(y[m], s[m])
    return fpr, tpr


def _fmt(x: float | None, width: int = 6) -> str:
    return f"{'n/a':>{width}}" if x is None else f"{x:{width}.4f}"


def format_dcase(report: dict) -> str:
    """The table of :func:`dcase_report`: a line per machine type and section (AUC of each
    domain, pAUC, normal and anomalous recordings per domain), each type's harmonic means when
    there are several, the harmonic means over all, the official score and, once, the figures
    left out of it."""
    src, tgt = report["domains"]
    groups = report["groups"]
    with_machine = any(g["machine"] is not None for g in groups)
    mw = max([len("machine")] + [len(str(g["machine"])) for g in groups]) if with_machine else 0
    sw = max([len("section"), len("harmonic mean")] + [len(g["section"]) for g in groups])
    aw = max(10, len(f"AUC {src}"), len(f"AUC {tgt}"))
    head = (f"{'machine':<{mw}}  " if with_machine else "") + f"{'section':<{sw}}"
    lines = [f"scores per section and domain (DCASE: a recording scores the mean of its windows; AUC of a "
             f"domain: its normal recordings against the section's anomalous ones; pAUC: FPR <= "
             f"{report['max_fpr']}, both domains):",
             f"{head}  {f'AUC {src}':>{aw}}  {f'AUC {tgt}':>{aw}}    pAUC  normal {src}/{tgt}  anomalous {src}/{tgt}"]
    nw, anw = len(f"normal {src}/{tgt}"), len(f"anomalous {src}/{tgt}")

    def row(first: str, auc: dict, pauc, counts: str = "") -> str:
        return f"{first}  {_fmt(auc[src], aw)}  {_fmt(auc[tgt], aw)}  {_fmt(pauc)}{counts}".rstrip()

    for g in groups:
        first = (f"{str(g['machine']):<{mw}}  " if with_machine else "") + f"{g['section']:<{sw}}"
        normal = f"{g['normal'][src]}/{g['normal'][tgt]}"
        anomalous = f"{g['anomalous'][src]}/{g['anomalous'][tgt]}"
        counts = f"  {normal:>{nw}}  {anomalous:>{anw}}"
        lines.append(row(first, g["auc"], g["pauc"], counts))
    machines = report.get("machines") or {}
    if len(machines) > 1:
        for m, r in machines.items():
            lines.append(row(f"{m:<{mw}}  {'harmonic mean':<{sw}}", r["auc"], r["pauc"]))
    hm = report["harmonic_mean"]
    lines.append(row((f"{'all':<{mw}}  " if with_machine else "") + f"{'harmonic mean':<{sw}}", hm["auc"], hm["pauc"]))
    score = report["official_score"]
    lines.append(f"official score {_fmt(score, 0).strip()} (harmonic mean of {report['figures']} figures: "
                 f"AUC {src}, AUC {tgt} and pAUC of {len(groups)} section{'s' if len(groups) != 1 else ''})")
    if report["left_out"]:
        lines.append(f"note: n/a (no normal or no anomalous recordings), left out of the means: "
                     f"{'; '.join(report['left_out'])}")
    if report.get("unscored"):
        lines.append(f"note: {report['unscored']} recordings had no window to score (shorter than a clip?) "
                     "and are left out")
    return "\n".join(lines)
