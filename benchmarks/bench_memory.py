"""Training memory vs amount of data: GMM on 1, 2, 4 and 8 hours of 44.1 kHz audio.

Generates two-class synthetic machine audio (44.1 kHz, 16-bit PCM, mono, 60 s files; class ``a``:
hum + noise, class ``b``: hum + ringing impulses + a little noise); the sets are nested (the 2 h
set is the 1 h set plus one more hour, ...), so 8 hours (about 2.5 GB) are written once and kept
in the work folder for later runs.  For each size, in fresh processes with one compute thread::

    wavetrain memory --data <csv> --label cls --model gmm --memory-limit 256M --json
    wavetrain train --data <csv> --label cls --model gmm --memory-limit 256M --cache <fresh dir> -o m.wt

records wall time, peak RSS (``/usr/bin/time -f %M``) and the planner's ``predicted_peak_mb``;
fits a line to peak RSS vs hours.  The contract: peak RSS <= 256 MB at 8 hours and a slope
<= 5 MB per hour.  Writes ``benchmarks/results/memory.json`` and ``benchmarks/results/memory.png``
(peak RSS vs hours with the planner's prediction, the Java framework's published 70 MB + 100 MB
per GB of training data, and the limit).

    .venv/bin/python benchmarks/bench_memory.py [--hours 1 2 4 8] [--workdir /tmp/wavetrain-bench] [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): 0.1 and 0.2 hours; results go to $TMPDIR/wavetrain-bench/.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

RATE = 44100
FILE_S = 60
LIMIT = "256M"
LIMIT_MB = 256.0
MAX_SLOPE_MB_PER_H = 5.0
#: The Java framework's published training memory: about 70 MB + 100 MB per GB of training data.
JAVA_BASE_MB, JAVA_MB_PER_GB = 70.0, 100.0
GB_PER_HOUR = RATE * 2 * 3600 / 1e9          # 16-bit mono: 0.3175 GB per hour
SHAFTS = (20, 25, 30)                          # Hz; 3.6 x shaft is a whole number of impulses per second


def _one_second(cls: str, shaft: int, rng: np.random.Generator) -> np.ndarray:
    """One exactly periodic second of hum (and impulses for class b), float32."""
    t = np.arange(RATE) / RATE
    x = np.zeros(RATE)
    ph = rng.uniform(0, 2 * np.pi, 8)
    for h, a in enumerate((1.0, 0.5, 0.3, 0.2, 0.12, 0.08), start=1):
        x += a * np.sin(2 * np.pi * h * shaft * t + ph[h])
    x += 0.3 * np.sin(2 * np.pi * 50 * t + ph[0]) + 0.1 * np.sin(2 * np.pi * 100 * t + ph[7])
    if cls == "b":
        n_ring = int(0.01 * RATE)
        k = np.arange(n_ring)
        ring = 1.5 * np.exp(-k / (0.0015 * RATE)) * np.sin(2 * np.pi * 3000 * k / RATE)
        per_s = int(round(3.6 * shaft))
        for j in range(per_s):
            i = int(j * RATE / per_s)
            seg = ring[: RATE - i]
            x[i:i + len(seg)] += seg
    return x.astype(np.float32)


def write_file(path: Path, index: int) -> tuple[str, int]:
    """File ``index`` of the nested sets: 60 s, class a or b alternately, deterministic."""
    import soundfile as sf

    rng = np.random.default_rng(index)
    cls = "ab"[index % 2]
    shaft = SHAFTS[(index // 2) % len(SHAFTS)]
    base = _one_second(cls, shaft, rng)
    p = float(np.mean(base.astype(np.float64) ** 2))
    noise_sd = np.sqrt(p / 10 ** ((10.0 if cls == "a" else 30.0) / 10))
    tmp = path.with_suffix(".tmp.wav")
    with sf.SoundFile(tmp, "w", samplerate=RATE, channels=1, subtype="PCM_16", format="WAV") as f:
        for _ in range(0, FILE_S, 10):                 # 10 s chunks
            x = np.tile(base, 10)
            x += rng.standard_normal(x.shape[0], dtype=np.float32) * np.float32(noise_sd)
            x *= np.float32(0.25)
            np.clip(x, -1.0, 1.0, out=x)
            f.write(x)
    os.replace(tmp, path)
    return cls, shaft


def make_data(work: Path, hours_list: list[float]) -> dict[float, Path]:
    """Write the audio files of the largest set (skipping those already there) and one csv per size."""
    import soundfile as sf

    audio = work / "audio"
    audio.mkdir(parents=True, exist_ok=True)
    n_max = int(round(max(hours_list) * 3600 / FILE_S))
    t0 = time.perf_counter()
    rows, made = [], 0
    for i in range(n_max):
        path = audio / f"rec{i:05d}.wav"
        ok = False
        if path.exists():
            try:
                ok = sf.info(str(path)).frames == RATE * FILE_S
            except Exception:
                ok = False
        if ok:
            cls = "ab"[i % 2]
            shaft = SHAFTS[(i // 2) % len(SHAFTS)]
        else:
            cls, shaft = write_file(path, i)
            made += 1
        rows.append(f"audio/{path.name},cls={cls};shaft={shaft}\n")
    csvs = {}
    for h in hours_list:
        n = int(round(h * 3600 / FILE_S))
        csv = work / f"metadata_{h:g}h.csv"
        csv.write_text("".join(rows[:n]))
        csvs[h] = csv
    print(f"data: {n_max} files of {FILE_S} s ({made} written) in {time.perf_counter() - t0:.1f} s -> {audio}",
          file=sys.stderr)
    return csvs


def run_bench(work: Path, hours_list: list[float], keep_cache: bool = False) -> list[dict]:
    env = _util.single_thread_env({"WAVETRAIN_CACHE": str(work / "default-cache")})
    wt = _util.wavetrain_cmd()
    csvs = make_data(work, hours_list)
    out = []
    for h in hours_list:
        csv = str(csvs[h])
        la0 = _util.loadavg()
        plan = _util.run_measured(wt + ["memory", "--data", csv, "--label", "cls", "--model", "gmm",
                                        "--memory-limit", LIMIT, "--json"], env=env)
        pj = json.loads(plan["stdout"].strip().splitlines()[-1])
        plan_text = _util.run_measured(wt + ["memory", "--data", csv, "--label", "cls", "--model", "gmm",
                                             "--memory-limit", LIMIT], env=env)["stdout"]
        cache = _util.fresh_dir(work / f"cache_{h:g}h")
        model = work / f"m_{h:g}h.wt"
        train = _util.run_measured(wt + ["train", "--data", csv, "--label", "cls", "--model", "gmm",
                                         "--memory-limit", LIMIT, "--cache", str(cache), "--no-progress",
                                         "-o", str(model)], env=env, check=False)
        cache_mb = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 2 ** 20
        if not keep_cache:
            shutil.rmtree(cache, ignore_errors=True)
        r = {"hours": h, "gb_of_audio": round(h * GB_PER_HOUR, 4), "files": int(round(h * 3600 / FILE_S)),
             "train_rc": train["rc"], "train_wall_s": train["wall_s"], "peak_rss_mb": train["peak_rss_mb"],
             "em_passes": _util.em_passes(model) if train["rc"] == 0 else None,
             "audio_s_per_s": round(h * 3600 / train["wall_s"], 1),
             "predicted_peak_mb": pj["predicted_peak_mb"], "planner_components_mb": pj["components_mb"],
             "planner_settings": pj["settings"], "planner_text": plan_text,
             "planner_error_pct": round(100 * (pj["predicted_peak_mb"] - train["peak_rss_mb"])
                                        / train["peak_rss_mb"], 1) if train["peak_rss_mb"] else None,
             "memory_cmd_peak_rss_mb": plan["peak_rss_mb"], "feature_cache_mb": round(cache_mb, 1),
             "train_stdout": train["stdout"].strip()[-2000:], "train_stderr": train["stderr"].strip()[-2000:],
             "cmd": train["cmd"], "loadavg_before": la0, "loadavg_after": _util.loadavg()}
        if train["rc"] != 0:
            print(f"train failed (exit {train['rc']}) at {h:g} h:\n{train['stderr'][-3000:]}", file=sys.stderr)
        print(f"{h:g} h: peak RSS {r['peak_rss_mb']} MB, predicted {r['predicted_peak_mb']} MB, "
              f"{r['train_wall_s']:.0f} s, load {r['loadavg_after']}", file=sys.stderr)
        out.append(r)
    return out


def calibrate(work: Path, hours: float, limits=("256M", "200M", "170M", "150M")) -> dict:
    """Planner components vs measured peak on one size at several limits (the planner shrinks the
    in-memory gram cache first, to 0 at the lowest limit): separates the cache's cost from the rest."""
    env = _util.single_thread_env({"WAVETRAIN_CACHE": str(work / "default-cache")})
    wt = _util.wavetrain_cmd()
    csv = str(work / f"metadata_{hours:g}h.csv")
    runs = []
    for lim in limits:
        plan = _util.run_measured(wt + ["memory", "--data", csv, "--label", "cls", "--model", "gmm",
                                        "--memory-limit", lim, "--json"], env=env, check=False)
        if plan["rc"] != 0:
            runs.append({"limit": lim, "planner_refused": plan["stderr"].strip()[-500:]})
            continue
        pj = json.loads(plan["stdout"].strip().splitlines()[-1])
        cache = _util.fresh_dir(work / "cache_calibration")
        train = _util.run_measured(wt + ["train", "--data", csv, "--label", "cls", "--model", "gmm",
                                         "--memory-limit", lim, "--cache", str(cache), "--no-progress",
                                         "-o", str(work / "m_calibration.wt")], env=env, check=False)
        shutil.rmtree(cache, ignore_errors=True)
        runs.append({"limit": lim, "predicted_peak_mb": pj["predicted_peak_mb"], "components_mb": pj["components_mb"],
                     "settings": pj["settings"], "train_rc": train["rc"], "peak_rss_mb": train["peak_rss_mb"],
                     "train_wall_s": train["wall_s"]})
        print(f"calibration {hours:g} h, --memory-limit {lim}: cache {pj['settings']['cache_mb']} MB, predicted "
              f"{pj['predicted_peak_mb']} MB, measured {train['peak_rss_mb']} MB", file=sys.stderr)
    out: dict = {"hours": hours, "runs": runs}
    ok = [r for r in runs if r.get("train_rc") == 0]
    if len(ok) >= 2:
        c = np.array([r["components_mb"]["memory_cache"] for r in ok])
        m = np.array([r["peak_rss_mb"] for r in ok])
        pr = np.array([r["predicted_peak_mb"] for r in ok])
        if np.ptp(c) > 1:
            mslope, micpt = np.polyfit(c, m, 1)
            pslope, picpt = np.polyfit(c, pr, 1)
            out.update(measured_mb_per_cache_mb=round(float(mslope), 3),
                       predicted_mb_per_cache_mb=round(float(pslope), 3),
                       measured_peak_without_cache_mb=round(float(micpt), 1),
                       predicted_peak_without_cache_mb=round(float(picpt), 1),
                       non_cache_overprediction_mb=round(float(picpt - micpt), 1))
    return out


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["train_rc"] == 0 and r["peak_rss_mb"] is not None]
    s: dict = {}
    if len(ok) >= 2:
        hrs = np.array([r["hours"] for r in ok])
        rss = np.array([r["peak_rss_mb"] for r in ok])
        slope, icpt = np.polyfit(hrs, rss, 1)
        ps, pi = np.polyfit(hrs, [r["predicted_peak_mb"] for r in ok], 1)
        s.update(slope_mb_per_hour=round(float(slope), 2), intercept_mb=round(float(icpt), 1),
                 predicted_slope_mb_per_hour=round(float(ps), 2), predicted_intercept_mb=round(float(pi), 1))
    largest = max(rows, key=lambda r: r["hours"]) if rows else None
    s["largest_hours"] = largest["hours"] if largest else None
    s["peak_rss_at_largest_mb"] = largest["peak_rss_mb"] if largest else None
    s["all_runs_succeeded"] = len(ok) == len(rows)
    s["accept_peak_le_256mb_at_largest"] = bool(largest and largest["train_rc"] == 0
                                                and largest["peak_rss_mb"] <= LIMIT_MB)
    s["accept_slope_le_5mb_per_hour"] = bool("slope_mb_per_hour" in s
                                             and s["slope_mb_per_hour"] <= MAX_SLOPE_MB_PER_H)
    s["planner_max_abs_error_pct"] = max((abs(r["planner_error_pct"]) for r in ok
                                          if r["planner_error_pct"] is not None), default=None)
    s["planner_within_20pct"] = s["planner_max_abs_error_pct"] is not None and s["planner_max_abs_error_pct"] <= 20
    return s


