"""Feature extraction benchmark: throughput (x realtime) vs librosa, and peak extra memory.

Run: ``.venv/bin/python benchmarks/bench_features.py [--seconds 60] [--repeats 5]``.
Writes ``benchmarks/results/features.json`` and prints a markdown table.

Setting: single thread, 44.1 kHz, 40 ms windows (1764 samples, zero-padded to n_fft = 1800 by
the default ``n_fft=fast``), 50 % shift, 64 mel bands.  librosa is timed with the same framing
(``n_fft=1800, win_length=1764``) and with its plain ``n_fft=1764``; the speed-up is against
the faster of the two.  Throughput is the best of ``--repeats`` runs (the machine is shared;
the best run is the least disturbed one); the load average is recorded before and after.
The stage breakdown times one chunk of frames per stage, minimum over many runs (an estimate
of the undisturbed cost, microseconds per frame).  Memory is measured in fresh subprocesses on a
10-minute recording: the tracemalloc peak of numpy allocations during ``extract`` and the growth of the peak RSS
(psutil RSS sampled every 0.5 ms), both excluding the input signal and the imports.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import wavetrain  # noqa: F401  (single-thread defaults before numpy loads its pools)

RATE = 44100
LOGMEL = "logmel(bands=64, window_ms=40, shift_pct=50)"
SPECS = {
    "logmel": LOGMEL,
    "mfcc": "mfcc(bands=64, coeffs=13, window_ms=40, shift_pct=50)",
    "fft": "fft(window_ms=40, shift_pct=50)",
    "fft_128_log": "fft(bins=128, fmax=8000, log=true, window_ms=40, shift_pct=50)",
    "stats": "stats(window_ms=40, shift_pct=50)",
}
#: Arithmetic bound quoted for this CPU (log-mel, single core), x realtime.
ARITHMETIC_BOUND_X = 16000.0

_STAGES_CODE = r"""
import sys, time, json
import wavetrain, numpy as np, scipy.fft as sfft
from wavetrain.features import parse_spec, frame, get_window
from wavetrain.features.filters import mel_blocks_interleaved
spec_text, reps = sys.argv[1], int(sys.argv[2])
from wavetrain.features.fft import fft_backend
rate = 44100
ext = parse_spec(spec_text).build_extractor()
size = ext.frame_size(rate); step = ext.frame_step(rate, size); nfft = ext.fft_size(size)
y = 0.1 * np.random.default_rng(0).standard_normal(rate * 10, dtype=np.float32)
fr = frame(y, size, step)[100:]
from wavetrain.features import base
m = max(1, base.CHUNK_BYTES // (4 * nfft))
src = fr[:m]; w = get_window("hann", size)
buf = np.zeros((m, nfft), np.float32)
wpad = np.zeros(nfft, np.float32); wpad[:size] = get_window("hann", size)
blocks = ext._state(rate, size)
out = np.empty((m, 64), np.float32)
spec = ext.rfft(buf.copy(), nfft); sq = spec.view(np.float32)
def mel():
    for lo, hi, b0, b1, ww in blocks:
        np.matmul(sq[:, 2 * lo:2 * hi], ww, out=out[:, b0:b1])
def log():
    out[...] = 1.0; out.__iadd__(np.float32(1e-10)); np.log(out, out=out)
def copy_window():
    np.copyto(buf[:, :size], src); np.multiply(buf, wpad, out=buf)
stages = {"copy_window": copy_window,
          "rfft": lambda: ext.rfft(buf, nfft), "square": lambda: np.square(sq, out=sq),
          "mel_matmul": mel, "log": log}
res = {}
for name, fn in stages.items():
    fn(); best = 1e9
    for _ in range(reps):
        t = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t)
    res[name] = best / m * 1e6
res["total"] = sum(res.values())
print(json.dumps({"n_fft": nfft, "fft_backend": fft_backend(), "chunk_frames": m,
                  "us_per_frame": res}))
"""

_MEM_CODE = r"""
import sys, tracemalloc
import wavetrain, numpy as np
which, seconds = sys.argv[1], float(sys.argv[2])
rate = 44100
y = (0.1 * np.random.default_rng(0).standard_normal(int(rate * seconds), dtype=np.float32))
short = y[:rate].copy()
if which == "wavetrain":
    from wavetrain.features import extract
    run = lambda x: extract(x, rate, "logmel(bands=64, window_ms=40, shift_pct=50)")
