"""FFT backends end to end: feature extraction of real data sets with Intel MKL's FFT and with scipy's.

Run: ``.venv/bin/python benchmarks/bench_fft.py [--repeats 5] [--data NAME ...] [--quick]``.
Writes ``benchmarks/results/fft.json`` and prints markdown tables.

wavetrain's CPU extractors transform their frames with ``mkl_fft`` (Intel MKL, the ``fast-fft``
extra) when it imports, else with scipy's pocketfft; ``WAVETRAIN_FFT=mkl|scipy`` forces one
(:mod:`wavetrain.features.fft`).  Three levels are timed, every backend in the same run, with one
compute thread:

1. **the commands**: ``wavetrain features --data DATA --features SPEC`` in a fresh process per
   run (start-up, imports, decoding, extraction, writing the .npy files), on
   ``../shared/data/spoken-words`` (short words) and ``../shared/data/machines`` (2-s machine
   clips), for a log-mel, an MFCC and an FFT-magnitude spec; and ``wavetrain train`` (gmm-speech
   on the words, gmm on the machines) with an empty feature store;
2. **extraction alone**: ``extract`` over the same recordings already in memory, in this process;
3. **the transform alone**: one chunk of frames of each FFT length, microseconds per frame; and
   what loading each backend (its import and first transform) costs a fresh process, once.

Runs alternate between the backends (the order flips every round) and each keeps its best round
(the machine is shared; the best run is the least disturbed one), of wall time and of CPU time
(user + system: what the run itself computed, less sensitive to other processes); medians are
kept too.  The gain is ``scipy / mkl - 1`` of the best times: positive when MKL is faster.  Without mkl_fft only
scipy is timed.  ``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): 40 recordings of each data set,
one spec, two rounds, written under $TMPDIR.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402
import wavetrain  # noqa: E402,F401  (single-thread defaults before numpy loads its pools)

SHARED = _util.ROOT.parent / "shared" / "data"
DATASETS = ("spoken-words", "machines")
SPECS = {
    "logmel": "logmel(bands=64)",
    "mfcc": "mfcc(bands=64, coeffs=13)",
    "fft": "fft()",
}
#: ``wavetrain train`` on each data set (with an empty feature store, so every recording is extracted).
TRAIN = {
    "spoken-words": ["--label", "word", "--model", "gmm-speech"],
    "machines": ["--label", "machine", "--model", "gmm"],
}
QUICK_RECORDINGS = 40
#: FFT lengths of the transform-alone part: 40 ms at 16 kHz (640), 25 ms at 16 kHz padded to
#: a power of two (512), 40 ms at 44.1 kHz (1800, ``n_fft=fast``) and at 48 kHz (1920).
KERNEL_SIZES = (512, 640, 1800, 1920)


def backends() -> list[str]:
    """The backends to time: ``mkl`` (when mkl_fft is installed) and ``scipy``."""
    return (["mkl"] if importlib.util.find_spec("mkl_fft") is not None else []) + ["scipy"]


def recordings(name: str, limit: int | None) -> list[Path]:
    """The audio files of a data set's metadata.csv (the first ``limit``)."""
    files = [p for p, _ in _util.read_csv_plain(SHARED / name / "metadata.csv")]
    return files[:limit] if limit else files


def _rounds(orders: list[str], repeats: int):
    """Round ``r`` runs the backends in ``orders`` order, reversed on odd rounds."""
    for r in range(repeats):
        yield orders if r % 2 == 0 else orders[::-1]


def _summary(times: dict[str, list[tuple[float, float]]]) -> dict:
    """Best and median wall seconds and best CPU seconds per backend, and MKL's gains on each."""
    med = statistics.median
    out: dict = {}
    for b, t in times.items():
        wall, cpu = [w for w, _ in t], [c for _, c in t]
        out[b] = {"best_s": round(min(wall), 4), "median_s": round(med(wall), 4), "best_cpu_s": round(min(cpu), 4),
                  "runs_s": [round(x, 4) for x in wall], "runs_cpu_s": [round(x, 4) for x in cpu]}
    if "mkl" in out and "scipy" in out:
        for key, gain in (("best_s", "gain_pct"), ("median_s", "gain_median_pct"), ("best_cpu_s", "gain_cpu_pct")):
            out[gain] = round(100 * (out["scipy"][key] / out["mkl"][key] - 1), 1)
    return out