def plot(rows: list[dict], path: Path, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hrs = [r["hours"] for r in rows]
    xmax = max(hrs) * 1.05
    xs = np.linspace(0, xmax, 50)
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    ok = [r for r in rows if r["peak_rss_mb"] is not None]
    ax.plot([r["hours"] for r in ok], [r["peak_rss_mb"] for r in ok], "o-", color="C0",
            label="wavetrain gmm, measured peak RSS")
    for r in ok:
        ax.annotate(f"{r['peak_rss_mb']:.0f}", (r["hours"], r["peak_rss_mb"]), textcoords="offset points",
                    xytext=(0, -13), ha="center", fontsize=8, color="C0")
    ax.plot(hrs, [r["predicted_peak_mb"] for r in rows], "s--", color="C2",
            label="wavetrain memory (planner) prediction")
    ax.plot(xs, JAVA_BASE_MB + JAVA_MB_PER_GB * GB_PER_HOUR * xs, ":", color="C3",
            label=f"Java framework, published ({JAVA_BASE_MB:.0f} MB + {JAVA_MB_PER_GB * GB_PER_HOUR:.1f} MB/h)")
    ax.axhline(LIMIT_MB, color="k", lw=1, ls="-.", label="--memory-limit 256M (wavetrain runs)")
    ax.set_xlabel("training data (hours of 44.1 kHz 16-bit mono audio)")
    ax.set_ylabel("peak resident memory (MB)")
    ax.set_xlim(0, xmax)
    top = max([LIMIT_MB] + [r["peak_rss_mb"] for r in ok] + [r["predicted_peak_mb"] for r in rows])
    top = max(top, JAVA_BASE_MB + JAVA_MB_PER_GB * GB_PER_HOUR * max(hrs))
    ax.set_ylim(0, top * 1.1)
    ax.set_title("GMM training memory vs amount of data" + (" (quick)" if quick else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(rows: list[dict], s: dict) -> str:
    body = [[f"{r['hours']:g}", r["gb_of_audio"], r["files"], r["train_wall_s"], r.get("em_passes"),
             r["audio_s_per_s"],
             r["peak_rss_mb"] if r["train_rc"] == 0 else f"failed (exit {r['train_rc']})", r["predicted_peak_mb"],
             f"{r['planner_error_pct']:+.1f}%" if r["planner_error_pct"] is not None else None,
             round(JAVA_BASE_MB + JAVA_MB_PER_GB * r["gb_of_audio"], 1)] for r in rows]
    t = _util.markdown_table(["hours", "GB", "files", "train wall s", "EM passes", "audio s / s", "peak RSS MB",
                              "planner MB", "planner error", "Java (published) MB"], body)
    foot = (f"\n\nslope {s.get('slope_mb_per_hour')} MB/hour (limit {MAX_SLOPE_MB_PER_H}: "
            f"{'pass' if s['accept_slope_le_5mb_per_hour'] else 'FAIL'}); peak at {s['largest_hours']:g} h "
            f"{s['peak_rss_at_largest_mb']} MB (limit {LIMIT_MB:.0f}: "
            f"{'pass' if s['accept_peak_le_256mb_at_largest'] else 'FAIL'}); planner within 20%: "
            f"{s['planner_within_20pct']} (max error {s['planner_max_abs_error_pct']}%)")
    if max(r["hours"] for r in rows) < 1:
        foot += "\n(sizes under one hour: the acceptance checks are not meaningful)"
    return t + foot


def calibration_table(cal: dict) -> str:
    comps = ["runtime", "audio", "extraction", "batches", "memory_cache", "model", "per_hour", "slack"]
    rows = []
    for r in cal["runs"]:
        if "components_mb" not in r:
            rows.append([r["limit"], "planner refused"] + [None] * (len(comps) + 1))
            continue
        rows.append([r["limit"]] + [r["components_mb"].get(k) for k in comps]
                    + [r["predicted_peak_mb"], r["peak_rss_mb"] if r["train_rc"] == 0 else f"exit {r['train_rc']}"])
    t = _util.markdown_table(["limit"] + comps + ["predicted", "measured"], rows)
    head = f"planner calibration at {cal['hours']:g} h (MB)\n\n"
    foot = ""
    if "non_cache_overprediction_mb" in cal:
        foot = (f"\n\nmeasured peak without gram cache {cal['measured_peak_without_cache_mb']} MB, predicted "
                f"{cal['predicted_peak_without_cache_mb']} MB (over by {cal['non_cache_overprediction_mb']} MB); "
                f"each MB of memory_cache costs {cal['measured_mb_per_cache_mb']} MB measured, "
                f"{cal['predicted_mb_per_cache_mb']} MB predicted")
    return head + t + foot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, nargs="+", help="data sizes in hours (default 1 2 4 8)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/wavetrain-bench/memory"),
                    help="audio (kept for reruns), csvs, caches and models (default /tmp/wavetrain-bench/memory)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-calibration", action="store_true",
                    help="skip the planner calibration runs (smallest size at limits 256M/200M/170M/150M; "
                         "always skipped with --quick)")
    ap.add_argument("--keep-cache", action="store_true", help="keep each size's feature store")
    ap.add_argument("--clean", action="store_true", help="remove the work folder (audio too) afterwards")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "memory.json")
    ap.add_argument("--png", type=Path, default=_util.RESULTS / "memory.png")
    ap.add_argument("--replot", action="store_true", help="only redraw --png and the table from --out's JSON")
    args = ap.parse_args(argv)
    if args.replot:
        res = json.loads(args.out.read_text())
        plot(res["runs"], args.png, res["quick"])
        print(table(res["runs"], res["summary"]))
        if res.get("calibration"):
            print("\n" + calibration_table(res["calibration"]))
        return 0
    quick = _util.quick_mode(args.quick)
    hours = sorted(args.hours or ([0.1, 0.2] if quick else [1, 2, 4, 8]))
    info = _util.machine_info()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    rows = run_bench(work, hours, keep_cache=args.keep_cache)
    s = summarize(rows)
    cal = None if args.no_calibration or quick else calibrate(work, hours[0])
    res = {"benchmark": "memory", "quick": quick, "machine": info, "limit": LIMIT,
           "java_published": {"base_mb": JAVA_BASE_MB, "mb_per_gb": JAVA_MB_PER_GB, "gb_per_hour": GB_PER_HOUR,
                              "mb_per_hour": round(JAVA_MB_PER_GB * GB_PER_HOUR, 2)},
           "runs": rows, "summary": s, "calibration": cal, "loadavg_end": _util.loadavg()}
    out = _util.quick_out(args.out, "memory") if quick else args.out
    png = _util.quick_out(args.png.with_suffix(".json"), "memory").with_suffix(".png") if quick and \
        args.png.resolve() == (_util.RESULTS / "memory.png").resolve() else args.png
    _util.write_json(out, res)
    plot(rows, png, quick)
    print(table(rows, s))
    if cal:
        print("\n" + calibration_table(cal))
    print(f"\nwrote {out} and {png}")
    if args.clean:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
