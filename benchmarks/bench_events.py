"""Events in long recordings: where each sound is and what it is, against the split a user would write.

Parts (``--parts``, run in the order given; one compute thread):

* **accuracy**: long recordings made with wavetrain's own tools from voices the models have not
  heard. ``wavetrain sound partition --group-by speaker`` holds out speakers (``spoken-words``,
  synthesized, 16 kHz, 48 voices: a quarter of them; ``fsdd-dev``, real, 8 kHz, 3 voices: each in
  turn, trained on the other two); the held-out speakers' words are spliced into long files by
  ``wavetrain sound splice --shuffle --gap-ms 200:1500 --pad-ms 200:1500 --noise 10:25 --noise-color
  pink,hum`` (one file per held-out speaker of ``spoken-words``, one per 10 words of ``fsdd-dev``;
  each file its own splice seed, ``1000 * S + k`` for seed S). Models are trained on the training
  speakers' recordings with ``wavetrain train`` (:data:`MODELS`). Each file is then answered three
  ways, by the same model: **wavetrain** (:func:`~wavetrain.pipeline.events.recording_events`,
  default settings), **the anchor** a user would write (``librosa.effects.split(y, top_db=20)``,
  each interval classified as one recording by
  :func:`~wavetrain.pipeline.prediction.classify_samples`) and **the true segments** (the ceiling:
  the splice's own rows, classified the same way). Scores are sed_eval's
  (:mod:`wavetrain.evaluation.event_metrics`): event-based F1 (200 ms onset collar, offset
  ``max(200 ms, 20 %)``), class-aware and detection-only, the class-aware error rate, and
  segment-based F1 (100 ms), per data set, model, seed and held-out speaker.
* **machines**: ``../shared/data/machines`` test clips (normal and anomalous) of one unit, cut by
  ``wavetrain sound cut`` into 1 s and 1.5 s pieces (a third of the clips each; the last third kept
  whole, 2 s), spliced as above; a ``gmm`` classifier of ``machine`` trained on the other two units.
  Detection-only and class-aware (the machine) scores with the default settings, and with settings
  chosen on the other units' files alone (:func:`settings_grid`, best detection-only event F1 there).
* **speed**: × real time of the detector alone (:class:`~wavetrain.features.activity.ActivityMeter`
  and :class:`~wavetrain.stream.events.Segmenter`, as ``event_stream`` runs them) over an hour of
  generated 16 kHz audio (:func:`synth`), of ``librosa.effects.split`` on the same, and of detect
  + classify on the spliced files: ``recording_events`` with ``gmm-speech`` against the anchor's
  file read + split + classify.
* **memory**: peak resident memory (``resource.getrusage`` in a fresh process each) of
  ``recording_events`` on generated 1-hour and 8-hour 16-bit wav files at 8 kHz (written in blocks,
  deleted afterwards), beside the same process loading the model alone.
* **latency**: a spliced file fed at real-time pace, in blocks of :data:`LATENCY_BLOCK_MS`, to
  ``event_stream`` (blocks carrying their arrival time) and, where ``classify`` has ``--events``,
  through a pipe to ``wavetrain classify -m M - --events --json`` (a writer thread sleeping per
  block): each event's delay from the arrival of the sample at its end, and from that of the
  sample at which the gap rule can first close it.

    .venv/bin/python benchmarks/bench_events.py [--parts accuracy machines speed memory latency]
                                                [--work DIR] [--quick]

``--work DIR`` keeps the partitions, spliced files and models there (reused by later runs: a part
run alone builds what it needs); by default they go to a temporary folder. ``--quick`` (or
``WAVETRAIN_BENCH_QUICK=1``): fsdd-dev's first held-out speaker, one seed, ``gmm-speech`` only, one
machine unit, a few minutes of audio; results to $TMPDIR/wavetrain-bench/. Writes
``benchmarks/results/events.json`` (parts not run keep their figures); each part records its
command, date and load average.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

for _var in _util.THREAD_VARS:            # one compute thread, also when run without the Makefile
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

SHARED = _util.ROOT.parent / "shared" / "data"
SEEDS = (0, 1, 2)
#: How the long recordings are spliced (besides --shuffle and --seed).
SPLICE = ["--gap-ms", "200:1500", "--pad-ms", "200:1500", "--noise", "10:25", "--noise-color", "pink,hum"]
#: Training audio as events in a noisy room give it: untrimmed edges and noise.
AUGMENT = "copies(n=2) | pad(before=30:100, after=30:100) | noise(snr=10:25, color=any)"
#: (name, train arguments) of the accuracy part.
MODELS = [
    ("gmm-speech", ["--model", "gmm-speech"]),
    ("gmm-speech + augment", ["--model", "gmm-speech", "--set", f"augment={AUGMENT}"]),
    ("linear-speech", ["--model", "linear-speech"]),
]
#: data set -> (label, words per spliced file: None for one file per held-out speaker)
SETS = {"spoken-words": ("word", None), "fsdd-dev": ("digit", 10)}
METHODS = ("wavetrain", "anchor", "true segments")
MACHINE_UNITS = ("u1", "u2", "u3")
#: Settings tried on the training units' files (machines part), as changes to the defaults:
#: ``on_db`` moved by these dB (``off_db`` following it by its default rule), and every
#: combination of the other values (the defaults among them).
GRID_ON_DB = (-8.0, -4.0, 0.0, 4.0)
GRID = {"gap_ms": (150, 300), "min_ms": (80, 300), "floor_s": (4.0, 10.0)}
LATENCY_BLOCK_MS = 20
#: Timed runs of each speed case: the fastest is reported (the others are in the results).
SPEED_REPEATS = 3


# ---- helpers ----------------------------------------------------------------------------------
def _wt(args: list, **kw) -> dict:
    return _util.run_measured(_util.wavetrain_cmd() + [str(a) for a in args], **kw)


class _LogCount(logging.Handler):
    """Counts wavetrain's log messages (by their first words) instead of printing them: a model
    answering thousands of events would otherwise repeat the same warning thousands of times."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.counts: Counter = Counter()

    def emit(self, record):
        self.counts[" ".join(record.getMessage().split()[:8])] += 1


