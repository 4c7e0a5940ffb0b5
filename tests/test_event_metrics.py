"""Event-based and segment-based scores: hand-made cases with known answers, and random event sets
compared with sed_eval 0.2.1 (the reference implementation) to 1e-9."""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from wavetrain.evaluation.event_metrics import (
    DETECTION_VALUE,
    Event,
    event_based,
    event_scores,
    segment_based,
)

# -- hand-made cases ----------------------------------------------------------------------------------


def ev(start, end, value="dog", file="a.wav"):
    return Event(file, start, end, value)


@pytest.mark.parametrize("onset, matched", [(200, 1), (-200, 1), (201, 0), (-201, 0)])
def test_onset_collar_is_200_ms_inclusive(onset, matched):
    start = 1000 + onset
    res = event_based([ev(1000, 2000)], [ev(start, 2000)])
    assert res["matched"] == matched
    assert res["f1"] == float(matched)


@pytest.mark.parametrize("length, offset_shift, matched", [
    (1000, 200, 1), (1000, 201, 0),          # 20 % of 1 s is 200 ms: the collar is 200 ms
    (500, 200, 1), (500, 201, 0),            # a short event keeps the 200 ms collar
    (3000, 600, 1), (3000, -600, 1), (3000, 601, 0), (3000, -601, 0),   # 20 % of 3 s: 600 ms
])
def test_offset_collar_is_200_ms_or_20_percent_of_the_reference_length(length, offset_shift, matched):
    res = event_based([ev(0, length)], [ev(0, length + offset_shift)])
    assert res["matched"] == matched
    assert res["deletions"] == 1 - matched and res["insertions"] == 1 - matched


def test_the_offset_collar_follows_the_reference_event_not_the_estimate():
    # reference 1 s long (collar 200 ms), estimate 3 s long: the estimate's own length does not widen it
    assert event_based([ev(0, 1000)], [ev(0, 1250)])["matched"] == 0
    # the other way round: reference 3 s long (collar 600 ms)
    assert event_based([ev(0, 3000)], [ev(0, 2450)])["matched"] == 1


def test_matching_is_a_maximum_matching_not_first_come():
    # X fits both reference events, Y only the first: taking X for the first (first come) would
    # leave the second unmatched; the maximum matching pairs both.
    ref = [ev(0, 1000), ev(100, 1100)]
    est = [ev(50, 1050), ev(0, 850)]
    res = event_based(ref, est)
    assert res["matched"] == 2
    assert res["f1"] == 1.0 and res["error_rate"] == 0.0


def test_a_wrong_value_is_a_substitution_and_matches_when_only_detection_counts():
    ref, est = [ev(0, 1000, "dog")], [ev(50, 1000, "car")]
    aware = event_based(ref, est)
    assert (aware["matched"], aware["substitutions"], aware["deletions"], aware["insertions"]) == (0, 1, 0, 0)
    assert aware["error_rate"] == 1.0 and aware["f1"] == 0.0
    assert aware["class_wise"]["dog"]["f1"] == 0.0 and aware["class_wise"]["dog"]["error_rate"] == 1.0
    assert aware["class_wise"]["car"]["recall"] is None and aware["class_wise"]["car"]["f1"] is None
    assert aware["macro_f1"] == 0.0                     # car has no reference event: no F1 to average
    detection = event_based(ref, est, class_aware=False)
    assert detection["f1"] == 1.0 and detection["error_rate"] == 0.0
    assert list(detection["class_wise"]) == [DETECTION_VALUE]


def test_events_of_different_files_never_match():
    res = event_based([ev(0, 1000, file="a.wav")], [ev(0, 1000, file="b.wav")])
    assert (res["matched"], res["deletions"], res["insertions"]) == (0, 1, 1)
    assert res["error_rate"] == 2.0
    seg = segment_based([ev(0, 1000, file="a.wav")], [ev(0, 1000, file="b.wav")])
    assert seg["matched"] == 0 and seg["reference"] == 10 and seg["estimated"] == 10