else:
    import librosa
    run = lambda x: librosa.feature.melspectrogram(y=x, sr=rate, n_fft=1800, hop_length=882,
        win_length=1764, window="hann", center=False, power=2.0, n_mels=64)
import threading, psutil
run(short)  # warm caches (filters, FFT plans)
proc = psutil.Process()
base = proc.memory_info().rss
top = [base]
done = threading.Event()
def sample():
    while not done.is_set():
        top[0] = max(top[0], proc.memory_info().rss)
        done.wait(0.0005)
th = threading.Thread(target=sample); th.start()
out = run(y)
done.set(); th.join()
top[0] = max(top[0], proc.memory_info().rss)
tracemalloc.start()
out = run(y)
cur, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(peak, top[0] - base, out.nbytes)
"""


def _with_fft(backend: str, fn):
    saved = os.environ.get("WAVETRAIN_FFT")
    os.environ["WAVETRAIN_FFT"] = backend
    try:
        return fn()
    finally:
        if saved is None:
            del os.environ["WAVETRAIN_FFT"]
        else:
            os.environ["WAVETRAIN_FFT"] = saved


def _best_round_robin(fns: dict, repeats: int) -> dict:
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def _memory(which: str, seconds: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _MEM_CODE, which, str(seconds)],
                         capture_output=True, text=True, env=env, check=True)
    peak, rss, out_bytes = (int(v) for v in out.stdout.split()[-3:])
    return {"tracemalloc_peak_mb": peak / 2**20, "rss_peak_growth_mb": rss / 2**20,
            "output_mb": out_bytes / 2**20}


def _stages(spec: str, backend: str = "auto", reps: int = 400) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               WAVETRAIN_FFT=backend)
    out = subprocess.run([sys.executable, "-c", _STAGES_CODE, spec, str(reps)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _blas() -> dict:
    info = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    try:
        from threadpoolctl import threadpool_info
        info["pools"] = [{k: p.get(k) for k in ("internal_api", "architecture", "num_threads",
                                                "version")} for p in threadpool_info()]
    except ImportError:
        pass
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="signal length for throughput")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--memory-seconds", type=float, default=600.0)
    ap.add_argument("--no-librosa", action="store_true")
    args = ap.parse_args()

    from wavetrain.features import extract

    y = 0.1 * np.random.default_rng(0).standard_normal(int(RATE * args.seconds), dtype=np.float32)
    results: dict = {"rate": RATE, "seconds": args.seconds, "repeats": args.repeats,
                     "threads": 1, "cpu_count": os.cpu_count(),
                     "loadavg_before": list(os.getloadavg()), "blas": _blas(),
                     "spec": str(__import__("wavetrain.features", fromlist=["parse_spec"])
                                 .parse_spec(LOGMEL)),
                     "throughput_x_realtime": {}}
    # Every timed function runs once per round, round-robin, so wavetrain and librosa see the
    # same (shared-machine) disturbance; each keeps its best round.
    fns = {name: (lambda spec=spec: extract(y, RATE, spec)) for name, spec in SPECS.items()}
    from wavetrain.features.fft import fft_backend
    results["fft_backend"] = fft_backend()
    if results["fft_backend"] != "scipy":  # the portable fallback, timed in the same rounds
        fns["logmel_scipy_fft"] = lambda: _with_fft("scipy", lambda: extract(y, RATE, LOGMEL))
    try:
        import torch  # noqa: F401
        fns["logmel_cpu_torch"] = lambda: extract(y, RATE, LOGMEL, device="cpu-torch")
    except ImportError:
        pass
    if not args.no_librosa:
        import librosa

        def lib(n_fft):
            return lambda: librosa.feature.melspectrogram(
                y=y, sr=RATE, n_fft=n_fft, hop_length=882, win_length=1764, window="hann",
                center=False, power=2.0, n_mels=64)
        for n in (1800, 1764):
            fns[f"librosa_n_fft_{n}"] = lib(n)
    best = _best_round_robin(fns, args.repeats)
    for name in fns:
        if not name.startswith("librosa"):
            results["throughput_x_realtime"][name] = args.seconds / best[name]
    lm = results["throughput_x_realtime"]["logmel"]
    if not args.no_librosa:
        lib_x = {k[len("librosa_"):]: args.seconds / v for k, v in best.items()
                 if k.startswith("librosa")}
        results["librosa_melspectrogram_x_realtime_by_n_fft"] = lib_x
        results["librosa_melspectrogram_x_realtime"] = max(lib_x.values())
        results["speedup_vs_librosa"] = lm / results["librosa_melspectrogram_x_realtime"]
        results["speedup_vs_librosa_n_fft_1764"] = lm / lib_x["n_fft_1764"]
    results["loadavg_after"] = list(os.getloadavg())
    results["arithmetic_bound_x_realtime"] = ARITHMETIC_BOUND_X
    results["fraction_of_bound"] = lm / ARITHMETIC_BOUND_X
    results["gap_to_bound_x"] = ARITHMETIC_BOUND_X / lm
    results["stages_us_per_frame"] = {
        "logmel (n_fft=fast)": _stages(LOGMEL),
        "logmel (n_fft=none)": _stages(LOGMEL.replace(")", ", n_fft=none)")),
        "logmel (n_fft=fast, scipy FFT)": _stages(LOGMEL, "scipy"),
    }
    for v in results["stages_us_per_frame"].values():
        v["x_realtime_undisturbed"] = (RATE / 882) ** -1 / (v["us_per_frame"]["total"] * 1e-6)
    results["memory_10min"] = {"wavetrain": _memory("wavetrain", args.memory_seconds)}
    if not args.no_librosa:
        results["memory_10min"]["librosa"] = _memory("librosa", args.memory_seconds)

    path = Path(__file__).resolve().parent / "results" / "features.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")

    print(f"FFT backend: {results['fft_backend']}\n")
    print(f"| extractor ({RATE} Hz, 40 ms / 50 %, 1 thread) | x realtime |")
    print("|---|---:|")
    for name, x in results["throughput_x_realtime"].items():
        label = (f"`{SPECS[name]}`" if name in SPECS else
                 f"`{LOGMEL}`, scipy FFT" if name == "logmel_scipy_fft" else
                 f"`{LOGMEL}`, device='cpu-torch'")
        print(f"| wavetrain {label} | {x:,.0f} |")
    if "librosa_melspectrogram_x_realtime" in results:
        for k, v in results["librosa_melspectrogram_x_realtime_by_n_fft"].items():
            print(f"| librosa.feature.melspectrogram (64 mels, {k}, win_length=1764) | "
                  f"{v:,.0f} |")
        print(f"\nlog-mel speed-up vs librosa: {results['speedup_vs_librosa']:.2f}x vs its "
              f"faster setting, {results['speedup_vs_librosa_n_fft_1764']:.2f}x vs n_fft=1764; "
              f"{100 * results['fraction_of_bound']:.0f}% of the ~{ARITHMETIC_BOUND_X:,.0f}x "
              f"arithmetic bound ({results['gap_to_bound_x']:.1f}x gap); load average "
              f"{results['loadavg_before'][0]:.2f} -> {results['loadavg_after'][0]:.2f} on "
              f"{os.cpu_count()} CPUs")
    print("\n| stage (us/frame, min over runs) | " + " | ".join(results["stages_us_per_frame"])
          + " |")
    print("|---|" + "---:|" * len(results["stages_us_per_frame"]))
    for stage in next(iter(results["stages_us_per_frame"].values()))["us_per_frame"]:
        print(f"| {stage} | " + " | ".join(f"{v['us_per_frame'][stage]:.2f}" for v in
                                          results["stages_us_per_frame"].values()) + " |")
    print("\n| 10-min recording, log-mel | tracemalloc peak (MB) | peak RSS growth (MB) | "
          "output (MB) |")
    print("|---|---:|---:|---:|")
    for who, m in results["memory_10min"].items():
        print(f"| {who} | {m['tracemalloc_peak_mb']:.1f} | {m['rss_peak_growth_mb']:.1f} | "
              f"{m['output_mb']:.1f} |")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
