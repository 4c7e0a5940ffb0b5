"""The Spark engine against the local engine: GMM on 2 and 8 hours of 44.1 kHz audio, cnn on 1 hour.

Data: the nested two-class 44.1 kHz sets of ``bench_memory.py`` (60 s files, written once to the
work folder and shared with it). Each run is one ``wavetrain train`` command in a fresh process
with one compute thread per process, a fresh feature store and a fresh feature table:

* ``local``   — ``wavetrain train ...`` (the local engine);
* ``local2``  — ``... --engine spark --master local[2]``;
* ``cluster`` — ``... --engine spark --master spark://127.0.0.1:PORT``: a standalone master and two
  one-core workers (``wavetrain.spark.standalone``), started for the run and stopped after it.

While a command runs, every process of it (and of the cluster's workers) is sampled with psutil
every 0.2 s: the driver's Python process, the driver's JVM, each executor's JVM and its Python
workers. Reported per run: wall time, EM passes, peak RSS of the driver (Python, JVM) and the
per-executor peak (the largest single Python worker, and Python workers plus JVM of one
executor), and how far the Spark model lies from the local one (largest relative difference of
the mixture parameters). From the measured numbers, a cost model of one EM pass at cluster scale
(bytes each executor reads, statistics shipped, driver work) and its prediction for 1,000 hours on
50 executors. Writes ``benchmarks/results/spark.json``.

    .venv/bin/python benchmarks/bench_spark.py [--hours 2 8] [--cnn-hours 1] [--modes local local2 cluster]
                                               [--workdir /tmp/wavetrain-bench] [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): 0.05 and 0.1 hours, cnn on 0.05 hours, local and
local[2] only; results go to $TMPDIR/wavetrain-bench/.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402
import bench_memory  # noqa: E402

GMM_SET = ["--set", "components=8"]
CNN_SET = ["--features", "logmel(bands=32)", "--clip-ms", "1000", "--set", "epochs=2", "--set", "batch_size=32",
           "--set", "valid_fraction=0.1"]
MODES = ("local", "local2", "cluster")
SAMPLE_S = 0.2


class Sampler:
    """Peak RSS of every process below some roots, sampled in a thread; grouped afterwards."""

    def __init__(self, roots: list[int]):
        self.roots = roots
        self.peak: dict[int, int] = {}
        self.samples: list[dict[int, int]] = []                # each sample: pid -> RSS
        self.info: dict[int, tuple[str, int | None]] = {}     # pid -> (name, parent pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def add_root(self, pid: int) -> None:
        self.roots.append(pid)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            now: dict[int, int] = {}
            self.samples.append(now)
            for root in list(self.roots):
                try:
                    procs = [psutil.Process(root)] + psutil.Process(root).children(recursive=True)
                except psutil.NoSuchProcess:
                    continue
                for p in procs:
                    try:
                        rss = p.memory_info().rss
                        self.info[p.pid] = (p.name(), p.ppid())   # again: a launcher script exec's its JVM
                    except psutil.Error:
                        continue
                    self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)
                    now[p.pid] = rss

    def groups(self, driver: int, workers: list[int]) -> dict:
        """Peaks (MB): the driver's Python and JVM, per executor its Python workers and JVM."""
        def kids(pid: int) -> list[int]:
            return [c for c, (_, parent) in self.info.items() if parent == pid]

        def below(pid: int) -> list[int]:
            out, todo = [], kids(pid)
            while todo:
                c = todo.pop()
                out.append(c)
                todo += kids(c)
            return out

        def mb(pids) -> float:
            """The largest resident total of these processes at one time."""
            pids = set(pids)
            return round(max((sum(v for p, v in s.items() if p in pids) for s in self.samples), default=0) / 2 ** 20,
                         1)

        def python(pids) -> list[int]:
            return [p for p in pids if "python" in self.info.get(p, ("", None))[0]]

        jvm = [p for p in below(driver) if self.info[p][0] == "java"]
        out = {"driver_python_mb": mb([driver]), "driver_jvm_mb": mb(jvm)}
        executors = []
        if workers:                  # standalone: worker JVM -> executor JVM -> Python daemon -> workers
            for w in workers:
                for e in [c for c in kids(w) if self.info[c][0] == "java"]:
                    executors.append((e, python(below(e))))
        elif jvm:                    # local[N]: the Python workers are children of the driver's JVM
            executors.append((jvm[0], python(below(jvm[0]))))
        if executors:
            out["executor_python_worker_peak_mb"] = max(
                (mb([p]) for _, pys in executors for p in pys), default=None)
            out["executor_python_mb"] = max(mb(pys) for _, pys in executors)
            out["executor_jvm_mb"] = max(mb([e]) for e, _ in executors) if workers else None
            out["executors"] = len(executors)
        return out