def test_empty_estimate_and_empty_reference():
    ref = [ev(0, 1000), ev(2000, 2500, "car")]
    res = event_based(ref, [])
    assert res["precision"] == 0.0 and res["recall"] == 0.0 and res["f1"] == 0.0
    assert res["error_rate"] == 1.0 and res["deletions"] == 2
    res = event_based([], ref)
    assert res["precision"] == 0.0 and res["recall"] is None and res["f1"] is None
    assert res["error_rate"] is None and res["insertions"] == 2
    res = event_scores([], [])
    assert res["files"] == 0 and res["segment_based"]["detection"]["segments"] == 0
    assert res["event_based"]["class_aware"]["macro_f1"] is None
    json.dumps(res, allow_nan=False)                # JSON-ready: no NaN anywhere


def test_segments_are_cut_at_exact_multiples_of_100_ms():
    # 300-400 ms is exactly the fourth segment; 250-350 ms touches the third and the fourth
    res = segment_based([ev(300, 400)], [ev(250, 350)])
    assert (res["reference"], res["estimated"], res["matched"]) == (1, 2, 1)
    assert res["precision"] == 0.5 and res["recall"] == 1.0
    assert res["insertions"] == 1 and res["error_rate"] == 1.0
    assert res["segments"] == 4


def test_segment_based_counts():
    res = segment_based([ev(0, 1000)], [ev(0, 500)])
    assert (res["reference"], res["estimated"], res["matched"]) == (10, 5, 5)
    assert res["f1"] == pytest.approx(2 / 3) and res["error_rate"] == 0.5 and res["deletions"] == 5
    # a wrong value in a segment is one substitution there, not a deletion and an insertion
    res = segment_based([ev(0, 1000, "dog")], [ev(0, 1000, "car")])
    assert (res["substitutions"], res["deletions"], res["insertions"]) == (10, 0, 0)
    assert res["error_rate"] == 1.0
    assert segment_based([ev(0, 1000, "dog")], [ev(0, 1000, "car")], class_aware=False)["f1"] == 1.0


def test_overlapping_events_of_one_value_are_one_activity_in_segments():
    res = segment_based([ev(0, 1000)], [ev(0, 600), ev(400, 1000)])
    assert res["estimated"] == 10 and res["f1"] == 1.0
    # but two events in the event-based scores: one matches, one is inserted
    eb = event_based([ev(0, 1000)], [ev(0, 600), ev(400, 1000)])
    assert (eb["matched"], eb["insertions"]) == (0, 2)     # neither fits both collars
    eb = event_based([ev(0, 1000)], [ev(0, 900), ev(400, 1000)])
    assert (eb["matched"], eb["insertions"]) == (1, 1)


def test_bad_events_are_refused():
    with pytest.raises(ValueError, match="start ≤ end"):
        Event("a.wav", 500, 400, "dog")
    with pytest.raises(ValueError, match="start ≤ end"):
        Event("a.wav", -1, 400, "dog")


# -- oracle: sed_eval ---------------------------------------------------------------------------------

VALUES = ["car", "dog", "speech"]


def _random_sets(seed: int):
    """Reference events in several files, and an estimate made from them: events jittered around
    the collars, values swapped, events dropped, events inserted (some of a value the reference
    lacks), events overlapping."""
    rng = np.random.default_rng(seed)
    ref, est = [], []
    for f in range(int(rng.integers(1, 5))):
        file = f"rec{f}.wav"
        for _ in range(int(rng.integers(0, 10))):
            start = float(rng.uniform(0, 8000))
            length = float(rng.choice([rng.uniform(20, 900), rng.uniform(900, 4000)]))
            value = str(rng.choice(VALUES))
            ref.append(Event(file, start, start + length, value))
            if rng.random() < 0.2:
                continue                                   # missed
            on = max(0.0, start + float(rng.normal(0, 180)))
            off = max(on, start + length + float(rng.normal(0, max(200.0, 0.2 * length))))
            if rng.random() < 0.2:
                value = str(rng.choice(VALUES))
            est.append(Event(file, on, off, value))
        for _ in range(int(rng.integers(0, 4))):           # inserted
            start = float(rng.uniform(0, 9000))
            est.append(Event(file, start, start + float(rng.uniform(10, 2000)),
                             str(rng.choice(VALUES + ["bird"]))))
    if rng.random() < 0.3:                                  # a file only the estimate has
        est.append(Event("other.wav", 100.0, 700.0, "dog"))
    order = rng.permutation(len(est))
    return ref, [est[i] for i in order]


