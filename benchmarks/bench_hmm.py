"""HMM word models: wavetrain's ``hmm-speech`` against an ``hmmlearn`` ``GMMHMM`` per word written as a
user would, on the same folds and the same features.

For each of 4 folds by speaker of ``spoken-words`` (and ``spoken-words-noisy``), in fresh processes
with one compute thread:

* wavetrain: ``train --where speaker=<others> --model hmm-speech`` then ``evaluate -m`` on the fold's
  speakers (wall time and peak RSS of each);
* hmmlearn: a script reads the csv, extracts the same features per recording
  (``wavetrain.features.extract`` with ``hmm-speech``'s spec), fits one
  ``GMMHMM(n_components=8, n_mix=6, covariance_type="diag", n_iter=20)`` per word with hmmlearn's own
  initialisation (k-means, every transition allowed) and answers the word of highest ``score``.

    .venv/bin/python benchmarks/bench_hmm.py [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): clean data, one fold of 6 + 2 speakers, 3 states of 2
Gaussians; results go to $TMPDIR/wavetrain-bench/. Writes ``benchmarks/results/hmm.json``. Skips when
the data set is missing.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

SHARED = _util.ROOT.parent / "shared" / "data"
SPEC = "mfcc(bands=40, coeffs=13, window_ms=25, shift_pct=40) | delta(order=2) | normalize(axis=time)"


def hmmlearn_fold(csv: Path, train: list[str], test: list[str], states: int, mixtures: int) -> dict:
    """The baseline, in this process: features, one GMMHMM per word, the test answers."""
    import numpy as np
    import soundfile as sf
    from hmmlearn.hmm import GMMHMM

    from wavetrain.features import extract

    rows = _util.read_csv_plain(csv)
    t0 = time.perf_counter()
    data: dict[str, list] = {"train": [], "test": []}
    for path, labels in rows:
        part = "train" if labels.get("speaker") in train else "test" if labels.get("speaker") in test else None
        if part is not None:
            x, rate = sf.read(path, dtype="float32")
            data[part].append((extract(x if x.ndim == 1 else x.mean(axis=1), rate, SPEC), labels["word"]))
    t1 = time.perf_counter()
    models = {}
    for word in sorted({w for _, w in data["train"]}):
        grams = [g for g, w in data["train"] if w == word]
        m = GMMHMM(n_components=states, n_mix=mixtures, covariance_type="diag", n_iter=20, random_state=0)
        models[word] = m.fit(np.concatenate(grams), lengths=[g.shape[0] for g in grams])
    t2 = time.perf_counter()
    right = sum(max(models, key=lambda w: models[w].score(g)) == word for g, word in data["test"])
    t3 = time.perf_counter()
    return {"accuracy": right / len(data["test"]), "test": len(data["test"]), "features_s": round(t1 - t0, 2),
            "fit_s": round(t2 - t1, 2), "score_s": round(t3 - t2, 2)}


def run(quick: bool, out: Path) -> dict:
    sets = ["spoken-words"] if quick else ["spoken-words", "spoken-words-noisy"]
    states, mixtures = (3, 2) if quick else (8, 6)
    results: dict = {"machine": _util.machine_info(), "load_before": _util.loadavg(), "quick": quick, "rows": []}
    with tempfile.TemporaryDirectory(prefix="wt-bench-hmm-") as tmp:
        work = Path(tmp)
        for name in sets:
            csv = SHARED / name / "metadata.csv"
            if not csv.exists():
                print(f"skip {name}: {csv} missing")
                continue
            speakers = sorted({lab["speaker"] for _, lab in _util.read_csv_plain(csv) if "speaker" in lab})
            folds = [speakers[:2]] if quick else [speakers[k::4] for k in range(4)]
            for k, test in enumerate(folds):
                train = [s for s in speakers if s not in test][: 6 if quick else None]
                model = work / "hmm.wt"
                tr = _util.run_measured(_util.wavetrain_cmd() + [
                    "train", "--data", str(csv), "--where", "speaker=" + ",".join(train), "--label", "word",
                    "--model", "hmm-speech", "--set", f"states={states}", "--set", f"mixtures={mixtures}",
                    "-o", str(model), "--no-cache", "--no-progress"])
                ev = _util.run_measured(_util.wavetrain_cmd() + [
                    "evaluate", "-m", str(model), "--data", str(csv), "--where", "speaker=" + ",".join(test),
                    "--label", "word", "--json", "--no-cache"])
                base = _util.run_measured([_util.python_exe(), __file__, "--hmmlearn", str(csv), ",".join(train),
                                           ",".join(test), str(states), str(mixtures)])
                ref = json.loads(base["stdout"].strip().splitlines()[-1])
                row = {"data": name, "fold": k + 1, "train_speakers": len(train), "test_speakers": len(test),
                       "wavetrain_accuracy": round(json.loads(ev["stdout"])["accuracy"], 4),
                       "wavetrain_train_s": tr["wall_s"], "wavetrain_train_rss_mb": tr["peak_rss_mb"],
                       "wavetrain_evaluate_s": ev["wall_s"],
                       "hmmlearn_accuracy": round(ref["accuracy"], 4), "hmmlearn_total_s": base["wall_s"],
                       "hmmlearn_fit_s": ref["fit_s"], "hmmlearn_score_s": ref["score_s"],
                       "hmmlearn_features_s": ref["features_s"], "hmmlearn_rss_mb": base["peak_rss_mb"]}
                print(json.dumps(row), flush=True)
                results["rows"].append(row)
    results["load_after"] = _util.loadavg()
    _util.write_json(out, results)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hmmlearn", nargs=5, metavar=("CSV", "TRAIN", "TEST", "STATES", "MIXTURES"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hmmlearn:
        csv, train, test, states, mixtures = args.hmmlearn
        print(json.dumps(hmmlearn_fold(Path(csv), train.split(","), test.split(","), int(states), int(mixtures))))
        return 0
    quick = _util.quick_mode(args.quick)
    out = _util.quick_out(_util.RESULTS / "hmm.json", "hmm") if quick else _util.RESULTS / "hmm.json"
    res = run(quick, out)
    rows = res["rows"]
    if rows:
        print(_util.markdown_table(
            ["data", "fold", "wavetrain acc", "train s", "hmmlearn acc", "hmmlearn fit s", "hmmlearn score s"],
            [[r["data"], r["fold"], r["wavetrain_accuracy"], r["wavetrain_train_s"], r["hmmlearn_accuracy"],
              r["hmmlearn_fit_s"], r["hmmlearn_score_s"]] for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