def _train(cmd: list[str], *, env: dict, workers: list[int], timeout: float) -> dict:
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=null)
        with Sampler([p.pid] + list(workers)) as s:
            out, _ = p.communicate(timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}")
    return {"wall_s": round(wall, 1), "stdout": out.decode(errors="replace").strip(),
            **s.groups(p.pid, list(workers))}


def _model_diff(a: Path, b: Path) -> float | None:
    from wavetrain.models.modelfile import load_model

    ma, mb = load_model(str(a)), load_model(str(b))
    if not hasattr(ma, "means_"):
        return None
    return float(max(np.max(np.abs(getattr(ma, n) - getattr(mb, n)) / np.maximum(np.abs(getattr(mb, n)), 1e-12))
                     for n in ("weights_", "means_", "variances_")))


def run_one(work: Path, csv: Path, model: list[str], mode: str, tag: str, timeout: float) -> dict:
    from wavetrain.spark.standalone import StandaloneCluster

    out = work / f"{tag}_{mode}.wt"
    cmd = _util.wavetrain_cmd() + ["train", "--data", str(csv), "--label", "cls", *model, "-o", str(out),
                                   "--cache", str(_util.fresh_dir(work / f"cache_{tag}_{mode}"))]
    env = _util.single_thread_env({"WAVETRAIN_PROGRESS": "0"})
    if mode == "local":
        res = _train(cmd, env=env, workers=[], timeout=timeout)
    else:
        cmd += ["--engine", "spark", "--table", str(_util.fresh_dir(work / f"table_{tag}_{mode}"))]
        if mode == "local2":
            res = _train(cmd + ["--master", "local[2]"], env=env, workers=[], timeout=timeout)
        else:
            with StandaloneCluster(workers=2, work_dir=str(_util.fresh_dir(work / f"cluster_{tag}"))) as cl:
                res = _train(cmd + ["--master", cl.url, "--spark-conf", "spark.executor.memory=512m"], env=env,
                             workers=cl.worker_pids(), timeout=timeout)
        table = work / f"table_{tag}_{mode}"
        res["table_mb"] = round(sum(f.stat().st_size for f in table.rglob("*.parquet")) / 2 ** 20, 1)
    res.update(mode=mode, em_passes=_util.em_passes(out), model=str(out))
    from wavetrain.models.modelfile import read_model_file

    training = read_model_file(out)[0].get("training", {})
    res.update({k: training[k] for k in ("init_seconds", "em_seconds", "score_seconds", "tasks") if k in training})
    return res


