"""The DCASE scores per machine type, section and domain and the official score
(:mod:`wavetrain.evaluation.dcase_scores`) against a re-implementation of the DCASE 2023 task 2
evaluator's formulas (scikit-learn's ``roc_auc_score``, ``scipy.stats.hmean`` of the figures
floored at the float epsilon), and hand cases."""
import sys

import numpy as np
import pytest
from scipy.stats import hmean
from sklearn.metrics import roc_auc_score

from wavetrain.evaluation.dcase_scores import (
    dcase_report,
    domain_order,
    format_dcase,
    harmonic_mean,
    recording_scores,
    section_roc,
)


def evaluator(y, scores, section, domain, machine):
    """The evaluator's loop (dcase2023_task2_evaluator.py ``output_result``): per machine type and
    section, pAUC over the section, AUC per domain over ``(y_domain == d) | (y_true != 0)``; the
    official score the harmonic mean of every AUC source, AUC target and pAUC, floored at eps."""
    y, scores = np.asarray(y), np.asarray(scores)
    section, domain, machine = (np.asarray(a, dtype=object) for a in (section, domain, machine))
    per_group, src, tgt, paucs = {}, [], [], []
    for m in sorted(set(machine)):
        for s in sorted(set(section[machine == m])):
            i = (machine == m) & (section == s)
            y_all, p_all, d = y[i], scores[i], domain[i]
            pauc = roc_auc_score(y_all, p_all, max_fpr=0.1)
            aucs = {}
            for dom in ("source", "target"):
                keep = (d == dom) | (y_all != 0)
                aucs[dom] = roc_auc_score(y_all[keep], p_all[keep])
            per_group[(m, s)] = (aucs["source"], aucs["target"], pauc)
            src.append(aucs["source"])
            tgt.append(aucs["target"])
            paucs.append(pauc)
    official = hmean(np.maximum(np.array(src + tgt + paucs), sys.float_info.epsilon))
    return per_group, official, (hmean(np.maximum(src, sys.float_info.epsilon)),
                                 hmean(np.maximum(tgt, sys.float_info.epsilon)),
                                 hmean(np.maximum(paucs, sys.float_info.epsilon)))


def fleet(rng, machines=("fan", "pump"), sections=("s00", "s01", "s02"), per=(10, 10), ties=False):
    """Random recordings: per machine type, section and domain ``per`` normal and anomalous ones,
    anomalies scoring higher on average (by a shift of each section's own)."""
    rows = []
    for m in machines:
        for s in sections:
            shift = rng.uniform(-0.5, 2.0)
            for d in ("source", "target"):
                for label, n in ((0, per[0]), (1, per[1])):
                    for _ in range(n):
                        score = rng.normal(shift * label + (0.7 if d == "target" else 0.0), 1.0)
                        rows.append((m, s, d, label, round(score, 1) if ties else score))
    m, s, d, y, p = (np.array(c, dtype=object if k < 3 else float) for k, c in enumerate(zip(*rows)))
    return y.astype(int), p, s, d, m


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [False, True])
def test_the_figures_and_official_score_are_the_evaluators(seed, ties):
    rng = np.random.default_rng(seed)
    y, p, s, d, m = fleet(rng, per=(int(rng.integers(3, 12)), int(rng.integers(2, 9))), ties=ties)
    order = rng.permutation(y.size)                   # the recordings in any order
    y, p, s, d, m = y[order], p[order], s[order], d[order], m[order]
    expected, official, (h_src, h_tgt, h_pauc) = evaluator(y, p, s, d, m)
    res = dcase_report(y, p, s, d, machine=m)
    assert res["domains"] == ["source", "target"]
    assert [(g["machine"], g["section"]) for g in res["groups"]] == sorted(expected)
    for g in res["groups"]:
        auc_s, auc_t, pauc = expected[(g["machine"], g["section"])]
        assert g["auc"]["source"] == pytest.approx(auc_s, abs=1e-12)
        assert g["auc"]["target"] == pytest.approx(auc_t, abs=1e-12)
        assert g["pauc"] == pytest.approx(pauc, abs=1e-12)
    assert res["official_score"] == pytest.approx(official, abs=1e-12)
    assert res["harmonic_mean"]["auc"]["source"] == pytest.approx(h_src, abs=1e-12)
    assert res["harmonic_mean"]["auc"]["target"] == pytest.approx(h_tgt, abs=1e-12)
    assert res["harmonic_mean"]["pauc"] == pytest.approx(h_pauc, abs=1e-12)
    assert res["figures"] == 3 * len(expected) and res["left_out"] == []
    # each machine type's score is the evaluator's over its own sections
    for name in ("fan", "pump"):
        _, own, _ = evaluator(y[m == name], p[m == name], s[m == name], d[m == name], m[m == name])
        assert res["machines"][name]["score"] == pytest.approx(own, abs=1e-12)


