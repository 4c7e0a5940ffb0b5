"""Sound-event detection scores: event-based and segment-based F1 and error rate.

The scores are those of sed_eval 0.2.1 (Mesaros, Heittola and Virtanen, "Metrics for polyphonic
sound event detection", Applied Sciences 6(6):162, 2016), computed file by file and summed over
the files (events of different files never match):

* **event-based** (:func:`event_based`): an estimated event is correct when its onset lies
  within ``collar_ms`` (200 ms) of a reference event's onset, its offset within
  ``max(collar_ms, offset_pct × the reference event's length)`` (200 ms or 20 %) of that
  event's offset, and, class-aware, its value is the reference's. Estimated and reference events
  are paired by a maximum matching (Hopcroft-Karp, as sed_eval's default ``optimal`` matching,
  visited in the same order so that the same pairs are made). Substitutions are then counted as
  sed_eval counts them: each unmatched reference event, in order, takes the first unmatched
  estimated event whose onset and offset fit, whatever its value. Deletions are the reference
  events left, insertions the estimated events left.
* **segment-based** (:func:`segment_based`): time is cut into ``segment_ms`` (100 ms) segments;
  a value is active in a segment when one of its events overlaps it. In each segment, with
  ``Nref`` values active in the reference, ``Nsys`` in the estimate and ``Ntp`` in both,
  substitutions are ``min(Nref, Nsys) − Ntp``, deletions ``max(0, Nref − Nsys)`` and
  insertions ``max(0, Nsys − Nref)``.

Precision is Ntp / Nsys, recall Ntp / Nref, F1 their harmonic mean; the error rate is
(substitutions + deletions + insertions) / Nref. Class-wise figures count each value alone
(its error rate is (deletions + insertions) / its Nref); the macro means average the values
that have a defined figure. Detection-only (``class_aware=False``) scores every event as one
value, :data:`DETECTION_VALUE`.

Where sed_eval's figures are undefined or degenerate they are written as follows: precision with
no estimated event is 0 (sed_eval's ``empty_system_output_handling='zero_score'``); recall, F1
(unless precision is 0 too) and every rate with no reference event are ``None`` (sed_eval's NaN,
or a count divided by machine epsilon for the rates). Times are compared in milliseconds, so a
boundary lies exactly where it is written (an event starting at 300 ms starts in the fourth
100 ms segment; sed_eval's 0.3 s / 0.1 s rounds to 2.999… and to the third).

Results are plain dicts of Python numbers (JSON-ready), rounded nowhere.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

#: The one value of every event in detection-only scoring.
DETECTION_VALUE = "event"
#: sed_eval's ``t_collar`` (0.2 s): the onset collar, and the least offset collar.
COLLAR_MS = 200.0
#: sed_eval's ``percentage_of_length``: the offset collar as a share of the reference event's length.
OFFSET_PCT = 0.2
#: The segment length of the segment-based scores.
SEGMENT_MS = 100.0


@dataclass(frozen=True)
class Event:
    """One sound event: ``value`` sounds in ``file`` from ``start_ms`` to ``end_ms``.

    Parameters
    ----------
    file : str
        The recording it belongs to; events of different files are never compared.
    start_ms, end_ms : float
        Onset and offset in milliseconds from the file's start (``0 ≤ start_ms ≤ end_ms``).
    value : str
        What sounds (the label's value); :data:`DETECTION_VALUE` when only detection counts.
    """

    file: str
    start_ms: float
    end_ms: float
    value: str = DETECTION_VALUE

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_ms) and math.isfinite(self.end_ms)
                and 0 <= self.start_ms <= self.end_ms):
            raise ValueError(f"event {self.value!r} in {self.file}: needs 0 ≤ start ≤ end, "
                             f"got {self.start_ms}-{self.end_ms} ms")


def event_scores(reference: Iterable[Event], estimate: Iterable[Event], *, collar_ms: float = COLLAR_MS,
                 offset_pct: float = OFFSET_PCT, segment_ms: float = SEGMENT_MS) -> dict:
    """Every score: event-based and segment-based, class-aware and detection-only.

    Parameters
    ----------
    reference, estimate : iterable of Event
        The true events and the detected ones (of any number of files).
    collar_ms, offset_pct, segment_ms : float
        As :func:`event_based` and :func:`segment_based` take them.

    Returns
    -------
    dict
        ``event_based`` and ``segment_based``, each ``{"class_aware": …, "detection": …}`` as
        those functions return them; ``reference_events``, ``estimated_events``, ``files``
        (those with a reference or an estimated event) and the settings ``collar_ms``,
        ``offset_pct``, ``segment_ms``.
    """
    ref, est = list(reference), list(estimate)
    return {
        "event_based": {
            "class_aware": event_based(ref, est, class_aware=True, collar_ms=collar_ms, offset_pct=offset_pct),
            "detection": event_based(ref, est, class_aware=False, collar_ms=collar_ms, offset_pct=offset_pct),
        },
        "segment_based": {
            "class_aware": segment_based(ref, est, class_aware=True, segment_ms=segment_ms),
            "detection": segment_based(ref, est, class_aware=False, segment_ms=segment_ms),
        },
        "reference_events": len(ref),
        "estimated_events": len(est),
        "files": len({e.file for e in ref} | {e.file for e in est}),
        "collar_ms": float(collar_ms),
        "offset_pct": float(offset_pct),
        "segment_ms": float(segment_ms),
    }


# -- event-based ------------------------------------------------------------------------------------

def event_based(reference: Iterable[Event], estimate: Iterable[Event], *, class_aware: bool = True,
                collar_ms: float = COLLAR_MS, offset_pct: float = OFFSET_PCT) -> dict:
    """Event-based scores (sed_eval's ``EventBasedMetrics`` with onset and offset evaluated).

    Parameters
    ----------
    reference, estimate : iterable of Event
        Within a file, events are taken in the order given (it decides which unmatched events
        pair up as substitutions, as in sed_eval).
    class_aware : bool
        True: an event matches only one of its own value; False: every event is
        :data:`DETECTION_VALUE`.
    collar_ms : float
        Onset collar, and the least offset collar.
    offset_pct : float
        Offset collar as a share of the reference event's length, when larger than ``collar_ms``.

    Returns
    -------
    dict
        ``f1``, ``precision``, ``recall``, ``error_rate``, ``substitution_rate``,
        ``deletion_rate``, ``insertion_rate``; the counts ``reference``, ``estimated``,
        ``matched``, ``substitutions``, ``deletions``, ``insertions``; ``class_wise``
        (value → ``f1``, ``precision``, ``recall``, ``error_rate``, ``deletion_rate``,
        ``insertion_rate``, ``reference``, ``estimated``, ``matched``) over every value of
        either side; ``macro`` (the class-wise means) and ``macro_f1``.
    """
    ref, est = _relabel(reference, class_aware), _relabel(estimate, class_aware)
    values = sorted({e.value for e in ref} | {e.value for e in est})
    n_ref = n_sys = n_tp = n_subs = 0
    per_value = {v: [0, 0, 0] for v in values}            # reference, estimated, matched
    for b in est:
        per_value[b.value][1] += 1
    est_by_file = _by_file(est)
    for file, r in _by_file(ref).items():
        e = est_by_file.pop(file, [])
        fits = _fits(r, e, collar_ms, offset_pct)
        same = [(j, int(i)) for j, row in enumerate(fits) for i in row if r[j].value == e[i].value]
        pairs = _maximum_matching(same)
        n_ref += len(r)
        n_tp += len(pairs)
        n_subs += _substitutions(fits, pairs, len(e))
        by_value: dict[str, list[tuple[int, int]]] = {}
        for j, i in same:
            by_value.setdefault(r[j].value, []).append((j, i))
        for a in r:
            per_value[a.value][0] += 1
        for v, edges in by_value.items():
            per_value[v][2] += len(_maximum_matching(edges))
    n_sys = len(est)
    n_del, n_ins = n_ref - n_tp - n_subs, n_sys - n_tp - n_subs
    res = _overall(n_ref, n_sys, n_tp, n_subs, n_del, n_ins)
    res["class_wise"] = {v: _class(*per_value[v]) for v in values}
    res["macro"] = _macro(res["class_wise"])
    res["macro_f1"] = res["macro"]["f1"]
    return res


def _fits(ref: Sequence[Event], est: Sequence[Event], collar_ms: float, offset_pct: float) -> list[np.ndarray]:
    """For each reference event, the estimated events (indices, ascending) whose onset and offset
    lie within its collars, values ignored. Only the estimated events whose onset lies within
    the onset collar are looked at, so that the cost follows the pairs that fit rather than
    ``len(ref) × len(est)``."""
    e_on = np.array([b.start_ms for b in est], dtype=np.float64)
    e_off = np.array([b.end_ms for b in est], dtype=np.float64)
    order = np.argsort(e_on, kind="stable")
    sorted_on = e_on[order]
    out = []
    for a in ref:
        slack = 1e-6 * (abs(a.start_ms) + collar_ms + 1)    # the exact test below decides
        lo = int(np.searchsorted(sorted_on, a.start_ms - collar_ms - slack, side="left"))
        hi = int(np.searchsorted(sorted_on, a.start_ms + collar_ms + slack, side="right"))
        near = np.sort(order[lo:hi])
        offset_collar = max(collar_ms, offset_pct * (a.end_ms - a.start_ms))
        ok = ((np.abs(a.start_ms - e_on[near]) <= collar_ms)
              & (np.abs(a.end_ms - e_off[near]) <= offset_collar))
        out.append(near[ok])
    return out


def _maximum_matching(edges: Iterable[tuple[int, int]]) -> dict[int, int]:
    """A maximum matching of reference to estimated events: ``{reference: estimated}``.

    ``edges`` are the ``(reference, estimated)`` pairs that may match, by reference then
    estimated index. Hopcroft-Karp as sed_eval runs it (its ``util.bipartite_match``, after
    mir_eval and David Eppstein's PADS), with the graph built in the same order (estimated event
    → the reference events it fits), so that the pairs are sed_eval's: which events stay
    unmatched decides the substitutions. The augmenting search is iterative (no recursion limit).
    """
    graph: dict[int, list[int]] = {}
    for j, i in edges:
        graph.setdefault(i, []).append(j)
    matching: dict[int, int] = {}                  # reference → estimated
    for u in graph:                                # greedy start
        for v in graph[u]:
            if v not in matching:
                matching[v] = u
                break
    while True:
        preds: dict[int, list[int]] = {}           # reference → estimated events of the layer before
        free: list[int] = []                       # unmatched reference events of the last layer
        pred: dict[int, int | None] = {u: None for u in graph}   # estimated → reference before (None: first layer)
        for v in matching:
            del pred[matching[v]]
        layer = list(pred)
        while layer and not free:                  # layers of alternating paths
            new_layer: dict[int, list[int]] = {}
            for u in layer:
                for v in graph[u]:
                    if v not in preds:
                        new_layer.setdefault(v, []).append(u)
            layer = []
            for v in new_layer:
                preds[v] = new_layer[v]
                if v in matching:
                    layer.append(matching[v])
                    pred[matching[v]] = v
                else:
                    free.append(v)
        if not free:
            return matching
        for v in free:
            _augment(v, preds, pred, matching)


def _augment(root: int, preds: dict[int, list[int]], pred: dict[int, int | None],
             matching: dict[int, int]) -> bool:
    """Search back through the layers from the free reference event ``root`` for an alternating
    path and flip it into ``matching``: PADS's recursive ``recurse(v)``, step for step, with a
    stack of frames ``[reference, its candidates, next candidate, candidate being tried]``."""
    if root not in preds:
        return False
    stack: list[list] = [[root, preds.pop(root), 0, -1]]
    returned: bool | None = None                    # what the frame just left returned
    while stack:
        frame = stack[-1]
        if returned:                                # the path through frame[3] is complete
            matching[frame[0]] = frame[3]
            stack.pop()
            continue
        v, candidates = frame[0], frame[1]
        found = descended = False
        while frame[2] < len(candidates):
            u = candidates[frame[2]]
            frame[2] += 1
            if u not in pred:
                continue
            pu = pred.pop(u)
            if pu is None:                          # u is in the first layer: the path starts there
                matching[v] = u
                found = True
                break
            if pu in preds:                         # one layer back
                frame[3] = u
                stack.append([pu, preds.pop(pu), 0, -1])
                descended = True
                break
        if descended:
            returned = None
            continue
        stack.pop()
        returned = found
    return bool(returned)


def _substitutions(fits: list[np.ndarray], pairs: dict[int, int], n_est: int) -> int:
    """sed_eval's substitutions: each unmatched reference event, in order, takes the first
    unmatched estimated event (in order) that fits its collars, whatever its value."""
    est_left = np.ones(n_est, dtype=bool)
    est_left[list(pairs.values())] = False
    n = 0
    for j, row in enumerate(fits):
        if j in pairs:
            continue
        free = row[est_left[row]]
        if free.size:
            est_left[free[0]] = False
            n += 1
    return n


# -- segment-based ----------------------------------------------------------------------------------

def segment_based(reference: Iterable[Event], estimate: Iterable[Event], *, class_aware: bool = True,
                  segment_ms: float = SEGMENT_MS) -> dict:
    """Segment-based scores (sed_eval's ``SegmentBasedMetrics``).

    Each file is cut into ``segment_ms`` segments from its start up to its last offset
    (reference or estimate); an event is active in segments ``floor(start / segment_ms)`` to
    ``ceil(end / segment_ms) − 1``.

    Parameters
    ----------
    reference, estimate : iterable of Event
    class_aware : bool
        True: one activity row per value; False: every event is :data:`DETECTION_VALUE`.
    segment_ms : float
        Segment length (> 0).

    Returns
    -------
    dict
        As :func:`event_based`, the counts in (segment, value) cells: ``reference`` and
        ``estimated`` active cells, ``matched`` active in both; substitutions, deletions and
        insertions per segment; plus ``segments``, the number of segments evaluated.
    """
    if not segment_ms > 0:
        raise ValueError(f"segment_ms must be > 0, got {segment_ms}")
    ref, est = _relabel(reference, class_aware), _relabel(estimate, class_aware)
    values = sorted({e.value for e in ref} | {e.value for e in est})
    col = {v: k for k, v in enumerate(values)}
    totals = np.zeros(6, dtype=np.int64)                      # ref, sys, tp, subs, del, ins
    per_value = np.zeros((len(values), 3), dtype=np.int64)    # ref, sys, tp
    segments = 0
    ref_by_file, est_by_file = _by_file(ref), _by_file(est)
    for file in ref_by_file.keys() | est_by_file.keys():
        r, e = ref_by_file.get(file, []), est_by_file.get(file, [])
        n = math.ceil(max(x.end_ms for x in [*r, *e]) / segment_ms)
        a, s = _roll(r, n, col, segment_ms), _roll(e, n, col, segment_ms)
        n_ref, n_sys, n_tp = a.sum(axis=1), s.sum(axis=1), (a & s).sum(axis=1)
        totals += [n_ref.sum(), n_sys.sum(), n_tp.sum(), (np.minimum(n_ref, n_sys) - n_tp).sum(),
                   np.maximum(0, n_ref - n_sys).sum(), np.maximum(0, n_sys - n_ref).sum()]
        per_value += np.stack([a.sum(axis=0), s.sum(axis=0), (a & s).sum(axis=0)], axis=1)
        segments += n
    res = _overall(*(int(x) for x in totals))
    res["segments"] = segments
    res["class_wise"] = {v: _class(*(int(x) for x in per_value[k])) for k, v in enumerate(values)}
    res["macro"] = _macro(res["class_wise"])
    res["macro_f1"] = res["macro"]["f1"]
    return res


def _roll(events: Sequence[Event], n: int, col: dict[str, int], segment_ms: float) -> np.ndarray:
    """``(n, len(col))`` booleans: value active in segment."""
    roll = np.zeros((n, len(col)), dtype=bool)
    for e in events:
        roll[math.floor(e.start_ms / segment_ms):math.ceil(e.end_ms / segment_ms), col[e.value]] = True
    return roll


# -- shared -----------------------------------------------------------------------------------------

def _relabel(events: Iterable[Event], class_aware: bool) -> list[Event]:
    if class_aware:
        return list(events)
    return [Event(e.file, e.start_ms, e.end_ms, DETECTION_VALUE) for e in events]


def _by_file(events: Sequence[Event]) -> dict[str, list[Event]]:
    """Events per file, in the order given."""
    out: dict[str, list[Event]] = {}
    for e in events:
        out.setdefault(e.file, []).append(e)
    return out


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def _f1(precision: float, recall: float | None) -> float | None:
    if precision == 0 and recall == 0:
        return 0.0
    if recall is None:
        return None
    return 2 * precision * recall / (precision + recall)


def _overall(n_ref: int, n_sys: int, n_tp: int, n_subs: int, n_del: int, n_ins: int) -> dict:
    precision = n_tp / n_sys if n_sys else 0.0
    recall = _ratio(n_tp, n_ref)
    return {
        "f1": _f1(precision, recall), "precision": precision, "recall": recall,
        "error_rate": _ratio(n_subs + n_del + n_ins, n_ref),
        "substitution_rate": _ratio(n_subs, n_ref), "deletion_rate": _ratio(n_del, n_ref),
        "insertion_rate": _ratio(n_ins, n_ref),
        "reference": n_ref, "estimated": n_sys, "matched": n_tp,
        "substitutions": n_subs, "deletions": n_del, "insertions": n_ins,
    }


def _class(n_ref: int, n_sys: int, n_tp: int) -> dict:
    precision = n_tp / n_sys if n_sys else 0.0
    recall = _ratio(n_tp, n_ref)
    n_del, n_ins = n_ref - n_tp, n_sys - n_tp
    return {
        "f1": _f1(precision, recall), "precision": precision, "recall": recall,
        "error_rate": _ratio(n_del + n_ins, n_ref), "deletion_rate": _ratio(n_del, n_ref),
        "insertion_rate": _ratio(n_ins, n_ref),
        "reference": n_ref, "estimated": n_sys, "matched": n_tp,
    }


def _macro(class_wise: dict) -> dict:
    """Means over the values of each class-wise figure, skipping the undefined ones (sed_eval's
    ``nanmean``); ``None`` where none is defined."""
    out = {}
    for key in ("f1", "precision", "recall", "error_rate"):
        defined = [c[key] for c in class_wise.values() if c[key] is not None]
        out[key] = float(np.mean(defined)) if defined else None
    return out


# -- report -----------------------------------------------------------------------------------------

def format_event_report(res: dict) -> str:
    """The text report of :func:`event_scores`' result: counts, the event-based and segment-based
    figures class-aware and detection-only, and the class-wise event-based figures (``n/a``: not
    defined, e.g. a recall without reference events)."""
    files = res["files"]
    lines = [f"events: {res['reference_events']} in the reference, {res['estimated_events']} detected, "
             f"in {files} file{'s' if files != 1 else ''}",
             f"{'':20s}{'F1':>8s}{'precision':>11s}{'recall':>8s}{'ER':>8s}   substitutions / deletions / insertions"]
    collar, pct = res["collar_ms"], res["offset_pct"]
    for part, title in (("event_based", f"event-based (onset ±{collar:g} ms, offset ±{collar:g} ms or "
                                        f"{100 * pct:g} % of the event)"),
                        ("segment_based", f"segment-based ({res['segment_ms']:g} ms segments)")):
        lines.append(title)
        for kind, name in (("class_aware", "class-aware"), ("detection", "detection only")):
            r = res[part][kind]
            lines.append(f"  {name:18s}{_num(r['f1']):>8s}{_num(r['precision']):>11s}{_num(r['recall']):>8s}"
                         f"{_num(r['error_rate']):>8s}   {r['substitutions']} / {r['deletions']} / {r['insertions']}")
    cw = res["event_based"]["class_aware"]
    lines.append("per value (event-based, class-aware):")
    lines.append(f"  {'value':18s}{'F1':>8s}{'precision':>11s}{'recall':>8s}{'reference':>11s}{'detected':>10s}")
    for value, c in cw["class_wise"].items():
        lines.append(f"  {value:18s}{_num(c['f1']):>8s}{_num(c['precision']):>11s}{_num(c['recall']):>8s}"
                     f"{c['reference']:>11d}{c['estimated']:>10d}")
    lines.append(f"  {'macro mean':18s}{_num(cw['macro']['f1']):>8s}{_num(cw['macro']['precision']):>11s}"
                 f"{_num(cw['macro']['recall']):>8s}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