def _quiet_wavetrain() -> _LogCount:
    h = _LogCount()
    lg = logging.getLogger("wavetrain")
    for old in list(lg.handlers):
        if isinstance(old, _LogCount):
            lg.removeHandler(old)
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    lg.propagate = False
    return h


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)


def _write_rows(path: Path, rows: list[tuple[Path, dict]]) -> Path:
    """A metadata.csv of ``(audio, labels)`` rows with absolute paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{p.resolve()},{';'.join(f'{k}={v}' for k, v in labels.items())}," for p, labels in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _splice(rows: list[tuple[Path, dict]], out: Path, seed: int) -> Path:
    """``wavetrain sound splice`` of the rows into ``out`` (kept if already there)."""
    if not out.exists():
        csv = _write_rows(out.with_name(out.stem + ".src.csv"), rows)
        _wt(["sound", "splice", "--data", csv, "--shuffle", "--seed", seed, *SPLICE, "-o", out, "--no-progress"])
    return out


def _train(out: Path, data: list[Path], label: str, args: list[str], work: Path, where: list[str] | None = None):
    """``wavetrain train`` (kept if already there): its wall seconds and peak memory, kept beside
    the model file (``.train.json``) for the runs that reuse it."""
    cost = out.with_suffix(".train.json")
    if out.exists():
        return json.loads(cost.read_text()) if cost.exists() else None
    out.parent.mkdir(parents=True, exist_ok=True)
    r = _wt(["train", "--data", *data, *(where or []), "--label", label, *args, "-o", out, "--cache",
             work / "cache", "--no-progress"])
    res = {"wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"], "load": _util.loadavg()}
    cost.write_text(json.dumps(res))
    return res


def _reference(wav: Path, label: str):
    """The splice's rows of ``wav`` as events (its sidecar csv), in file order."""
    from wavetrain.data import load_dataset
    from wavetrain.evaluation.event_metrics import Event

    ds = load_dataset(str(wav.with_suffix(".csv")))
    return [Event(str(wav), float(r.segment_ms[0]), float(r.segment_ms[1]), str(r.labels[label]))
            for r in ds.recordings]


def _classify_one(model, x: np.ndarray, rate: int) -> str | None:
    """The model's answer for samples taken as one recording (None: too short to answer)."""
    from wavetrain.core.errors import AudioError
    from wavetrain.pipeline.prediction import classify_samples
    from wavetrain.stream.windows import Windowing

    try:
        preds = classify_samples(model, x, rate, windowing=Windowing(0, 0, "keep"))
    except AudioError:
        return None
    return str(preds[0].label) if preds else None


def _anchor_split(y: np.ndarray) -> np.ndarray:
    import librosa

    return librosa.effects.split(y, top_db=20)


def answer_file(model, wav: Path, label: str, split_cache: dict) -> dict:
    """The three answers for one spliced file: ``{"reference": [...], method: [...]}`` as events."""
    import soundfile as sf

    from wavetrain.evaluation.event_metrics import Event
    from wavetrain.pipeline.events import recording_events

    ref = _reference(wav, label)
    out = {"reference": ref,
           "wavetrain": [Event(str(wav), float(p.start_ms), float(p.end_ms), str(p.label))
                         for p in recording_events(model, str(wav))]}
    y, rate = sf.read(str(wav), dtype="float32")
    if str(wav) not in split_cache:
        split_cache[str(wav)] = _anchor_split(y)
    anchor = []
    for a, b in split_cache[str(wav)]:
        value = _classify_one(model, y[a:b], rate)
        if value is not None:
            anchor.append(Event(str(wav), 1000.0 * a / rate, 1000.0 * b / rate, value))
    out["anchor"] = anchor
    ceiling = []
    for e in ref:
        a, b = int(round(e.start_ms * rate / 1000)), int(round(e.end_ms * rate / 1000))
        ceiling.append(Event(e.file, e.start_ms, e.end_ms, _classify_one(model, y[a:b], rate) or "(none)"))
    out["true segments"] = ceiling
    return out


def scores(ref: list, est: list) -> dict:
    """The figures reported: event F1 (class-aware, detection-only), error rate, segment F1, counts."""
    from wavetrain.evaluation.event_metrics import event_scores

    s = event_scores(ref, est)
    ca, det = s["event_based"]["class_aware"], s["event_based"]["detection"]
    seg = s["segment_based"]
    return {"event_f1": ca["f1"], "detection_f1": det["f1"], "error_rate": ca["error_rate"],
            "detection_error_rate": det["error_rate"], "segment_f1": seg["class_aware"]["f1"],
            "segment_detection_f1": seg["detection"]["f1"], "reference": ca["reference"],
            "estimated": ca["estimated"], "detected": det["matched"],
            "right_of_detected": ca["matched"] / det["matched"] if det["matched"] else None,
            "unknown": sum(1 for e in est if e.value == "unknown")}