def test_a_hand_section():
    # source normals 1, 2; target normals 3, 4; anomalies 2.5 (source) and 5 (target)
    y = [0, 0, 0, 0, 1, 1]
    p = [1.0, 2.0, 3.0, 4.0, 2.5, 5.0]
    d = ["source", "source", "target", "target", "source", "target"]
    res = dcase_report(y, p, ["s00"] * 6, d)
    g = res["groups"][0]
    assert g["machine"] is None and g["section"] == "s00"
    assert g["auc"] == {"source": 1.0, "target": 0.5}          # 4 of 4 pairs; 2.5 < 3, 4 and 5 > 3, 4
    # ROC over all: (0, .5) at 5, then (.25, .5): the area to FPR 0.1 is 0.05, McClish-standardised
    assert g["pauc"] == pytest.approx(0.5 * (1 + (0.05 - 0.005) / (0.1 - 0.005)))
    assert (g["normal"], g["anomalous"]) == ({"source": 2, "target": 2}, {"source": 1, "target": 1})
    assert res["official_score"] == pytest.approx(3 / (1 / 1.0 + 1 / 0.5 + 1 / g["pauc"]))
    assert "machines" not in res


def test_a_perfect_and_an_inverted_detector():
    y = np.array([0, 0, 1, 1, 0, 0, 1, 1])
    d = np.array(["source"] * 4 + ["target"] * 4)
    p = np.array([0.1, 0.2, 0.8, 0.9, 0.3, 0.4, 0.7, 0.6])
    perfect = dcase_report(y, p, ["s00"] * 8, d)
    assert perfect["official_score"] == pytest.approx(1.0)
    inverted = dcase_report(y, -p, ["s00"] * 8, d)
    g = inverted["groups"][0]
    assert g["auc"] == {"source": 0.0, "target": 0.0}
    # an AUC of 0 counts as the float epsilon, as the evaluator floors it: the harmonic mean collapses
    assert 0 < inverted["official_score"] < 1e-14
    assert inverted["official_score"] == pytest.approx(hmean(np.maximum([0.0, 0.0, g["pauc"]], sys.float_info.epsilon)))


def test_figures_without_both_kinds_are_na_and_left_out_of_the_means():
    y = [0, 0, 1, 1, 0, 0, 1, 1] + [0, 0, 0, 0] + [0, 0, 1]
    p = [0.1, 0.2, 0.8, 0.9, 0.3, 0.4, 0.7, 0.6] + [0.5, 0.2, 0.3, 0.1] + [0.1, 0.3, 0.2]
    sec = ["s00"] * 8 + ["s01"] * 4 + ["s02"] * 3
    d = ["source"] * 4 + ["target"] * 4 + ["source", "source", "target", "target"] + ["source", "source", "source"]
    res = dcase_report(y, p, sec, d)
    by = {g["section"]: g for g in res["groups"]}
    assert by["s01"]["auc"] == {"source": None, "target": None} and by["s01"]["pauc"] is None
    # s02 has no target normal recording: its AUC target is n/a, its AUC source and pAUC are not
    assert by["s02"]["auc"]["target"] is None and by["s02"]["auc"]["source"] == 0.5
    assert res["left_out"] == ["s01: AUC source", "s01: AUC target", "s01: pAUC", "s02: AUC target"]
    assert res["figures"] == 5
    kept = [1.0, 1.0, by["s00"]["pauc"], 0.5, by["s02"]["pauc"]]
    assert res["official_score"] == pytest.approx(hmean(kept))
    text = format_dcase(res)
    assert text.count("note: n/a") == 1 and "s01: pAUC" in text
    s01 = next(line for line in text.splitlines() if line.startswith("s01 "))
    assert s01.split()[1:4] == ["n/a", "n/a", "n/a"]


def test_a_recording_scores_the_mean_of_its_windows():
    s = recording_scores([1.0, 3.0, 10.0, 2.0, 4.0], [0, 0, 2, 0, 2], 3)
    assert s[0] == pytest.approx(2.0) and np.isnan(s[1]) and s[2] == pytest.approx(7.0)
    # a recording without windows is left out and counted
    res = dcase_report([0, 1, 1, 0], [0.1, np.nan, 0.9, 0.2], ["a"] * 4, ["source", "source", "target", "target"])
    assert res["unscored"] == 1 and res["recordings"] == 3
    assert res["groups"][0]["anomalous"] == {"source": 0, "target": 1}


def test_domains_are_two_source_first():
    assert domain_order(["target", "source", "target"]) == ("source", "target")
    assert domain_order(["b", "a"]) == ("a", "b")
    for bad in (["source"], ["a", "b", "c"], []):
        with pytest.raises(ValueError, match="expected two domains"):
            domain_order(bad)


def test_the_harmonic_mean_skips_none_and_floors_at_epsilon():
    assert harmonic_mean([None, None]) is None
    assert harmonic_mean([0.5, None, 1.0]) == pytest.approx(hmean([0.5, 1.0]))
    assert harmonic_mean([0.0, 1.0]) == pytest.approx(2 * sys.float_info.epsilon, rel=1e-6)


def test_the_roc_of_a_domain_is_its_normals_against_every_anomaly():
    y = [0, 0, 1, 1]
    p = [0.1, 0.6, 0.5, 0.9]
    d = ["source", "target", "target", "source"]
    fpr, tpr = section_roc(y, p, d, "source")            # 0.1 against 0.5 and 0.9: perfect
    assert np.trapezoid(tpr, fpr) == pytest.approx(1.0)
    fpr, tpr = section_roc(y, p, d, "target")            # 0.6 against 0.5 and 0.9: half
    assert np.trapezoid(tpr, fpr) == pytest.approx(0.5)
    assert section_roc([0, 0], [0.1, 0.2], ["source", "target"], "source")[0].size == 0
