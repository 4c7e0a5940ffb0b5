"""Feature store throughput: puts/s, cold and warm gets/s; MemoryCache ops/s.

Writes N typical grams (100 frames x 64 features) to a fresh store in a temporary folder, reads
them back cold (a new store instance after asking the kernel to drop the entries from the page
cache with ``posix_fadvise(DONTNEED)``; no root rights needed, so "cold" is best effort) and warm,
and prints a table plus ``benchmarks/results/store.json``.  Every get touches all of the gram's
data (a sum), so the read is real, not just a map.  Grams under ``mmap_min_bytes`` (1 MiB by default)
are read into memory, larger ones memory-mapped; one run maps every gram for comparison.

Usage::

    python benchmarks/bench_store.py [--n 1000] [--frames 100] [--features 64] [--root DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from wavetrain.store import FeatureStore, MemoryCache, entry_bytes


def _rec(i: int) -> str:
    return f"{i:040x}"


SPEC = "0123456789abcdef"


def _drop_page_cache(root: Path) -> None:
    for p in root.rglob("*.gram"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_all(store: FeatureStore, n: int) -> float:
    t0 = time.perf_counter()
    total = 0.0
    for i in range(n):
        g = store.get(_rec(i), SPEC)
        total += float(g.sum())
    dt = time.perf_counter() - t0
    assert np.isfinite(total)
    return dt


def bench_feature_store(root: Path, n: int, shape: tuple[int, int], dtype: str,
                        verify: bool = True, mmap_min_bytes: int = 1 << 20) -> dict:
    rng = np.random.default_rng(0)
    grams = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
    store = FeatureStore(root, dtype=dtype, verify=verify, mmap_min_bytes=mmap_min_bytes)
    t0 = time.perf_counter()
    for i, g in enumerate(grams):
        store.put(_rec(i), SPEC, g)
    put_s = time.perf_counter() - t0
    store.close()

    _drop_page_cache(root)
    cold = FeatureStore(root, dtype=dtype, verify=verify, mmap_min_bytes=mmap_min_bytes)
    cold_s = _read_all(cold, n)
    warm_s = _read_all(cold, n)
    miss_t0 = time.perf_counter()
    for i in range(n, 2 * n):
        cold.get(_rec(i), SPEC)
    miss_s = time.perf_counter() - miss_t0
    info = cold.info()
    disk = sum(p.stat().st_blocks * 512 for p in root.rglob("*.gram"))
    cold.close()
    return {"n": n, "shape": list(shape), "dtype": dtype, "verify": verify,
            "mmap_min_bytes": mmap_min_bytes,
            "entry_bytes": entry_bytes(*shape, dtype), "store_bytes": info["bytes"],
            "disk_bytes": disk,
            "puts_per_s": n / put_s, "gets_per_s_cold": n / cold_s,
            "gets_per_s_warm": n / warm_s, "misses_per_s": n / miss_s,
            "put_mb_per_s": n * entry_bytes(*shape, dtype) / put_s / 1e6}


def bench_memory_cache(n: int, shape: tuple[int, int]) -> dict:
    item = np.zeros(shape, np.float32)
    cache = MemoryCache(max_bytes=(n // 4) * item.nbytes)        # forces eviction
    t0 = time.perf_counter()
    for i in range(n):
        cache.put(i, item, cost_s=(i % 7) * 1e-3)
    put_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n):
        cache.get(i)
    get_s = time.perf_counter() - t0
    return {"n": n, "puts_per_s": n / put_s, "gets_per_s": n / get_s, **cache.stats()}


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g}M"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--root", help="folder for the temporary stores (default: system temp)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "store.json"))
    args = ap.parse_args(argv)
    shape = (args.frames, args.features)
    base = Path(tempfile.mkdtemp(prefix="wt-bench-store-", dir=args.root))
    try:
        runs = [bench_feature_store(base / "f32", args.n, shape, "float32"),
                bench_feature_store(base / "f16", args.n, shape, "float16"),
                bench_feature_store(base / "f32-mmap", args.n, shape, "float32", mmap_min_bytes=0),
                bench_feature_store(base / "f32-noverify", args.n, shape, "float32", verify=False)]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result = {"benchmark": "store", "machine": platform.platform(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "numpy": np.__version__,
              "feature_store": runs, "memory_cache": bench_memory_cache(100_000, (4,))}
    print(f"{'dtype':8} {'verify':6} {'mmap':5} {'puts/s':>9} {'gets/s cold':>12} {'gets/s warm':>12} "
          f"{'misses/s':>9} {'entry B':>8} {'disk B/entry':>12}")
    for r in runs:
        mapped = "all" if r["mmap_min_bytes"] == 0 else ">=" + _mib(r["mmap_min_bytes"])
        print(f"{r['dtype']:8} {str(r['verify']):6} {mapped:5} {r['puts_per_s']:9.0f} "
              f"{r['gets_per_s_cold']:12.0f} {r['gets_per_s_warm']:12.0f} "
              f"{r['misses_per_s']:9.0f} {r['entry_bytes']:8d} {r['disk_bytes'] / r['n']:12.0f}")
    mc = result["memory_cache"]
    print(f"MemoryCache: {mc['puts_per_s']:.0f} puts/s, {mc['gets_per_s']:.0f} gets/s "
          f"({mc['evictions']} evictions)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
