"""False alarms of detector thresholds on new normal clips, against the rate asked for.

For each registered detector family (``--families``, default every one), machine (fan, pump,
bearing, gearbox) and unit (u1-u3) of ``/work/shared/data/machines``: train on the unit's
``split=train`` clips (default parameters, ``fpr=0.05``: 48 clips learnt, 12 held out to set the
threshold), score the unit's 20 normal ``split=test`` clips and count the share above the
threshold. Besides the shipped threshold (:func:`wavetrain.evaluation.detection_metrics.fit_threshold`:
a gamma fit with so few held-out windows), the same held-out scores give the plain ``1 - fpr``
quantile (the earlier threshold) and the DCASE baseline's gamma fit with a free location
(``scipy.stats.gamma.fit(scores)``), for comparison. Reported per family: the mean (and the
spread over units) of the measured false-alarm rate, and the mean expected range printed at
training. Target: mean measured rate 0.02-0.10 at fpr 0.05.

Runs in-process (rates, not times, are measured), one compute thread; writes
``benchmarks/results/thresholds.json``.

    .venv/bin/python benchmarks/bench_thresholds.py [--families F ...] [--quick] [-o OUT]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): unit u1 of each machine, two families.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

DEFAULT_DATA = Path("/work/shared/data/machines")
MACHINES = ("fan", "pump", "bearing", "gearbox")
UNITS = ("u1", "u2", "u3")
FPR = 0.05


def dcase_gamma_threshold(scores: np.ndarray, fpr: float) -> float:
    """The DCASE baseline's: a three-parameter gamma fit (free location) to positive scores."""
    from scipy import stats

    shift = 0.0 if scores.min() > 0 else scores.min() - max(scores.std(), 1e-12)
    a, loc, scale = stats.gamma.fit(scores - shift)
    return float(stats.gamma.ppf(1 - fpr, a, loc=loc, scale=scale) + shift)


def one_unit(family: str, data: Path, machine: str, unit: str) -> dict:
    from wavetrain.data import load_dataset
    from wavetrain.evaluation.detection_metrics import threshold_at_fpr
    from wavetrain.models.anomaly import AnomalyDetector
    from wavetrain.pipeline.jobs import RunOptions, detector_scores, train_model

    where = [("machine", [machine]), ("unit", [unit])]
    held: dict = {}
    original = AnomalyDetector.set_threshold

    def spy(self, scores):
        held["scores"] = np.asarray(scores, dtype=np.float64).copy()
        return original(self, scores)

    AnomalyDetector.set_threshold = spy  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        train = load_dataset([str(data)], where=where + [("split", ["train"])])
        model, _ = train_model(train, "state", family, {"fpr": FPR}, RunOptions())
        train_s = time.perf_counter() - t0
    finally:
        AnomalyDetector.set_threshold = original  # type: ignore[method-assign]
    test = load_dataset([str(data)], where=where + [("split", ["test"]), ("state", ["normal"])])
    _, s, _, _ = detector_scores(model, test, "state", "normal", RunOptions(), warn=False)
    s = np.asarray(s)
    h = held["scores"]
    thresholds = {"shipped": model.threshold_, "quantile": threshold_at_fpr(h, FPR),
                  "gamma_dcase": dcase_gamma_threshold(h, FPR)}
    return {"family": family, "machine": machine, "unit": unit, "held_out_windows": int(h.size),
            "test_normal_windows": int(s.size), "method": model.train_info_.get("threshold_method"),
            "expected_fpr": model.train_info_.get("expected_fpr"), "train_seconds": round(train_s, 2),
            "thresholds": {k: float(v) for k, v in thresholds.items()},
            "false_alarms": {k: float(np.mean(s > v)) for k, v in thresholds.items()},
            "held_out_scores": [round(float(v), 5) for v in h], "test_normal_scores": [round(float(v), 5) for v in s]}


def summarise(rows: list[dict]) -> dict:
    out: dict = {}
    for fam in sorted({r["family"] for r in rows}, key=[r["family"] for r in rows].index):
        rs = [r for r in rows if r["family"] == fam]
        fam_out: dict = {"units": len(rs)}
        for k in rs[0]["false_alarms"]:
            v = np.array([r["false_alarms"][k] for r in rs])
            fam_out[k] = {"mean": round(float(v.mean()), 4), "min": float(v.min()), "max": float(v.max()),
                          "sd": round(float(v.std(ddof=1)), 4) if v.size > 1 else 0.0}
        ex = np.array([r["expected_fpr"] for r in rs if r["expected_fpr"]])
        if ex.size:
            fam_out["expected_range_mean"] = [round(float(ex[:, 0].mean()), 4), round(float(ex[:, 1].mean()), 4)]
        fam_out["shipped_in_target"] = bool(0.02 <= fam_out["shipped"]["mean"] <= 0.10)
        out[fam] = fam_out
    return out


def main(argv=None) -> int:
    from wavetrain.models import registry

    detectors = [n for n in registry.family_names() if getattr(registry.family(n), "detector", False)]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--families", nargs="+", default=detectors)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("-o", "--output", type=Path, default=_util.RESULTS / "thresholds.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("WAVETRAIN_PROGRESS", "0")
    quick = _util.quick_mode(args.quick)
    units = UNITS[:1] if quick else UNITS
    families = args.families[:2] if quick else args.families
    out = _util.quick_out(args.output, "thresholds") if quick else args.output
    rows = []
    for fam in families:
        for m in MACHINES:
            for u in units:
                r = one_unit(fam, args.data, m, u)
                rows.append(r)
                print(f"{fam:12s} {m:8s} {u}  held-out {r['held_out_windows']:3d}  false alarms "
                      + "  ".join(f"{k} {v:.2f}" for k, v in r["false_alarms"].items()), flush=True)
    summary = summarise(rows)
    for fam, f in summary.items():
        print(f"{fam:12s} mean false alarms: " + "  ".join(f"{k} {f[k]['mean']:.3f}" for k in rows[0]["false_alarms"])
              + f"  (expected range at training, mean: {f.get('expected_range_mean')})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"fpr": FPR, "data": str(args.data), "quick": quick, "summary": summary,
                               "units": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