def _dense_sets(seed: int):
    """Two files crowded with overlapping events of three values, the estimate unrelated to the
    reference: many events fit several others, so which pairs the matching makes, and in what
    order the unmatched ones pair up as substitutions, decide the counts."""
    rng = np.random.default_rng(seed)
    ref, est = [], []
    for file in ("d0.wav", "d1.wav"):
        for events in (ref, est):
            for _ in range(int(rng.integers(3, 12))):
                start = float(rng.uniform(0, 1500))
                events.append(Event(file, start, start + float(rng.uniform(100, 1500)),
                                    str(rng.choice(VALUES))))
    return ref, est


def _edge_sets():
    """Named edge cases: empty estimate, empty reference, events just inside and just outside the
    collars, overlapping events, a zero-length event."""
    base = [ev(1000, 2000, "dog"), ev(5000, 8000, "car"), ev(5200, 5300, "dog", "b.wav")]
    return {
        "empty estimate": (base, []),
        "empty reference": ([], base),
        "just inside": (base, [ev(1199.5, 2199.5, "dog"), ev(4800.5, 8599.5, "car"),
                               ev(5000.5, 5100.5, "dog", "b.wav")]),
        "just outside": (base, [ev(1200.5, 2000, "dog"), ev(5000, 8600.5, "car"),
                                ev(4999.5, 5300, "dog", "b.wav")]),
        "overlapping": ([ev(0, 1000, "dog"), ev(100, 1100, "dog"), ev(150, 1000, "car")],
                        [ev(50, 1050, "dog"), ev(0, 850, "dog"), ev(120, 1020, "dog"), ev(0, 1000, "car")]),
        "zero length": ([ev(1000, 1000, "dog")], [ev(1100, 1100, "dog")]),
    }


def _oracle(ref, est, class_aware):
    """sed_eval's event-based and segment-based metrics over the union of files and values,
    file by file, with events in the order given."""
    import sed_eval  # a development requirement (slow to import)

    def items(events):
        return [{"file": e.file, "event_onset": e.start_ms / 1000, "event_offset": e.end_ms / 1000,
                 "event_label": e.value if class_aware else DETECTION_VALUE} for e in events]

    labels = sorted({x["event_label"] for x in items(ref) + items(est)})
    eb = sed_eval.sound_event.EventBasedMetrics(labels, t_collar=0.2, percentage_of_length=0.2,
                                                evaluate_onset=True, evaluate_offset=True,
                                                empty_system_output_handling="zero_score")
    sb = sed_eval.sound_event.SegmentBasedMetrics(labels, time_resolution=0.1)
    sb.empty_system_output_handling = "zero_score"
    for file in sorted({e.file for e in ref} | {e.file for e in est}):
        r = items([e for e in ref if e.file == file])
        s = items([e for e in est if e.file == file])
        eb.evaluate(r, s)
        sb.evaluate(r, s)
    return eb, sb


def _same(ours, theirs, *, rate=False, n_ref=None):
    """Ours is None where sed_eval's figure is NaN, or, for a rate, where there is no reference
    (sed_eval divides by machine epsilon); else equal to 1e-9."""
    if rate and n_ref == 0 or theirs is None or (isinstance(theirs, float) and math.isnan(theirs)):
        assert ours is None
    else:
        assert ours == pytest.approx(float(theirs), abs=1e-9, rel=0)


