"""Generalisation: models measured on speakers and machine units they never saw in training.

Two measures, each run through the CLI in fresh processes with one compute thread:

* **clean → noisy, speakers held out**: train on ``spoken-words`` recordings of the first 36
  speakers (sorted names), evaluate on ``spoken-words-noisy`` recordings of the other 12 (reverb,
  band limits, pitch/tempo changes, noise at 0–20 dB SNR). Models: ``gmm``, ``gmm-speech``,
  ``knn``, ``cnn``, ``dcase`` and ``rescnn`` (``--set epochs=``), with and without training-time
  augmentation (:data:`ROOM`, :data:`VOICE`); accuracy overall and by the test recording's noise
  (``noise=`` label).
* **speakers held out, k folds**: 4-fold cross-validation by speaker (``evaluate --folds 4
  --group-by speaker --repeat 3``) on ``spoken-words`` and on ``spoken-words-noisy``, for the
  speech models of :data:`FOLD_MODELS` with and without vocal tract length normalisation
  (``vtln=true``); accuracy as mean ± sd over the three repeats (each with its own folds and seed).
* **machines, cross-unit**: for each machine type and each unit, every registered anomaly
  detector trained on the other two units' normal ``split=train`` clips and evaluated (ROC AUC,
  pAUC) on the held-out unit's ``split=test`` clips. ``--repeat N`` trains a family with a
  ``seed`` parameter N times (``--set seed=0`` … ``seed=N-1``) and reports each case's mean and sd
  over the repeats; a family without one runs once (``deterministic``).

    .venv/bin/python benchmarks/bench_generalisation.py [--parts speech folds machines] [--repeat N] [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): ``gmm`` with and without ``room`` only, 6 + 4
speakers, ``gmm-speech`` with and without ``vtln`` on 8 speakers in 2 folds once, one machine type
and the non-neural detectors once; results go to $TMPDIR/wavetrain-bench/. Writes
``benchmarks/results/generalisation.json`` (the parts not run keep their figures there; each part
run records its command, date and load average at start and end as ``<part>_run``). Skips a part
whose data set is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402
from wavetrain.features.augment import PRESETS  # noqa: E402

SHARED = _util.ROOT.parent / "shared" / "data"
#: The augmentation of the speech runs: the ``room`` preset (silence around the recording, reverb,
#: band limits, noise of any colour at 0-20 dB), with and without pitch and speed changes.
ROOM = "room"
VOICE = "room | pitch(semitones=-2:2, p=0.5) | speed(factor=0.9:1.1, p=0.5)"
#: (name, model spec, extra train arguments) of the speech part.
SPEECH_MODELS = [
    ("gmm", "gmm", []),
    ("gmm + room", "gmm", ["--set", f"augment={ROOM}"]),
    ("gmm-speech", "gmm-speech", []),
    ("gmm-speech + room", "gmm-speech", ["--set", f"augment={ROOM}"]),
    ("gmm-speech + room, pitch, speed", "gmm-speech", ["--set", f"augment={VOICE}"]),
    ("knn", "knn", []),
    ("knn + room, pitch, speed", "knn", ["--set", f"augment={VOICE}"]),
    ("cnn, 15 epochs", "cnn", ["--set", "epochs=15"]),
    ("cnn, 15 epochs + room", "cnn", ["--set", "epochs=15", "--set", f"augment={ROOM}"]),
    ("cnn, 15 epochs + room, pitch, speed, specaugment", "cnn",
     ["--set", "epochs=15", "--set", f"augment={VOICE} | specaugment(time=2, freq=2)"]),
    ("dcase, 15 epochs", "dcase", ["--set", "epochs=15"]),
    ("rescnn, 15 epochs", "rescnn", ["--set", "epochs=15"]),
]
#: (name, model spec, extra arguments) of the k-fold part.
VTLP = "copies(n=3) | warp(factor=0.9:1.1)"
FOLD_MODELS = [
    ("gmm-speech", "gmm-speech", []),
    ("gmm-speech, vtln", "gmm-speech", ["--set", "vtln=true"]),
    # (the frame cache holds the three warped copies: EM passes then read them instead of extracting again)
    ("gmm-speech, vtlp", "gmm-speech", ["--set", f"augment={VTLP}", "--set", "frame_cache_mb=512"]),
    ("gmm-speech, vtlp + vtln", "gmm-speech", ["--set", f"augment={VTLP}", "--set", "frame_cache_mb=512",
                                               "--set", "vtln=true"]),
    ("hmm-speech", "hmm-speech", []),
    ("hmm-speech, vtln", "hmm-speech", ["--set", "vtln=true"]),
]
FOLDS, REPEATS = 4, 3
MACHINES = ("fan", "pump", "bearing", "gearbox")
UNITS = ("u1", "u2", "u3")


def _speakers(csv: Path) -> list[str]:
    return sorted({labels["speaker"] for _, labels in _util.read_csv_plain(csv) if "speaker" in labels})


def speech(work: Path, quick: bool) -> list[dict]:
    clean, noisy = SHARED / "spoken-words", SHARED / "spoken-words-noisy"
    speakers = _speakers(clean / "metadata.csv")
    train, test = (speakers[:6], speakers[6:10]) if quick else (speakers[:36], speakers[36:])
    models = SPEECH_MODELS[:2] if quick else SPEECH_MODELS
    noises = sorted({labels["noise"] for _, labels in _util.read_csv_plain(noisy / "metadata.csv")
                     if labels.get("speaker") in test and "noise" in labels})
    rows = []
    for name, spec, extra in models:
        model = work / "speech.wt"
        t = _util.run_measured(_util.wavetrain_cmd() + [
            "train", "--data", str(clean), "--where", "speaker=" + ",".join(train), "--label", "word",
            "--model", spec, *extra, "-o", str(model), "--cache", str(work / "cache"), "--no-progress"])
        e = _util.run_measured(_util.wavetrain_cmd() + [
            "evaluate", "-m", str(model), "--data", str(noisy), "--where", "speaker=" + ",".join(test),
            "--label", "word", "--json", "--cache", str(work / "cache")])
        res = json.loads(e["stdout"])
        by_noise = {}
        for kind in noises:
            k = _util.run_measured(_util.wavetrain_cmd() + [
                "evaluate", "-m", str(model), "--data", str(noisy), "--where", "speaker=" + ",".join(test),
                "--where", f"noise={kind}", "--label", "word", "--json", "--cache", str(work / "cache")])
            by_noise[kind] = json.loads(k["stdout"])["accuracy"]
        rows.append({"model": name, "spec": spec, "args": extra, "accuracy": res["accuracy"],
                     "macro_f1": res["macro_f1"], "accuracy_by_noise": by_noise, "train_wall_s": t["wall_s"],
                     "train_peak_rss_mb": t["peak_rss_mb"], "train_speakers": len(train), "test_speakers": len(test)})
        print(f"{name:36s} clean -> noisy accuracy {res['accuracy']:.4f} "
              f"({', '.join(f'{k} {v:.3f}' for k, v in by_noise.items())})  train {t['wall_s']:.1f} s "
              f"{t['peak_rss_mb']} MB", flush=True)
    return rows


def folds(work: Path, quick: bool, only: list[str] | None = None) -> list[dict]:
    """k-fold cross-validation by speaker of the speech models (those named in ``only``: all by
    default), clean and noisy."""
    speakers = _speakers(SHARED / "spoken-words" / "metadata.csv")
    where = ["--where", "speaker=" + ",".join(speakers[:8])] if quick else []
    k, repeats = (2, 1) if quick else (FOLDS, REPEATS)
    rows = []
    for name, spec, extra in FOLD_MODELS[:2] if quick else FOLD_MODELS:
        if only and name not in only:
            continue
        for data in ("spoken-words", "spoken-words-noisy"):
            e = _util.run_measured(_util.wavetrain_cmd() + [
                "evaluate", "--model", spec, *extra, "--data", str(SHARED / data), *where, "--label", "word",
                "--folds", str(k), "--group-by", "speaker", "--repeat", str(repeats), "--json",
                "--cache", str(work / "cache")])
            res = json.loads(e["stdout"])
            runs = [r["accuracy"] for r in res.get("repeats", [res])]
            rows.append({"model": name, "spec": spec, "args": extra, "data": data, "folds": k,
                         "accuracy_mean": float(np.mean(runs)), "accuracy_sd": float(np.std(runs, ddof=1)) if
                         len(runs) > 1 else 0.0, "accuracy_repeats": runs, "wall_s": e["wall_s"],
                         "peak_rss_mb": e["peak_rss_mb"]})
            print(f"{name:20s} {data:20s} accuracy {np.mean(runs):.4f} ± {rows[-1]['accuracy_sd']:.4f} "
                  f"({', '.join(f'{v:.4f}' for v in runs)})  {e['wall_s']:.0f} s {e['peak_rss_mb']} MB", flush=True)
    return rows


def detectors() -> list[str]:
    from wavetrain.models.registry import family, family_names

    return [n for n in family_names() if getattr(family(n), "detector", False)]


def seeded(fam: str) -> bool:
    """Whether detector family ``fam`` takes a ``seed`` parameter (its parameter table says)."""
    from wavetrain.models.registry import family

    return any(p.name == "seed" for p in family(fam).param_table())


def _sd(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def machines(work: Path, quick: bool, repeat: int = 1) -> list[dict]:
    """Cross-unit runs of every detector; a family with a ``seed`` parameter ``repeat`` times
    (seeds 0 … repeat-1; once with ``quick``), one without it once."""
    data = SHARED / "machines"
    fams = [f for f in detectors() if f != "autoencoder"] if quick else detectors()
    rows = []
    for fam in fams:
        seeds = list(range(1 if quick else repeat)) if seeded(fam) else [None]
        for mach in MACHINES[:1] if quick else MACHINES:
            for held in UNITS:
                others = ",".join(u for u in UNITS if u != held)
                model = work / "det.wt"
                aucs, paucs, walls, rss = [], [], [], []
                for seed in seeds:
                    t = _util.run_measured(_util.wavetrain_cmd() + [
                        "train", "--data", str(data), "--where", f"machine={mach}", "--where", f"unit={others}",
                        "--where", "split=train", "--label", "state", "--model", fam,
                        *(["--set", f"seed={seed}"] if seed is not None else []), "-o", str(model),
                        "--cache", str(work / "cache"), "--no-progress"])
                    e = _util.run_measured(_util.wavetrain_cmd() + [
                        "evaluate", "-m", str(model), "--data", str(data), "--where", f"machine={mach}",
                        "--where", f"unit={held}", "--where", "split=test", "--label", "state", "--json",
                        "--cache", str(work / "cache")])
                    res = json.loads(e["stdout"])
                    aucs.append(res["auc"])
                    paucs.append(res["pauc"])
                    walls.append(t["wall_s"])
                    rss.append(t["peak_rss_mb"] or 0.0)
                rows.append({"model": fam, "machine": mach, "held_out_unit": held, "repeats": len(seeds),
                             "deterministic": seeds == [None], "seeds": [s for s in seeds if s is not None],
                             "auc": float(np.mean(aucs)), "auc_sd": _sd(aucs), "auc_repeats": aucs,
                             "pauc": float(np.mean(paucs)), "pauc_sd": _sd(paucs), "pauc_repeats": paucs,
                             "train_wall_s": round(float(np.mean(walls)), 3), "train_wall_s_repeats": walls,
                             "train_peak_rss_mb": max(rss)})
                how = "deterministic" if seeds == [None] else "seeds " + ", ".join(map(str, seeds))
                print(f"{fam:12s} {mach:8s} held out {held}: AUC {np.mean(aucs):.3f} ± {_sd(aucs):.3f} "
                      f"pAUC {np.mean(paucs):.3f} ± {_sd(paucs):.3f} (repeats: {len(seeds)}, {how}; "
                      f"AUC {', '.join(f'{a:.3f}' for a in aucs)})", flush=True)
    return rows


def machines_summary(rows: list[dict]) -> list[dict]:
    """Per family: mean AUC (and pAUC) of each machine type's held-out units and of all cases,
    as mean ± sd over the repeats (the sd of the per-repeat means); the train wall time of one
    repeat's runs (mean over repeats)."""
    out = []
    for fam in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == fam]
        n = min(r["repeats"] for r in mine)

        def over(cases: list[dict], key: str, n: int = n) -> tuple[float, float]:
            per_repeat = [float(np.mean([c[f"{key}_repeats"][i] for c in cases])) for i in range(n)]
            return float(np.mean(per_repeat)), _sd(per_repeat)

        by_machine = {m: over([r for r in mine if r["machine"] == m], "auc")
                      for m in dict.fromkeys(r["machine"] for r in mine)}
        out.append({"model": fam, "repeats": n, "deterministic": all(r["deterministic"] for r in mine),
                    "cases": len(mine), "auc_by_machine": by_machine, "auc": over(mine, "auc"),
                    "pauc": over(mine, "pauc"),
                    "train_wall_s": round(sum(float(np.mean(r["train_wall_s_repeats"][:n])) for r in mine), 1)})
    return out


