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

Section ``families``: every model family trained with the local engine and with ``--engine spark
--master local[2]`` from the same data, in fresh processes, and both models evaluated with the local
engine on the same held-out data (``wavetrain evaluate -m ... --json``) and classified window by
window (``wavetrain classify -o``): classifiers on spoken-words split by speaker (accuracy),
detectors on one machine unit (``--machine-unit``, ROC AUC), and gmm-speech augmented (padding and
noise) tested on the held-out speakers of spoken-words-noisy. Per family: training wall time and peak RSS
(every process of the command at once), the score, and whether the two models predict the same.

    .venv/bin/python benchmarks/bench_spark.py [--sections runs gram_cache mllib planning families]
                                               [--hours 2 8] [--cnn-hours 1] [--modes local local2 cluster]
                                               [--families gmm ... augment] [--machine-unit fan:u1]
                                               [--workdir /tmp/wavetrain-bench] [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): 0.05 and 0.1 hours, cnn on 0.05 hours, local and
local[2] only; the gram cache off and at its default on 0.1 hours; the MLlib baseline on every
sixth recording; planning at 1,000 recordings; families: gmm on every sixth recording and
normal-dist; results go to $TMPDIR/wavetrain-bench/.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
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
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err)
        with Sampler([p.pid] + list(workers)) as s:
            out, _ = p.communicate(timeout=timeout)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}: {' | '.join(tail)}")
    all_mb = round(max((sum(sample.values()) for sample in s.samples), default=0) / 2 ** 20, 1)
    return {"wall_s": round(wall, 1), "stdout": out.decode(errors="replace").strip(),
            **s.groups(p.pid, list(workers)), "all_processes_mb": all_mb or None}


def _model_diff(a: Path, b: Path) -> float | None:
    from wavetrain.models.modelfile import load_model

    ma, mb = load_model(str(a)), load_model(str(b))
    if not hasattr(ma, "means_"):
        return None
    return float(max(np.max(np.abs(getattr(ma, n) - getattr(mb, n)) / np.maximum(np.abs(getattr(mb, n)), 1e-12))
                     for n in ("weights_", "means_", "variances_")))


def run_one(work: Path, csv: Path, model: list[str], mode: str, tag: str, timeout: float,
            gram_cache: str | None = None) -> dict:
    from wavetrain.spark.standalone import StandaloneCluster

    out = work / f"{tag}_{mode}.wt"
    cmd = _util.wavetrain_cmd() + ["train", "--data", str(csv), "--label", "cls", *model, "-o", str(out),
                                   "--cache", str(_util.fresh_dir(work / f"cache_{tag}_{mode}"))]
    env = _util.single_thread_env({"WAVETRAIN_PROGRESS": "0"})
    if mode == "local":
        res = _train(cmd, env=env, workers=[], timeout=timeout)
    else:
        cmd += ["--engine", "spark", "--table", str(_util.fresh_dir(work / f"table_{tag}_{mode}"))]
        if gram_cache is not None:
            cmd += ["--spark-conf", f"spark.executorEnv.WAVETRAIN_SPARK_GRAM_CACHE={gram_cache}"]
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


def stages_worker(csv: str, work: str) -> dict:
    """In one process: the GMM trained on ``csv`` by the local engine and by the Spark engine
    (local[2]) through the same job code, each twice — cold (an empty store or table) and warm (the
    features already there; on Spark the same session: no JVM start) — with each stage's seconds:
    JVM start, preparing the data (extraction when cold, else the driver's planning: headers,
    identities, the table's catalog, the task plan), and the job (the init pass, EM, the score
    statistics)."""
    from wavetrain.data import load_dataset
    from wavetrain.models.registry import build
    from wavetrain.pipeline.engine import LocalEngine
    from wavetrain.pipeline.jobs import RunOptions, present_values
    from wavetrain.spark.engine import SparkEngine
    from wavetrain.spark.session import SparkSettings
    from wavetrain.spark.table import FeatureTable
    from wavetrain.store import FeatureStore

    ds = load_dataset([Path(csv)])
    labels = present_values(ds, "cls")
    params = {"components": "8"}
    out: dict[str, dict] = {}

    def train(engine, opts, name: str) -> dict:
        model = build("gmm", params)
        model.label_name_ = "cls"
        t0 = time.perf_counter()
        prep = engine.prepare(ds, model, opts, label="cls", labels=labels)
        t1 = time.perf_counter()
        model.learn(engine.executor(prep, model, opts, label="cls", labels=labels))
        t2 = time.perf_counter()
        info = model.train_info_
        row = {"prepare_s": round(t1 - t0, 2), "extracted": prep.extracted, "job_s": round(t2 - t1, 2),
               "em_passes": info.get("em_passes"), "wall_s": round(t2 - t0, 2),
               **{k: info[k] for k in ("init_seconds", "em_seconds", "score_seconds") if k in info}}
        print(name, row, flush=True)
        return row

    store = FeatureStore(_util.fresh_dir(Path(work) / "stages-store"))
    local = LocalEngine()
    out["local_cold"] = train(local, RunOptions(store=store), "local cold")
    out["local_warm"] = train(local, RunOptions(store=store), "local warm")
    settings = SparkSettings("local[2]", dict(SPARK_LOCAL_CONF))
    with SparkEngine(None, FeatureTable(str(_util.fresh_dir(Path(work) / "stages-table"))), settings=settings) as spark:
        t0 = time.perf_counter()
        spark.spark.sparkContext.parallelize([0], 1).count()       # the JVM, the session, a first Python worker
        jvm = round(time.perf_counter() - t0, 2)
        print("spark session", jvm, flush=True)
        out["spark_cold"] = {"jvm_start_s": jvm, **train(spark, RunOptions(), "spark cold")}
        out["spark_warm"] = {"jvm_start_s": 0.0, **train(spark, RunOptions(), "spark warm")}
    for kind in ("cold", "warm"):
        s, loc = out[f"spark_{kind}"], out[f"local_{kind}"]
        s["ratio_to_local"] = round((s["wall_s"] + s["jvm_start_s"]) / loc["wall_s"], 2)
        s["job_ratio_to_local"] = round(s["job_s"] / loc["job_s"], 2)
    return out


