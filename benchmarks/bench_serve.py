"""Load test of ``wavetrain serve``: requests per second, latency and errors under concurrent
clients, the server's memory before and after, and its overhead over ``classify_samples`` in process.

Model: a gmm (``components=3``) of the synthetic demo machine sounds (``wavetrain.demo``, 16 kHz),
trained in a temporary folder. Clips: 1 s and 10 s of demo recordings as 16-bit wav bodies.

1. ``wavetrain serve -m m.wt --workers 1 --queue 16`` in its own process (one compute thread),
   on 127.0.0.1 and a free port.
2. Sequential: one client posts each clip (``Content-Type: audio/wav``) back to back for a few
   seconds: the latency of one request, with nothing else running.
3. Concurrent: ``--clients`` threads (http.client, a kept-alive connection each) post 1 s and 10 s
   clips alternately for ``--seconds``: requests/s, p50/p99 latency per clip, errors (anything but
   200; the target is 0), the server's RSS before and after.
4. In process: the same clips decoded with soundfile and classified with ``classify_samples``
   back to back: the time of the work itself; the server's sequential latency over it is its
   overhead (HTTP, JSON, the worker thread hand-off).

Writes ``benchmarks/results/serve.json``.

    .venv/bin/python benchmarks/bench_serve.py [--clients 4] [--seconds 60] [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): 10 s of concurrent load, 2 s per sequential clip.
"""
from __future__ import annotations

import argparse
import http.client
import io
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))], 2)


def make_model_and_clips(work: Path) -> tuple[Path, dict[str, bytes]]:
    import numpy as np
    import soundfile as sf

    from wavetrain.demo import make_demo_dataset

    csv = make_demo_dataset(work / "demo", per_combo=2, speeds=(15.0, 30.0), snrs=(10.0, 20.0), seconds=1.0)
    model = work / "m.wt"
    _util.run_measured(_util.wavetrain_cmd() + ["train", "--data", str(csv), "--label", "state", "--model", "gmm",
                                                "--set", "components=3", "--no-cache", "--no-progress", "-o",
                                                str(model)])
    files = sorted((work / "demo").glob("*.wav"))
    parts = [sf.read(str(p), dtype="float32")[0] for p in files[:10]]
    clips = {}
    for name, x in (("1s", parts[0]), ("10s", np.concatenate(parts)[: 10 * 16000])):
        buf = io.BytesIO()
        sf.write(buf, x, 16000, format="WAV", subtype="PCM_16")
        clips[name] = buf.getvalue()
    return model, clips


class Client:
    """One kept-alive connection; reconnects after an error."""

    def __init__(self, port: int):
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> int:
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.conn.request("POST", "/v1/classify", body=body, headers={"Content-Type": "audio/wav"})
                r = self.conn.getresponse()
                r.read()
                return r.status
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def sequential(port: int, clips: dict[str, bytes], seconds: float) -> dict:
    out = {}
    c = Client(port)
    try:
        for name, body in clips.items():
            lat: list[float] = []
            c.post(body)                                   # warm
            end = time.perf_counter() + seconds
            while time.perf_counter() < end or len(lat) < 3:
                t = time.perf_counter()
                assert c.post(body) == 200
                lat.append(1000 * (time.perf_counter() - t))
            out[name] = {"requests": len(lat), "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99),
                         "mean_ms": round(statistics.fmean(lat), 2)}
    finally:
        c.close()
    return out