def summary(res: dict) -> str:
    out = []
    if res.get("speech"):
        kinds = list(res["speech"][0].get("accuracy_by_noise", {}))
        out.append(_util.markdown_table(
            ["model", "clean → noisy accuracy", "macro-F1", *kinds, "train wall s", "train peak RSS MB"],
            [[r["model"], r["accuracy"], r["macro_f1"], *(r["accuracy_by_noise"][k] for k in kinds),
              r["train_wall_s"], r["train_peak_rss_mb"]]
             for r in res["speech"]]))
    if res.get("folds"):
        rows = res["folds"]
        names = [m[0] for m in FOLD_MODELS if any(r["model"] == m[0] for r in rows)]

        def cell(name: str, data: str) -> str:
            r = next(r for r in rows if r["model"] == name and r["data"] == data)
            return f"{r['accuracy_mean']:.4f} ± {r['accuracy_sd']:.4f}"

        out.append(_util.markdown_table(
            ["model", "spoken-words", "spoken-words-noisy", "wall s (clean + noisy)"],
            [[n, cell(n, "spoken-words"), cell(n, "spoken-words-noisy"),
              round(sum(r["wall_s"] for r in rows if r["model"] == n), 1)] for n in names]))
    if res.get("machines"):
        rows = res["machines"]
        fams = list(dict.fromkeys(r["model"] for r in rows))
        table = [[mach] + [" / ".join(f"{r['auc']:.2f}" for r in rows if r["model"] == f and r["machine"] == mach)
                           for f in fams]
                 for mach in dict.fromkeys(r["machine"] for r in rows)]
        out.append(_util.markdown_table(["machine (held-out u1 / u2 / u3), AUC mean over repeats"] + fams, table))
        if all("auc_repeats" in r for r in rows):
            summ = machines_summary(rows)
            machs = list(dict.fromkeys(r["machine"] for r in rows))

            def pm(v: tuple[float, float]) -> str:
                return f"{v[0]:.3f} ± {v[1]:.3f}"

            out.append(_util.markdown_table(
                ["detector (repeats)", *machs, f"mean AUC ({summ[0]['cases']} cases)", "mean pAUC",
                 "train wall s per repeat"],
                [[f"{s['model']} ({s['repeats']}{', deterministic' if s['deterministic'] else ''})",
                  *(pm(s["auc_by_machine"][m]) for m in machs), pm(s["auc"]), pm(s["pauc"]), s["train_wall_s"]]
                 for s in summ]))
    return "\n\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", choices=("speech", "folds", "machines"),
                    default=["speech", "folds", "machines"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="machines: train each detector with a seed parameter N times (seeds 0..N-1); "
                         "mean ± sd over the repeats (--quick: once)")
    ap.add_argument("--fold-models", nargs="+", metavar="NAME", choices=[m[0] for m in FOLD_MODELS],
                    help="run only these models of the k-fold part (the others keep their figures)")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "generalisation.json")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    quick = _util.quick_mode(args.quick)
    out = _util.quick_out(args.out, "generalisation") if quick else args.out
    res: dict = json.loads(out.read_text()) if out.exists() and not quick else {}
    res.update({"benchmark": "generalisation", "quick": quick, "machine": _util.machine_info(),
                "augment": {"room": PRESETS["room"], "voice": VOICE}})
    exe = Path(sys.executable)
    exe_text = str(exe.relative_to(_util.ROOT)) if exe.is_relative_to(_util.ROOT) else str(exe)
    command = " ".join([*(f"{v}={shlex.quote(os.environ[v])}" for v in _util.THREAD_VARS if v in os.environ),
                        shlex.quote(exe_text), *map(shlex.quote, sys.argv)])

    def ran(part: str, start: dict) -> None:
        res[f"{part}_run"] = {"command": command, "machine": start, "loadavg_end": _util.loadavg(),
                              "end_time": _util.machine_info()["time"]}

    with tempfile.TemporaryDirectory(prefix="wt-bench-gen-") as tmp:
        work = Path(tmp)
        if "speech" in args.parts and (SHARED / "spoken-words-noisy" / "metadata.csv").exists():
            start = _util.machine_info()
            res["speech"] = speech(work, quick)
            ran("speech", start)
        if "folds" in args.parts and (SHARED / "spoken-words-noisy" / "metadata.csv").exists():
            start = _util.machine_info()
            new = folds(work, quick, args.fold_models)
            again = {(r["model"], r["data"]) for r in new}
            res["folds"] = [r for r in res.get("folds", []) if (r["model"], r["data"]) not in again] + new
            ran("folds", start)
        if "machines" in args.parts and (SHARED / "machines" / "metadata.csv").exists():
            start = _util.machine_info()
            res["machines"] = machines(work, quick, args.repeat)
            res["machines_summary"] = machines_summary(res["machines"])
            ran("machines", start)
    res["loadavg_end"] = _util.loadavg()
    _util.write_json(out, res)
    print(summary(res))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
