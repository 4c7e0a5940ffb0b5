"""``wavetrain export``: ONNX graphs against the in-process model they came from.

1. Every family (``gmm``, ``gmm-speech``, ``knn``, ``cnn``, ``dcase``, ``rescnn``, ``ensemble`` of
   ``gmm,knn``; detectors ``normal-dist``, ``anomaly-gmm``, ``knn-anomaly``, ``autoencoder``; and
   the cnn exported with ``--quantize int8``), trained small in fresh processes with one compute
   thread (the graph, not the model, is under test: neural models :data:`EPOCHS` epochs)::

       wavetrain train --data <train.csv> --label L --model F [--set epochs=E] -o F.wt
       wavetrain export -m F.wt -o F.onnx [--quantize int8] --check <check.csv>

   Classifiers learn ``word`` on the ``spoken-words`` recordings of 8 speakers and are checked
   on 4 others; detectors learn the normal ``split=train`` clips of ``machines`` fan u1 and are
   checked on its ``split=test`` clips (the demo machine sounds of ``wavetrain.data.demo`` where
   these sets are missing). Per graph:

   - size: the file's bytes, split into the weights (initializers) of the feature front-end, of
     the model part and of its network (initializers named, or used by nodes named, ``/net/``);
   - latency of one 1 s clip at the model's rate: ``onnxruntime.InferenceSession`` (one intra-op
     and one inter-op thread) against ``classify_samples(model, clip, rate)`` with the ``.wt``
     model in process, and ``classify_samples`` with the ``.onnx`` loaded by wavetrain; p50 and
     p99 of :data:`RUNS` runs each after 20 warm-up runs, the three taken in turn, 10 runs at a
     time, in one process of their own;
   - peak RSS (``/usr/bin/time -f %M``, and ``VmHWM`` read inside) of a process that imports
     numpy and onnxruntime only (it checks that ``wavetrain`` and ``torch`` are not in
     ``sys.modules``), loads the graph and scores 20 passes over the 1 s clips, against a
     process that loads the ``.wt`` with wavetrain and classifies the same clips with
     ``classify_samples``, and one that does that with the ``.onnx``; and the floors: python +
     numpy alone, and with onnxruntime imported;
   - parity: the largest relative score difference (``max |graph - wt| / max(max |wt|, 1e-3)``,
     as ``--check`` measures it) over the 1 s clips (onnxruntime direct) and over the check
     recordings (``--check``), and how many answers agree.

2. The accuracy change of int8 on ``spoken-words`` (1,440 utterances, 48 speakers), 4 folds by
   speaker: the speakers sorted by name, fold k holds out every 4th one from the k-th (as
   ``bench_gmm.py`` holds out every 4th); on each fold a ``cnn`` with default parameters
   (``--fold-epochs`` to shorten it) is trained on 36 speakers and exported float and int8 with
   ``--check`` on the 12 held-out ones: accuracy of the ``.wt``, the float graph and the int8
   graph, and the loss in points (target: at most 0.5); on their clean recordings and, as the
   clean ones leave little room, on the same utterances of ``spoken-words-noisy`` (the models
   never saw noise).

Writes ``benchmarks/results/export.json``.

    .venv/bin/python benchmarks/bench_export.py [--families F ...] [--runs 200] [--no-folds]
                                                [--fold-epochs N] [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): the demo machine sounds, ``gmm``, ``normal-dist`` and
``cnn`` (1 epoch, float and int8), 40 runs, no folds; results go to $TMPDIR/wavetrain-bench/.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

SHARED = _util.ROOT.parent / "shared" / "data"
#: Epochs of the neural families in part 1 (small: the graph is under test, not the model).
EPOCHS = 5
#: (row name, family, extra train arguments, detector, --quantize).
FAMILIES = [
    ("gmm", "gmm", [], False, None),
    ("gmm-speech", "gmm-speech", [], False, None),
    ("knn", "knn", [], False, None),
    ("cnn", "cnn", ["--set", f"epochs={EPOCHS}"], False, None),
    ("cnn int8", "cnn", ["--set", f"epochs={EPOCHS}"], False, "int8"),
    ("dcase", "dcase", ["--set", f"epochs={EPOCHS}"], False, None),
    ("rescnn", "rescnn", ["--set", f"epochs={EPOCHS}"], False, None),
    ("ensemble gmm,knn", "ensemble", ["--set", "members=gmm,knn"], False, None),
    ("normal-dist", "normal-dist", [], True, None),
    ("anomaly-gmm", "anomaly-gmm", [], True, None),
    ("knn-anomaly", "knn-anomaly", [], True, None),
    ("autoencoder", "autoencoder", ["--set", "epochs=20"], True, None),
]
QUICK_FAMILIES = ["gmm", "normal-dist", "cnn", "cnn int8"]
RUNS = 200
WARMUP = 20
RSS_PASSES = 20
N_CLIPS = 20
FOLDS = 4
INT8_TARGET_POINTS = 0.5

# ---- the measuring processes ----------------------------------------------------------------------
#: Scores the clips with onnxruntime alone (numpy + onnxruntime imported, nothing else of ours).
ORT_SCRIPT = """
import json, sys
import numpy as np
import onnxruntime as ort
graph, clips, passes = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3])
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
opts.inter_op_num_threads = 1
session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
for _ in range(passes):
    for clip in clips:
        session.run(None, {"audio": np.ascontiguousarray(clip)})
