"""Why wavetrain defaults to one compute thread: time the GMM E-step block and a log-mel
extraction with 1 and 2 BLAS/OpenMP threads (each in a fresh subprocess). Writes
benchmarks/results/threads.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import time, json, numpy as np
from wavetrain.models.mixture import Stats, gauss_terms, responsibilities
from wavetrain.features import extract
rng = np.random.default_rng(0)
x = rng.normal(size=(8192, 39)); w = np.ones(8) / 8; mu = rng.normal(size=(8, 39)); var = np.ones((8, 39))
def best(f, n):
    out = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): f()
        out.append((time.perf_counter() - t) / n)
    return min(out)
def estep():
    xx = (x, x * x); ll, r = responsibilities(xx, *gauss_terms(w, mu, var)); Stats(8, 39).add(xx, r, ll)
sig = rng.normal(size=44100 * 10).astype(np.float32)
res = {"gmm_estep_block_ms": best(estep, 20) * 1e3,
       "gemm_512_ms": best(lambda: rng.normal(size=(512, 512)) @ rng.normal(size=(512, 512)), 5) * 1e3,
       "logmel_10s_ms": best(lambda: extract(sig, 44100, "logmel(bands=64)"), 3) * 1e3}
print(json.dumps(res))
"""


def main() -> int:
    out = {"loadavg": os.getloadavg()}
    for n in (1, 2):
        env = dict(os.environ, WAVETRAIN_THREADS=str(n), OMP_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n),
                   MKL_NUM_THREADS=str(n))
        r = subprocess.run([sys.executable, "-c", "import wavetrain\n" + CHILD], env=env, capture_output=True,
                           text=True, check=True)
        out[f"threads_{n}"] = json.loads(r.stdout)
    res = Path(__file__).parent / "results"
    res.mkdir(exist_ok=True)
    (res / "threads.json").write_text(json.dumps(out, indent=2))
    print("| work | 1 thread (ms) | 2 threads (ms) | 2 threads / 1 thread |")
    print("|---|---:|---:|---:|")
    for k in out["threads_1"]:
        a, b = out["threads_1"][k], out["threads_2"][k]
        print(f"| {k} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
