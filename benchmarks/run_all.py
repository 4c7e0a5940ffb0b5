"""Run every ``benchmarks/bench_*.py`` in its own process, one after another, with one compute thread.

    .venv/bin/python benchmarks/run_all.py [--only NAME ...] [--quick] [--list]

``--only gmm`` (or ``bench_gmm``, ``bench_gmm.py``) runs just that benchmark (repeatable);
``--quick`` sets ``WAVETRAIN_BENCH_QUICK=1``, which every benchmark that knows it reads as "small
sizes" (quick results go to $TMPDIR/wavetrain-bench/, not benchmarks/results/: whatever a quick
run writes there is moved to $TMPDIR/wavetrain-bench/results/ and the committed file restored).  Each benchmark's
output streams through; a summary (exit code, wall time, load average) is printed at the end and
written to $TMPDIR/wavetrain-bench/run_all.json.  Exit code 1 when any benchmark failed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

HERE = Path(__file__).resolve().parent
QUICK_DIR = Path(tempfile.gettempdir()) / "wavetrain-bench"
#: Quick-mode arguments for benchmarks that do not read WAVETRAIN_BENCH_QUICK themselves; their
#: results are redirected to QUICK_DIR so that quick numbers never replace benchmarks/results/.
QUICK_ARGS = {
    "store": ["--n", "200", "--out", str(QUICK_DIR / "store.quick.json")],
    "neural": ["--steps", "10", "--windows", "256", "--out", str(QUICK_DIR / "neural.quick.json")],
    "features": ["--seconds", "2", "--repeats", "1", "--memory-seconds", "10"],
    "threads": [],                                    # a few seconds as it is
}


def _snapshot() -> dict[Path, bytes]:
    return {f: f.read_bytes() for f in _util.RESULTS.rglob("*") if f.is_file()}


def _protect_results(before: dict[Path, bytes]) -> list[str]:
    """Undo what a quick run wrote to benchmarks/results/ (kept under QUICK_DIR/results/ instead)."""
    moved = []
    for f in [f for f in _util.RESULTS.rglob("*") if f.is_file()]:
        old = before.get(f)
        new = f.read_bytes()
        if old == new:
            continue
        keep = QUICK_DIR / "results" / f.relative_to(_util.RESULTS)
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.write_bytes(new)
        if old is None:
            f.unlink()
        else:
            f.write_bytes(old)
        moved.append(str(keep))
    for f, old in before.items():   # deleted by the run
        if not f.exists():
            f.write_bytes(old)
    return moved


def knows_quick(p: Path) -> bool:
    return "WAVETRAIN_BENCH_QUICK" in p.read_text() or "quick_mode(" in p.read_text()


def discover() -> list[Path]:
    return sorted(HERE.glob("bench_*.py"))


def _name(p: Path) -> str:
    return p.stem[len("bench_"):]


def select(benches: list[Path], only: list[str] | None) -> list[Path]:
    if not only:
        return benches
    want = {o.removesuffix(".py").removeprefix("bench_") for o in only}
    unknown = want - {_name(b) for b in benches}
    if unknown:
        raise SystemExit(f"run_all: no benchmark named {', '.join(sorted(unknown))}; "
                         f"have {', '.join(_name(b) for b in benches)}")
    return [b for b in benches if _name(b) in want]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run the wavetrain benchmarks sequentially.")
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this benchmark (repeatable)")
    ap.add_argument("--quick", action="store_true", help="small sizes (WAVETRAIN_BENCH_QUICK=1)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args(argv)
    benches = select(discover(), args.only)
    if args.list:
        print("\n".join(_name(b) for b in benches))
        return 0
    env = _util.single_thread_env({"WAVETRAIN_BENCH_QUICK": "1"} if args.quick else None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_util.ROOT / "src"), env.get("PYTHONPATH")]))
    summary = []
    for b in benches:
        print(f"\n=== {b.name}{' (quick)' if args.quick else ''} ===", flush=True)
        extra = []
        if args.quick and not knows_quick(b):
            if _name(b) not in QUICK_ARGS:
                print(f"{b.name} has no quick mode; skipped")
                summary.append({"benchmark": _name(b), "rc": None, "wall_s": 0.0, "skipped": "no quick mode",
                                "loadavg_before": _util.loadavg(), "loadavg_after": _util.loadavg()})
                continue
            extra = QUICK_ARGS[_name(b)]
        la = _util.loadavg()
        before = _snapshot() if args.quick else None
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(b)] + extra, env=env, cwd=_util.ROOT)
        if before is not None:
            for m in _protect_results(before):
                print(f"quick run wrote into benchmarks/results/; restored, quick output kept as {m}")
        summary.append({"benchmark": _name(b), "rc": rc, "wall_s": round(time.perf_counter() - t0, 1),
                        "loadavg_before": la, "loadavg_after": _util.loadavg()})
    print("\n## benchmark summary\n")
    print(_util.markdown_table(["benchmark", "exit", "wall s", "load before", "load after"],
                               [[s["benchmark"], "skipped" if s.get("skipped") else s["rc"], s["wall_s"],
                                 s["loadavg_before"][0], s["loadavg_after"][0]] for s in summary]))
    out = QUICK_DIR / "run_all.json"
    _util.write_json(out, {"quick": args.quick, "machine": _util.machine_info(), "runs": summary})
    print(f"\nwrote {out}")
    return 1 if any(s["rc"] for s in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
