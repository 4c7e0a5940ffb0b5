"""Anomaly detection on the machine sounds, against a plain librosa + scikit-learn script, and
detector training memory over 1, 2, 4 and 8 hours.

1. Detection quality. Every registered model family whose class has ``detector = True`` (read
   from ``wavetrain.models.registry`` at run time, so new detector families are covered), default
   parameters, for each machine (fan, pump, bearing, gearbox) and unit (u1-u3) of
   ``/work/shared/data/machines``, in fresh processes with one compute thread::

       wavetrain train --model <family> --data DATA --where machine=M --where unit=U --where split=train
                       --label state --cache <fresh dir> --no-progress -o m.wt
       wavetrain evaluate -m m.wt --data DATA --where machine=M --where unit=U --where split=test
                          --label state --json --no-progress --cache <same dir>

   records wall time, peak RSS (``/usr/bin/time -f %M``), ROC AUC and pAUC (FPR <= 0.1, as
   ``sklearn.metrics.roc_auc_score(max_fpr=0.1)``). The baseline, in its own processes (train,
   then score): what a user would write with librosa and scikit-learn: ``librosa.load``,
   ``librosa.feature.melspectrogram`` (n_fft 1024, hop 512, 64 mels), ``librosa.power_to_db``;
   one ``GaussianMixture(16, covariance_type="diag", random_state=0)`` fitted on the unit's
   training frames; a clip's anomaly score is its negative mean frame log-likelihood.
   Reported per machine type (mean over its units) and overall (mean over all units).

2. Flat memory. ``normal-dist`` and ``anomaly-gmm`` (``--memory-models``) trained on the nested
   1, 2, 4, 8-hour sets of 44.1 kHz 60 s files that ``bench_memory.py`` writes (same generator,
   same work folder, default ``/tmp/wavetrain-bench/memory``: files already there are reused),
   every recording taken as normal (no ``--label``)::

       wavetrain memory --data <csv> --model <detector> --memory-limit 256M --json
       wavetrain train --data <csv> --model <detector> --memory-limit 256M --cache <fresh dir> -o m.wt

   peak RSS per size, a fitted slope in MB per hour (targets: <= 256 MB at 8 hours, <= 5 MB/h),
   and the planner's ``predicted_peak_mb`` next to the measured peak (target: within +-20%).

Writes ``benchmarks/results/anomaly.json`` and ``benchmarks/results/anomaly.png``.

    .venv/bin/python benchmarks/bench_anomaly.py [--families F ...] [--hours 1 2 4 8] [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): unit u1 of each machine, 0.05 and 0.1 hours;
results go to $TMPDIR/wavetrain-bench/.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

DEFAULT_DATA = Path("/work/shared/data/machines")
MACHINES = ("fan", "pump", "bearing", "gearbox")
UNITS = ("u1", "u2", "u3")
MEMORY_MODELS = ("normal-dist", "anomaly-gmm")
LIMIT = "256M"
LIMIT_MB = 256.0
MAX_SLOPE_MB_PER_H = 5.0
MAX_FPR = 0.1
#: Quick mode: epochs of the families that have an ``epochs`` parameter.
QUICK_EPOCHS = 5
#: The baseline's choices (what a user would write).
BASE_N_FFT, BASE_HOP, BASE_MELS, BASE_COMPONENTS = 1024, 512, 64, 16


def quick_settings(fam: str) -> list[str]:
    """Quick mode: a few epochs for families trained by epochs (the neural ones)."""
    from wavetrain.models.registry import family

    try:
        names = {p.name for p in family(fam).param_table()}
    except Exception:
        return []
    return ["--set", f"epochs={QUICK_EPOCHS}"] if "epochs" in names else []


def detector_families() -> list[str]:
    """Every registered family whose class is an anomaly detector, in registry order."""
    from wavetrain.models.registry import family, family_names

    out = []
    for name in family_names():
        try:
            cls = family(name)
        except Exception as e:  # a family whose module cannot be imported here
            print(f"bench_anomaly: family {name!r} not importable ({e}); skipped", file=sys.stderr)
            continue
        if getattr(cls, "detector", False):
            out.append(name)
    return out


# ---- the librosa + scikit-learn baseline (runs in its own process) -------------------------------
def _baseline_frames(path: Path):
    import librosa

    y, sr = librosa.load(path, sr=None)
    s = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=BASE_N_FFT, hop_length=BASE_HOP, n_mels=BASE_MELS)
    return librosa.power_to_db(s).T


def baseline_main(mode: str, csv_path: Path, model_path: Path) -> int:
    t_import = time.perf_counter()
    import pickle

    import librosa  # noqa: F401
    from sklearn.metrics import roc_auc_score
    from sklearn.mixture import GaussianMixture

    t0 = time.perf_counter()
    items = _util.read_csv_plain(csv_path)
    if mode == "train":
        x = np.vstack([_baseline_frames(p) for p, _ in items])
        t_feat = time.perf_counter()
        gm = GaussianMixture(BASE_COMPONENTS, covariance_type="diag", random_state=0).fit(x)
        with open(model_path, "wb") as f:
            pickle.dump(gm, f)
        t1 = time.perf_counter()
        print(json.dumps({"import_s": t0 - t_import, "features_s": t_feat - t0, "fit_s": t1 - t_feat,
                          "compute_s": t1 - t0, "files": len(items), "frames": int(x.shape[0]),
                          "converged": bool(gm.converged_), "n_iter": int(gm.n_iter_)}))
    else:
        with open(model_path, "rb") as f:
            gm = pickle.load(f)
        y = np.array([lab["state"] != "normal" for _, lab in items], dtype=int)
        s = np.array([-gm.score_samples(_baseline_frames(p)).mean() for p, _ in items])
        t1 = time.perf_counter()
        print(json.dumps({"import_s": t0 - t_import, "compute_s": t1 - t0, "files": len(items),
                          "auc": float(roc_auc_score(y, s)), "pauc": float(roc_auc_score(y, s, max_fpr=MAX_FPR))}))
    return 0


# ---- 1. detection quality ----------------------------------------------------------------------
def _unit_csvs(data: Path, work: Path, machine: str, unit: str) -> dict[str, Path]:
    rows = [(p, lab) for p, lab in _util.read_csv_plain(data / "metadata.csv")
            if lab.get("machine") == machine and lab.get("unit") == unit]
    out = {}
    for split in ("train", "test"):
        csv = work / f"{machine}_{unit}_{split}.csv"
        with open(csv, "w") as f:
            for p, lab in rows:
                if lab.get("split") == split:
                    f.write(f"{p.resolve()},{';'.join(f'{k}={v}' for k, v in lab.items())}\n")
        out[split] = csv
    return out


def _last_json(stdout: str) -> dict | None:
    for ln in reversed(stdout.strip().splitlines()):
        if ln.startswith("{"):
            try:
                return json.loads(ln)
            except json.JSONDecodeError:
                return None
    return None


def run_detection(data: Path, work: Path, families: list[str], units: list[str],
                  quick: bool = False) -> list[dict]:
    env = _util.single_thread_env({"WAVETRAIN_CACHE": str(work / "default-cache")})
    wt = _util.wavetrain_cmd()
    me = [_util.python_exe(), str(Path(__file__).resolve()), "--baseline"]
    rows = []
    for machine in MACHINES:
        for unit in units:
            where = ["--where", f"machine={machine}", "--where", f"unit={unit}"]
            for fam in families + ["baseline"]:
                la0 = _util.loadavg()
                r: dict = {"machine": machine, "unit": unit, "model": fam}
                model = work / (f"{fam}_{machine}_{unit}" + (".pkl" if fam == "baseline" else ".wt"))
                if fam == "baseline":
                    csvs = _unit_csvs(data, work, machine, unit)
                    tr = _util.run_measured(me + ["train", "--csv", str(csvs["train"]), "--model-file", str(model)],
                                            env=env, check=False)
                    ev = _util.run_measured(me + ["evaluate", "--csv", str(csvs["test"]), "--model-file",
                                                  str(model)], env=env, check=False) if tr["rc"] == 0 else None
                    bt = _last_json(tr["stdout"]) or {}
                    r.update(baseline_train=bt)
                else:
                    cache = _util.fresh_dir(work / "cache")
                    settings = quick_settings(fam) if quick else []
                    r["settings"] = settings
                    tr = _util.run_measured(wt + ["train", "--model", fam, "--data", str(data)] + where + settings
                                            + ["--where", "split=train", "--label", "state", "--cache", str(cache),
                                               "--no-progress", "-o", str(model)], env=env, check=False)
                    ev = _util.run_measured(wt + ["evaluate", "-m", str(model), "--data", str(data)] + where
                                            + ["--where", "split=test", "--label", "state", "--json",
                                               "--no-progress", "--cache", str(cache)],
                                            env=env, check=False) if tr["rc"] == 0 else None
                    r.update(train_stdout=tr["stdout"].strip()[-1000:])
                ej = _last_json(ev["stdout"]) if ev is not None and ev["rc"] == 0 else None
                r.update(train_rc=tr["rc"], train_wall_s=tr["wall_s"], train_peak_rss_mb=tr["peak_rss_mb"],
                         evaluate_rc=ev["rc"] if ev else None, evaluate_wall_s=ev["wall_s"] if ev else None,
                         evaluate_peak_rss_mb=ev["peak_rss_mb"] if ev else None,
                         auc=ej.get("auc") if ej else None, pauc=ej.get("pauc") if ej else None,
                         cmd_train=tr["cmd"], cmd_evaluate=ev["cmd"] if ev else None,
                         loadavg_before=la0, loadavg_after=_util.loadavg())
                if ej and fam != "baseline":
                    r.update({k: ej.get(k) for k in ("precision", "recall", "f1", "fpr", "threshold")})
                if tr["rc"] != 0 or (ev is not None and ev["rc"] != 0) or ej is None:
                    err = (ev or tr)["stderr"] if tr["rc"] == 0 else tr["stderr"]
                    r["error"] = err.strip()[-2000:]
                    print(f"{fam} {machine} {unit}: failed\n{r['error']}", file=sys.stderr)
                else:
                    print(f"{fam:>12} {machine:>8} {unit}: AUC {r['auc']:.3f} pAUC {r['pauc']:.3f}  train "
                          f"{r['train_wall_s']:.1f} s {r['train_peak_rss_mb']} MB", file=sys.stderr)
                rows.append(r)
    shutil.rmtree(work / "cache", ignore_errors=True)
    return rows


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(float(np.mean(xs)), 4) if xs else None


def summarize_detection(rows: list[dict], models: list[str]) -> dict:
    out: dict = {}
    for m in models:
        mine = [r for r in rows if r["model"] == m]
        per = {}
        for machine in MACHINES:
            mr = [r for r in mine if r["machine"] == machine]
            if mr:
                per[machine] = {"auc": _mean([r["auc"] for r in mr]), "pauc": _mean([r["pauc"] for r in mr]),
                                "units": len(mr), "failed": sum(r["auc"] is None for r in mr)}
        ok = [r for r in mine if r["train_rc"] == 0]
        out[m] = {"per_machine": per, "auc": _mean([r["auc"] for r in mine]),
                  "pauc": _mean([r["pauc"] for r in mine]),
                  "failed_units": sum(r["auc"] is None for r in mine), "units": len(mine),
                  "train_wall_s_mean": _mean([r["train_wall_s"] for r in ok]),
                  "train_peak_rss_mb_max": max((r["train_peak_rss_mb"] for r in ok
                                                if r["train_peak_rss_mb"] is not None), default=None),
                  "evaluate_wall_s_mean": _mean([r["evaluate_wall_s"] for r in mine]),
                  "evaluate_peak_rss_mb_max": max((r["evaluate_peak_rss_mb"] for r in mine
                                                   if r["evaluate_peak_rss_mb"] is not None), default=None)}
    return out


# ---- 2. flat memory over 1-8 hours ---------------------------------------------------------------
def run_memory(work: Path, hours_list: list[float], models: list[str]) -> list[dict]:
    import bench_memory

    env = _util.single_thread_env({"WAVETRAIN_CACHE": str(work / "default-cache")})
    wt = _util.wavetrain_cmd()
    csvs = bench_memory.make_data(work, hours_list)
    mine = work / "anomaly"
    mine.mkdir(exist_ok=True)
    out = []
    for model_name in models:
        for h in hours_list:
            csv = str(csvs[h])
            la0 = _util.loadavg()
            plan = _util.run_measured(wt + ["memory", "--data", csv, "--model", model_name, "--memory-limit", LIMIT,
                                            "--json"], env=env, check=False)
            pj = _last_json(plan["stdout"]) or {}
            cache = _util.fresh_dir(mine / f"cache_{model_name}_{h:g}h")
            model = mine / f"{model_name}_{h:g}h.wt"
            train = _util.run_measured(wt + ["train", "--data", csv, "--model", model_name, "--memory-limit", LIMIT,
                                             "--cache", str(cache), "--no-progress", "-o", str(model)],
                                       env=env, check=False)
            shutil.rmtree(cache, ignore_errors=True)
            # the same run without the in-memory gram cache (fixed size, fills with the first hours)
            cache = _util.fresh_dir(mine / f"cache_{model_name}_{h:g}h")
            nomc = _util.run_measured(wt + ["train", "--data", csv, "--model", model_name, "--memory-limit", LIMIT,
                                            "--memory-cache", "0", "--cache", str(cache), "--no-progress",
                                            "-o", str(mine / f"{model_name}_{h:g}h_nomc.wt")], env=env, check=False)
            shutil.rmtree(cache, ignore_errors=True)
            pred, peak = pj.get("predicted_peak_mb"), train["peak_rss_mb"]
            mc = (pj.get("components_mb") or {}).get("memory_cache")
            r = {"model": model_name, "hours": h, "files": int(round(h * 3600 / bench_memory.FILE_S)),
                 "train_rc": train["rc"], "train_wall_s": train["wall_s"], "peak_rss_mb": peak,
                 "audio_s_per_s": round(h * 3600 / train["wall_s"], 1),
                 "em_passes": _util.em_passes(model) if train["rc"] == 0 and model_name == "anomaly-gmm" else None,
                 "predicted_peak_mb": pred, "planner_components_mb": pj.get("components_mb"),
                 "planner_settings": pj.get("settings"), "planner_rc": plan["rc"],
                 "planner_error_pct": round(100 * (pred - peak) / peak, 1) if pred and peak else None,
                 "no_memory_cache": {"train_rc": nomc["rc"], "train_wall_s": nomc["wall_s"],
                                     "peak_rss_mb": nomc["peak_rss_mb"], "cmd": nomc["cmd"],
                                     "planner_minus_memory_cache_mb": round(pred - mc, 1) if pred and mc else None},
                 "train_stdout": train["stdout"].strip()[-2000:], "train_stderr": train["stderr"].strip()[-2000:],
                 "cmd": train["cmd"], "cmd_memory": plan["cmd"], "loadavg_before": la0,
                 "loadavg_after": _util.loadavg()}
            if train["rc"] != 0:
                print(f"{model_name} train failed (exit {train['rc']}) at {h:g} h:\n{train['stderr'][-3000:]}",
                      file=sys.stderr)
            print(f"{model_name} {h:g} h: peak RSS {peak} MB, predicted {pred} MB (gram cache {mc} MB), "
                  f"{train['wall_s']:.0f} s; with --memory-cache 0: {nomc['peak_rss_mb']} MB, "
                  f"load {r['loadavg_after']}", file=sys.stderr)
            out.append(r)
    return out


def summarize_memory(rows: list[dict], models: list[str]) -> dict:
    out: dict = {}
    for m in models:
        mine = [r for r in rows if r["model"] == m]
        ok = [r for r in mine if r["train_rc"] == 0 and r["peak_rss_mb"] is not None]
        s: dict = {}
        if len(ok) >= 2:
            hrs = np.array([r["hours"] for r in ok])
            slope, icpt = np.polyfit(hrs, [r["peak_rss_mb"] for r in ok], 1)
            s.update(slope_mb_per_hour=round(float(slope), 2), intercept_mb=round(float(icpt), 1))
            nm = [r for r in ok if r["no_memory_cache"]["train_rc"] == 0 and r["no_memory_cache"]["peak_rss_mb"]]
            if len(nm) >= 2:
                ns, _ = np.polyfit([r["hours"] for r in nm], [r["no_memory_cache"]["peak_rss_mb"] for r in nm], 1)
                s["slope_mb_per_hour_memory_cache_0"] = round(float(ns), 2)
            pr = [r for r in ok if r["predicted_peak_mb"] is not None]
            if len(pr) >= 2:
                ps, _ = np.polyfit([r["hours"] for r in pr], [r["predicted_peak_mb"] for r in pr], 1)
                s["predicted_slope_mb_per_hour"] = round(float(ps), 2)
        largest = max(mine, key=lambda r: r["hours"]) if mine else None
        s["largest_hours"] = largest["hours"] if largest else None
        s["peak_rss_at_largest_mb"] = largest["peak_rss_mb"] if largest else None
        s["all_runs_succeeded"] = len(ok) == len(mine)
        s["accept_peak_le_256mb_at_largest"] = bool(largest and largest["train_rc"] == 0
                                                    and largest["peak_rss_mb"] <= LIMIT_MB)
        s["accept_slope_le_5mb_per_hour"] = bool("slope_mb_per_hour" in s
                                                 and s["slope_mb_per_hour"] <= MAX_SLOPE_MB_PER_H)
        errs = [abs(r["planner_error_pct"]) for r in ok if r["planner_error_pct"] is not None]
        s["planner_max_abs_error_pct"] = max(errs) if errs else None
        s["planner_within_20pct"] = bool(errs) and max(errs) <= 20
        out[m] = s
    return out


def plot(rows: list[dict], path: Path, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    top = LIMIT_MB
    for i, m in enumerate(dict.fromkeys(r["model"] for r in rows)):
        mine = [r for r in rows if r["model"] == m]
        ok = [r for r in mine if r["peak_rss_mb"] is not None]
        ax.plot([r["hours"] for r in ok], [r["peak_rss_mb"] for r in ok], "o-", color=f"C{i}",
                label=f"{m}, measured peak RSS")
        pr = [r for r in mine if r["predicted_peak_mb"] is not None]
        ax.plot([r["hours"] for r in pr], [r["predicted_peak_mb"] for r in pr], "s--", color=f"C{i}", alpha=0.6,
                label=f"{m}, planner prediction")
        nm = [r for r in mine if (r.get("no_memory_cache") or {}).get("peak_rss_mb") is not None]
        if nm:
            ax.plot([r["hours"] for r in nm], [r["no_memory_cache"]["peak_rss_mb"] for r in nm], "^:",
                    color=f"C{i}", label=f"{m}, measured, --memory-cache 0")
        top = max([top] + [r["peak_rss_mb"] for r in ok] + [r["predicted_peak_mb"] for r in pr])
    ax.axhline(LIMIT_MB, color="k", lw=1, ls="-.", label="--memory-limit 256M")
    ax.set_xlabel("training data (hours of 44.1 kHz 16-bit mono audio)")
    ax.set_ylabel("peak resident memory (MB)")
    ax.set_xlim(0, max(r["hours"] for r in rows) * 1.05)
    ax.set_ylim(0, top * 1.1)
    ax.set_title("Anomaly detector training memory vs amount of data" + (" (quick)" if quick else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- tables ------------------------------------------------------------------------------------
def tables(res: dict) -> str:
    det, models = res["detection_summary"], res["detection_models"]
    if not models:
        return _memory_tables(res)
    names = [m if m != "baseline" else "librosa + sklearn GMM" for m in models]
    head = ["machine"] + [f"{n} AUC / pAUC" for n in names]
    body = []
    for machine in MACHINES:
        if not any(machine in det[m]["per_machine"] for m in models):
            continue
        body.append([machine] + [f"{det[m]['per_machine'][machine]['auc']:.3f} / "
                                 f"{det[m]['per_machine'][machine]['pauc']:.3f}"
                                 if det[m]["per_machine"].get(machine, {}).get("auc") is not None else "failed"
                                 for m in models])
    body.append(["**all**"] + [f"**{det[m]['auc']:.3f} / {det[m]['pauc']:.3f}**" if det[m]["auc"] is not None
                               else "failed" for m in models])
    t1 = _util.markdown_table(head, body)
    t2 = _util.markdown_table(
        ["model", "train wall s (mean per unit)", "train peak RSS MB (max)", "evaluate wall s (mean)",
         "evaluate peak RSS MB (max)", "failed units"],
        [[n, det[m]["train_wall_s_mean"], det[m]["train_peak_rss_mb_max"], det[m]["evaluate_wall_s_mean"],
          det[m]["evaluate_peak_rss_mb_max"], det[m]["failed_units"]] for n, m in zip(names, models)])
    return t1 + "\n\n" + t2 + _memory_tables(res)


def _memory_tables(res: dict) -> str:
    mem, out = res.get("memory_runs") or [], ""
    if mem:
        body = [[r["model"], f"{r['hours']:g}", r["files"], r["train_wall_s"], r.get("em_passes"),
                 r["peak_rss_mb"] if r["train_rc"] == 0 else f"failed (exit {r['train_rc']})",
                 r["predicted_peak_mb"],
                 f"{r['planner_error_pct']:+.1f}%" if r["planner_error_pct"] is not None else None,
                 (r["planner_components_mb"] or {}).get("memory_cache"),
                 r["no_memory_cache"]["peak_rss_mb"] if r["no_memory_cache"]["train_rc"] == 0
                 else f"failed (exit {r['no_memory_cache']['train_rc']})"] for r in mem]
        t3 = _util.markdown_table(["model", "hours", "files", "train wall s", "EM passes", "peak RSS MB",
                                   "planner MB", "planner error", "planned gram cache MB",
                                   "peak RSS MB, --memory-cache 0"], body)
        foot = []
        for m, s in res["memory_summary"].items():
            foot.append(f"{m}: slope {s.get('slope_mb_per_hour')} MB/hour (limit {MAX_SLOPE_MB_PER_H:g}: "
                        f"{'pass' if s['accept_slope_le_5mb_per_hour'] else 'FAIL'}; with --memory-cache 0: "
                        f"{s.get('slope_mb_per_hour_memory_cache_0')} MB/hour); peak at "
                        f"{s['largest_hours']:g} h {s['peak_rss_at_largest_mb']} MB (limit {LIMIT_MB:.0f}: "
                        f"{'pass' if s['accept_peak_le_256mb_at_largest'] else 'FAIL'}); planner within 20%: "
                        f"{s['planner_within_20pct']} (max error {s['planner_max_abs_error_pct']}%)")
        if max(r["hours"] for r in mem) < 1:
            foot.append("(sizes under one hour: the acceptance checks are not meaningful)")
        out += "\n\n" + t3 + "\n\n" + "\n".join(foot)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--families", nargs="+", help="detector families (default: every registered detector)")
    ap.add_argument("--units", nargs="+", help="units of each machine (default u1 u2 u3; u1 with --quick)")
    ap.add_argument("--hours", type=float, nargs="+", help="memory part: data sizes in hours (default 1 2 4 8)")
    ap.add_argument("--memory-models", nargs="*", default=list(MEMORY_MODELS),
                    help="memory part: detectors to train on long audio (default normal-dist anomaly-gmm; "
                         "none to skip the part)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/wavetrain-bench/memory"),
                    help="long audio of the memory part, shared with bench_memory.py (kept for reruns)")
    ap.add_argument("--parts", nargs="+", choices=("detection", "memory"), default=["detection", "memory"],
                    help="which parts to run (default both)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "anomaly.json")
    ap.add_argument("--png", type=Path, default=_util.RESULTS / "anomaly.png")
    ap.add_argument("--retable", action="store_true", help="only print the tables of --out's JSON")
    ap.add_argument("--replot", action="store_true", help="only redraw --png from --out's JSON")
    ap.add_argument("--baseline", choices=("train", "evaluate"), help=argparse.SUPPRESS)
    ap.add_argument("--csv", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--model-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.baseline:
        return baseline_main(args.baseline, args.csv, args.model_file)
    if args.replot:
        res = json.loads(args.out.read_text())
        plot(res["memory_runs"], args.png, res["quick"])
        return 0
    if args.retable:
        print(tables(json.loads(args.out.read_text())))
        return 0
    quick = _util.quick_mode(args.quick)
    units = args.units or (["u1"] if quick else list(UNITS))
    hours = sorted(args.hours or ([0.05, 0.1] if quick else [1, 2, 4, 8]))
    families = args.families or detector_families()
    info = _util.machine_info()
    info["registered_detector_families"] = detector_families()
    res: dict = {"benchmark": "anomaly", "quick": quick, "machine": info, "data": str(args.data),
                 "units": units, "detection_models": families + ["baseline"],
                 "baseline": {"features": f"librosa.feature.melspectrogram(n_fft={BASE_N_FFT}, "
                                          f"hop_length={BASE_HOP}, n_mels={BASE_MELS}) + power_to_db",
                              "model": f"sklearn GaussianMixture({BASE_COMPONENTS}, covariance_type='diag', "
                                       "random_state=0)",
                              "score": "negative mean frame log-likelihood"}}
    if "detection" not in args.parts:
        res["detection_models"], res["detection_summary"] = [], {}
    elif (args.data / "metadata.csv").exists():
        with tempfile.TemporaryDirectory(prefix="wt-bench-anomaly-") as tmp:
            rows = run_detection(args.data, Path(tmp), families, units, quick)
        res["detection_runs"] = rows
        res["detection_summary"] = summarize_detection(rows, families + ["baseline"])
    else:
        print(f"bench_anomaly: {args.data}/metadata.csv not found; detection part skipped", file=sys.stderr)
        res["detection_models"], res["detection_summary"] = [], {}
    out = _util.quick_out(args.out, "anomaly") if quick else args.out
    png = out.with_suffix(".png") if quick else args.png
    if args.memory_models and "memory" in args.parts:
        args.workdir.mkdir(parents=True, exist_ok=True)
        mem = run_memory(args.workdir, hours, args.memory_models)
        res["memory_hours"], res["memory_runs"] = hours, mem
        res["memory_summary"] = summarize_memory(mem, args.memory_models)
        plot(mem, png, quick)
    res["loadavg_end"] = _util.loadavg()
    res["parts"] = list(args.parts)
    if set(args.parts) != {"detection", "memory"} and out.exists():
        # one part: keep the other part's results of the file (and say when each was measured)
        old = json.loads(out.read_text())
        keep = ("detection_runs", "detection_summary", "detection_models", "units") if "detection" not in args.parts \
            else ("memory_hours", "memory_runs", "memory_summary")
        for k in keep:
            if k in old:
                res[k] = old[k]
        res["machine_other_part"] = old.get("machine")
    _util.write_json(out, res)
    print(tables(res))
    print(f"\nwrote {out}" + (f" and {png}" if "memory" in args.parts and args.memory_models else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