def cost_model(runs: list[dict], hours: list[float], cores: int = 2) -> dict:
    """One EM pass at cluster scale, from the local[2] GMM runs: the seconds of a pass are fitted
    as ``fixed + per_hour * hours`` (the fixed part: a job's scheduling and the tasks' start-up),
    the per-hour part scaled to one core and to each executor's share of 1,000 hours."""
    pts = sorted((r["hours"], r["em_seconds"] / r["em_passes"], r["table_mb"]) for r in runs
                 if r.get("mode") == "local2" and r.get("family") == "gmm" and r.get("em_seconds")
                 and r.get("em_passes") and r["hours"] in hours)
    if len(pts) < 2:
        return {}
    (h0, p0, _), (h1, p1, mb1) = pts[0], pts[-1]
    per_hour = (p1 - p0) / (h1 - h0)           # seconds per pass per hour of audio, on ``cores`` cores
    fixed = max(p0 - per_hour * h0, 0.0)
    core_s_per_hour = per_hour * cores         # one core's seconds per pass per hour of audio
    table_mb_per_hour = mb1 / h1
    labels, k, d, n_exec, total_h = 2, 8, 39, 50, 1000.0
    tasks = max(4 * n_exec, int(total_h * 60 / 256))     # 60 s files, at most 256 per task
    stats_bytes = labels * k * (2 * d + 1) * 8 + 200       # N, [sum x, sum x^2], log-likelihood, pickling
    share_h = total_h / n_exec
    compute_s = core_s_per_hour * share_h
    read_s = table_mb_per_hour * share_h / 100.0           # shared storage at 100 MB/s per executor
    return {"fitted_from": f"local[2] GMM passes at {h0:g} and {h1:g} h: {p0:.2f} and {p1:.2f} s",
            "fixed_s_per_pass": round(fixed, 2), "core_s_per_pass_per_hour": round(core_s_per_hour, 3),
            "table_mb_per_hour": round(table_mb_per_hour, 1),
            "at_1000h_50_executors_1_core": {
                "bytes_read_per_executor_per_pass_mb": round(table_mb_per_hour * share_h),
                "statistics_per_task_kb": round(stats_bytes / 1024, 1), "tasks": tasks,
                "statistics_shipped_per_pass_kb": round(stats_bytes * tasks / 1024),
                "statistics_reaching_the_driver_per_pass_kb": round(stats_bytes * math.ceil(math.sqrt(tasks)) / 1024),
                "driver_work_per_pass": f"adding {math.ceil(math.sqrt(tasks))} partial sums (a tree aggregation of "
                                        f"depth 2) and one M-step of {labels}x{k}x{d} parameters (< 10 ms)",
                "compute_s_per_pass": round(compute_s, 1), "read_s_per_pass_at_100_MBps": round(read_s, 1),
                "pass_s": round(fixed + max(compute_s, read_s), 1),
                "em_minutes_for_20_passes": round(20 * (fixed + max(compute_s, read_s)) / 60, 1)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, nargs="+", default=[2, 8])
    ap.add_argument("--cnn-hours", type=float, default=1.0, help="0: no cnn runs")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/wavetrain-bench"))
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "spark.json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if _util.quick_mode(args.quick):
        args.hours, args.cnn_hours, args.modes = [0.05, 0.1], 0.05, ["local", "local2"]
        args.out = _util.quick_out(args.out, "spark")
    work = args.workdir / "spark"
    work.mkdir(parents=True, exist_ok=True)
    sizes = sorted(set(args.hours) | ({args.cnn_hours} if args.cnn_hours else set()))
    csvs = bench_memory.make_data(args.workdir / "memory", sizes)
    runs = []
    t0 = time.time()
    jobs = [("gmm", h, GMM_SET) for h in args.hours] + ([("cnn", args.cnn_hours, ["--model", "cnn", *CNN_SET])]
                                                       if args.cnn_hours else [])
    for family, h, model in jobs:
        model = model if family == "cnn" else ["--model", "gmm", *model]
        local_model = None
        for mode in args.modes:
            tag = f"{family}_{h:g}h"
            try:
                r = run_one(work, csvs[h], model, mode, tag, args.timeout)
            except Exception as e:     # a failed mode is reported, the others still run
                r = {"mode": mode, "error": str(e)[-2000:]}
            r.update(family=family, hours=h)
            if mode == "local" and "model" in r:
                local_model = Path(r["model"])
            elif local_model is not None and "model" in r:
                r["max_rel_diff_to_local"] = _model_diff(Path(r["model"]), local_model)
            print({k: v for k, v in r.items() if k not in ("stdout",)}, flush=True)
            runs.append(r)
    growth = {}
    if len(args.hours) >= 2:
        lo, hi = min(args.hours), max(args.hours)
        for mode in args.modes:
            a = next((r for r in runs if r.get("hours") == lo and r["mode"] == mode and r["family"] == "gmm"), {})
            b = next((r for r in runs if r.get("hours") == hi and r["mode"] == mode and r["family"] == "gmm"), {})
            key = "executor_python_worker_peak_mb" if mode != "local" else "driver_python_mb"
            if a.get(key) and b.get(key):
                growth[mode] = round((b[key] - a[key]) / (hi - lo), 2)
    result = {"benchmark": "spark", "machine": _util.machine_info(), "loadavg_end": _util.loadavg(),
              "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0),
              "runs": [{k: v for k, v in r.items() if k != "stdout"} for r in runs],
              "peak_growth_mb_per_hour": growth, "target_mb_per_hour": 5.0,
              "cost_model": cost_model(runs, args.hours)}
    _util.write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
