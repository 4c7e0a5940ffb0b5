"""Peak RSS of CNN training against the amount of data (it must not grow with hours).

Trains ``cnn`` for one epoch on 0.5, 1 and 2 hours of the 44.1 kHz two-class audio that
``bench_memory.py`` generates (60 s files, reused), cut into 1 s clips (``--clip-ms 1000``), each
size in a fresh process with a fresh feature store, and records wall time, peak RSS and the
planner's prediction. Writes benchmarks/results/neural_memory.json.

    .venv/bin/python benchmarks/bench_neural_memory.py [--hours 0.5 1 2] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _util  # noqa: E402
import bench_memory  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--workdir", default="/tmp/wavetrain-bench/memory")
    args = ap.parse_args(argv)
    if _util.quick_mode():
        args.hours = [0.05, 0.1]
    work = Path(args.workdir)
    csvs = bench_memory.make_data(work, args.hours)
    rows = []
    common = ["--label", "cls", "--model", "cnn", "--set", "clip_ms=1000", "--set", "epochs=1",
              "--set", "valid_fraction=0.05"]
    for h in args.hours:
        cache = _util.fresh_dir(work / f"cnn-cache-{h:g}h")
        plan = _util.run_measured(_util.wavetrain_cmd() + [
            "memory", "--data", str(csvs[h]), "--json", "--label", "cls", "--model", "cnn", "--set", "epochs=1",
            "--set", "clip_ms=1000"])
        r = _util.run_measured(_util.wavetrain_cmd() + ["train", "--data", str(csvs[h])] + common +
                               ["--cache", str(cache), "--no-progress", "-o", str(work / "cnn.wt")])
        rows.append({"hours": h, "wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"],
                     "predicted_peak_mb": json.loads(plan["stdout"])["predicted_peak_mb"],
                     "settings": json.loads(plan["stdout"]).get("settings"),
                     "loadavg": _util.loadavg()})
        print(f"{h:g} h: peak RSS {r['peak_rss_mb']:.1f} MB, {r['wall_s']:.0f} s", file=sys.stderr)
    hs = [r["hours"] for r in rows]
    ys = [r["peak_rss_mb"] for r in rows]
    mh, my = sum(hs) / len(hs), sum(ys) / len(ys)
    slope = sum((h - mh) * (y - my) for h, y in zip(hs, ys)) / max(sum((h - mh) ** 2 for h in hs), 1e-9)
    out = {"benchmark": "neural_memory", "machine": _util.machine_info(), "rows": rows,
           "slope_mb_per_hour": slope, "note": "1 s clips (clip_ms=1000), one epoch"}
    path = Path(__file__).parent / "results" / "neural_memory.json"
    if _util.quick_mode():
        path = _util.quick_out(path, "neural_memory")
    _util.write_json(path, out)
    print(_util.markdown_table(["hours", "train wall s", "peak RSS MB"],
                               [[r["hours"], f"{r['wall_s']:.0f}", f"{r['peak_rss_mb']:.1f}"] for r in rows]))
    print(f"\nslope {slope:.1f} MB/hour -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