def stage_runs(work: Path, csv: Path, hours: float, timeout: float) -> dict:
    """:func:`stages_worker` in a fresh process (threads pinned to one, as the command line)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, __file__, "--stages-worker", str(csv), str(work)], env=env, check=True,
                         stdout=subprocess.PIPE, text=True, timeout=timeout)
    return {"hours": hours, "loadavg": _util.loadavg(), **json.loads(res.stdout.strip().splitlines()[-1])}


def gram_cache_runs(work: Path, csvs: dict[float, Path], hours: float, sizes: list[str], timeout: float) -> dict:
    """The GMM on ``hours`` with the local engine, then on local[2] with each executor gram cache
    size (``0``: none; ``default``: 64 MB): wall time, EM seconds, and the ratio to the local engine."""
    model = ["--model", "gmm", *GMM_SET]
    tag = f"gmm_{hours:g}h_cache"
    local = run_one(work, csvs[hours], model, "local", tag, timeout)
    rows = [{"mode": "local", "wall_s": local["wall_s"], "em_passes": local["em_passes"],
             "driver_python_mb": local["driver_python_mb"]}]
    for size in sizes:
        r = run_one(work, csvs[hours], model, "local2", f"{tag}_{size}", timeout,
                    gram_cache=None if size == "default" else size)
        r["max_rel_diff_to_local"] = _model_diff(Path(r["model"]), Path(local["model"]))
        rows.append({"mode": "local2", "gram_cache": size, "ratio_to_local": round(r["wall_s"] / local["wall_s"], 2),
                     **{k: r.get(k) for k in ("wall_s", "em_passes", "init_seconds", "em_seconds", "score_seconds",
                                              "executor_python_worker_peak_mb", "executor_python_mb", "table_mb",
                                              "max_rel_diff_to_local")}})
        print(rows[-1], flush=True)
    return {"hours": hours, "loadavg": _util.loadavg(), "runs": rows}


SPOKEN = Path("/work/shared/data/spoken-words/metadata.csv")
SPARK_LOCAL_CONF = {"spark.driver.memory": "1g", "spark.driver.host": "127.0.0.1",
                    "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false",
                    "spark.ui.showConsoleProgress": "false", "spark.executorEnv.OMP_NUM_THREADS": "1",
                    "spark.executorEnv.OPENBLAS_NUM_THREADS": "1", "spark.executorEnv.MKL_NUM_THREADS": "1"}


def speaker_split(work: Path, csv: Path = SPOKEN, test_fraction: float = 0.25, every: int = 1) -> tuple[Path, Path]:
    """Train and test metadata files of ``csv`` (absolute paths), whole speakers held out; every
    ``every``-th recording of each side (1: all)."""
    from wavetrain.data import load_dataset
    from wavetrain.data.splits import holdout_split

    ds = load_dataset([csv])
    train, test = holdout_split(ds, test_fraction, seed=0, group_by="speaker")
    lines = {ln.split(",", 1)[0]: ln.split(",", 1)[1] for ln in csv.read_text().splitlines()
             if ln.strip() and not ln.startswith("#")}
    out = []
    for name, idx in (("train", train), ("test", test)):
        path = work / f"spoken_{name}.csv"
        path.write_text("".join(f"{ds[int(i)].path.resolve()},{lines[ds[int(i)].path.name]}\n"
                                for i in idx[::every]))
        out.append(path)
    return out[0], out[1]


def mllib_comparison(work: Path, timeout: float, every: int = 1) -> dict:
    """wavetrain's GMM on Spark against what a Spark user would write with MLlib, on spoken-words
    split by speaker (every ``every``-th recording), both on local[2] in a fresh process: wall
    time, peak RSS, accuracy."""
    train_csv, test_csv = speaker_split(work, every=every)
    env = _util.single_thread_env({"WAVETRAIN_PROGRESS": "0"})
    table, model = _util.fresh_dir(work / "table_spoken"), work / "spoken_spark.wt"
    spark = ["--engine", "spark", "--master", "local[2]", "--table", str(table)]
    fit = _train(_util.wavetrain_cmd() + ["train", "--data", str(train_csv), "--label", "word", "--model", "gmm",
                                          "-o", str(model), "--no-cache", *spark], env=env, workers=[],
                 timeout=timeout)
    ev = _train(_util.wavetrain_cmd() + ["evaluate", "--data", str(test_csv), "--label", "word", "-m", str(model),
                                         "--json", "--no-cache", *spark], env=env, workers=[], timeout=timeout)
    report = json.loads(ev["stdout"])
    from wavetrain.models.modelfile import load_model

    k = int(load_model(str(model)).params["components"])
    wt = {"train": {x: fit.get(x) for x in MEASURED}, "evaluate": {x: ev.get(x) for x in MEASURED},
          "wall_s": round(fit["wall_s"] + ev["wall_s"], 1), "accuracy": report.get("accuracy"),
          "components": k, "covariance": "diag", "em_passes": _util.em_passes(model)}
    out = work / "mllib.json"
    ml = _train([sys.executable, __file__, "--mllib-worker", str(train_csv), str(test_csv), str(out), str(k)],
                env=env, workers=[], timeout=timeout)
    ml_res = json.loads(out.read_text())
    return {"data": f"{SPOKEN} ({sum(1 for _ in train_csv.open())} train / {sum(1 for _ in test_csv.open())} "
                    "test recordings, whole speakers held out)",
            "wavetrain_spark": wt,
            "mllib": {"wall_s": ml["wall_s"], **{x: ml.get(x) for x in MEASURED[1:]}, **ml_res}}


MEASURED = ("wall_s", "driver_python_mb", "driver_jvm_mb", "executor_python_worker_peak_mb", "executor_python_mb")


def mllib_worker(train_csv: str, test_csv: str, out: str, k: int) -> None:
    """The baseline: features (wavetrain's gmm default, extracted on executors) as a DataFrame of
    one row per frame, one MLlib GaussianMixture per word, held-out recordings classified by the
    largest mean frame log-likelihood (computed on executors from the fitted parameters)."""
    from pyspark.ml.clustering import GaussianMixture
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import SparkSession

    from wavetrain.data import load_dataset
    from wavetrain.features import parse_spec
    from wavetrain.models.gmm import GMMClassifier
    from wavetrain.stream.source import FeatureSource

    t0 = time.perf_counter()
    os.environ["PYSPARK_PYTHON"] = sys.executable        # the executors' Python: this environment's
    builder = SparkSession.builder.master("local[2]").appName("mllib-baseline").config(
        "spark.pyspark.python", sys.executable)
    for key, value in SPARK_LOCAL_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spec = parse_spec(GMMClassifier.default_features)
    train, test = load_dataset([Path(train_csv)]), load_dataset([Path(test_csv)])

    def frames(indexed):
        i, rec, word = indexed
        source = FeatureSource(spec)
        return [(i, word, Vectors.dense(row.astype(float))) for row in source.gram(rec)]

    def frame_df(ds):
        items = [(i, rec, rec.labels["word"]) for i, rec in enumerate(ds)]
        rdd = spark.sparkContext.parallelize(items, 8).flatMap(frames)
        return spark.createDataFrame(rdd, ["rec", "word", "features"])

    train_df = frame_df(train).persist()
    words = sorted({r.labels["word"] for r in train})
    t1 = time.perf_counter()
    params = {}
    for w in words:
        m = GaussianMixture(k=k, seed=0).fit(train_df.filter(train_df.word == w))
        g = m.gaussiansDF.collect()
        params[w] = (np.asarray(m.weights), np.stack([r["mean"].toArray() for r in g]),
                     np.stack([r["cov"].toArray() for r in g]))
    t2 = time.perf_counter()
    chol = {w: (np.log(wt), mu, np.linalg.cholesky(cov)) for w, (wt, mu, cov) in params.items()}
    bc = spark.sparkContext.broadcast(chol)

    def loglik(rows):
        rows = list(rows)
        if not rows:
            return []
        x = np.stack([r["features"].toArray() for r in rows])
        lls = []
        for w in words:
            logw, mu, ch = bc.value[w]
            comp = []
            for j in range(len(logw)):
                z = np.linalg.solve(ch[j], (x - mu[j]).T)
                comp.append(logw[j] - 0.5 * (z * z).sum(0) - np.log(np.diag(ch[j])).sum()
                            - 0.5 * x.shape[1] * np.log(2 * np.pi))
            c = np.stack(comp)
            top = c.max(0)
            lls.append(top + np.log(np.exp(c - top).sum(0)))
        ll = np.stack(lls, 1)
        return [(r["rec"], (ll[i], 1)) for i, r in enumerate(rows)]

    test_df = frame_df(test)
    sums = test_df.rdd.mapPartitions(loglik).reduceByKey(lambda a, b: (a[0] + b[0], a[1] + b[1])).collect()
    truth = [rec.labels["word"] for rec in test]
    correct = sum(words[int(np.argmax(s / n))] == truth[i] for i, (s, n) in sums)
    t3 = time.perf_counter()
    res = {"accuracy": round(correct / len(test), 4), "test_recordings": len(test), "classified": len(sums),
           "components": k, "covariance": "full (MLlib GaussianMixture has no diagonal option)",
           "train_frames": train_df.count(), "seconds": {"start_and_features": round(t1 - t0, 1),
                                                        "fit": round(t2 - t1, 1), "classify": round(t3 - t2, 1)}}
    spark.stop()
    Path(out).write_text(json.dumps(res))


PLAN_FILES = 10            # real 60 s files the synthetic rows name


def plan_setup(n: int, csv: str, table_root: str, audio_dir: str) -> None:
    """A metadata file of ``n`` rows naming :data:`PLAN_FILES` real 60 s files with distinct
    segments (so every row is its own recording), and a feature table that holds them all (part
    files of 256 recordings and one frame each: the catalog reads only their ``rec`` column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wavetrain.data import load_dataset
    from wavetrain.pipeline.jobs import feature_layout
    from wavetrain.spark.extract import MAX_CHUNK
    from wavetrain.spark.table import FeatureTable, _schema
    from wavetrain.stream.source import FeatureSource

    audio = sorted(Path(audio_dir).glob("rec*.wav"))[:PLAN_FILES]
    rows = []
    for j in range(n):
        start = j // PLAN_FILES // 50
        rows.append(f"{audio[j % PLAN_FILES]}[{start}-{start + 100 + j // PLAN_FILES % 50}],cls={'ab'[j % 2]}\n")
    Path(csv).write_text("".join(rows))
    ds = load_dataset([Path(csv)])
    spec = parse_spec_default()
    rate, channels = feature_layout(ds, spec)
    source = FeatureSource(spec, rate=rate, channels=channels)
    table = FeatureTable(table_root)
    folder = table.folder(source.spec_for(ds[0])[1])
    Path(folder).mkdir(parents=True, exist_ok=True)
    d = 39
    x = np.zeros((1, d), "<f4").tobytes()
    shift = source.frame_shift(rate or 44100)
    for p in range(0, n, MAX_CHUNK):
        ids = [ds[i].id for i in range(p, min(n, p + MAX_CHUNK))]
        cols = {"rec": ids, "block": [0] * len(ids), "frames": [1] * len(ids), "dim": [d] * len(ids),
                "rate": [rate] * len(ids), "shift": [shift] * len(ids), "duration_ms": [100] * len(ids),
                "x": [x] * len(ids)}
        pq.write_table(pa.table(cols, schema=_schema()), f"{folder}/part-{p // MAX_CHUNK:08d}.parquet")


def parse_spec_default():
    from wavetrain.features import parse_spec
    from wavetrain.models.gmm import GMMClassifier

    return parse_spec(GMMClassifier.default_features)


def plan_worker(csv: str, table_root: str) -> dict:
    """The Spark driver's work before any executor runs, for ``wavetrain train --engine spark``
    on ``csv`` (every recording already in the table): load the data set, build the model, read
    headers (sample rates), recording identities, the table's catalog, the task plan. Seconds per
    step and peak RSS."""
    import resource

    from wavetrain.data import load_dataset
    from wavetrain.pipeline.jobs import feature_layout, model_and_data
    from wavetrain.spark.engine import label_indices, prepare
    from wavetrain.spark.table import FeatureTable
    from wavetrain.stream.source import FeatureSource

    def rss_mb() -> float:
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    base = rss_mb()
    steps: dict[str, float] = {}
    t = time.perf_counter()

    def step(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        steps[name] = round(now - t, 3)
        t = now

    ds = load_dataset([Path(csv)])
    step("load_dataset")
    model, ds = model_and_data(ds, "cls", "gmm", None)
    rate, channels = feature_layout(ds, model.feature_spec)
    step("model_and_headers")
    source = FeatureSource(model.feature_spec, rate=rate, channels=channels)
    ids = [rec.id for rec in ds]
    step("identities")
    prep = prepare(None, FeatureTable(table_root), ds, source)   # every recording is in the table: no executor runs
    step("catalog_and_prepare")
    labels = sorted({r.labels["cls"] for r in prep.ds})
    tasks = prep.tasks(label_indices(prep.ds, "cls", labels))
    step("task_plan")
    return {"recordings": len(ds), "distinct_ids": len(set(ids)), "tasks": len(tasks), "steps_s": steps,
            "seconds": round(sum(steps.values()), 2), "rss_after_imports_mb": base, "peak_rss_mb": rss_mb()}


def planning_runs(work: Path, sizes: list[int], timeout: float) -> dict:
    """Driver planning at each size (a fresh process each: setup, then the measured run)."""
    csvs = bench_memory.make_data(work.parent / "memory", [PLAN_FILES / 60])
    audio = Path(next(iter(csvs.values()))).parent / "audio"
    env = _util.single_thread_env({"WAVETRAIN_PROGRESS": "0"})
    rows = []
    for n in sizes:
        folder = _util.fresh_dir(work / f"plan_{n}")
        csv, table = folder / "metadata.csv", folder / "table"
        subprocess.run([sys.executable, __file__, "--plan-setup", str(n), str(csv), str(table), str(audio)], env=env,
                       check=True, timeout=timeout)
        out = subprocess.run([sys.executable, __file__, "--plan-worker", str(csv), str(table)], env=env, check=True,
                             timeout=timeout, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    fit = {}
    if len(rows) >= 2:
        n = np.array([r["recordings"] for r in rows], float)
        for key in ("seconds", "peak_rss_mb"):
            slope, icpt = np.polyfit(n, [r[key] for r in rows], 1)
            fit[key] = {"fixed": round(float(icpt), 2), "per_recording": float(f"{slope:.3g}")}
    return {"files_named": PLAN_FILES, "loadavg": _util.loadavg(), "runs": rows, "fit": fit}


def planning_at_scale(planning: dict) -> dict:
    """The fitted driver planning cost at 1,000 h of 60 s recordings (60,000) and of 1 s clips (3.6M)."""
    fit = planning.get("fit") or {}
    if not fit:
        return {}
    out = {}
    for name, n in (("60_s_recordings", 60_000), ("1_s_clips", 3_600_000)):
        out[name] = {"recordings": n, **{k: round(v["fixed"] + v["per_recording"] * n, 1) for k, v in fit.items()}}
    return out


def gram_cache_at_scale(scale: dict, hours: float = 1000.0, executors: int = 50, d: int = 39,
                        shift_s: float = 0.01) -> dict:
    """What an executor's gram cache must hold to serve its share of 1,000 hours from memory."""
    decoded_mb_per_hour = 3600 / shift_s * d * 4 / 2 ** 20
    share = decoded_mb_per_hour * hours / executors
    return {"decoded_mb_per_hour": round(decoded_mb_per_hour, 1), "share_per_executor_mb": round(share),
            "setting_to_hold_it": f"spark.executorEnv.WAVETRAIN_SPARK_GRAM_CACHE={math.ceil(share * 1.1 / 1024)}G",
            "pass_s_when_held": round(scale["pass_s"] - max(scale["compute_s_per_pass"],
                                                             scale["read_s_per_pass_at_100_MBps"])
                                      + scale["compute_s_per_pass"], 1),
            "caveat": "a task must run again in the Python worker that read it: with one-core executors and "
                      "tasks that return to their executor (locality), not guaranteed by Spark for a "
                      "parallelized task list"}


# --- every family on Spark against the local engine -------------------------------------------

MACHINES = Path("/work/shared/data/machines/metadata.csv")
SPOKEN_NOISY = Path("/work/shared/data/spoken-words-noisy/metadata.csv")
#: Classifier families and their settings (the neural ones: a few epochs, so the whole section
#: takes about half an hour on two shared vCPUs).
FAMILY_CLASSIFIERS: dict[str, list[str]] = {
    "gmm": [], "gmm-speech": [], "knn": [],
    "cnn": ["--set", "epochs=3"], "dcase": ["--set", "epochs=2"], "rescnn": ["--set", "epochs=3"],
    "ensemble": ["--set", "members=gmm,knn"],
}
FAMILY_DETECTORS: dict[str, list[str]] = {
    "normal-dist": [], "anomaly-gmm": [], "knn-anomaly": [], "autoencoder": ["--set", "epochs=10"],
}
#: The augmenting run: trained on clean speakers, tested on the noisy recordings of the others. The
#: ``room`` preset without its reverb and band limits: on Spark every EM pass augments its
#: recordings again, and with reverb a sixth of the training set alone took 138 s of EM.
AUGMENT_FAMILY = "gmm-speech"
AUGMENT_SET = ["--set", "augment=pad(before=0:450, after=0:450) | noise(snr=0:20, color=any)"]
QUICK_FAMILIES = ("gmm", "normal-dist")


def unit_split(work: Path, machine: str, unit: str, csv: Path = MACHINES) -> tuple[Path, Path]:
    """Train and test metadata files (absolute paths) of one machine unit: its ``split=train``
    clips (all normal) and its ``split=test`` clips."""
    out = {}
    for split in ("train", "test"):
        rows = []
        for path, labels in _util.read_csv_plain(csv):
            if (labels.get("machine"), labels.get("unit"), labels.get("split")) == (machine, unit, split):
                rows.append(f"{path.resolve()},{';'.join(f'{k}={v}' for k, v in labels.items())}\n")
        if not rows:
            raise SystemExit(f"{csv}: no {split} clips of machine={machine} unit={unit}; pick another --machine-unit")
        out[split] = work / f"{machine}_{unit}_{split}.csv"
        out[split].write_text("".join(rows))
    return out["train"], out["test"]


def machine_unit(text: str) -> tuple[str, str]:
    """An argparse ``type``: ``MACHINE:UNIT`` (e.g. ``fan:u1``) as ``(machine, unit)``."""
    machine, sep, unit = text.partition(":")
    if not sep or not machine or not unit:
        raise argparse.ArgumentTypeError(f"expected MACHINE:UNIT such as fan:u1, got {text!r}")
    return machine, unit


def compare_predictions(a: Path, b: Path) -> dict:
    """Two ``wavetrain classify -o FILE.csv`` outputs of the same windows: windows with the same
    value, and the largest absolute difference of any score (every value's score, the detector's
    anomaly score, log-likelihood, confidence) between the two."""
    import csv

    def rows(p: Path) -> dict[tuple, dict]:
        with open(p, newline="") as f:
            return {(r["file"], r["start_ms"], r["end_ms"]): r for r in csv.DictReader(f)}

    ra, rb = rows(a), rows(b)
    if ra.keys() != rb.keys():
        return {"windows": len(ra), "same_windows": False}
    scores = [c for c in next(iter(ra.values()), {}) if c.startswith("score:")
              or c in ("anomaly_score", "loglik", "confidence")]
    diff = 0.0
    for key, x in ra.items():
        y = rb[key]
        for c in scores:
            if x.get(c) not in (None, "") and y.get(c) not in (None, ""):
                diff = max(diff, abs(float(x[c]) - float(y[c])))
    return {"windows": len(ra), "same_value": sum(x["value"] == rb[k]["value"] for k, x in ra.items()),
            "max_score_diff": diff, "identical_files": a.read_bytes() == b.read_bytes()}


def family_pair(work: Path, tag: str, family: str, sets: list[str], train: list[str], test: list[str],
                test_csv: Path, timeout: float) -> dict:
    """One family trained with the local engine and on local[2] from the same ``train`` options,
    both models evaluated (local engine, one shared feature store) on the same ``test`` options
    and classified window by window on ``test_csv``."""
    from wavetrain.models.modelfile import read_model_file
    from wavetrain.models.registry import build

    env = _util.single_thread_env({"WAVETRAIN_PROGRESS": "0"})
    probe = build(family, None)
    row: dict = {"family": family, "settings": " ".join(sets[1::2]), "learns_by": probe.learns_by,
                 "detector": probe.detector}
    eval_cache = work / f"eval_cache_{'machines' if probe.detector else test_csv.stem}"
    preds = {}
    for mode in ("local", "local2"):
        out = work / f"{tag}_{mode}.wt"
        cmd = _util.wavetrain_cmd() + ["train", *train, "--model", family, *sets, "-o", str(out),
                                       "--cache", str(_util.fresh_dir(work / f"cache_{tag}_{mode}"))]
        if mode == "local2":
            cmd += ["--engine", "spark", "--master", "local[2]",
                    "--table", str(_util.fresh_dir(work / f"table_{tag}_{mode}"))]
        try:
            fit = _train(cmd, env=env, workers=[], timeout=timeout)
            ev = _train(_util.wavetrain_cmd() + ["evaluate", "-m", str(out), *test, "--json", "--cache",
                                                 str(eval_cache)], env=env, workers=[], timeout=timeout)
            report = json.loads(ev["stdout"].splitlines()[-1])
            preds[mode] = work / f"{tag}_{mode}_predictions.csv"
            _train(_util.wavetrain_cmd() + ["classify", "-m", str(out), str(test_csv), "-o", str(preds[mode]),
                                            "--cache", str(eval_cache)], env=env, workers=[], timeout=timeout)
        except Exception as e:     # a failed run is reported, the others still run
            row[mode] = {"error": str(e)[-2000:]}
            print(f"{tag} {mode}: failed\n{row[mode]['error']}", file=sys.stderr, flush=True)
            continue
        training = read_model_file(out)[0].get("training", {})
        row[mode] = {**{k: fit.get(k) for k in MEASURED + ("all_processes_mb",) if fit.get(k) is not None},
                     **{k: training[k] for k in ("train_seconds", "init_seconds", "em_seconds", "score_seconds",
                                                 "tasks") if k in training},
                     "score": report.get("auc" if probe.detector else "accuracy"),
                     "metric": "auc" if probe.detector else "accuracy", "evaluate_wall_s": ev["wall_s"],
                     "model": str(out)}
    if "wall_s" in row.get("local", {}) and "wall_s" in row.get("local2", {}):
        row["ratio"] = round(row["local2"]["wall_s"] / row["local"]["wall_s"], 2)
    if len(preds) == 2:
        row["predictions"] = compare_predictions(preds["local"], preds["local2"])
        try:
            row["max_rel_param_diff"] = _model_diff(Path(row["local2"]["model"]), Path(row["local"]["model"]))
        except Exception:        # families without mixture parameters of that shape
            row["max_rel_param_diff"] = None
    print({k: v for k, v in row.items()}, flush=True)
    return row


def family_runs(args: argparse.Namespace, work: Path) -> dict:
    """Every family (or ``args.families``) trained locally and on local[2], scored on held-out data."""
    work = _util.fresh_dir(work / "families")
    every = 6 if args.quick else 1
    train_csv, test_csv = speaker_split(work, every=every)
    noisy = _util.fresh_dir(work / "noisy")
    _, noisy_test = speaker_split(noisy, csv=SPOKEN_NOISY, every=every)
    speakers = {lab.get("speaker") for _, lab in _util.read_csv_plain(test_csv)}
    if speakers != {lab.get("speaker") for _, lab in _util.read_csv_plain(noisy_test)}:
        raise SystemExit(f"{SPOKEN_NOISY}: its held-out speakers differ from {SPOKEN}'s; the split needs the same "
                         "speakers in both")
    machine, unit = args.machine_unit
    unit_train, unit_test = unit_split(work, machine, unit)
    words = ["--label", "word"]
    state = ["--label", "state", "--normal", "normal"]
    jobs = []
    for fam, sets in {**FAMILY_CLASSIFIERS, **FAMILY_DETECTORS}.items():
        if fam not in args.families:
            continue
        if fam in FAMILY_DETECTORS:
            jobs.append((fam, fam, sets, ["--data", str(unit_train), *state], ["--data", str(unit_test), *state],
                         unit_test))
        else:
            jobs.append((fam, fam, sets, ["--data", str(train_csv), *words], ["--data", str(test_csv), *words],
                         test_csv))
    if "augment" in args.families:
        jobs.append(("augment", AUGMENT_FAMILY, AUGMENT_SET, ["--data", str(train_csv), *words],
                     ["--data", str(noisy_test), *words], noisy_test))
    t0, load0 = time.time(), _util.loadavg()
    rows = []
    for tag, fam, sets, train, test, csv in jobs:
        rows.append({"run": tag, **family_pair(work, tag.replace("-", "_"), fam, sets, train, test, csv,
                                               args.timeout)})
    n_train, n_test = (sum(1 for _ in p.open()) for p in (train_csv, test_csv))
    return {"date": time.strftime("%Y-%m-%d"), "machine": _util.machine_info(), "loadavg_start": load0,
            "loadavg_end": _util.loadavg(), "seconds": round(time.time() - t0),
            "data": {"classifiers": f"{SPOKEN}: {n_train} train / {n_test} test recordings, whole speakers held out "
                                    f"({'every recording' if every == 1 else f'every {every}th recording'})",
                     "augment": f"trained on the same {n_train}; tested on the {n_test} recordings of the same "
                                f"held-out speakers in {SPOKEN_NOISY}",
                     "detectors": f"{MACHINES}: machine={machine} unit={unit}, "
                                  f"{sum(1 for _ in unit_train.open())} normal train clips, "
                                  f"{sum(1 for _ in unit_test.open())} test clips"},
            "evaluation": "both models with the local engine (`wavetrain evaluate -m`, `wavetrain classify -o`)",
            "runs": rows}


def families_table(section: dict) -> str:
    """The section's rows as a markdown table."""
    out = []
    for r in section.get("runs", []):
        lo, sp = r.get("local", {}), r.get("local2", {})
        pr = r.get("predictions") or {}
        same = (f"{pr['same_value']}/{pr['windows']}, {pr['max_score_diff']:.2g}" if "same_value" in pr
                else "–")
        out.append([r["run"] + (f" ({r['settings']})" if r.get("settings") else ""), r["learns_by"],
                    lo.get("wall_s"), sp.get("wall_s"), r.get("ratio"), lo.get("score"), sp.get("score"), same,
                    lo.get("driver_python_mb"), sp.get("all_processes_mb")])
    return _util.markdown_table(["family", "learns by", "local s", "Spark s", "× local", "local score",
                                 "Spark score", "same value, max score diff", "local peak MB",
                                 "Spark peak MB (all processes)"], out)


SECTIONS = ("runs", "gram_cache", "stages", "mllib", "planning", "families")


def main() -> None:
    if sys.argv[1:2] == ["--mllib-worker"]:
        mllib_worker(*sys.argv[2:5], int(sys.argv[5]))
        return
    if sys.argv[1:2] == ["--plan-setup"]:
        plan_setup(int(sys.argv[2]), *sys.argv[3:6])
        return
    if sys.argv[1:2] == ["--stages-worker"]:
        print(json.dumps(stages_worker(sys.argv[2], sys.argv[3])))
        return
    if sys.argv[1:2] == ["--plan-worker"]:
        print(json.dumps(plan_worker(sys.argv[2], sys.argv[3])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                    help="what to measure; the JSON keeps the other sections' last results")
    ap.add_argument("--hours", type=float, nargs="+", default=[2, 8])
    ap.add_argument("--cnn-hours", type=float, default=1.0, help="0: no cnn runs")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--cache-hours", type=float, default=8.0, help="hours of the gram cache comparison")
    ap.add_argument("--cache-sizes", nargs="+", default=["0", "default", "1G"],
                    help="executor gram cache sizes compared (0: off; default: 64 MB)")
    ap.add_argument("--plan-sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--families", nargs="+", choices=(*FAMILY_CLASSIFIERS, *FAMILY_DETECTORS, "augment"),
                    help="families of the families section (default: all; augment: gmm-speech with "
                         "augment=pad | noise)")
    ap.add_argument("--machine-unit", type=machine_unit, default="fan:u1", metavar="MACHINE:UNIT",
                    help="the machine unit the detectors of the families section learn (default fan:u1)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/wavetrain-bench"))
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "spark.json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if _util.quick_mode(args.quick):
        args.hours, args.cnn_hours, args.modes = [0.05, 0.1], 0.05, ["local", "local2"]
        args.cache_hours, args.plan_sizes, args.cache_sizes = 0.1, [1000], ["0", "default"]
        args.families = args.families or list(QUICK_FAMILIES)
        args.quick = True
        args.out = _util.quick_out(args.out, "spark")
    args.families = args.families or [*FAMILY_CLASSIFIERS, *FAMILY_DETECTORS, "augment"]
    work = args.workdir / "spark"
    work.mkdir(parents=True, exist_ok=True)
    result = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "spark"}
    if "runs" in args.sections:
        result.update(engine_runs(args, work))
    if "gram_cache" in args.sections:
        csvs = bench_memory.make_data(args.workdir / "memory", [args.cache_hours])
        result["gram_cache"] = {"date": time.strftime("%Y-%m-%d"), "machine": _util.machine_info(),
                                **gram_cache_runs(work, csvs, args.cache_hours, args.cache_sizes, args.timeout)}
    if "stages" in args.sections:
        csvs = bench_memory.make_data(args.workdir / "memory", [args.cache_hours])
        result["stages"] = {"date": time.strftime("%Y-%m-%d"), "machine": _util.machine_info(),
                            **stage_runs(work, csvs[args.cache_hours], args.cache_hours, args.timeout)}
    if "mllib" in args.sections:
        result["mllib_baseline"] = {"date": time.strftime("%Y-%m-%d"), "machine": _util.machine_info(),
                                    **mllib_comparison(work, args.timeout, every=6 if args.quick else 1)}
    if "planning" in args.sections:
        result["driver_planning"] = {"date": time.strftime("%Y-%m-%d"), "machine": _util.machine_info(),
                                     **planning_runs(work, args.plan_sizes, args.timeout)}
    if "families" in args.sections:
        result["families"] = family_runs(args, work)
        print(families_table(result["families"]))
    if result.get("cost_model"):
        scale = result["cost_model"]["at_1000h_50_executors_1_core"]
        if "driver_planning" in result:
            scale["driver_planning"] = planning_at_scale(result["driver_planning"])
        scale["gram_cache"] = gram_cache_at_scale(scale)
    _util.write_json(args.out, result)
    print(f"wrote {args.out}")


def engine_runs(args: argparse.Namespace, work: Path) -> dict:
    """The engines side by side: GMM at ``args.hours``, cnn at ``args.cnn_hours``, each mode."""
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
    return {"machine": _util.machine_info(), "loadavg_end": _util.loadavg(),
            "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t0),
            "runs": [{k: v for k, v in r.items() if k != "stdout"} for r in runs],
            "peak_growth_mb_per_hour": growth, "target_mb_per_hour": 5.0,
            "cost_model": cost_model(runs, args.hours)}


if __name__ == "__main__":
    main()