def _score_rows(answers: dict[str, list[dict]], base: dict) -> list[dict]:
    """Rows of scores per method for each group of files (``answers``: group -> answer_file results)."""
    rows = []
    for group, files in answers.items():
        ref = [e for f in files for e in f["reference"]]
        for method in METHODS:
            est = [e for f in files for e in f[method]]
            rows.append({**base, "speaker": group, "method": method, "files": len(files), **scores(ref, est)})
    return rows


# ---- generated audio (speed, memory) ----------------------------------------------------------
def synth(rate: int, a: int, b: int, period_s: float = 3.0) -> np.ndarray:
    """Samples ``[a, b)`` of a generated recording, the same whatever the blocks asked for: a
    steady background (white noise about 46 dB and a 50 Hz hum 40 dB below full scale) and, in
    each ``period_s``, one sound of 0.2 to 1.5 s (a tone of 200 Hz to 0.4 × the rate, or a noise
    burst, under a smooth envelope, 25 to 45 dB above the noise)."""
    t = np.arange(a, b, dtype=np.float64) / rate
    x = 0.005 * np.random.default_rng([a, b]).standard_normal(b - a) + 0.01 * np.sin(2 * np.pi * 50 * t)
    period = int(period_s * rate)
    for k in range(max(0, a // period - 1), b // period + 1):
        r = np.random.default_rng([7, k])
        start = k * period + int(r.uniform(0, 1.2) * rate)
        dur = int(r.uniform(0.2, 1.5) * rate)
        amp, tone, freq = r.uniform(0.05, 0.3), r.random() < 0.5, r.uniform(200, 0.4 * rate)
        lo, hi = max(a, start), min(b, start + dur)
        if lo >= hi:
            continue
        tt = np.arange(lo, hi) - start
        env = np.sin(np.pi * tt / dur) ** 0.5
        if tone:
            sig = np.sin(2 * np.pi * freq * tt / rate)
        else:
            sig = np.random.default_rng([11, k]).standard_normal(dur)[tt]
        x[lo - a:hi - a] += amp * env * sig
    return x.astype(np.float32)


def detector_spans(blocks, rate: int, options=None) -> list:
    """The detector alone, as ``event_stream`` runs it: activity of each block, then the
    segmenter's spans (samples); ``blocks``: mono float32 arrays in order."""
    from wavetrain.features.activity import ActivityMeter
    from wavetrain.stream.events import EventOptions, Segmenter

    o = options or EventOptions()
    meter = ActivityMeter(rate, o.activity)
    seg = Segmenter(o, rate, o.on_db, o.off)
    hop, n, spans = meter.hop, 0, []
    for x in blocks:
        first = meter.frames
        levels = meter.push(x)
        at = (np.arange(first, first + len(levels)) - meter.delay) * hop + hop // 2
        spans += seg.add(np.maximum(at, 0), at + hop, levels)
        n += len(x)
    spans += seg.finish(n)
    return spans


# ---- the speech sets --------------------------------------------------------------------------
def speech_folds(data: str, work: Path, quick: bool) -> list[dict]:
    """Partitions by speaker: ``{"name", "train": [csv folders], "test": csv folder}`` per fold."""
    label = SETS[data][0]
    out = work / data / "partition"
    if data == "spoken-words":
        if not out.exists():
            _wt(["sound", "partition", "--data", SHARED / data, "--label", label, "--ratio", "0.75", "--group-by",
                 "speaker", "--seed", "0", "-o", out, "--no-progress"])
        return [{"name": "quarter", "train": [out / "train"], "test": out / "test"}]
    if not out.exists():
        _wt(["sound", "partition", "--data", SHARED / data, "--label", label, "--parts", "3", "--group-by",
             "speaker", "--seed", "0", "-o", out, "--no-progress"])
    parts = sorted(p for p in out.iterdir() if p.is_dir())
    folds = [{"name": p.name, "train": [q for q in parts if q != p], "test": p} for p in parts]
    return folds[:1] if quick else folds


def speech_files(data: str, fold: dict, seed: int, work: Path, quick: bool) -> dict[str, list[Path]]:
    """The spliced files of a fold's held-out speakers for one seed: speaker -> files."""
    per_file = SETS[data][1]
    rows = _util.read_csv_plain(fold["test"] / "metadata.csv")
    by_speaker: dict[str, list] = {}
    for path, labels in rows:
        by_speaker.setdefault(labels["speaker"], []).append((path, labels))
    out: dict[str, list[Path]] = {}
    k = 0
    for speaker, rs in sorted(by_speaker.items()):
        rs = sorted(rs, key=lambda r: str(r[0]))
        random.Random(f"{seed}:{speaker}").shuffle(rs)
        if quick:
            rs = rs[:30]
        chunks = [rs] if per_file is None else [rs[i:i + per_file] for i in range(0, len(rs), per_file)]
        for j, chunk in enumerate(chunks):
            wav = work / data / f"seed{seed}" / f"{_safe(speaker)}-{j:03d}.wav"
            out.setdefault(speaker, []).append(_splice(chunk, wav, 1000 * seed + k))
            k += 1
    return out


def speech_model(data: str, fold: dict, name: str, args: list[str], work: Path) -> tuple[Path, dict | None]:
    path = work / data / fold["name"] / f"{_safe(name)}.wt"
    return path, _train(path, fold["train"], SETS[data][0], args, work)


def accuracy(work: Path, quick: bool) -> dict:
    from wavetrain.models.modelfile import load_model

    log = _quiet_wavetrain()
    rows, trainings, audio = [], [], {}
    split_cache: dict = {}
    seeds = SEEDS[:1] if quick else SEEDS
    for data in (["fsdd-dev"] if quick else list(SETS)):
        if not (SHARED / data).exists():
            print(f"{data}: not found under {SHARED}; skipped", flush=True)
            continue
        label = SETS[data][0]
        folds = speech_folds(data, work, quick)
        files = {(fold["name"], s): speech_files(data, fold, s, work, quick) for fold in folds for s in seeds}
        audio[data] = _audio_s([f for fs in files.values() for group in fs.values() for f in group])
        for name, args in (MODELS[:1] if quick else MODELS):
            t0 = time.perf_counter()
            answers: dict[tuple, list] = {}          # (seed, held-out speaker) -> answered files
            held_out: dict[str, str] = {}
            for fold in folds:
                path, cost = speech_model(data, fold, name, args, work)
                trainings.append({"data": data, "fold": fold["name"], "model": name, "args": args, "train": cost})
                model = load_model(str(path))
                for s in seeds:
                    for speaker, fs in files[(fold["name"], s)].items():
                        answers[(s, speaker)] = [answer_file(model, f, label, split_cache) for f in fs]
                        held_out[speaker] = fold["name"]
            base = {"data": data, "model": name}
            for s in [*seeds, "all"]:
                grouped: dict[str, list] = {}
                for (s2, spk), a in answers.items():
                    if s == "all" or s2 == s:
                        grouped.setdefault(spk, []).extend(a)
                rows += _score_rows(grouped, {**base, "seed": s})
                rows += _score_rows({"all": [a for fs in grouped.values() for a in fs]}, {**base, "seed": s})
            pooled = [r for r in rows if r["data"] == data and r["model"] == name and r["seed"] == "all"
                      and r["speaker"] == "all"]
            print(f"{data:13s} {name:22s} " + "  ".join(
                f"{r['method']}: F1 {_f(r['event_f1'])} det {_f(r['detection_f1'])} seg {_f(r['segment_f1'])}"
                for r in pooled) + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
            for r in rows:
                if r["data"] == data and r["model"] == name and r["speaker"] in held_out:
                    r["fold"] = held_out[r["speaker"]]
    return {"rows": rows, "trainings": trainings, "audio_s": audio, "log": dict(log.counts),
            "settings": _default_settings(), "seeds": list(seeds)}


def _audio_s(files: list[Path]) -> float:
    import soundfile as sf

    return round(sum(sf.info(str(f)).duration for f in files), 1)


def _default_settings() -> dict:
    from wavetrain.stream.events import EventOptions

    o = EventOptions()
    return {**o.describe(), "off": getattr(o, "off", o.off_db)}


# ---- machines ---------------------------------------------------------------------------------
def machine_files(unit: str, seed: int, work: Path, quick: bool) -> list[Path]:
    """Spliced files of a unit's test clips: a third cut into 1 s pieces, a third into 1.5 s,
    a third whole (2 s); shuffled by the seed, ten pieces a file."""
    root = work / "machines" / unit
    rows = [(p, lab) for p, lab in _util.read_csv_plain(SHARED / "machines" / "metadata.csv")
            if lab["unit"] == unit and lab["split"] == "test"]
    rows.sort(key=lambda r: str(r[0]))
    if quick:
        rows = rows[::8]
    pieces = [r for i, r in enumerate(rows) if i % 3 == 2]
    for group, clip_ms in ((0, 1000), (1, 1500)):
        cut = root / f"cut{clip_ms}"
        if not cut.exists():
            src = _write_rows(root / f"group{group}.csv", [r for i, r in enumerate(rows) if i % 3 == group])
            _wt(["sound", "cut", "--data", src, "--clip-ms", clip_ms, "-o", cut, "--no-progress"])
        pieces += _util.read_csv_plain(cut / "metadata.csv")
    pieces.sort(key=lambda r: str(r[0]))
    random.Random(f"{seed}:{unit}").shuffle(pieces)
    files = []
    for j in range(0, len(pieces), 10):
        wav = root / f"seed{seed}" / f"{unit}-{j // 10:03d}.wav"
        files.append(_splice(pieces[j:j + 10], wav, 1000 * seed + j // 10))
    return files


def _detection_f1(files: list[Path], options) -> float:
    """Detection-only event F1 of the detector alone over files."""
    import soundfile as sf

    from wavetrain.evaluation.event_metrics import Event, event_based

    ref, est = [], []
    for f in files:
        ref += _reference(f, "machine")
        y, rate = sf.read(str(f), dtype="float32")
        step = 10 * rate
        est += [Event(str(f), 1000.0 * s.start / rate, 1000.0 * s.end / rate)
                for s in detector_spans((y[i:i + step] for i in range(0, len(y), step)), rate, options)]
    return float(event_based(ref, est, class_aware=False)["f1"] or 0.0)


def machines(work: Path, quick: bool) -> dict:
    from wavetrain.evaluation.event_metrics import Event
    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline.events import recording_events
    from wavetrain.stream.events import EventOptions

    log = _quiet_wavetrain()
    if not (SHARED / "machines").exists():
        print("machines: not found; skipped")
        return {}
    units = MACHINE_UNITS[:2] if quick else MACHINE_UNITS
    seeds = SEEDS[:1] if quick else SEEDS
    grid = settings_grid(quick)
    files = {(u, s): machine_files(u, s, work, quick) for u in units for s in seeds}
    rows, chosen, trainings = [], [], []
    split_cache: dict = {}
    for unit in units[:1] if quick else units:
        others = [u for u in MACHINE_UNITS if u != unit]
        path = work / "machines" / unit / "gmm-machine.wt"
        cost = _train(path, [SHARED / "machines"], "machine", ["--model", "gmm"], work,
                      where=["--where", "unit=" + ",".join(others)])
        trainings.append({"held_out": unit, "trained_on": others, "train": cost})
        model = load_model(str(path))
        every: dict[str, list] = {"defaults": [], "chosen": []}
        for s in seeds:
            # settings chosen on the other units' files of this seed, never on this unit's
            tuning = [f for (u, s2), fs in files.items() if u != unit and s2 == s for f in fs]
            tried = [(_detection_f1(tuning, EventOptions(**g)), i) for i, g in enumerate(grid)]
            best_f1, best = max(tried, key=lambda t: (t[0], -t[1]))      # ties: the earlier (defaults first)
            settings = grid[best]
            chosen.append({"held_out": unit, "seed": s, "settings": settings, "tuning_detection_f1": best_f1,
                           "tuning_files": len(tuning),
                           "defaults_tuning_detection_f1": tried[0][0],
                           "tried": [{"settings": grid[i], "detection_f1": f} for f, i in tried]})
            tuned = EventOptions(**settings)
            answers = [answer_file(model, f, "machine", split_cache) for f in files[(unit, s)]]
            again = [{**a, "wavetrain": [Event(str(f), float(p.start_ms), float(p.end_ms), str(p.label))
                                         for p in recording_events(model, str(f), tuned)]}
                     for f, a in zip(files[(unit, s)], answers)]
            for which, got in (("defaults", answers), ("chosen", again)):
                every[which] += got
                rows += _score_rows({unit: got}, {"settings": which, "seed": s})
            print(f"machines {unit} seed {s}: chosen on {', '.join(others)} {settings} "
                  f"(F1 there {best_f1:.3f})", flush=True)
        for which, answers in every.items():
            pooled = _score_rows({unit: answers}, {"settings": which, "seed": "all"})
            rows += pooled
            print(f"machines {unit} {which:8s} " + "  ".join(
                f"{r['method']}: F1 {_f(r['event_f1'])} det {_f(r['detection_f1'])} seg det "
                f"{_f(r['segment_detection_f1'])}" for r in pooled), flush=True)
    return {"rows": rows, "chosen": chosen, "trainings": trainings, "log": dict(log.counts),
            "audio_s": {u: _audio_s([f for (u2, _), fs in files.items() if u2 == u for f in fs]) for u in units}}


def settings_grid(quick: bool = False) -> list[dict]:
    """The settings tried on the training units (:data:`GRID_ON_DB`, :data:`GRID`), the defaults
    first; each a dict of :class:`~wavetrain.stream.events.EventOptions` arguments."""
    from wavetrain.stream.events import EventOptions

    d = EventOptions()
    out = [{"on_db": d.on_db, "gap_ms": d.gap_ms, "min_ms": d.min_ms, "floor_s": d.floor_s}]
    if quick:
        return out + [{**out[0], "on_db": d.on_db + GRID_ON_DB[0]}]
    for delta in GRID_ON_DB:
        for gap in GRID["gap_ms"]:
            for mn in GRID["min_ms"]:
                for fl in GRID["floor_s"]:
                    g = {"on_db": d.on_db + delta, "gap_ms": gap, "min_ms": mn, "floor_s": fl}
                    if g != out[0]:
                        out.append(g)
    return out


# ---- speed ------------------------------------------------------------------------------------
def speed(work: Path, quick: bool) -> dict:
    import librosa
    import soundfile as sf

    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline.events import recording_events

    log = _quiet_wavetrain()
    rate, block = 16000, 160000
    total = int((60 if quick else 3600) * rate)
    out: dict = {"generated_s": total / rate, "rate": rate}
    detector_spans((synth(rate, i, i + block) for i in range(0, 10 * block, block)), rate)    # warm
    times, found = [], 0
    for _ in range(SPEED_REPEATS):
        timed = _Timed(synth(rate, i, min(total, i + block)) for i in range(0, total, block))
        found = len(detector_spans(timed, rate))
        times.append(timed.busy)
    out["detector"] = {"s": min(times), "runs_s": times, "x_realtime": total / rate / min(times), "events": found}
    chunk = 600 * rate            # librosa holds a whole signal: ten minutes at a time
    _anchor_split(synth(rate, 0, 10 * rate))
    times = []
    for _ in range(SPEED_REPEATS):
        busy, found = 0.0, 0
        for i in range(0, total, chunk):
            y = np.concatenate([synth(rate, j, min(total, i + chunk, j + block))
                                for j in range(i, min(total, i + chunk), block)])
            t0 = time.perf_counter()
            found += len(_anchor_split(y))
            busy += time.perf_counter() - t0
        times.append(busy)
    out["anchor_split"] = {"s": min(times), "runs_s": times, "x_realtime": total / rate / min(times), "events": found,
                           "note": "librosa.effects.split(y, top_db=20) on ten minutes at a time"}
    out["ratio_detector"] = out["detector"]["x_realtime"] / out["anchor_split"]["x_realtime"]
    print(f"detector alone {out['detector']['x_realtime']:,.0f} x real time ({out['detector']['events']} events); "
          f"librosa split "
          f"{out['anchor_split']['x_realtime']:,.0f} x ({out['anchor_split']['events']})", flush=True)
    out["files"] = []
    for data in (["fsdd-dev"] if quick else list(SETS)):
        if not (SHARED / data).exists():
            continue
        fold = speech_folds(data, work, quick)[0]
        files = [f for fs in speech_files(data, fold, 0, work, quick).values() for f in fs]
        path, _ = speech_model(data, fold, "gmm-speech", MODELS[0][1], work)
        model = load_model(str(path))
        recording_events(model, str(files[0]))                      # warm
        _anchor_classify(model, files[0])
        seconds = sum(sf.info(str(f)).duration for f in files)
        runs = {}
        for name in ("wavetrain", "anchor"):
            times = []
            for _ in range(SPEED_REPEATS):
                t0 = time.perf_counter()
                n = sum(len(recording_events(model, str(f))) if name == "wavetrain" else _anchor_classify(model, f)
                        for f in files)
                times.append(time.perf_counter() - t0)
            runs[name] = {"s": min(times), "runs_s": times, "x_realtime": seconds / min(times), "events": n,
                          "ms_per_event": 1000 * min(times) / max(1, n)}
        out["files"].append({"data": data, "fold": fold["name"], "files": len(files), "audio_s": seconds,
                             "model": "gmm-speech", **runs,
                             "ratio": runs["wavetrain"]["x_realtime"] / runs["anchor"]["x_realtime"]})
        print(f"{data}: {len(files)} files, {seconds:.0f} s: detect + classify {runs['wavetrain']['x_realtime']:,.0f} "
              f"x real time, anchor read + split + classify {runs['anchor']['x_realtime']:,.0f} x", flush=True)
    out["librosa"] = getattr(librosa, "__version__", None)
    out["log"] = dict(log.counts)
    return out


class _Timed:
    """Blocks from a generator, the time spent between taking one and asking for the next summed
    (the consumer's work, not the generator's)."""

    def __init__(self, blocks):
        self.blocks, self.busy = blocks, 0.0

    def __iter__(self):
        for b in self.blocks:
            t0 = time.perf_counter()
            yield b
            self.busy += time.perf_counter() - t0


def _anchor_classify(model, wav: Path) -> int:
    """The anchor on a file: read, split, each interval classified; the number of intervals answered."""
    import soundfile as sf

    y, rate = sf.read(str(wav), dtype="float32")
    return sum(_classify_one(model, y[a:b], rate) is not None for a, b in _anchor_split(y))


# ---- memory -----------------------------------------------------------------------------------
MEMORY_CHILD = r'''
import json, resource, sys, time
from wavetrain.models.modelfile import load_model
from wavetrain.data.recording import Recording
from wavetrain.pipeline.events import iter_recording_events, recording_events
model_path, wav, how = sys.argv[1:4]
model = load_model(model_path)
t0 = time.perf_counter()
if how == "list":
    n = len(recording_events(model, wav))
elif how == "iterate":
    n = sum(1 for _ in iter_recording_events(model, Recording(wav)))
else:
    n = 0
print(json.dumps({"events": n, "s": time.perf_counter() - t0,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def write_long_wav(path: Path, seconds: float, rate: int) -> Path:
    """A generated 16-bit wav of ``seconds``, written in ten-second blocks."""
    import soundfile as sf

    n, block = int(seconds * rate), 10 * rate
    with sf.SoundFile(str(path), "w", samplerate=rate, channels=1, subtype="PCM_16") as f:
        for i in range(0, n, block):
            f.write(synth(rate, i, min(n, i + block)))
    return path


def memory(work: Path, quick: bool) -> dict:
    rate = 8000
    hours = (2 / 60, 6 / 60) if quick else (1, 8)
    fold = speech_folds("fsdd-dev", work, quick)[0]
    model, _ = speech_model("fsdd-dev", fold, "gmm-speech", MODELS[0][1], work)
    need = sum(int(h * 3600 * rate * 2) for h in hours)
    folder = Path(tempfile.gettempdir())
    free = shutil.disk_usage(folder).free
    out: dict = {"rate": rate, "model": "gmm-speech (fsdd-dev, two speakers)", "disk_free_gb": round(free / 1e9, 1)}
    if free < 2 * need:
        out["skipped"] = f"{need / 1e9:.1f} GB of wav files need twice that free under {folder}"
        print(out["skipped"])
        return out
    rows = []
    base = _util.run_measured([_util.python_exe(), "-c", MEMORY_CHILD, str(model), "-", "none"])
    out["model_alone"] = {**json.loads(base["stdout"].strip().splitlines()[-1]), "time_peak_mb": base["peak_rss_mb"]}
    for h in hours:
        wav = folder / f"wavetrain-bench-events-{h:g}h.wav"
        try:
            write_long_wav(wav, h * 3600, rate)
            for how in ("list", "iterate"):
                r = _util.run_measured([_util.python_exe(), "-c", MEMORY_CHILD, str(model), str(wav), how])
                res = json.loads(r["stdout"].strip().splitlines()[-1])
                rows.append({"hours": h, "how": how, "file_mb": round(wav.stat().st_size / 2 ** 20, 1), **res,
                             "x_realtime": h * 3600 / res["s"], "time_peak_mb": r["peak_rss_mb"]})
                print(f"{h:g} h ({rows[-1]['file_mb']} MB) {how:8s}: {res['events']} events, peak "
                      f"{res['maxrss_mb']:.1f} MB, {rows[-1]['x_realtime']:,.0f} x real time", flush=True)
        finally:
            wav.unlink(missing_ok=True)
    out["rows"] = rows
    for how in ("list", "iterate"):
        peaks = [r["maxrss_mb"] for r in rows if r["how"] == how]
        out[f"growth_mb_{how}"] = peaks[-1] - peaks[0]
    return out


# ---- latency ----------------------------------------------------------------------------------
def _paced(samples: np.ndarray, rate: int, block: int, put, t0: float) -> list[float]:
    """Hands ``samples`` to ``put`` a block at a time at real-time pace from ``t0``; the arrival
    time of each block (after ``put`` returned)."""
    arrived = []
    for i in range(0, len(samples), block):
        x = samples[i:i + block]
        wait = t0 + (i + len(x)) / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        put(x)
        arrived.append(time.perf_counter())
    return arrived


def _delays(events: list[tuple[float, float, float]], arrived: list[float], rate: int, block: int, n: int,
            options) -> dict:
    """Each event's delay (ms) from the arrival of the sample at its end, and from that of the
    sample at which the gap rule can first close it (its end less the padding plus the gap)."""
    after_end, after_close, at_stream_end = [], [], 0
    for _start_ms, end_ms, t in events:
        end = int(round(end_ms * rate / 1000))
        close = int(round((end_ms - options.pad_ms + options.gap_ms) * rate / 1000))
        if close >= n:
            at_stream_end += 1            # closed by the end of the stream
            continue
        after_end.append(1000 * (t - arrived[max(0, end - 1) // block]))
        after_close.append(1000 * (t - arrived[max(0, close - 1) // block]))
    return {"events": len(events), "closed_by_stream_end": at_stream_end,
            "after_end_ms": _stats(after_end), "after_close_ms": _stats(after_close),
            "target_after_end_ms": options.gap_ms + 100}


def _stats(v: list[float]) -> dict:
    return {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)), "max": float(np.max(v))} if v else {}


def _latency_signal(work: Path, quick: bool) -> tuple[np.ndarray, int, Path, list[Path]]:
    import soundfile as sf

    data = "spoken-words" if (SHARED / "spoken-words").exists() and not quick else "fsdd-dev"
    fold = speech_folds(data, work, quick)[0]
    files = [f for fs in speech_files(data, fold, 0, work, quick).values() for f in fs][:1 if quick else 2]
    model, _ = speech_model(data, fold, "gmm-speech", MODELS[0][1], work)
    parts, rate = [], 0
    for f in files:
        y, rate = sf.read(str(f), dtype="float32")
        parts.append(y)
    y = np.concatenate(parts)
    return (y[:8 * rate] if quick else y), rate, model, files


def latency(work: Path, quick: bool) -> dict:
    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline.events import event_stream
    from wavetrain.stream.events import EventOptions

    log = _quiet_wavetrain()
    y, rate, model_path, files = _latency_signal(work, quick)
    options = EventOptions()
    block = int(rate * LATENCY_BLOCK_MS / 1000)
    out: dict = {"audio_s": len(y) / rate, "rate": rate, "block_ms": LATENCY_BLOCK_MS,
                 "files": [f.name for f in files], "model": "gmm-speech"}
    # in process: a feeder thread, the stream reading its queue
    model = load_model(str(model_path))
    q: queue.Queue = queue.Queue()
    arrived: list[float] = []

    def feed():
        arrived.extend(_paced(y, rate, block, lambda x: q.put((x, time.perf_counter())), t0))
        q.put(None)

    def blocks():
        while (item := q.get()) is not None:
            yield item

    t0 = time.perf_counter() + 0.2
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    found = [(w.prediction.start_ms, w.prediction.end_ms, time.perf_counter())
             for w in event_stream(model, blocks(), rate, options=options)]
    feeder.join()
    out["event_stream"] = _delays(found, arrived, rate, block, len(y), options)
    print(f"event_stream: {_show(out['event_stream'])}", flush=True)
    # the command line, through a pipe
    help_text = _wt(["classify", "--help"])["stdout"]
    if "--events" not in help_text:
        out["cli"] = {"skipped": "this classify has no --events"}
        print("classify has no --events: the command line is not measured")
    else:
        out["cli"] = _cli_latency(model_path, y, rate, block, options, startup_s=4.0 if quick else 8.0)
        print(f"classify - --events: {_show(out['cli'])}", flush=True)
    out["log"] = dict(log.counts)
    return out


def _cli_latency(model_path: Path, y: np.ndarray, rate: int, block: int, options, startup_s: float = 8.0) -> dict:
    pcm = (np.clip(y, -1, 1) * 32767).astype("<i2")
    cmd = _util.wavetrain_cmd() + ["classify", "-m", str(model_path), "-", "--events", "--json", "--rate", str(rate)]
    errors = tempfile.TemporaryFile()  # noqa: SIM115 (the command's stderr, read once it has ended)
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                         env=_util.single_thread_env())
    assert p.stdin is not None and p.stdout is not None
    lines: list[tuple[bytes, float]] = []

    def read():
        assert p.stdout is not None
        for line in p.stdout:
            lines.append((line, time.perf_counter()))

    def write(x):
        assert p.stdin is not None
        p.stdin.write(x.tobytes())
        p.stdin.flush()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(startup_s)                  # the command's imports and model load, before the stream
    arrived = _paced(pcm, rate, block, write, time.perf_counter())
    p.stdin.close()
    rc = p.wait(timeout=120)
    reader.join(timeout=10)
    errors.seek(0)
    err = errors.read().decode(errors="replace")
    errors.close()
    found, own = [], []
    for line, t in lines:
        e = json.loads(line)
        found.append((e["start_ms"], e["end_ms"], t))
        own.append(e.get("latency_ms"))
    res = _delays(found, arrived, rate, block, len(pcm), options)
    return {**res, "rc": rc, "startup_wait_s": startup_s, "stderr_tail": err[-500:],
            "reported_latency_ms": _stats([v for v in own if v is not None])}


def _show(d: dict) -> str:
    a, c = d.get("after_end_ms") or {}, d.get("after_close_ms") or {}
    if not a:
        return json.dumps(d)[:200]
    return (f"{d['events']} events; after the end median {a['median']:.0f} ms, max {a['max']:.0f} ms (target "
            f"<= {d['target_after_end_ms']}); after the closing sample median {c['median']:.0f}, max {c['max']:.0f}")


# ---- tables -----------------------------------------------------------------------------------
def _f(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def events_code() -> dict:
    """The last commit of the detector's modules, whether they differ from it, and the defaults in
    effect: parts measured on different versions of the detector are told apart."""
    files = ["src/wavetrain/features/activity.py", "src/wavetrain/stream/events.py", "src/wavetrain/pipeline/events.py"]

    def git(*a):
        r = subprocess.run(["git", *a], cwd=_util.ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    return {"commit": git("log", "-1", "--format=%h", "--", *files),
            "dirty": bool(git("status", "--porcelain", "--", *files)), "defaults": _default_settings()}


def tables(results: dict) -> str:
    """Markdown tables of whatever parts the results hold."""
    out = []
    rows = (results.get("accuracy") or {}).get("rows") or []
    order = [m[0] for m in MODELS]
    keys = sorted({(r["data"], r["model"]) for r in rows},
                  key=lambda k: (k[0], order.index(k[1]) if k[1] in order else len(order)))
    if keys:
        head = ["data", "model"] + [f"{m} {k}" for m in METHODS for k in ("F1", "det F1", "ER", "seg F1")]
        body = []
        for data, model in keys:
            got = _pick(rows, data=data, model=model, seed="all", speaker="all")
            body.append([data, model] + [v for m in METHODS for v in (
                got[m]["event_f1"], got[m]["detection_f1"], got[m]["error_rate"], got[m]["segment_f1"])])
        out += ["Every seed and held-out speaker:\n", _util.markdown_table(head, body)]
        seeds = (results.get("accuracy") or {}).get("seeds") or list(SEEDS)
        body = [[data, model] + [f"{_f(g['wavetrain']['event_f1'])} / {_f(g['anchor']['event_f1'])}"
                                 for g in (_pick(rows, data=data, model=model, seed=s, speaker="all") for s in seeds)]
                for data, model in keys]
        out += ["\nClass-aware event F1 by seed (wavetrain / anchor):\n",
                _util.markdown_table(["data", "model"] + [f"seed {s}" for s in seeds], body)]
        for data, model in keys:
            speakers = sorted({r["speaker"] for r in rows if r["data"] == data and r["model"] == model} - {"all"})
            body = []
            for spk in speakers:
                got = _pick(rows, data=data, model=model, seed="all", speaker=spk)
                body.append([spk] + [v for m in METHODS for v in (got[m]["event_f1"], got[m]["detection_f1"])])
            out += [f"\n{data}, {model}, by held-out speaker (seeds pooled):\n",
                    _util.markdown_table(["speaker"] + [f"{m} {k}" for m in METHODS for k in ("F1", "det F1")], body)]
    mach = (results.get("machines") or {}).get("rows") or []
    if mach:
        head = ["held-out unit", "settings"] + [f"{m} {k}" for m in METHODS for k in ("F1", "det F1", "seg det F1")]
        body = []
        for unit in sorted({r["speaker"] for r in mach}):
            for which in ("defaults", "chosen"):
                got = {r["method"]: r for r in mach if r["speaker"] == unit and r["settings"] == which
                       and r["seed"] == "all"}
                body.append([unit, which] + [v for m in METHODS for v in (
                    got[m]["event_f1"], got[m]["detection_f1"], got[m]["segment_detection_f1"])])
        out += ["\nMachines (seeds pooled):\n", _util.markdown_table(head, body)]
    return "\n".join(out)


def _pick(rows: list[dict], **want) -> dict:
    """Method -> the row matching every ``want``."""
    return {r["method"]: r for r in rows if all(r.get(k) == v for k, v in want.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parts = ["accuracy", "machines", "speed", "memory", "latency"]
    ap.add_argument("--parts", nargs="+", default=parts, choices=parts)
    ap.add_argument("--work", type=Path, help="keep partitions, spliced files and models here (reused)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    quick = _util.quick_mode(args.quick)
    out_path = _util.quick_out(_util.RESULTS / "events.json", "events") if quick else _util.RESULTS / "events.json"
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    work = args.work or Path(tempfile.mkdtemp(prefix="wt-bench-events-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for part in args.parts:
            start = {"command": " ".join(["benchmarks/bench_events.py", *sys.argv[1:]]),
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": _util.loadavg(),
                     "events_code": events_code()}
            print(f"-- {part} (load {start['load_start']})", flush=True)
            run = {"accuracy": accuracy, "machines": machines, "speed": speed, "memory": memory,
                   "latency": latency}[part]
            results[part] = run(work, quick)
            results[f"{part}_run"] = {**start, "load_end": _util.loadavg(), "machine": _util.machine_info(),
                                      "quick": quick}
            _util.write_json(out_path, results)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(tables(results))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
