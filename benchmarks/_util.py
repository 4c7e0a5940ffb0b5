"""Shared helpers of the benchmarks: single-thread environment, measured subprocess runs, tables.

Every measured command runs in its own fresh subprocess under ``/usr/bin/time -f %M`` (peak
resident set size of that process, in KiB, as the kernel reports it in ``wait4``); where
``/usr/bin/time`` is missing, ``os.wait4`` on the child gives the same number.  ``time`` is a
small C program, so its child's peak cannot inherit the (possibly large) Python driver's pages.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS")
GNU_TIME = "/usr/bin/time"


def single_thread_env(extra: dict | None = None) -> dict:
    """The current environment with one compute thread (and no progress bars' terminal tricks)."""
    env = dict(os.environ)
    for v in THREAD_VARS:
        env[v] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # as on a user's machine, modules are compiled once (this workplace sets the opposite)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if extra:
        env.update(extra)
    return env


def quick_mode(args_quick: bool = False) -> bool:
    """``--quick`` on the command line or ``WAVETRAIN_BENCH_QUICK=1`` (set by run_all.py --quick)."""
    return bool(args_quick) or os.environ.get("WAVETRAIN_BENCH_QUICK", "") not in ("", "0")


def quick_out(out: Path, name: str) -> Path:
    """Quick runs never overwrite the committed results: they go to $TMPDIR/wavetrain-bench/."""
    if Path(out).resolve() != (RESULTS / f"{name}.json").resolve():
        return Path(out)
    return Path(tempfile.gettempdir()) / "wavetrain-bench" / f"{name}.quick.json"


def python_exe() -> str:
    return sys.executable


def wavetrain_cmd() -> list[str]:
    """The ``wavetrain`` entry point of this interpreter's environment."""
    exe = Path(sys.executable).parent / "wavetrain"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "wavetrain.cli.main"]


def run_measured(cmd: list[str], *, cwd: str | os.PathLike | None = None, env: dict | None = None,
                 check: bool = True, timeout: float | None = None) -> dict:
    """Run ``cmd`` in a fresh subprocess; return wall seconds, peak RSS (MB), rc, stdout, stderr."""
    env = env or single_thread_env()
    with tempfile.TemporaryDirectory(prefix="wt-bench-run-") as tmp:
        out_p, err_p, rss_p = (Path(tmp) / n for n in ("out", "err", "rss"))
        use_time = os.access(GNU_TIME, os.X_OK)
        full = [GNU_TIME, "-o", str(rss_p), "-f", "%M"] + list(cmd) if use_time else list(cmd)
        with open(out_p, "wb") as fo, open(err_p, "wb") as fe:
            t0 = time.perf_counter()
            p = subprocess.Popen(full, cwd=cwd, env=env, stdout=fo, stderr=fe)
            try:
                if use_time:
                    rc = p.wait(timeout=timeout)
                    maxrss_kb = None
                else:
                    _, status, ru = os.wait4(p.pid, 0)
                    rc = os.waitstatus_to_exitcode(status)
                    p.returncode = rc
                    maxrss_kb = ru.ru_maxrss
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise
            wall = time.perf_counter() - t0
        stdout = out_p.read_text(errors="replace")
        stderr = err_p.read_text(errors="replace")
        if use_time:
            lines = [ln for ln in rss_p.read_text().splitlines() if ln.strip()] if rss_p.exists() else []
            try:
                maxrss_kb = int(lines[-1])
            except (IndexError, ValueError):
                maxrss_kb = None
    res = {"cmd": " ".join(str(c) for c in cmd), "rc": rc, "wall_s": round(wall, 3),
           "peak_rss_mb": round(maxrss_kb / 1024, 1) if maxrss_kb is not None else None,
           "stdout": stdout, "stderr": stderr}
    if check and rc != 0:
        raise RuntimeError(f"command failed with exit code {rc}: {res['cmd']}\n--- stderr ---\n{stderr[-4000:]}")
    return res


def em_passes(model_file) -> int | None:
    """EM passes of a trained gmm model file (its ``history_``), or None."""
    try:
        from wavetrain.models.modelfile import load_model

        hist = getattr(load_model(str(model_file)), "history_", None)
        return len(hist) if hist else None
    except Exception:
        return None


def machine_info() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "threads_env": {v: "1" for v in THREAD_VARS[:3]},
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        import psutil

        info["mem_total_mb"] = round(psutil.virtual_memory().total / 2 ** 20)
    except Exception:  # pragma: no cover
        pass
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                            text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        info["src_dirty"] = bool(dirty)
    except Exception:  # pragma: no cover
        pass
    return info


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def markdown_table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 10 else f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def read_csv_plain(csv_path: Path) -> list[tuple[Path, dict]]:
    """``(audio path, labels)`` of a metadata.csv, read as a user's baseline script would (the csv
    module, no wavetrain): the baselines use it."""
    import csv

    out = []
    with open(csv_path, newline="") as f:
        for row in csv.reader(f):
            if not row or row[0].startswith("#"):
                continue
            labels = dict(p.split("=", 1) for p in row[1].split(";") if "=" in p)
            path = Path(row[0])
            out.append((path if path.is_absolute() else csv_path.parent / path, labels))
    return out