def concurrent(port: int, clips: dict[str, bytes], clients: int, seconds: float) -> dict:
    lat: dict[str, list[float]] = {k: [] for k in clips}
    errors: list[str] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds
    names = list(clips)

    def worker(i: int) -> None:
        c = Client(port)
        n = i
        try:
            while time.perf_counter() < stop:
                name = names[n % len(names)]
                n += 1
                t = time.perf_counter()
                try:
                    status = c.post(clips[name])
                except Exception as e:                  # counted, never fatal
                    status, err = -1, f"{type(e).__name__}: {e}"
                dt = 1000 * (time.perf_counter() - t)
                with lock:
                    if status == 200:
                        lat[name].append(dt)
                    else:
                        errors.append(err if status == -1 else f"HTTP {status}")
        finally:
            c.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = sum(len(v) for v in lat.values())
    audio_s = sum(len(lat[k]) * (1 if k == "1s" else 10) for k in lat)
    return {"clients": clients, "seconds": round(wall, 2), "requests": done, "errors": len(errors),
            "error_kinds": sorted(set(errors))[:5], "requests_per_s": round(done / wall, 2),
            "audio_s_per_s": round(audio_s / wall, 2),
            "per_clip": {k: {"requests": len(v), "p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99)} for k, v in lat.items()},
            "all_p50_ms": _pct([x for v in lat.values() for x in v], 50),
            "all_p99_ms": _pct([x for v in lat.values() for x in v], 99)}


def in_process(model_path: Path, clips: dict[str, bytes], seconds: float) -> dict:
    import soundfile as sf

    from wavetrain.models.modelfile import load_model
    from wavetrain.prediction import classify_samples

    model = load_model(model_path)
    out = {}
    for name, body in clips.items():
        times: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 3:
            t = time.perf_counter()
            x, rate = sf.read(io.BytesIO(body), dtype="float32")
            classify_samples(model, x, rate)
            times.append(1000 * (time.perf_counter() - t))
        out[name] = {"calls": len(times), "p50_ms": _pct(times, 50), "mean_ms": round(statistics.fmean(times), 2)}
    return out


def run_bench(work: Path, clients: int, seconds: float, seq_seconds: float) -> dict:
    import psutil

    model, clips = make_model_and_clips(work)
    port = _free_port()
    queue = max(16, 2 * clients)
    cmd = _util.wavetrain_cmd() + ["serve", "-m", str(model), "--port", str(port), "--workers", "1", "--queue",
                                   str(queue)]
    proc = subprocess.Popen(cmd, env=_util.single_thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("wavetrain serve did not start: "
                                       + (proc.stderr.read().decode() if proc.stderr else "")) from None
                time.sleep(0.1)
        server = psutil.Process(proc.pid)
        rss_start = server.memory_info().rss
        seq = sequential(port, clips, seq_seconds)
        rss_before = server.memory_info().rss
        conc = concurrent(port, clips, clients, seconds)
        rss_after = server.memory_info().rss
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    local = in_process(model, clips, seq_seconds)
    return {
        "server_cmd": " ".join(cmd[1:]), "clip_bytes": {k: len(v) for k, v in clips.items()},
        "sequential": seq, "concurrent": conc, "in_process": local,
        "server_rss_mb": {"started": round(rss_start / 2 ** 20, 1), "before_load": round(rss_before / 2 ** 20, 1),
                          "after_load": round(rss_after / 2 ** 20, 1),
                          "growth_under_load": round((rss_after - rss_before) / 2 ** 20, 1)},
        "server_over_in_process_p50": {k: round(seq[k]["p50_ms"] / local[k]["p50_ms"], 2) for k in clips},
        "server_overhead_p50_ms": {k: round(seq[k]["p50_ms"] - local[k]["p50_ms"], 2) for k in clips},
    }


def table(res: dict) -> str:
    s, c, p, r = res["sequential"], res["concurrent"], res["in_process"], res["server_over_in_process_p50"]
    rows = [[f"{k} clip: one client, p50 / p99 ms", f"{s[k]['p50_ms']} / {s[k]['p99_ms']}", p[k]["p50_ms"], r[k]]
            for k in s]
    rows += [[f"{k} clip: {c['clients']} clients, p50 / p99 ms",
              f"{c['per_clip'][k]['p50_ms']} / {c['per_clip'][k]['p99_ms']}", None, None] for k in c["per_clip"]]
    rows += [[f"{c['clients']} clients: requests/s (audio s/s)", f"{c['requests_per_s']} ({c['audio_s_per_s']})",
              None, None],
             ["errors", f"{c['errors']} of {c['requests'] + c['errors']}", None, None],
             ["server RSS MB before / after load", f"{res['server_rss_mb']['before_load']} / "
                                                   f"{res['server_rss_mb']['after_load']}", None, None]]
    head = (f"wavetrain serve (gmm of the demo machine sounds, 1 worker, one compute thread), "
            f"{c['seconds']} s of load; in process: soundfile + classify_samples\n\n")
    return head + _util.markdown_table(["", "server", "in process ms", "ratio"], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, help="concurrent load (default 60, 10 with --quick)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "serve.json",
                    help="JSON result (default benchmarks/results/serve.json; with --quick a file in /tmp)")
    ap.add_argument("--retable", action="store_true", help="only print the table of --out's JSON")
    args = ap.parse_args(argv)
    if args.retable:
        print(table(json.loads(args.out.read_text())))
        return 0
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("bench_serve: the serve extra (starlette, uvicorn) is not installed; skipping", file=sys.stderr)
        return 0
    quick = _util.quick_mode(args.quick)
    seconds = args.seconds or (10.0 if quick else 60.0)
    info = _util.machine_info()
    with tempfile.TemporaryDirectory(prefix="wt-bench-serve-") as tmp:
        res = run_bench(Path(tmp), args.clients, seconds, 2.0 if quick else 5.0)
    res = {"benchmark": "serve", "quick": quick, "machine": info, **res, "loadavg_end": _util.loadavg()}
    out = _util.quick_out(args.out, "serve") if quick else args.out
    _util.write_json(out, res)
    print(table(res))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
