"""Classify a wav file with a graph from `wavetrain export`, using numpy, soundfile and onnxruntime only.

    python examples/onnx_classify.py model.onnx recording.wav
"""
import json
import sys

import numpy as np
import onnxruntime as ort
import soundfile as sf


def classify(graph: str, wav: str) -> None:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(graph, opts)
    meta = session.get_modelmeta().custom_metadata_map
    labels, rate, kind = json.loads(meta["labels"]), int(meta["rate"]), meta["score_kind"]
    samples, sr = sf.read(wav, dtype="float32", always_2d=True)
    if sr != rate:
        sys.exit(f"{wav}: {sr} Hz; the model takes {rate} Hz (e.g. sox {wav} -r {rate} resampled.wav)")
    x = samples.mean(axis=1)                                      # mono
    size, hop = int(meta["window_samples"]), int(meta["hop_samples"])    # 0: the whole recording
    details = json.loads(meta["outputs"])                         # e.g. ["z"], ["nearest"]
    rule = json.loads(meta.get("unknown") or "{}")
    start = 0
    while True:
        clip = np.ascontiguousarray(x[start:start + size] if size else x)
        if len(clip) < int(meta["min_samples"]) or (len(clip) < size and meta["pad"] == "none"):
            break                                                 # (the graph completes a shorter clip)
        scores, best, *more = session.run(["scores", "best", *details], {"audio": clip})
        answer = labels[best[0]]
        if kind == "anomaly":
            answer = "anomaly" if scores[0] > np.float32(meta["threshold"]) else labels[0]
        elif rule.get("rule") == "top_below" and scores.max() < np.float32(rule["value"]):
            answer = "unknown"
        elif rule.get("rule") == "best_below" and scores[best[0]] < np.float32(rule["floors"][best[0]]):
            answer = "unknown"
        elif rule.get("rule") == "above" and dict(zip(details, more))[rule["output"]][0] > np.float32(rule["value"]):
            answer = "unknown"
        ms = round(1000 * start / rate)
        end = min(ms + int(meta["clip_ms"]), round(1000 * len(x) / rate)) if size else round(1000 * len(x) / rate)
        name = {"mean_loglik": "loglik", "probability": "confidence", "anomaly": "score"}.get(kind, kind)
        score = scores[0 if kind == "anomaly" else best[0]]                 # named as `wavetrain classify` names it
        print(f"{wav}[{ms}-{end}]: {meta['label_name']}={answer} {name}={score:.4g}")
        if not size or start + size >= len(x):                   # the whole recording, or the last window
            break
        start += hop


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    classify(sys.argv[1], sys.argv[2])
