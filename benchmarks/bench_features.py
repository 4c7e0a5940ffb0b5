"""Feature extraction benchmark: throughput (x realtime) vs librosa, and peak extra memory.

Run: ``.venv/bin/python benchmarks/bench_features.py [--seconds 60] [--repeats 5]``.
Writes ``benchmarks/results/features.json`` and prints a markdown table.

Setting: single thread, 44.1 kHz, 40 ms windows (n_fft = 1764), 50 % shift, 64 mel bands.
Throughput is the best of ``--repeats`` runs (the machine is shared; the best run is the least
disturbed one).  Memory is measured in fresh subprocesses on a 10-minute recording: the
tracemalloc peak of numpy allocations during ``extract`` and the growth of the peak RSS
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

import wavetrain  # noqa: F401  (single-thread defaults before numpy loads its pools)
import numpy as np

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
    run = lambda x: librosa.feature.melspectrogram(y=x, sr=rate, n_fft=1764, hop_length=882,
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


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _memory(which: str, seconds: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _MEM_CODE, which, str(seconds)],
                         capture_output=True, text=True, env=env, check=True)
    peak, rss, out_bytes = (int(v) for v in out.stdout.split()[-3:])
    return {"tracemalloc_peak_mb": peak / 2**20, "rss_peak_growth_mb": rss / 2**20,
            "output_mb": out_bytes / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="signal length for throughput")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--memory-seconds", type=float, default=600.0)
    ap.add_argument("--no-librosa", action="store_true")
    args = ap.parse_args()

    from wavetrain.features import extract

    y = 0.1 * np.random.default_rng(0).standard_normal(int(RATE * args.seconds), dtype=np.float32)
    results: dict = {"rate": RATE, "seconds": args.seconds, "repeats": args.repeats,
                     "threads": 1, "throughput_x_realtime": {}}
    for name, spec in SPECS.items():
        t = _best(lambda: extract(y, RATE, spec), args.repeats)
        results["throughput_x_realtime"][name] = args.seconds / t
    try:
        import torch  # noqa: F401
        t = _best(lambda: extract(y, RATE, LOGMEL, device="cpu-torch"), args.repeats)
        results["throughput_x_realtime"]["logmel_cpu_torch"] = args.seconds / t
    except ImportError:
        pass
    lm = results["throughput_x_realtime"]["logmel"]
    if not args.no_librosa:
        import librosa

        def lib():
            return librosa.feature.melspectrogram(
                y=y, sr=RATE, n_fft=1764, hop_length=882, win_length=1764, window="hann",
                center=False, power=2.0, n_mels=64)
        tl = _best(lib, max(1, args.repeats // 2))
        results["librosa_melspectrogram_x_realtime"] = args.seconds / tl
        results["speedup_vs_librosa"] = lm / results["librosa_melspectrogram_x_realtime"]
    results["arithmetic_bound_x_realtime"] = ARITHMETIC_BOUND_X
    results["fraction_of_bound"] = lm / ARITHMETIC_BOUND_X
    results["memory_10min"] = {"wavetrain": _memory("wavetrain", args.memory_seconds)}
    if not args.no_librosa:
        results["memory_10min"]["librosa"] = _memory("librosa", args.memory_seconds)

    path = Path(__file__).resolve().parent / "results" / "features.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")

    print(f"| extractor ({RATE} Hz, 40 ms / 50 %, 1 thread) | x realtime |")
    print("|---|---:|")
    for name, x in results["throughput_x_realtime"].items():
        label = f"`{SPECS[name]}`" if name in SPECS else f"`{LOGMEL}`, device='cpu-torch'"
        print(f"| wavetrain {label} | {x:,.0f} |")
    if "librosa_melspectrogram_x_realtime" in results:
        print(f"| librosa.feature.melspectrogram (64 mels) | "
              f"{results['librosa_melspectrogram_x_realtime']:,.0f} |")
        print(f"\nlog-mel speed-up vs librosa: {results['speedup_vs_librosa']:.2f}x; "
              f"{100 * results['fraction_of_bound']:.0f}% of the ~{ARITHMETIC_BOUND_X:,.0f}x "
              "arithmetic bound")
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
