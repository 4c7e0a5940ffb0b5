"""GMM word classification: wavetrain vs a plain librosa + scikit-learn script.

Data: ``/work/shared/data/spoken-words`` (1,440 one-second 16 kHz recordings, labels
``word=..;speaker=..``), split by speaker: the speakers sorted by name, every 4th one (12) is the
test set, the other 36 train.  Subset csvs in the metadata.csv format go to the work folder.

(a) wavetrain, each command in its own fresh process with one compute thread::

    wavetrain train --data train.csv --label word --model gmm --cache <fresh dir> -o m.wt
    wavetrain train ... (again, same cache: the warm-cache run)
    wavetrain classify -m m.wt test.csv --json --cache <fresh dir>
    wavetrain evaluate -m m.wt --data test.csv --label word --json --cache <fresh dir>
    wavetrain evaluate -m m.wt --data <all 1,440> --label word --cache <fresh dir>, then again
        with the same cache (a second run reads the features the first stored)

(b) the same job as a user would write it with librosa + scikit-learn (this file run with
``--baseline train|evaluate``): ``librosa.load(sr=16000)``, 13 MFCCs from 40 mel bands
(n_fft 400, hop 160) plus delta orders 1 and 2, one ``GaussianMixture(8, covariance_type='diag')``
per word on all frames of that word; a file gets the word whose mixture gives the highest mean
frame log-likelihood.

Reported: seconds of audio processed per wall second (the whole command, imports included, as a
user sees it; the in-process compute time too), peak RSS of each process, accuracy, and the
ratios wavetrain / baseline.  Writes ``benchmarks/results/gmm.json``.

    .venv/bin/python benchmarks/bench_gmm.py [--data DIR] [--workdir DIR] [--repeats 3] [--quick]

Every command runs ``--repeats`` times (interleaved, wavetrain then baseline); the fastest run
counts and the largest peak RSS.  ``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``) uses 12 train
and 4 test speakers and one round.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

DEFAULT_DATA = Path("/work/shared/data/spoken-words")


# ---- the librosa + scikit-learn baseline (runs in its own process) -------------------------------
def _baseline_features(path: Path):
    import librosa
    import numpy as np

    y, sr = librosa.load(path, sr=16000)
    m = librosa.feature.mfcc(y=y, sr=sr, n_mfcc=13, n_mels=40, n_fft=400, hop_length=160)
    f = np.vstack([m, librosa.feature.delta(m, order=1), librosa.feature.delta(m, order=2)])
    return f.T


def baseline_main(mode: str, csv_path: Path, model_path: Path, label: str) -> int:
    t_import = time.perf_counter()
    import pickle

    import librosa  # noqa: F401
    import numpy as np
    from sklearn.mixture import GaussianMixture

    t0 = time.perf_counter()
    items = _util.read_csv_plain(csv_path)
    if mode == "train":
        frames: dict[str, list] = {}
        for path, labels in items:
            frames.setdefault(labels[label], []).append(_baseline_features(path))
        t_feat = time.perf_counter()
        models = {}
        for word in sorted(frames):
            x = np.concatenate(frames[word])
            models[word] = GaussianMixture(8, covariance_type="diag", random_state=0).fit(x)
        with open(model_path, "wb") as f:
            pickle.dump(models, f)
        t1 = time.perf_counter()
        print(json.dumps({"import_s": t0 - t_import, "features_s": t_feat - t0, "fit_s": t1 - t_feat,
                          "compute_s": t1 - t0, "files": len(items),
                          "converged": {w: bool(m.converged_) for w, m in models.items()}}))
    else:
        with open(model_path, "rb") as f:
            models = pickle.load(f)
        words = sorted(models)
        correct = 0
        for path, labels in items:
            x = _baseline_features(path)
            scores = [models[w].score_samples(x).mean() for w in words]
            correct += words[int(np.argmax(scores))] == labels[label]
        t1 = time.perf_counter()
        print(json.dumps({"import_s": t0 - t_import, "compute_s": t1 - t0, "files": len(items),
                          "accuracy": correct / len(items)}))
    return 0


# ---- the benchmark driver ----------------------------------------------------------------------
def make_split(data: Path, work: Path, n_test_every: int = 4, quick: bool = False) -> dict:
    """Write train.csv and test.csv (absolute paths) split by speaker; return the split's facts."""
    import soundfile as sf

    rows = _util.read_csv_plain(data / "metadata.csv")
    speakers = sorted({lab["speaker"] for _, lab in rows})
    test_spk = speakers[n_test_every - 1::n_test_every]
    train_spk = [s for s in speakers if s not in test_spk]
    if quick:
        train_spk, test_spk = train_spk[:12], test_spk[:4]
    out = {}
    for name, spk in (("train", set(train_spk)), ("test", set(test_spk))):
        sel = [(p, lab) for p, lab in rows if lab["speaker"] in spk]
        csv = work / f"{name}.csv"
        with open(csv, "w") as f:
            for p, lab in sel:
                f.write(f"{p.resolve()},{';'.join(f'{k}={v}' for k, v in lab.items())}\n")
        seconds = sum(sf.info(str(p)).duration for p, _ in sel)
        out[name] = {"csv": str(csv), "recordings": len(sel), "speakers": sorted(spk),
                     "seconds_of_audio": round(seconds, 3),
                     "words": sorted({lab["word"] for _, lab in sel})}
    out["all_seconds_of_audio"] = round(sum(sf.info(str(p)).duration for p, _ in rows), 3)
    return out