def _check(ref, est):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)   # sed_eval's nanmean of no class
        _compare(ref, est)


def _compare(ref, est):
    for class_aware in (True, False):
        eb, sb = _oracle(ref, est, class_aware)
        for ours, theirs in ((event_based(ref, est, class_aware=class_aware), eb),
                             (segment_based(ref, est, class_aware=class_aware), sb)):
            o = theirs.results_overall_metrics()
            n_ref = theirs.overall["Nref"]
            _same(ours["f1"], o["f_measure"]["f_measure"])
            _same(ours["precision"], o["f_measure"]["precision"])
            _same(ours["recall"], o["f_measure"]["recall"])
            for key in ("error_rate", "substitution_rate", "deletion_rate", "insertion_rate"):
                _same(ours[key], o["error_rate"][key], rate=True, n_ref=n_ref)
            assert ours["reference"] == n_ref and ours["estimated"] == theirs.overall["Nsys"]
            assert ours["matched"] == theirs.overall["Ntp"]
            if theirs is eb:
                assert ours["substitutions"] == eb.overall["Nsubs"]
                assert ours["deletions"] == eb.overall["Nfn"] and ours["insertions"] == eb.overall["Nfp"]
            else:
                assert (ours["substitutions"], ours["deletions"], ours["insertions"]) == \
                    (sb.overall["S"], sb.overall["D"], sb.overall["I"])
            cw = theirs.results_class_wise_metrics()
            assert sorted(ours["class_wise"]) == sorted(cw)
            for value, c in ours["class_wise"].items():
                t = cw[value]
                _same(c["f1"], t["f_measure"]["f_measure"])
                _same(c["precision"], t["f_measure"]["precision"])
                _same(c["recall"], t["f_measure"]["recall"])
                _same(c["error_rate"], t["error_rate"]["error_rate"], rate=True, n_ref=t["count"]["Nref"])
                assert (c["reference"], c["estimated"]) == (t["count"]["Nref"], t["count"]["Nsys"])
            avg = theirs.results_class_wise_average_metrics()
            if avg["f_measure"]:
                _same(ours["macro"]["f1"], avg["f_measure"]["f_measure"])
                _same(ours["macro"]["precision"], avg["f_measure"]["precision"])
                _same(ours["macro"]["recall"], avg["f_measure"]["recall"])
                if all(t["count"]["Nref"] for t in cw.values()):   # sed_eval's rate over 0 is huge, not NaN
                    _same(ours["macro"]["error_rate"], avg["error_rate"]["error_rate"])
            assert ours["macro_f1"] == ours["macro"]["f1"]


@pytest.mark.parametrize("seed", range(40))
def test_random_event_sets_score_as_sed_eval(seed):
    ref, est = _random_sets(seed)
    _check(ref, est)


@pytest.mark.parametrize("seed", range(40))
def test_crowded_event_sets_score_as_sed_eval(seed):
    ref, est = _dense_sets(seed)
    _check(ref, est)


@pytest.mark.parametrize("case", list(_edge_sets()))
def test_edge_cases_score_as_sed_eval(case):
    ref, est = _edge_sets()[case]
    _check(ref, est)


def test_the_random_sets_exercise_every_kind_of_outcome():
    """The random sets are not all trivial: matches, substitutions, deletions, insertions and a
    file only the estimate has all occur."""
    totals = np.zeros(4)
    only_estimate = 0
    for seed in range(40):
        ref, est = _random_sets(seed)
        res = event_based(ref, est)
        totals += [res["matched"], res["substitutions"], res["deletions"], res["insertions"]]
        only_estimate += bool({e.file for e in est} - {e.file for e in ref})
    assert (totals > 10).all() and only_estimate > 0
    # in the crowded sets, unmatched events often fit several others
    assert sum(event_based(*_dense_sets(seed))["substitutions"] for seed in range(40)) > 40