hwm = [int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
print(json.dumps({"vmhwm_kb": hwm, "wavetrain_imported": "wavetrain" in sys.modules,
                  "torch_imported": "torch" in sys.modules, "modules": len(sys.modules)}))
"""
#: Classifies the clips with wavetrain (a .wt or an .onnx model file).
WT_SCRIPT = """
import json, sys
import numpy as np
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.prediction import classify_samples
model, clips, passes, rate = load_model(sys.argv[1]), np.load(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for _ in range(passes):
    for clip in clips:
        classify_samples(model, clip, rate)
hwm = [int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
print(json.dumps({"vmhwm_kb": hwm, "wavetrain_imported": "wavetrain" in sys.modules,
                  "torch_imported": "torch" in sys.modules, "modules": len(sys.modules)}))
"""
#: The floors: the interpreter, numpy and the clips (and onnxruntime imported, no session).
FLOOR_SCRIPT = """
import json, sys
import numpy as np
if sys.argv[2] == "onnxruntime":
    import onnxruntime
clips = np.load(sys.argv[1])
hwm = [int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
print(json.dumps({"vmhwm_kb": hwm, "modules": len(sys.modules)}))
"""


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """``max |a - b| / max(max |b|, 1e-3)``: as ``wavetrain export --check`` compares scores."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-3)
    return float(np.max(np.abs(a - b)) / scale) if a.size else 0.0


def latency_worker(wt: str, graph: str, clips_path: str, runs: int) -> int:
    """One process: onnxruntime, classify_samples(.wt) and classify_samples(.onnx) on clip 0, taken
    in turn 10 runs at a time; parity of onnxruntime with the .wt on every clip. Prints JSON."""
    import onnxruntime as ort

    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline.prediction import classify_samples

    clips = np.load(clips_path)
    model, onnx_model = load_model(wt), load_model(graph)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    rate, labels = int(meta["rate"]), json.loads(meta["labels"])
    size = int(meta.get("window_samples", "0") or 0)
    detector = meta["score_kind"] == "anomaly"
    clip = np.ascontiguousarray(clips[0])
    feed = {"audio": np.ascontiguousarray(clip[:size] if size else clip)}

    paths = {"onnxruntime": lambda: session.run(None, feed),
             "wavetrain_wt": lambda: classify_samples(model, clip, rate),
             "wavetrain_onnx": lambda: classify_samples(onnx_model, clip, rate)}
    times: dict[str, list[float]] = {k: [] for k in paths}
    for f in paths.values():
        for _ in range(WARMUP):
            f()
    block = 10
    while len(times["onnxruntime"]) < runs:
        for k, f in paths.items():
            for _ in range(block):
                t = time.perf_counter()
                f()
                times[k].append(1000 * (time.perf_counter() - t))
    out: dict = {k: {"p50_ms": round(_pct(v, 50), 3), "p99_ms": round(_pct(v, 99), 3), "mean_ms":
                     round(float(np.mean(v)), 3), "runs": len(v)} for k, v in times.items()}

    rel, same, windows = 0.0, 0, 0
    for c in clips:
        c = np.ascontiguousarray(c)
        preds = classify_samples(model, c, rate)
        p = preds[0]
        scores, best = session.run(["scores", "best"], {"audio": np.ascontiguousarray(c[:size] if size else c)})
        if detector:
            answer = "anomaly" if scores[0] > np.float32(meta["threshold"]) else labels[0]
        else:
            answer = labels[int(best[0])]
        rel = max(rel, _rel(scores, p.scores))
        same += answer == p.label
        windows += 1
    out["parity_1s_clips"] = {"clips": windows, "windows_per_clip_wt": len(preds), "max_rel_diff": rel,
                              "same_answer": same}
    print(json.dumps(out))
    return 0


# ---- data ----------------------------------------------------------------------------------------
def _write_csv(path: Path, rows: list[tuple[Path, dict]]) -> Path:
    with open(path, "w") as f:
        for p, lab in rows:
            f.write(f"{Path(p).resolve()},{';'.join(f'{k}={v}' for k, v in lab.items())}\n")
    return path


def _speaker_folds(rows: list[tuple[Path, dict]]) -> list[list[str]]:
    """Held-out speakers of each fold: sorted by name, every 4th one from the k-th."""
    speakers = sorted({lab["speaker"] for _, lab in rows})
    return [speakers[k::FOLDS] for k in range(FOLDS)]


def _one_second_clips(paths: list[Path], rate: int, n: int) -> np.ndarray:
    """``n`` clips of 1 s: consecutive recordings joined (short utterances) or cut (longer ones)."""
    import soundfile as sf

    signal = []
    total = 0
    for p in paths:
        x, sr = sf.read(str(p), dtype="float32", always_2d=True)
        if sr != rate:
            raise SystemExit(f"bench_export: {p} is at {sr} Hz, expected {rate}")
        signal.append(x.mean(axis=1))
        total += len(signal[-1])
        if total >= n * rate:
            break
    x = np.concatenate(signal)
    if len(x) < n * rate:
        x = np.tile(x, int(np.ceil(n * rate / len(x))))
    return np.stack([x[i * rate:(i + 1) * rate] for i in range(n)]).astype(np.float32)


def prepare_data(work: Path, quick: bool) -> dict:
    """Train and check csvs of the classifiers and of the detectors, and 1 s clips of each."""
    speech, machines = SHARED / "spoken-words" / "metadata.csv", SHARED / "machines" / "metadata.csv"
    if not quick and speech.exists() and machines.exists():
        rows = _util.read_csv_plain(speech)
        speakers = sorted({lab["speaker"] for _, lab in rows})
        train_spk, check_spk = speakers[0::6][:8], speakers[3::6][:4]
        tr = [r for r in rows if r[1]["speaker"] in train_spk]
        ch = [r for r in rows if r[1]["speaker"] in check_spk]
        mrows = [r for r in _util.read_csv_plain(machines)
                 if r[1].get("machine") == "fan" and r[1].get("unit") == "u1"]
        mtr = [r for r in mrows if r[1].get("split") == "train" and r[1].get("state") == "normal"]
        mch = [r for r in mrows if r[1].get("split") == "test"]
        out = {"source": "shared", "classifier": {"label": "word", "train_speakers": train_spk,
                                                  "check_speakers": check_spk},
               "detector": {"label": "state", "normal": "normal", "machine": "fan", "unit": "u1"}}
    else:
        from wavetrain.data.demo import make_demo_dataset

        csv = make_demo_dataset(work / "demo", per_combo=2, speeds=(15.0, 30.0), snrs=(10.0, 20.0), seconds=2.0)
        rows = _util.read_csv_plain(Path(csv))
        tr = [r for r in rows if r[1].get("machine") == "m0"]
        ch = [r for r in rows if r[1].get("machine") == "m1"]
        mtr = [r for r in tr if r[1].get("state") == "healthy"]
        mch = ch
        out = {"source": "demo", "classifier": {"label": "state", "train": "machine m0", "check": "machine m1"},
               "detector": {"label": "state", "normal": "healthy", "train": "machine m0, healthy",
                            "check": "machine m1"}}
    out["classifier"].update(train=str(_write_csv(work / "cls_train.csv", tr)),
                             check=str(_write_csv(work / "cls_check.csv", ch)), train_n=len(tr), check_n=len(ch))
    out["detector"].update(train=str(_write_csv(work / "det_train.csv", mtr)),
                           check=str(_write_csv(work / "det_check.csv", mch)), train_n=len(mtr), check_n=len(mch))
    rate = 16000
    for kind, sel in (("classifier", ch), ("detector", mch)):
        clips = _one_second_clips([p for p, _ in sel], rate, N_CLIPS)
        path = work / f"{kind}_clips.npy"
        np.save(path, clips)
        out[kind]["clips"] = str(path)
    out["rate"] = rate
    return out


# ---- measures ------------------------------------------------------------------------------------
CHECK_RE = re.compile(r"check: (\d+) windows, same answer on (\d+) \(([\d.]+)%\), scores differ by at most "
                      r"(\S+) relative(?:; accuracy (.+?) ([\d.]+)%, (.+?) ([\d.]+)% \((\d+) windows)?")


def parse_check(stderr: str) -> dict:
    for ln in stderr.splitlines():
        m = CHECK_RE.search(ln)
        if m:
            d = {"line": ln.strip(), "windows": int(m[1]), "same_answer": int(m[2]), "max_rel_diff": float(m[4])}
            if m[5]:
                d.update(accuracy_wt=float(m[6]), accuracy_graph=float(m[8]), with_value=int(m[9]))
            return d
    return {"line": None}


def graph_parts(path: Path) -> dict:
    """The graph's bytes: the file, and the initializers of the front-end, the model and its network."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(path))
    users: dict[str, list[str]] = {}
    for n in proto.graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n.name)
    parts = {"features": 0, "model": 0, "net": 0, "other": 0}
    for t in proto.graph.initializer:
        b = len(t.raw_data) if t.raw_data else numpy_helper.to_array(t).nbytes
        u = users.get(t.name, [])
        if "/net/" in t.name or any("/net/" in x for x in u):
            parts["net"] += b
            parts["model"] += b
        elif t.name.startswith("features/") or any(x.startswith("features/") for x in u):
            parts["features"] += b
        elif t.name.startswith("model/") or any(x.startswith("model/") for x in u):
            parts["model"] += b
        else:
            parts["other"] += b
    net_nodes = [n for n in proto.graph.node if "/net/" in n.name]
    return {"file_bytes": path.stat().st_size, "features_weight_bytes": parts["features"],
            "model_weight_bytes": parts["model"], "net_weight_bytes": parts["net"],
            "net_node_bytes": sum(n.ByteSize() for n in net_nodes), "nodes": len(proto.graph.node),
            "net_nodes": len(net_nodes), "other_weight_bytes": parts["other"]}


def _script_json(res: dict) -> dict:
    for ln in reversed(res["stdout"].strip().splitlines()):
        if ln.startswith("{"):
            return json.loads(ln)
    return {}


def peak_rss(wt: Path, graph: Path, clips: str, rate: int, env: dict, cwd: Path) -> dict:
    py = _util.python_exe()
    runs = {"onnxruntime": [py, "-c", ORT_SCRIPT, str(graph), clips, str(RSS_PASSES)],
            "wavetrain_wt": [py, "-c", WT_SCRIPT, str(wt), clips, str(RSS_PASSES), str(rate)],
            "wavetrain_onnx": [py, "-c", WT_SCRIPT, str(graph), clips, str(RSS_PASSES), str(rate)]}
    out = {}
    for k, cmd in runs.items():
        r = _util.run_measured(cmd, env=env, cwd=cwd)
        inner = _script_json(r)
        out[k] = {"peak_rss_mb": r["peak_rss_mb"], "vmhwm_mb": round(inner["vmhwm_kb"] / 1024, 1),
                  "wall_s": r["wall_s"], "wavetrain_imported": inner["wavetrain_imported"],
                  "torch_imported": inner["torch_imported"], "modules": inner["modules"]}
    if out["onnxruntime"]["wavetrain_imported"] or out["onnxruntime"]["torch_imported"]:
        raise RuntimeError("the onnxruntime-only process imported wavetrain or torch")
    return out


def floor_rss(clips: str, env: dict, cwd: Path) -> dict:
    """Peak RSS of python + numpy with the clips loaded, and of the same with onnxruntime imported."""
    out = {}
    for k in ("numpy", "onnxruntime"):
        r = _util.run_measured([_util.python_exe(), "-c", FLOOR_SCRIPT, clips, k], env=env, cwd=cwd)
        inner = _script_json(r)
        out[k] = {"peak_rss_mb": r["peak_rss_mb"], "vmhwm_mb": round(inner["vmhwm_kb"] / 1024, 1)}
    return out


def run_families(work: Path, data: dict, names: list[str], runs: int, quick: bool) -> list[dict]:
    env = _util.single_thread_env()
    wt = _util.wavetrain_cmd()
    cache = work / "cache"
    rows = []
    for name, fam, extra, detector, quantize in [f for f in FAMILIES if f[0] in names]:
        d = data["detector" if detector else "classifier"]
        if quick and "epochs=" in " ".join(extra):
            extra = ["--set", "epochs=1"]
        model = work / f"{fam}.wt"
        graph = work / (f"{fam}-{quantize}.onnx" if quantize else f"{fam}.onnx")
        row: dict = {"name": name, "family": fam, "train_args": extra, "quantize": quantize,
                     "loadavg_before": _util.loadavg()}
        label = ["--label", d["label"]] + (["--normal", d["normal"]] if detector else [])
        if not model.exists():           # the int8 row exports the cnn trained for the float row
            t = _util.run_measured(wt + ["train", "--data", d["train"], *label, "--model", fam, *extra, "-o",
                                         str(model), "--cache", str(cache), "--no-progress"], env=env)
            row.update(train_wall_s=t["wall_s"], train_peak_rss_mb=t["peak_rss_mb"])
        e = _util.run_measured(wt + ["export", "-m", str(model), "-o", str(graph), "--check", d["check"]]
                               + (["--quantize", quantize] if quantize else []), env=env)
        row.update(export_wall_s=e["wall_s"], export_peak_rss_mb=e["peak_rss_mb"],
                   check=parse_check(e["stderr"]), wt_bytes=model.stat().st_size, size=graph_parts(graph))
        lat = _util.run_measured([_util.python_exe(), str(Path(__file__).resolve()), "--latency-worker",
                                  str(model), str(graph), d["clips"], str(runs)], env=env, cwd=work)
        row["latency"] = _script_json(lat)
        row["rss"] = peak_rss(model, graph, d["clips"], data["rate"], env, work)
        row["loadavg_after"] = _util.loadavg()
        rows.append(row)
        la, c, s = row["latency"], row["check"], row["size"]
        print(f"{name:18s} {s['file_bytes'] / 1e6:7.3f} MB (net {s['net_weight_bytes'] / 1e6:.3f} MB)  "
              f"ort p50/p99 {la['onnxruntime']['p50_ms']:.2f}/{la['onnxruntime']['p99_ms']:.2f} ms  "
              f"wt {la['wavetrain_wt']['p50_ms']:.2f}/{la['wavetrain_wt']['p99_ms']:.2f} ms  "
              f"RSS ort {row['rss']['onnxruntime']['peak_rss_mb']} MB, wt {row['rss']['wavetrain_wt']['peak_rss_mb']} "
              f"MB  rel diff 1 s {la['parity_1s_clips']['max_rel_diff']:.1e}, check {c.get('max_rel_diff')}",
              flush=True)
    return rows


def run_folds(work: Path, epochs: int | None) -> dict:
    """4 folds by speaker: a cnn per fold, its float and int8 graphs checked on the held-out
    speakers' clean recordings (and on their ``spoken-words-noisy`` versions, where present)."""
    env = _util.single_thread_env()
    wt = _util.wavetrain_cmd()
    rows = _util.read_csv_plain(SHARED / "spoken-words" / "metadata.csv")
    noisy_csv = SHARED / "spoken-words-noisy" / "metadata.csv"
    noisy = _util.read_csv_plain(noisy_csv) if noisy_csv.exists() else []
    extra = ["--set", f"epochs={epochs}"] if epochs else []
    out: dict = {"model": "cnn", "train_args": extra, "test_sets": ["clean"] + (["noisy"] if noisy else []),
                 "folds": []}
    for k, held in enumerate(_speaker_folds(rows)):
        train_rows = [r for r in rows if r[1]["speaker"] not in held]
        tests = {"clean": [r for r in rows if r[1]["speaker"] in held]}
        if noisy:
            tests["noisy"] = [r for r in noisy if r[1]["speaker"] in held]
        tr = _write_csv(work / f"fold{k}_train.csv", train_rows)
        model = work / f"fold{k}.wt"
        la0 = _util.loadavg()
        t = _util.run_measured(wt + ["train", "--data", str(tr), "--label", "word", "--model", "cnn", *extra, "-o",
                                     str(model), "--cache", str(work / "cache"), "--no-progress"], env=env)
        r: dict = {"fold": k, "held_out_speakers": held, "train_recordings": len(train_rows),
                   "train_wall_s": t["wall_s"], "train_peak_rss_mb": t["peak_rss_mb"],
                   "train_stderr": t["stderr"].strip()[-600:]}
        for name, test_rows in tests.items():
            te = _write_csv(work / f"fold{k}_{name}.csv", test_rows)
            checks = {}
            for q in (None, "int8"):
                graph = work / f"fold{k}-{name}{'-' + q if q else ''}.onnx"
                e = _util.run_measured(wt + ["export", "-m", str(model), "-o", str(graph), "--check", str(te)]
                                       + (["--quantize", q] if q else []), env=env)
                checks[q or "float"] = parse_check(e["stderr"]) | {"bytes": graph.stat().st_size,
                                                                   "export_wall_s": e["wall_s"]}
            f, i8 = checks["float"], checks["int8"]
            r[name] = {"recordings": len(test_rows), "accuracy_wt": f["accuracy_wt"],
                       "accuracy_float": f["accuracy_graph"], "accuracy_int8": i8["accuracy_graph"],
                       "accuracy_wt_int8_run": i8["accuracy_wt"],
                       "int8_loss_points": round(f["accuracy_graph"] - i8["accuracy_graph"], 2),
                       "float_vs_wt_points": round(f["accuracy_wt"] - f["accuracy_graph"], 2),
                       "int8_same_answer_as_wt": i8["same_answer"], "checks": checks}
            print(f"fold {k} {name}: accuracy .wt {f['accuracy_wt']:.2f}%, float graph {f['accuracy_graph']:.2f}%, "
                  f"int8 {i8['accuracy_graph']:.2f}% (loss {r[name]['int8_loss_points']:+.2f} points; int8 answers as "
                  f".wt on {i8['same_answer']} of {i8['windows']}); rel diff float {f['max_rel_diff']:.1e}, "
                  f"int8 {i8['max_rel_diff']:.1e}", flush=True)
        r.update(loadavg_before=la0, loadavg_after=_util.loadavg())
        out["folds"].append(r)
        print(f"fold {k}: train {t['wall_s']:.0f} s, {t['peak_rss_mb']} MB", flush=True)
    fl = out["folds"]
    out["mean"] = {"train_wall_s": round(float(np.mean([r["train_wall_s"] for r in fl])), 1)}
    for name in out["test_sets"]:
        out["mean"][name] = {k: round(float(np.mean([r[name][k] for r in fl])), 3)
                             for k in ("accuracy_wt", "accuracy_float", "accuracy_int8", "int8_loss_points")}
    out["int8_target_points"] = INT8_TARGET_POINTS
    out["int8_target_met"] = {name: out["mean"][name]["int8_loss_points"] <= INT8_TARGET_POINTS
                              for name in out["test_sets"]}
    return out


# ---- report --------------------------------------------------------------------------------------
def summary(res: dict) -> str:
    out = []
    fams = res.get("families", [])
    if fams:
        rows = []
        for r in fams:
            s, la, rss = r["size"], r["latency"], r["rss"]
            o, w = la["onnxruntime"], la["wavetrain_wt"]
            rows.append([r["name"], f"{s['file_bytes'] / 1e3:,.1f}",
                         f"{s['net_weight_bytes'] / 1e3:,.1f}" if s["net_weight_bytes"] else None,
                         f"{o['p50_ms']:.2f} / {o['p99_ms']:.2f}", f"{w['p50_ms']:.2f} / {w['p99_ms']:.2f}",
                         f"{o['p50_ms'] / w['p50_ms']:.2f}",
                         f"{rss['onnxruntime']['peak_rss_mb']} / {rss['wavetrain_wt']['peak_rss_mb']}",
                         f"{la['parity_1s_clips']['max_rel_diff']:.1e} / {r['check'].get('max_rel_diff', 0):.1e}"])
        out.append(_util.markdown_table(
            ["graph", "kB", "network weights kB", "onnxruntime p50 / p99 ms", "classify_samples .wt p50 / p99 ms",
             "ratio p50", "peak RSS MB ort / wt", "max rel diff 1 s / check"], rows))
    if res.get("folds"):
        f = res["folds"]
        for name in f["test_sets"]:
            rows = [[r["fold"], r[name]["recordings"], f"{r[name]['accuracy_wt']:.2f}",
                     f"{r[name]['accuracy_float']:.2f}", f"{r[name]['accuracy_int8']:.2f}",
                     f"{0.0 - r[name]['int8_loss_points']:+.2f}", f"{r['train_wall_s']:.0f}"] for r in f["folds"]]
            m = f["mean"][name]
            rows.append(["mean", "", f"{m['accuracy_wt']:.2f}", f"{m['accuracy_float']:.2f}",
                         f"{m['accuracy_int8']:.2f}", f"{0.0 - m['int8_loss_points']:+.2f}",
                         f"{f['mean']['train_wall_s']:.0f}"])
            out.append(f"held-out speakers, {name}:\n\n" + _util.markdown_table(
                ["fold", "recordings", ".wt %", "float graph %", "int8 graph %", "int8 change (points)", "train s"],
                rows))
    return "\n\n".join(out)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--latency-worker":
        return latency_worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", choices=[f[0] for f in FAMILIES], metavar="NAME",
                    help="rows to measure (default: all)")
    ap.add_argument("--runs", type=int, default=None, help=f"latency runs per path (default {RUNS})")
    ap.add_argument("--no-folds", action="store_true", help="skip the 4-fold int8 accuracy part")
    ap.add_argument("--fold-epochs", type=int, default=None, help="cnn epochs of the folds (default: the default)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "export.json")
    args = ap.parse_args()
    quick = _util.quick_mode(args.quick)
    names = args.families or (QUICK_FAMILIES if quick else [f[0] for f in FAMILIES])
    if "cnn int8" in names and "cnn" not in names:
        names = ["cnn", *names]
    runs = args.runs or (40 if quick else RUNS)
    res: dict = {"benchmark": "export", "quick": quick, "machine": _util.machine_info(), "runs": runs,
                 "warmup": WARMUP, "rss_passes": RSS_PASSES, "clips": N_CLIPS}
    import onnxruntime

    res["onnxruntime"] = onnxruntime.__version__
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="wt-bench-export-") as tmp:
        work = Path(tmp)
        data = prepare_data(work, quick)
        res["data"] = {k: ({kk: vv for kk, vv in v.items() if kk not in ("train", "check", "clips")}
                           if isinstance(v, dict) else v) for k, v in data.items()}
        env = _util.single_thread_env()
        res["floor_rss"] = floor_rss(data["classifier"]["clips"], env, work)
        res["families"] = run_families(work, data, names, runs, quick)
        res["families_wall_s"] = round(time.time() - t0, 1)
        if not quick and not args.no_folds and (SHARED / "spoken-words" / "metadata.csv").exists():
            res["folds"] = run_folds(work, args.fold_epochs)
    res["wall_s"] = round(time.time() - t0, 1)
    res["loadavg_end"] = _util.loadavg()
    out = _util.quick_out(args.out, "export") if quick else args.out
    _util.write_json(out, res)
    print(summary(res))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