def _features_seconds(model_file: Path) -> float | None:
    """Seconds the training run spent getting every gram once (extracting or reading the store)."""
    try:
        from wavetrain.models.modelfile import read_model_file

        return read_model_file(model_file)[0]["training"]["features_seconds"]
    except Exception:
        return None


def _trained_seconds(stdout: str) -> float | None:
    m = re.search(r" in ([0-9.]+) s -> ", stdout)
    return float(m[1]) if m else None


def _summ(run: dict, seconds: float, **extra) -> dict:
    r = {"wall_s": run["wall_s"], "peak_rss_mb": run["peak_rss_mb"],
         "audio_s_per_s": round(seconds / run["wall_s"], 2), "cmd": run["cmd"]}
    r.update(extra)
    return r


def run_bench(data: Path, work: Path, quick: bool, repeats: int = 3) -> dict:
    env = _util.single_thread_env({"WAVETRAIN_CACHE": str(work / "default-cache")})
    split = make_split(data, work, quick=quick)
    tr_s, te_s = split["train"]["seconds_of_audio"], split["test"]["seconds_of_audio"]
    train_csv, test_csv = split["train"]["csv"], split["test"]["csv"]
    wt = _util.wavetrain_cmd()
    res: dict = {"split": split, "loadavg": {}}

    me = [_util.python_exe(), str(Path(__file__).resolve()), "--baseline"]
    model, bmodel = work / "m.wt", work / "baseline.pkl"
    runs: dict[str, list] = {k: [] for k in ("train", "train_warm_cache", "classify", "evaluate",
                                             "evaluate_all", "evaluate_all_warm_cache",
                                             "baseline_train", "baseline_classify")}
    for rep in range(repeats):
        # (a) wavetrain: cold cache, then the same command with the warm cache
        res["loadavg"][f"round{rep + 1}_start"] = _util.loadavg()
        cache = _util.fresh_dir(work / "cache-train")
        runs["train"].append(_util.run_measured(
            wt + ["train", "--data", train_csv, "--label", "word", "--model", "gmm", "--cache", str(cache),
                  "--no-progress", "-o", str(model)], env=env))
        runs["train"][-1]["features_s"] = _features_seconds(model)
        runs["train_warm_cache"].append(_util.run_measured(
            wt + ["train", "--data", train_csv, "--label", "word", "--model", "gmm", "--cache", str(cache),
                  "--no-progress", "-o", str(work / "m2.wt")], env=env))
        runs["train_warm_cache"][-1]["features_s"] = _features_seconds(work / "m2.wt")
        runs["classify"].append(_util.run_measured(
            wt + ["classify", "-m", str(model), test_csv, "--json", "--no-progress",
                  "--cache", str(_util.fresh_dir(work / "cache-classify"))], env=env))
        runs["evaluate"].append(_util.run_measured(
            wt + ["evaluate", "-m", str(model), "--data", test_csv, "--label", "word", "--json", "--no-progress",
                  "--cache", str(_util.fresh_dir(work / "cache-eval"))], env=env))
        cache = _util.fresh_dir(work / "cache-eval-all")
        for key in ("evaluate_all", "evaluate_all_warm_cache"):
            runs[key].append(_util.run_measured(
                wt + ["evaluate", "-m", str(model), "--data", str(data), "--label", "word", "--json",
                      "--no-progress", "--cache", str(cache)], env=env))
        # (b) librosa + scikit-learn
        runs["baseline_train"].append(_util.run_measured(
            me + ["train", "--csv", train_csv, "--model-file", str(bmodel)], env=env))
        runs["baseline_classify"].append(_util.run_measured(
            me + ["evaluate", "--csv", test_csv, "--model-file", str(bmodel)], env=env))
    res["loadavg"]["end"] = _util.loadavg()
    res["repeats"] = repeats
    res["all_wall_s"] = {k: [r["wall_s"] for r in v] for k, v in runs.items()}
    res["all_peak_rss_mb"] = {k: [r["peak_rss_mb"] for r in v] for k, v in runs.items()}

    def best(key: str) -> dict:
        """The fastest of the repeats (the machine is shared), with the largest peak RSS of them."""
        r = dict(min(runs[key], key=lambda x: x["wall_s"]))
        rss = [x["peak_rss_mb"] for x in runs[key] if x["peak_rss_mb"] is not None]
        r["peak_rss_mb"] = max(rss) if rss else None
        return r

    train1, train2, classify, evaluate = best("train"), best("train_warm_cache"), best("classify"), best("evaluate")
    ev = json.loads(runs["evaluate"][-1]["stdout"].strip().splitlines()[-1])
    # accuracy from classify's own output as a cross-check (one window per recording)
    truth = {str(p.resolve()): lab["word"] for p, lab in _util.read_csv_plain(Path(test_csv))}
    lines = [json.loads(ln) for ln in classify["stdout"].splitlines() if ln.startswith("{")]
    cls_acc = sum(truth.get(str(Path(d["file"]).resolve())) == d["value"] for d in lines) / max(len(lines), 1)
    wt_res = {
        "train": _summ(train1, tr_s, in_process_train_s=_trained_seconds(train1["stdout"])),
        "train_warm_cache": _summ(train2, tr_s, in_process_train_s=_trained_seconds(train2["stdout"])),
        "classify": _summ(classify, te_s, windows=len(lines), accuracy=round(cls_acc, 4)),
        "evaluate": _summ(evaluate, te_s),
        "accuracy": ev["accuracy"], "macro_f1": ev.get("macro_f1"), "em_passes": _util.em_passes(model),
    }
    # cold / warm: per round (each warm run follows its own cold run), and the best of each
    wt_res["cold_over_warm_train_per_round"] = [round(a["wall_s"] / b["wall_s"], 2)
                                                for a, b in zip(runs["train"], runs["train_warm_cache"])]
    wt_res["cold_over_warm_train"] = round(train1["wall_s"] / train2["wall_s"], 2)
    f1 = [r["features_s"] for r in runs["train"] if r.get("features_s")]
    f2 = [r["features_s"] for r in runs["train_warm_cache"] if r.get("features_s")]
    if f1 and f2:
        wt_res["features_s_cold_warm"] = [min(f1), min(f2)]
        wt_res["cold_over_warm_features"] = round(min(f1) / min(f2), 2)
    ev1, ev2 = best("evaluate_all"), best("evaluate_all_warm_cache")
    wt_res["evaluate_all"] = _summ(ev1, split["all_seconds_of_audio"])
    wt_res["evaluate_all_warm_cache"] = _summ(ev2, split["all_seconds_of_audio"])
    wt_res["cold_over_warm_evaluate_all_per_round"] = [
        round(a["wall_s"] / b["wall_s"], 2)
        for a, b in zip(runs["evaluate_all"], runs["evaluate_all_warm_cache"])]
    wt_res["cold_over_warm_evaluate_all"] = round(ev1["wall_s"] / ev2["wall_s"], 2)
    t1, t2 = wt_res["train"]["in_process_train_s"], wt_res["train_warm_cache"]["in_process_train_s"]
    wt_res["cold_over_warm_train_in_process"] = round(t1 / t2, 2) if t1 and t2 else None
    res["wavetrain"] = wt_res

    btrain, btest = best("baseline_train"), best("baseline_classify")
    bt, be = json.loads(btrain["stdout"].splitlines()[-1]), json.loads(btest["stdout"].splitlines()[-1])
    res["baseline"] = {
        "train": _summ(btrain, tr_s, in_process_compute_s=round(bt["compute_s"], 3),
                       import_s=round(bt["import_s"], 3), features_s=round(bt["features_s"], 3),
                       fit_s=round(bt["fit_s"], 3), converged=bt["converged"]),
        "classify": _summ(btest, te_s, in_process_compute_s=round(be["compute_s"], 3)),
        "accuracy": be["accuracy"],
    }

    b = res["baseline"]
    res["ratios_wavetrain_over_baseline"] = {
        "train_audio_s_per_s": round(wt_res["train"]["audio_s_per_s"] / b["train"]["audio_s_per_s"], 2),
        "train_warm_audio_s_per_s": round(wt_res["train_warm_cache"]["audio_s_per_s"]
                                          / b["train"]["audio_s_per_s"], 2),
        "classify_audio_s_per_s": round(wt_res["classify"]["audio_s_per_s"] / b["classify"]["audio_s_per_s"], 2),
        "train_peak_rss": round(wt_res["train"]["peak_rss_mb"] / b["train"]["peak_rss_mb"], 2),
        "classify_peak_rss": round(wt_res["classify"]["peak_rss_mb"] / b["classify"]["peak_rss_mb"], 2),
        "accuracy": round(wt_res["accuracy"] / b["accuracy"], 3) if b["accuracy"] else None,
    }
    return res