def _run_child(cmd: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of a command in a fresh process (which must succeed)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {err.decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def time_command(data_arg: list[str], spec: str, names: list[str], repeats: int) -> dict:
    """Wall and CPU seconds of ``wavetrain features`` per backend (fresh process per run)."""
    times: dict[str, list[tuple[float, float]]] = {b: [] for b in names}
    with tempfile.TemporaryDirectory(prefix="wt-bench-fft-") as tmp:
        for order in _rounds(names, repeats):
            for b in order:
                out = Path(tmp) / f"out-{b}"
                _util.fresh_dir(out)
                cmd = _util.wavetrain_cmd() + ["features", "--data", *data_arg, "--features", spec,
                                               "-o", str(out), "--no-progress"]
                times[b].append(_run_child(cmd, _util.single_thread_env({"WAVETRAIN_FFT": b})))
    return _summary(times)


def time_train(data_arg: list[str], train_args: list[str], names: list[str], repeats: int) -> dict:
    """Wall and CPU seconds of ``wavetrain train`` per backend, each run with an empty feature store."""
    times: dict[str, list[tuple[float, float]]] = {b: [] for b in names}
    with tempfile.TemporaryDirectory(prefix="wt-bench-fft-") as tmp:
        for order in _rounds(names, repeats):
            for b in order:
                store = _util.fresh_dir(Path(tmp) / "store")
                cmd = _util.wavetrain_cmd() + ["train", "--data", *data_arg, *train_args, "-o", str(Path(tmp) / "m.wt"),
                                               "--no-progress"]
                env = _util.single_thread_env({"WAVETRAIN_FFT": b, "WAVETRAIN_CACHE": str(store)})
                times[b].append(_run_child(cmd, env))
    return _summary(times)


def time_extraction(signals: list[tuple[np.ndarray, int]], spec: str, names: list[str], repeats: int) -> dict:
    """Wall and CPU seconds of ``extract`` over recordings already in memory, per backend, in this process."""
    from wavetrain.features import extract

    def run(b: str) -> tuple[float, float]:
        os.environ["WAVETRAIN_FFT"] = b
        t, c = time.perf_counter(), time.process_time()
        for y, rate in signals:
            extract(y, rate, spec)
        return time.perf_counter() - t, time.process_time() - c

    saved = os.environ.get("WAVETRAIN_FFT")
    try:
        for b in names:       # warm: filters, plans, the backend's import
            run(b)
        times: dict[str, list[tuple[float, float]]] = {b: [] for b in names}
        for order in _rounds(names, repeats):
            for b in order:
                times[b].append(run(b))
    finally:
        if saved is None:
            os.environ.pop("WAVETRAIN_FFT", None)
        else:
            os.environ["WAVETRAIN_FFT"] = saved
    return _summary(times)


#: A fresh process that imports wavetrain's FFT module and transforms one frame with backend argv[1]
#: (``none``: imports only).
STARTUP_CODE = """
import sys
import numpy as np
from wavetrain.features.fft import get_rfft
if sys.argv[1] != "none":
    get_rfft(sys.argv[1])(np.zeros((1, 640), np.float32), 640)
"""


def time_startup(names: list[str], repeats: int) -> dict:
    """CPU seconds of a fresh process's first transform per backend, less those of the same process
    without a transform: what loading the backend costs each command once."""
    times: dict[str, list[tuple[float, float]]] = {b: [] for b in ["none", *names]}
    for order in _rounds(["none", *names], repeats):
        for b in order:
            times[b].append(_run_child([sys.executable, "-c", STARTUP_CODE, b], _util.single_thread_env()))
    base = min(c for _, c in times["none"])
    return {b: {"best_cpu_s": round(min(c for _, c in times[b]), 4),
                "load_cpu_s": round(min(c for _, c in times[b]) - base, 4)} for b in times}


def time_kernels(names: list[str], reps: int) -> dict:
    """Microseconds per frame of the real FFT alone: a chunk of float32 frames per length."""
    from wavetrain.features.base import CHUNK_BYTES
    from wavetrain.features.fft import get_rfft

    rng = np.random.default_rng(0)
    out: dict = {}
    for n in KERNEL_SIZES:
        m = max(1, CHUNK_BYTES // (4 * n))
        src = rng.standard_normal((m, n), dtype=np.float32)
        row: dict = {"chunk_frames": m}
        for b in names:
            fn = get_rfft(b)
            buf = src.copy()
            fn(buf, n)
            best = float("inf")
            for _ in range(reps):
                np.copyto(buf, src)        # the input is scratch: every run transforms the same frames
                t = time.perf_counter()
                fn(buf, n)
                best = min(best, time.perf_counter() - t)
            row[f"{b}_us_per_frame"] = round(best / m * 1e6, 3)
        if "mkl" in names:
            row["speedup"] = round(row["scipy_us_per_frame"] / row["mkl_us_per_frame"], 2)
        out[str(n)] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds of every timing (best and median kept)")
    ap.add_argument("--data", nargs="+", default=list(DATASETS), help="data sets under ../shared/data")
    ap.add_argument("--quick", action="store_true", help="40 recordings, one spec, two rounds")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "fft.json")
    args = ap.parse_args()
    quick = _util.quick_mode(args.quick)
    out_path = _util.quick_out(args.out, "fft") if quick else args.out
    repeats = 2 if quick else args.repeats
    specs = {"logmel": SPECS["logmel"]} if quick else SPECS
    limit = QUICK_RECORDINGS if quick else None
    names = backends()

    from wavetrain.data.audio import read_audio
    from wavetrain.features.fft import fft_backend

    results: dict = {"machine": _util.machine_info(), "backends": names, "auto_backend": fft_backend("auto"),
                     "repeats": repeats, "quick": quick, "datasets": {}}
    for ds in args.data:
        if not (SHARED / ds / "metadata.csv").exists():
            print(f"skipped {ds}: {SHARED / ds} is absent")
            results["datasets"][ds] = {"skipped": "absent"}
            continue
        files = recordings(ds, limit)
        signals = [read_audio(f) for f in files]
        audio_s = sum(len(y) / rate for y, rate in signals)
        data_arg = [str(f) for f in files] if limit else [str(SHARED / ds)]
        entry: dict = {"recordings": len(files), "audio_s": round(audio_s, 1),
                       "rates": sorted({rate for _, rate in signals}), "specs": {}}
        for key, spec in specs.items():
            entry["specs"][key] = {"spec": spec,
                                   "command": time_command(data_arg, spec, names, repeats),
                                   "extraction": time_extraction(signals, spec, names, repeats)}
            print(f"{ds} {key}: done", flush=True)
        if ds in TRAIN and not quick:
            entry["train"] = {"args": " ".join(TRAIN[ds]), "command": time_train(data_arg, TRAIN[ds], names, repeats)}
            print(f"{ds} train: done", flush=True)
        results["datasets"][ds] = entry
    results["kernel"] = time_kernels(names, 30 if quick else 300)
    results["startup"] = time_startup(names, 3 if quick else 3 * repeats)
    results["loadavg_end"] = _util.loadavg()
    _util.write_json(out_path, results)

    print(f"\nbackends timed: {', '.join(names)}; auto picks {results['auto_backend']}; "
          f"load {results['machine']['loadavg_start']} -> {results['loadavg_end']}\n")
    both = "mkl" in names
    head = ["data set", "spec", "recordings (audio s)"]
    for level in ("command", "extraction"):
        head += [f"{level}: {b} wall / CPU (s)" for b in names] + ([f"{level}: MKL gain wall / CPU"] if both else [])
    rows = []
    for ds, entry in results["datasets"].items():
        for r in entry.get("specs", {}).values():
            row: list = [ds, f"`{r['spec']}`", f"{entry['recordings']} ({entry['audio_s']:.0f})"]
            for level in ("command", "extraction"):
                row += [f"{r[level][b]['best_s']:.3g} / {r[level][b]['best_cpu_s']:.3g}" for b in names]
                if both:
                    row.append(f"{r[level]['gain_pct']:+.0f} % / {r[level]['gain_cpu_pct']:+.0f} %")
            rows.append(row)
    print(_util.markdown_table(head, rows))
    trains = [(ds, e["train"]) for ds, e in results["datasets"].items() if "train" in e]
    if trains:
        print()
        thead = ["data set", "wavetrain train (empty feature store)"] + [f"{b} wall / CPU (s)" for b in names]
        thead += ["MKL gain wall / CPU"] if both else []
        trows = [[ds, f"`{t['args']}`"] + [f"{t['command'][b]['best_s']:.3g} / {t['command'][b]['best_cpu_s']:.3g}"
                                           for b in names]
                 + ([f"{t['command']['gain_pct']:+.0f} % / {t['command']['gain_cpu_pct']:+.0f} %"] if both else [])
                 for ds, t in trains]
        print(_util.markdown_table(thead, trows))
    print()
    khead = ["FFT length", "frames per chunk"] + [f"{b} (us/frame)" for b in names]
    khead += ["MKL speed-up"] if both else []
    krows = [[n, k["chunk_frames"]] + [k[f"{b}_us_per_frame"] for b in names]
             + ([f"{k['speedup']:.2f}x"] if both else []) for n, k in results["kernel"].items()]
    print(_util.markdown_table(khead, krows))
    print("\nloading the backend and its first transform, once per process (CPU s, best run): "
          + ", ".join(f"{b} {results['startup'][b]['load_cpu_s']:.3f}" for b in names))
    print(f"\nwrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
