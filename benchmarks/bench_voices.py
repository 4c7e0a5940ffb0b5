"""Voices a model has not heard: the pretrained speech embedding against what a user would write.

Three parts, each in fresh processes with one compute thread:

* **accuracy by held-out speaker**: ``wavetrain evaluate --folds K --group-by speaker --json`` of the
  models of :data:`MODELS` on the real speakers of ``fsdd-dev`` (three speakers: each fold trains
  on two and tests on the third) and on the synthesized ``spoken-words`` and ``spoken-words-noisy``
  (4 folds of 12 speakers), beside **the plain script** a user would write from openWakeWord's
  documentation (:func:`plain_script`: its two ONNX graphs through onnxruntime on each recording
  padded to 1 s, mean and max of the embeddings, scikit-learn's ``LogisticRegression``), on the
  same folds. Accuracy per held-out speaker, for every model.
* **nested choice of the preset**: for each fsdd-dev speaker, each candidate of :data:`CANDIDATES`
  is cross-validated on the *other two* speakers alone (2 folds by speaker); the best there is the
  one that fold would have chosen, and its accuracy on the held-out speaker is the nested estimate.
* **official split**: FSDD's own split (takes 0-4 of each digit and speaker tested, the rest
  trained) on the development speakers, for ``linear-speech`` and ``gmm-speech``.
* **floor**: the mel floor wavetrain takes (a fixed 0 dB) against the mel graph's own (80 dB below
  the loudest value of its input) and other fixed floors, on the same embeddings of fsdd-dev.
* **cost**: embedding extraction in × real time on one core, of the fsdd-dev recordings (short
  clips, padded as the preset pads them) and of a 10-minute generated recording, with the peak
  memory of each extraction (flat: the long recording is read and embedded a block at a time).

    .venv/bin/python benchmarks/bench_voices.py [--parts accuracy nested official floor cost] [--quick]

``--quick``: fsdd-dev only, two models, no repeats. Writes ``benchmarks/results/voices.json``
(parts not run keep their figures); each part records its command, date and load average.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

SHARED = _util.ROOT.parent / "shared" / "data"
EMB = "speech_embedding | pool"
#: Training audio with its voice changed a little: three copies of each recording, half of them
#: pitch-shifted by up to 2 semitones, half sped up or slowed down by up to 10%.
VOICE = "copies(n=3) | pitch(semitones=-2:2, p=0.5) | speed(factor=0.9:1.1, p=0.5)"
#: (name, evaluate arguments) of the accuracy part.
MODELS = [
    ("linear-speech (preset)", ["--model", "linear-speech"]),
    ("knn on pooled embeddings", ["--model", "knn", "--features", EMB]),
    ("gmm on pooled embeddings", ["--model", "gmm", "--features", EMB]),
    ("gmm-speech (mfcc)", ["--model", "gmm-speech"]),
    ("hmm-speech, vtln (mfcc)", ["--model", "hmm-speech", "--set", "vtln=true"]),
]
#: (name, evaluate arguments) of the nested choice.
CANDIDATES = [
    *[(f"linear c={c}, pad {pad} s", ["--model", "linear", "--set", f"c={c}", "--features",
                                      f"speech_embedding(pad_s={pad}) | pool"])
      for c in ("0.1", "1") for pad in ("1", "1.5", "2")],
    ("linear c=0.1, pad 1.5 s, mean+max+sd", ["--model", "linear", "--set", "c=0.1", "--features",
                                              "speech_embedding(pad_s=1.5) | pool(sd=true)"]),
    ("linear c=0.1, pad 1.5 s, + voice changes", ["--model", "linear", "--set", "c=0.1", "--features",
                                                  "speech_embedding(pad_s=1.5) | pool", "--set", f"augment={VOICE}"]),
    ("knn, pad 1.5 s", ["--model", "knn", "--features", "speech_embedding(pad_s=1.5) | pool"]),
    ("gmm-speech", ["--model", "gmm-speech"]),
]
SETS = {"fsdd-dev": ("digit", 3), "spoken-words": ("word", 4), "spoken-words-noisy": ("word", 4)}


def _evaluate(data: str, args: list[str], cache: Path, where: list[str] | None = None,
              folds: int | None = None) -> dict:
    label, k = SETS[data]
    e = _util.run_measured(_util.wavetrain_cmd() + [
        "evaluate", "--data", str(SHARED / data), *(where or []), "--label", label, "--folds", str(folds or k),
        "--group-by", "speaker", "--json", "--cache", str(cache), "--no-progress", *args])
    res = json.loads(e["stdout"])
    return {"accuracy": res["accuracy"], "by_speaker": _by_speaker(res), "wall_s": e["wall_s"],
            "peak_rss_mb": e["peak_rss_mb"]}


def _by_speaker(res: dict) -> dict[str, float]:
    return {g: float(v["accuracy"]) for g, v in (res.get("groups") or {}).items()}


# ---- the plain script -------------------------------------------------------------------------
def plain_script(data: str, folds: int) -> dict:
    """openWakeWord's graphs through onnxruntime, pad to 1 s, mean + max, scikit-learn logistic
    regression; folds of whole speakers (sorted names dealt round-robin, as evaluate does not
    promise the same assignment, so folds of three speakers are the only exactly shared ones)."""
    import importlib.util

    import onnxruntime as ort
    import soundfile as sf
    from scipy.signal import resample_poly
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    package = importlib.util.find_spec("openwakeword")
    assert package is not None and package.submodule_search_locations, "the speech extra is not installed"
    models = Path(next(iter(package.submodule_search_locations))) / "resources" / "models"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    mel = ort.InferenceSession(str(models / "melspectrogram.onnx"), opts)
    emb = ort.InferenceSession(str(models / "embedding_model.onnx"), opts)
    label = SETS[data][0]
    rows = _util.read_csv_plain(SHARED / data / "metadata.csv")
    t0 = time.perf_counter()
    X, y, spk, seconds = [], [], [], 0.0
    for path, labels in rows:
        x, sr = sf.read(str(path), dtype="float32")
        seconds += len(x) / sr
        if sr != 16000:
            x = resample_poly(x, 16000, sr).astype(np.float32)
        if len(x) < 16000:
            left = (16000 - len(x)) // 2
            x = np.pad(x, (left, 16000 - len(x) - left))
        m = mel.run(None, {"input": (x * 32768)[None].astype(np.float32)})[0][0, 0] / 10 + 2
        wins = np.stack([m[i:i + 76] for i in range(0, m.shape[0] - 75, 8)])[..., None].astype(np.float32)
        e = emb.run(None, {"input_1": wins})[0].reshape(len(wins), 96)
        X.append(np.concatenate([e.mean(0), e.max(0)]))
        y.append(labels[label])
        spk.append(labels["speaker"])
    embed_s = time.perf_counter() - t0
    X = np.array(X)
    y, spk = np.array(y), np.array(spk)
    speakers = sorted(set(spk))
    by_speaker, correct = {}, 0
    for f in range(folds):
        test_spk = speakers[f::folds]
        test = np.isin(spk, test_spk)
        scaler = StandardScaler().fit(X[~test])
        clf = LogisticRegression(max_iter=2000).fit(scaler.transform(X[~test]), y[~test])
        pred = clf.predict(scaler.transform(X[test]))
        correct += int(np.sum(pred == y[test]))
        for s in test_spk:
            sel = spk[test] == s
            by_speaker[s] = float(np.mean(pred[sel] == y[test][sel]))
    return {"accuracy": correct / len(y), "by_speaker": by_speaker, "embed_s": embed_s,
            "audio_s": seconds, "recordings": len(y)}


# ---- parts ------------------------------------------------------------------------------------
def accuracy(work: Path, quick: bool) -> list[dict]:
    out = []
    for data in (["fsdd-dev"] if quick else list(SETS)):
        if not (SHARED / data).exists():
            continue
        plain = plain_script(data, SETS[data][1])
        out.append({"data": data, "model": "plain script (onnxruntime + scikit-learn)", **plain})
        print(f"{data:20s} {'plain script':36s} {plain['accuracy']:.4f}  {_fmt(plain['by_speaker'])}", flush=True)
        for name, args in (MODELS[:2] if quick else MODELS):
            r = _evaluate(data, args, work / "cache")
            out.append({"data": data, "model": name, "args": args, **r})
            print(f"{data:20s} {name:36s} {r['accuracy']:.4f}  {_fmt(r['by_speaker'])}  "
                  f"{r['wall_s']:.0f} s {r['peak_rss_mb']} MB", flush=True)
    return out


def nested(work: Path, quick: bool) -> list[dict]:
    speakers = sorted({labels["speaker"] for _, labels in _util.read_csv_plain(SHARED / "fsdd-dev" / "metadata.csv")})
    outer = {name: _evaluate("fsdd-dev", args, work / "cache") for name, args in CANDIDATES}
    out = []
    for s in speakers:
        others = [o for o in speakers if o != s]
        inner = {name: _evaluate("fsdd-dev", args, work / "cache", ["--where", "speaker=" + ",".join(others)], 2)
                 ["accuracy"] for name, args in CANDIDATES}
        best = max(inner, key=lambda k: inner[k])
        out.append({"held_out": s, "inner": inner, "chosen": best, "accuracy": outer[best]["by_speaker"].get(s)})
        print(f"held out {s:10s} chosen {best:28s} ({inner[best]:.4f} inside) -> {out[-1]['accuracy']}", flush=True)
    out.append({"outer": {k: v for k, v in outer.items()}})
    return out


def floor(work: Path, quick: bool) -> list[dict]:
    """The mel floor: the same embeddings (recordings of fsdd-dev padded to 1.5 s, mean and max)
    under the mel graph's own floor (80 dB below the loudest value of each recording), that floor
    within each embedding's window, and fixed floors; scikit-learn's logistic regression (C=0.1) on
    standardised features, one fold a speaker."""
    import onnxruntime as ort
    import soundfile as sf
    from scipy.signal import resample_poly
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from wavetrain.features.onnx_chain import PRESETS, graph_model, resolve_graph

    stages, package = PRESETS["speech_embedding"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3

    def session(stage, edit):
        model = graph_model(resolve_graph(stage.graph, package), stage.output, edit)
        return ort.InferenceSession(model.SerializeToString(), opts)

    mel, conv, win = session(stages[0], None), session(stages[1], stages[1].edit), session(stages[1], None)
    rows = _util.read_csv_plain(SHARED / "fsdd-dev" / "metadata.csv")
    mels, y, spk = [], [], []
    for path, labels in rows[::5] if quick else rows:
        x, sr = sf.read(str(path), dtype="float32")
        x = resample_poly(x, 16000, sr).astype(np.float32)
        if len(x) < 24000:
            left = (24000 - len(x)) // 2
            x = np.pad(x, (left, 24000 - len(x) - left))
        mels.append(mel.run(None, {"input": (x * 32768)[None]})[0].reshape(-1, 32))
        y.append(labels["digit"])
        spk.append(labels["speaker"])
    y_, spk_ = np.array(y), np.array(spk)

    def whole(d):
        return conv.run(None, {"input_1": ((d / 10 + 2)[None, :, :, None]).astype(np.float32)})[0].reshape(-1, 96)

    def per_window(d):
        w = np.stack([d[i:i + 76] for i in range(0, len(d) - 75, 8)])
        w = np.maximum(w, w.max(axis=(1, 2), keepdims=True) - 80) / 10 + 2
        return win.run(None, {"input_1": w[..., None].astype(np.float32)})[0].reshape(-1, 96)

    cases = {"the graph's floor (80 dB below each recording's loudest)": [whole(np.maximum(d, d.max() - 80))
                                                                          for d in mels],
             "80 dB below each window's loudest": [per_window(d) for d in mels]}
    for f in (-100, -20, 0, 10, 20, 30):
        cases[f"fixed {f} dB"] = [whole(np.maximum(d, f)) for d in mels]
    out = []
    for name, embs in cases.items():
        X = np.array([np.concatenate([e.mean(0), e.max(0)]) for e in embs])
        by = {}
        for s in sorted(set(spk)):
            te = spk_ == s
            sc = StandardScaler().fit(X[~te])
            clf = LogisticRegression(C=0.1, max_iter=3000).fit(sc.transform(X[~te]), y_[~te])
            by[s] = float(np.mean(clf.predict(sc.transform(X[te])) == y_[te]))
        out.append({"floor": name, "accuracy": float(np.mean(list(by.values()))), "by_speaker": by})
        print(f"{name:58s} {out[-1]['accuracy']:.4f}  {_fmt(by)}", flush=True)
    peaks = [float(d.max()) for d in mels]
    out.append({"loudest_mel_db_percentiles_5_50_95": [float(v) for v in np.percentile(peaks, [5, 50, 95])]})
    return out


def official(work: Path, quick: bool) -> list[dict]:
    """FSDD's own split on the development speakers: takes 0-4 of each digit and speaker are the test
    set, the other 45 the training set (the same speakers on both sides)."""
    rows = _util.read_csv_plain(SHARED / "fsdd-dev" / "metadata.csv")
    sides: dict[str, list[str]] = {"train": [], "test": []}
    for path, labels in rows:
        take = int(Path(path).stem.rsplit("_", 1)[1])
        sides["test" if take < 5 else "train"].append(f"{path},digit={labels['digit']};speaker={labels['speaker']},")
    csvs = {}
    for side, lines in sides.items():
        csvs[side] = work / f"official-{side}.csv"
        csvs[side].write_text("\n".join(lines) + "\n")
    out = []
    for name, args in ([MODELS[0]] if quick else MODELS[:1] + MODELS[3:4]):
        wt = work / "official.wt"
        t = _util.run_measured(_util.wavetrain_cmd() + ["train", "--data", str(csvs["train"]), "--label", "digit",
                                                        *args, "-o", str(wt), "--cache", str(work / "cache"),
                                                        "--no-progress"])
        e = _util.run_measured(_util.wavetrain_cmd() + ["evaluate", "-m", str(wt), "--data", str(csvs["test"]),
                                                        "--label", "digit", "--json", "--cache", str(work / "cache")])
        acc = json.loads(e["stdout"])["accuracy"]
        out.append({"model": name, "args": args, "accuracy": acc, "train": len(sides["train"]),
                    "test": len(sides["test"]), "train_wall_s": t["wall_s"], "train_peak_rss_mb": t["peak_rss_mb"]})
        print(f"official split  {name:36s} {acc:.4f}  ({len(sides['test'])} test recordings)", flush=True)
    return out


def cost(work: Path, quick: bool) -> list[dict]:
    script = r'''
import sys, time, json, numpy as np
from wavetrain.data import load_dataset
from wavetrain.features import extract, extract_blocks
from wavetrain.models import build
what, arg = sys.argv[1], sys.argv[2]
if what == "clips":
    ds = load_dataset(arg)
    spec = build("linear-speech").feature_spec      # the preset's: the embeddings, pooled
    extract(np.zeros(8000, np.float32), 8000, spec)                      # sessions loaded
    t = time.perf_counter(); secs = 0.0
    for rec in ds.recordings:
        x, sr = rec.load(spec.rate)
        secs += len(x) / sr
        extract(x, sr, spec)
    print(json.dumps({"audio_s": secs, "s": time.perf_counter() - t}))
else:
    from wavetrain.features import parse_spec
    n = int(float(arg) * 16000)
    def read(a, b):   # made block by block, as a recording is decoded: nothing holds the whole signal
        t_ = np.arange(a, b) / 16000
        noise = np.random.default_rng(a).standard_normal(b - a)
        return (0.1 * np.sin(2 * np.pi * 150 * t_) * (1 + np.sin(2 * np.pi * 3 * t_)) + 0.01 * noise).astype(np.float32)
    spec = parse_spec("speech_embedding")          # every embedding of the recording, kept
    extract(read(0, 16000), 16000, spec)
    t = time.perf_counter()
    g = extract_blocks(read, n, 16000, spec, block_s=30.0)
    print(json.dumps({"audio_s": n / 16000, "s": time.perf_counter() - t, "frames": int(g.shape[0])}))
'''
    rows = []
    jobs = [("fsdd-dev clips", ["clips", str(SHARED / "fsdd-dev")])] if (SHARED / "fsdd-dev").exists() else []
    minutes = 1 if quick else 10
    jobs += [("1 min recording", ["long", "60"]), (f"{minutes} min recording", ["long", str(60 * minutes)])]
    for name, args in jobs:
        r = _util.run_measured([_util.python_exe(), "-c", script, *args])
        res = json.loads(r["stdout"].strip().splitlines()[-1])
        rows.append({"case": name, "x_realtime": res["audio_s"] / res["s"], **res, "peak_rss_mb": r["peak_rss_mb"]})
        print(f"{name:32s} {res['audio_s'] / res['s']:7.1f} x real time   peak {r['peak_rss_mb']} MB", flush=True)
    return rows


def _fmt(d: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in sorted(d.items(), key=lambda kv: kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = ["accuracy", "nested", "official", "floor", "cost"]
    ap.add_argument("--parts", nargs="+", default=parts, choices=parts)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    quick = _util.quick_mode(args.quick)
    out_path = _util.quick_out(_util.RESULTS / "voices.json", "voices") if quick else _util.RESULTS / "voices.json"
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for part in args.parts:
            start = {"command": " ".join(["benchmarks/bench_voices.py", *sys.argv[1:]]),
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": _util.loadavg()}
            run = {"accuracy": accuracy, "nested": nested, "official": official, "floor": floor, "cost": cost}[part]
            results[part] = run(work, quick)
            results[f"{part}_run"] = {**start, "load_end": _util.loadavg(), "machine": _util.machine_info()}
            _util.write_json(out_path, results)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