def table(res: dict) -> str:
    w, b, r = res["wavetrain"], res["baseline"], res["ratios_wavetrain_over_baseline"]
    rows = [
        ["train: audio s / s", w["train"]["audio_s_per_s"], b["train"]["audio_s_per_s"], r["train_audio_s_per_s"]],
        ["train: wall s", w["train"]["wall_s"], b["train"]["wall_s"], None],
        ["train: in-process s (no imports)", w["train"]["in_process_train_s"], b["train"]["in_process_compute_s"],
         None],
        ["train: peak RSS MB", w["train"]["peak_rss_mb"], b["train"]["peak_rss_mb"], r["train_peak_rss"]],
        ["train, warm cache: audio s / s", w["train_warm_cache"]["audio_s_per_s"], None,
         r["train_warm_audio_s_per_s"]],
        ["train, warm cache: wall s", w["train_warm_cache"]["wall_s"], None, None],
        ["train, warm cache: in-process s", w["train_warm_cache"]["in_process_train_s"], None, None],
        ["train, warm cache: peak RSS MB", w["train_warm_cache"]["peak_rss_mb"], None, None],
        ["classify: audio s / s", w["classify"]["audio_s_per_s"], b["classify"]["audio_s_per_s"],
         r["classify_audio_s_per_s"]],
        ["classify: wall s", w["classify"]["wall_s"], b["classify"]["wall_s"], None],
        ["classify: peak RSS MB", w["classify"]["peak_rss_mb"], b["classify"]["peak_rss_mb"], r["classify_peak_rss"]],
        ["evaluate (wavetrain): audio s / s", w["evaluate"]["audio_s_per_s"], None, None],
        ["evaluate all 1,440 (wavetrain), cold / warm cache: wall s",
         f"{w['evaluate_all']['wall_s']} / {w['evaluate_all_warm_cache']['wall_s']}", None, None],
        ["accuracy", w["accuracy"], b["accuracy"], r["accuracy"]],
    ]
    s = res["split"]
    head = (f"GMM, spoken words: train {s['train']['recordings']} recordings "
            f"({s['train']['seconds_of_audio']:.0f} s, {len(s['train']['speakers'])} speakers), test "
            f"{s['test']['recordings']} ({s['test']['seconds_of_audio']:.0f} s, {len(s['test']['speakers'])} "
            f"speakers); one thread; wall time of the whole command, fastest of {res.get('repeats', 1)} rounds; "
            f"peak RSS the largest of them\n\n")
    foot = (f"\n\nwavetrain training, cold / warm feature cache: {w['cold_over_warm_train']}x wall "
            f"({w['cold_over_warm_train_in_process']}x in-process training time); evaluating all "
            f"1,440 recordings, cold / warm: {w['cold_over_warm_evaluate_all']}x wall; feature stage "
            f"of training (every gram once), cold / warm: {w.get('features_s_cold_warm')} s = "
            f"{w.get('cold_over_warm_features')}x; wavetrain EM passes: {w.get('em_passes')}")
    return head + _util.markdown_table(["", "wavetrain", "librosa + sklearn", "ratio"], rows) + foot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--workdir", type=Path, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, help="rounds of every command; the fastest counts, the largest "
                                                "peak RSS counts (default 3, 1 with --quick)")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "gmm.json",
                    help="JSON result (default benchmarks/results/gmm.json; with --quick a file in /tmp)")
    ap.add_argument("--retable", action="store_true", help="only print the table of --out's JSON")
    ap.add_argument("--baseline", choices=("train", "evaluate"), help=argparse.SUPPRESS)
    ap.add_argument("--csv", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--model-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.baseline:
        return baseline_main(args.baseline, args.csv, args.model_file, "word")
    if args.retable:
        print(table(json.loads(args.out.read_text())))
        return 0
    quick = _util.quick_mode(args.quick)
    repeats = args.repeats or (1 if quick else 3)
    if not (args.data / "metadata.csv").exists():
        print(f"bench_gmm: {args.data}/metadata.csv not found; skipping", file=sys.stderr)
        return 0
    info = _util.machine_info()
    if args.workdir:
        work = _util.fresh_dir(args.workdir)
        res = run_bench(args.data, work, quick, repeats)
    else:
        with tempfile.TemporaryDirectory(prefix="wt-bench-gmm-") as tmp:
            res = run_bench(args.data, Path(tmp), quick, repeats)
    res = {"benchmark": "gmm", "quick": quick, "machine": info, **res,
           "loadavg_end": _util.loadavg()}
    out = _util.quick_out(args.out, "gmm") if quick else args.out
    _util.write_json(out, res)
    print(table(res))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
