"""Load test of ``wavetrain serve``: requests per second, latency and errors under concurrent
clients, the server's memory before and after, and its overhead over ``classify_samples`` in process.

Model: a gmm (``components=3``) of the synthetic demo machine sounds (``wavetrain.data.demo``, 16 kHz),
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

``--abuse``: the same server and clients, first under normal load alone, then while abusers
run for as long: ``--idle`` connections that never send a byte and ``--stalled`` uploads that
send their headers and no body (each reopened as soon as the server closes it), and a thread
that posts costly requests back to back (a one-minute clip every 10 ms over 70 s of audio, a
1 ms shift, 20,000 empty multipart parts; each must be refused). Reports requests/s, p50/p99
and errors of the normal requests in both phases, what the abusers got, the server's RSS (and its
peak, sampled every 50 ms), and one request of the largest audio ``--max-bytes`` admits against
the peak memory per worker the server states at start-up. Writes
``benchmarks/results/serve_abuse.json``.

``--load``: ``--load-clients`` (50) threads post a 1 s clip ``--load-requests`` (20) times each,
all starting together, to ``wavetrain serve --workers 1 --queue 100``: answered, p50/p99,
requests/s. Then, against a server with the default settings, ``--real`` (10) clients post the
1 s clip on a new connection each, back to back, for ``--seconds`` (25) alone; then
``--slow`` (100) connections each
upload a ``--slow-bytes`` (40 MB) body at ``--slow-rate`` (25 KB/s, above the server's rate
floor of 16 KiB/s), each reopened as soon as the server answers or closes it, and once they are
under way ``--real`` (10) clients post the 1 s clip on a new connection each, back to back, for
``--seconds`` (25): how many real requests were answered, their latency, what the others and the
uploads got. Everything comes from 127.0.0.1, so the slow uploads run a second time with
``--variant`` (default ``--uploads-per-client 1000``: no per-client limit in effect). And one
request of 100 s of audio in 10 ms windows (10,000) with ``smooth`` 1, 1000 and 10000: the
worker's time. Writes ``benchmarks/results/serve_load.json``.

    .venv/bin/python benchmarks/bench_serve.py [--clients 4] [--seconds 60] [--quick]
    .venv/bin/python benchmarks/bench_serve.py --abuse [--idle 60] [--stalled 12] [--seconds 30]
    .venv/bin/python benchmarks/bench_serve.py --load [--load-clients 50] [--slow 100] [--seconds 25]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): 10 s of concurrent load, 2 s per sequential clip.
"""
from __future__ import annotations

import argparse
import http.client
import io
import json
import re
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

    from wavetrain.data.demo import make_demo_dataset

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
    from wavetrain.pipeline.prediction import classify_samples

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
    queue = max(16, 2 * clients)
    extra = ["--workers", "1", "--queue", str(queue)]
    proc, port, _ = _start_server(model, *extra)
    try:
        server = psutil.Process(proc.pid)
        rss_start = server.memory_info().rss
        seq = sequential(port, clips, seq_seconds)
        rss_before = server.memory_info().rss
        conc = concurrent(port, clips, clients, seconds)
        rss_after = server.memory_info().rss
    finally:
        _stop(proc)
    local = in_process(model, clips, seq_seconds)
    return {
        "server_cmd": " ".join(["wavetrain", "serve", "-m", str(model), "--port", str(port), *extra]),
        "clip_bytes": {k: len(v) for k, v in clips.items()},
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


# ---- abuse ------------------------------------------------------------------------------------
def _start_server(model: Path, *extra: str) -> tuple[subprocess.Popen, int, str]:
    port = _free_port()
    cmd = _util.wavetrain_cmd() + ["serve", "-m", str(model), "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, env=_util.single_thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    line = proc.stderr.readline().decode() if proc.stderr else ""
    deadline = time.monotonic() + 60
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return proc, port, line.strip()
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                rest = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"wavetrain serve did not start: {line}{rest[-3000:]}") from None
            time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _RssSampler(threading.Thread):
    def __init__(self, pid: int):
        import psutil

        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except Exception:
                return
            self.stop.wait(0.05)


def _abusers(port: int, idle: int, stalled: int, costly: list[tuple[str, bytes, str]], stop: float) -> tuple[
        list[threading.Thread], dict]:
    """Threads that keep ``idle`` silent connections and ``stalled`` bodiless uploads open until
    ``stop``, and one that posts the ``costly`` requests in turn; their tallies in the dict."""
    tally: dict = {"idle_reopened": 0, "stalled_reopened": 0, "stalled_answers": {}, "costly_answers": {},
                   "costly_ms": []}
    lock = threading.Lock()

    def hold(kind: str, n: int) -> None:
        head = (b"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: audio/wav\r\n"
                b"Content-Length: 300000\r\n\r\n")
        socks: list[socket.socket | None] = [None] * n
        while time.perf_counter() < stop:
            for i in range(n):
                s = socks[i]
                if s is None:
                    try:
                        s = socket.create_connection(("127.0.0.1", port), timeout=5)
                        if kind == "stalled":
                            s.sendall(head)
                        s.setblocking(False)
                        socks[i] = s
                    except OSError:
                        continue
                    continue
                try:
                    data = s.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                s.close()
                socks[i] = None
                with lock:
                    tally[f"{kind}_reopened"] += 1
                    if kind == "stalled":
                        status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
                        tally["stalled_answers"][status] = tally["stalled_answers"].get(status, 0) + 1
            time.sleep(0.02)
        for s in socks:
            if s is not None:
                s.close()

    def costly_loop() -> None:
        i = 0
        while time.perf_counter() < stop:
            q, body, ctype = costly[i % len(costly)]
            i += 1
            t = time.perf_counter()
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("POST", "/v1/classify" + q, body=body, headers={"Content-Type": ctype})
                r = c.getresponse()
                r.read()
                status = str(r.status)
                c.close()
            except Exception as e:
                status = type(e).__name__
            with lock:
                tally["costly_answers"][status] = tally["costly_answers"].get(status, 0) + 1
                tally["costly_ms"].append(1000 * (time.perf_counter() - t))

    threads = [threading.Thread(target=hold, args=("idle", idle)), threading.Thread(target=hold,
                                                                                     args=("stalled", stalled)),
               threading.Thread(target=costly_loop)]
    return threads, tally


def _costly_requests() -> list[tuple[str, bytes, str]]:
    import numpy as np
    import soundfile as sf

    noise = np.random.default_rng(0).normal(0, 0.1, 70 * 16000).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, noise, 16000, format="FLAC")
    flac = buf.getvalue()
    boundary = "b0undary"
    parts = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\r\n" * 20_000
             + f"--{boundary}--\r\n").encode()
    return [("?clip_ms=60000&clip_shift_ms=10", flac, "audio/flac"),
            ("?clip_ms=30&clip_shift_ms=1", flac, "audio/flac"),
            ("", parts, f"multipart/form-data; boundary={boundary}")]


def _largest_request(model: Path, max_bytes: str) -> dict:
    """One request of the most samples ``--max-bytes`` admits (a compressible flac): the server's
    RSS growth against the peak memory per worker it states."""
    import numpy as np
    import soundfile as sf

    from wavetrain.cli.common import parse_size

    proc, port, line = _start_server(model, "--max-bytes", max_bytes)
    try:
        n = max(parse_size(max_bytes), 1 << 20)
        t = np.arange(n, dtype=np.float32) / 16000
        x = (0.01 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)   # quiet: compresses well
        buf = io.BytesIO()
        sf.write(buf, x, 16000, format="FLAC")
        body = buf.getvalue()
        small = io.BytesIO()
        sf.write(small, x[:16000], 16000, format="FLAC")
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        c.request("POST", "/v1/classify", body=small.getvalue(), headers={"Content-Type": "audio/flac"})
        c.getresponse().read()                   # warm: the decoder's and extractor's imports
        sampler = _RssSampler(proc.pid)
        before = sampler.proc.memory_info().rss
        sampler.start()
        t0 = time.perf_counter()
        c.request("POST", "/v1/classify", body=body, headers={"Content-Type": "audio/flac"})
        r = c.getresponse()
        r.read()
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
    finally:
        _stop(proc)
    stated = line.split("peak memory about ", 1)[1].split(" per worker", 1)[0] if "peak memory" in line else None
    return {"max_bytes": max_bytes, "samples": n, "flac_bytes": len(body), "status": r.status,
            "seconds": round(wall, 2), "rss_before_mb": round(before / 2 ** 20, 1),
            "rss_peak_mb": round(sampler.peak / 2 ** 20, 1),
            "growth_mb": round((sampler.peak - before) / 2 ** 20, 1), "stated_per_worker": stated,
            "start_up_line": line}


def run_abuse(work: Path, clients: int, seconds: float, idle: int, stalled: int, max_bytes: str) -> dict:
    model, clips = make_model_and_clips(work)
    queue = max(16, 2 * clients)
    proc, port, line = _start_server(model, "--workers", "1", "--queue", str(queue), "--timeout", "5")
    try:
        sampler = _RssSampler(proc.pid)
        sampler.start()
        rss_start = sampler.proc.memory_info().rss
        normal = concurrent(port, clips, clients, seconds)
        rss_normal = sampler.proc.memory_info().rss
        stop = time.perf_counter() + seconds + 2
        threads, tally = _abusers(port, idle, stalled, _costly_requests(), stop)
        for t in threads:
            t.start()
        time.sleep(1.0)                         # the abusers are in place
        abused = concurrent(port, clips, clients, seconds)
        for t in threads:
            t.join()
        rss_end = sampler.proc.memory_info().rss
        sampler.stop.set()
        health = json.loads(_get(port, "/healthz"))
    finally:
        _stop(proc)
    costly_ms = tally.pop("costly_ms")
    tally["costly_p50_ms"] = _pct(costly_ms, 50)
    tally["costly_p99_ms"] = _pct(costly_ms, 99)
    return {"server_start_up_line": line, "idle_connections": idle, "stalled_uploads": stalled,
            "normal_load": normal, "under_abuse": abused, "abusers": tally, "healthz_after": health,
            "server_rss_mb": {"started": round(rss_start / 2 ** 20, 1), "after_normal": round(rss_normal / 2 ** 20, 1),
                              "after_abuse": round(rss_end / 2 ** 20, 1), "peak": round(sampler.peak / 2 ** 20, 1)},
            "largest_request": _largest_request(model, max_bytes)}


def _get(port: int, path: str) -> bytes:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    return c.getresponse().read()


def abuse_table(res: dict) -> str:
    n, a, t = res["normal_load"], res["under_abuse"], res["abusers"]
    rows = [[f"{c['clients']} clients: requests/s", n["requests_per_s"], a["requests_per_s"]]
            for c in (n,)]
    rows += [["p50 / p99 ms (1 s and 10 s clips)", f"{n['all_p50_ms']} / {n['all_p99_ms']}",
              f"{a['all_p50_ms']} / {a['all_p99_ms']}"],
             ["errors", f"{n['errors']} of {n['requests'] + n['errors']}", f"{a['errors']} of "
                                                                        f"{a['requests'] + a['errors']}"],
             ["server RSS MB (end of phase; peak)", res["server_rss_mb"]["after_normal"],
              f"{res['server_rss_mb']['after_abuse']}; {res['server_rss_mb']['peak']}"]]
    big = res["largest_request"]
    return (_util.markdown_table(["", "normal load", f"with {res['idle_connections']} idle + "
                                                     f"{res['stalled_uploads']} stalled + costly"], rows)
            + f"\n\nstalled uploads answered {t['stalled_answers']} ({t['stalled_reopened']} reopened), idle "
              f"connections closed {t['idle_reopened']} times; costly requests answered {t['costly_answers']} "
              f"(p50 {t['costly_p50_ms']} ms, p99 {t['costly_p99_ms']} ms)\n"
              f"largest request ({big['samples']} samples, --max-bytes {big['max_bytes']}): HTTP {big['status']} in "
              f"{big['seconds']} s, RSS {big['rss_before_mb']} -> peak {big['rss_peak_mb']} MB (+{big['growth_mb']}); "
              f"stated per worker: {big['stated_per_worker']}")


# ---- load: many clients, and slow uploaders beside real clients ----------------------------------
def _one_request(port: int, body: bytes, timeout: float, why: dict | None = None) -> tuple[int | str, float]:
    """One request on a new connection: (status or the exception's name, seconds); the error
    message of each status other than 200 goes to ``why`` (counted by message)."""
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/classify", body=body, headers={"Content-Type": "audio/wav"})
        r = c.getresponse()
        data = r.read()
        status: int | str = r.status
        if status != 200 and why is not None:
            try:
                msg = re.sub(r"\d+", "N", json.loads(data)["error"])
            except Exception:
                msg = data[:80].decode(errors="replace")
            why[f"{status}: {msg}"] = why.get(f"{status}: {msg}", 0) + 1
    except Exception as e:                      # counted, never fatal
        status = type(e).__name__
    finally:
        c.close()
    return status, time.perf_counter() - t


def many_clients(port: int, body: bytes, clients: int, requests: int) -> dict:
    """``clients`` threads, each posting ``body`` ``requests`` times on a kept-alive connection
    (all start together): latency of the answered requests, errors, requests/s."""
    lat: list[float] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()
    go = threading.Barrier(clients + 1)

    def worker() -> None:
        c = Client(port)
        go.wait()
        try:
            for _ in range(requests):
                t = time.perf_counter()
                try:
                    status: int | str = c.post(body)
                except Exception as e:
                    status = type(e).__name__
                dt = 1000 * (time.perf_counter() - t)
                with lock:
                    if status == 200:
                        lat.append(dt)
                    else:
                        errors[str(status)] = errors.get(str(status), 0) + 1
        finally:
            c.close()

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests_each": requests, "answered": len(lat), "errors": sum(errors.values()),
            "error_kinds": errors, "seconds": round(wall, 2), "requests_per_s": round(len(lat) / wall, 2),
            "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), "max_ms": _pct(lat, 100)}


class _SlowUploaders(threading.Thread):
    """``n`` connections, each posting a ``size``-byte body at ``rate`` bytes/s (above the
    server's rate floor), reopened as soon as the server answers or closes one."""

    def __init__(self, port: int, n: int, size: int, rate: int):
        super().__init__(daemon=True)
        self.port, self.n, self.size, self.rate = port, n, size, rate
        self.stop = threading.Event()
        self.answers: dict[str, int] = {}
        self.opened = 0
        self.bytes_sent = 0
        self.held_s: list[float] = []            # how long the server kept each closed upload

    def _open(self) -> tuple[socket.socket, float, int] | None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(f"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: audio/wav\r\n"
                      f"Content-Length: {self.size}\r\n\r\n".encode())
            s.setblocking(False)
        except OSError:
            return None
        self.opened += 1
        return s, time.perf_counter(), 0

    def run(self) -> None:
        tick = 0.1
        piece = b"\0" * max(1, int(self.rate * tick))
        socks: list[tuple[socket.socket, float, int] | None] = [None] * self.n
        while not self.stop.is_set():
            t_tick = time.perf_counter()
            for i in range(self.n):
                if socks[i] is None:
                    socks[i] = self._open()
                    continue
                s, t0, sent = socks[i]  # type: ignore[misc]
                answer = None
                try:
                    data = s.recv(4096)
                    answer = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
                except BlockingIOError:
                    try:
                        k = s.send(piece[: self.size - sent]) if sent < self.size else 0
                        sent += k
                        self.bytes_sent += k
                        socks[i] = (s, t0, sent)
                    except BlockingIOError:
                        pass
                    except OSError:
                        answer = "reset"
                except OSError:
                    answer = "reset"
                if answer is not None:
                    s.close()
                    socks[i] = None
                    self.answers[answer] = self.answers.get(answer, 0) + 1
                    self.held_s.append(time.perf_counter() - t0)
            self.stop.wait(max(0.0, tick - (time.perf_counter() - t_tick)))
        for x in socks:
            if x is not None:
                x[0].close()


def slow_uploads(port: int, body: bytes, n: int, size: int, rate: int, real: int, seconds: float,
                 health_port: int) -> dict:
    """``n`` slow uploaders (:class:`_SlowUploaders`) and, once they are in place, ``real`` clients
    posting ``body`` on a new connection each, back to back, for ``seconds``: how many real
    requests were answered, their latency, what else they got."""
    up = _SlowUploaders(port, n, size, rate)
    if n:
        up.start()
        time.sleep(2.0)                            # the uploads are under way
    health_during = json.loads(_get(health_port, "/healthz")) if _ping(health_port) else None
    lat: list[float] = []
    other: dict[str, int] = {}
    why: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < stop:
            status, dt = _one_request(port, body, timeout=10, why=why)
            with lock:
                if status == 200:
                    lat.append(1000 * dt)
                else:
                    other[str(status)] = other.get(str(status), 0) + 1
            if status != 200:
                time.sleep(0.1)                    # as a client would, before it tries again

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(real)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    up.stop.set()
    if n:
        up.join()
    attempts = len(lat) + sum(other.values())
    return {"slow_uploaders": n, "slow_body_bytes": size, "slow_rate_bytes_per_s": rate, "real_clients": real,
            "seconds": round(wall, 2), "real_requests": attempts, "real_answered": len(lat),
            "real_not_answered": other, "real_refusals": why, "real_p50_ms": _pct(lat, 50),
            "real_p99_ms": _pct(lat, 99),
            "real_answered_per_s": round(len(lat) / wall, 2),
            "uploads_opened": up.opened, "upload_answers": up.answers, "upload_bytes_sent": up.bytes_sent,
            "upload_held_s_p50": _pct(up.held_s, 50), "upload_held_s_max": _pct(up.held_s, 100),
            "healthz_during": health_during}


def _ping(port: int) -> bool:
    try:
        _get(port, "/healthz")
        return True
    except Exception:
        return False


def smoothing_cost(port: int, clips: dict[str, bytes], smooths: tuple[int, ...] = (1, 1000, 10_000)) -> dict:
    """One request of 100 s of audio cut into 10 ms windows (10,000 of them) per ``smooth`` value:
    its status, wall time and the server's own timings."""
    import numpy as np
    import soundfile as sf

    x, rate = sf.read(io.BytesIO(clips["10s"]), dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, np.tile(x, 10), rate, format="WAV", subtype="PCM_16")
    body = buf.getvalue()
    out = {}
    for n in smooths:
        for data in (body, clips["1s"]):           # the 1 s clip: the answer of a request refused unread
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            t = time.perf_counter()
            try:
                c.request("POST", f"/v1/classify?clip_ms=10&clip_shift_ms=10&top_k=1&smooth={n}", body=data,
                          headers={"Content-Type": "audio/wav"})
                r = c.getresponse()
                res = json.loads(r.read())
            except OSError:                            # refused before its body was read
                continue
            finally:
                c.close()
            wall = time.perf_counter() - t
            out[str(n)] = {"status": r.status, "seconds": round(wall, 3), "windows": res.get("windows"),
                           "timings": res.get("timings"), "error": res.get("error"),
                           "audio_s": 100.0 if data is body else 1.0}
            break
    return {"audio_s": round(len(x) * 10 / rate, 1), "by_smooth": out}


def run_load(work: Path, clients: int, requests: int, slow: int, slow_bytes: int, slow_rate: int, real: int,
             seconds: float, variant: list[str] | None = None) -> dict:
    model, clips = make_model_and_clips(work)
    body = clips["1s"]
    queue = max(16, 2 * clients)
    extra = ["--workers", "1", "--queue", str(queue)]
    proc, port, line = _start_server(model, *extra)
    try:
        _one_request(port, body, 30)                       # warm
        many = many_clients(port, body, clients, requests)
    finally:
        _stop(proc)
    proc, port2, line2 = _start_server(model)
    try:
        _one_request(port2, body, 30)
        smooth = smoothing_cost(port2, clips)
        alone = slow_uploads(port2, body, 0, slow_bytes, slow_rate, real, seconds, port2)
        slow_res = slow_uploads(port2, body, slow, slow_bytes, slow_rate, real, seconds, port2)
        health = json.loads(_get(port2, "/healthz")) if _ping(port2) else None
    finally:
        _stop(proc)
    out = {"clip_bytes": len(body),
           "many_clients": {"server_cmd": f"wavetrain serve -m m.wt {' '.join(extra)}", "start_up_line": line,
                            **many},
           "real_alone": {"server_cmd": "wavetrain serve -m m.wt (defaults)", **alone},
           "slow_uploads": {"server_cmd": "wavetrain serve -m m.wt (defaults)", "start_up_line": line2, **slow_res,
                            "healthz_after": health},
           "smoothing": smooth}
    if variant:
        proc, port3, line3 = _start_server(model, *variant)
        try:
            _one_request(port3, body, 30)
            res3 = slow_uploads(port3, body, slow, slow_bytes, slow_rate, real, seconds, port3)
            health = json.loads(_get(port3, "/healthz")) if _ping(port3) else None
        finally:
            _stop(proc)
        out["slow_uploads_variant"] = {"server_cmd": f"wavetrain serve -m m.wt {' '.join(variant)}",
                                       "start_up_line": line3, **res3, "healthz_after": health}
    return out


def load_table(res: dict) -> str:
    m, s = res["many_clients"], res["slow_uploads"]
    rows = [[f"{m['clients']} clients x {m['requests_each']} requests (`{m['server_cmd']}`)",
             f"{m['answered']} of {m['answered'] + m['errors']}", f"{m['p50_ms']} / {m['p99_ms']}",
             m["requests_per_s"], m["error_kinds"] or "none"]]
    for v in (res.get("real_alone"), s, res.get("slow_uploads_variant")):
        if v:
            beside = (f"beside {v['slow_uploaders']} uploaders of {v['slow_body_bytes'] / 1e6:g} MB at "
                      f"{v['slow_rate_bytes_per_s'] / 1e3:g} KB/s" if v["slow_uploaders"] else "alone")
            rows.append([f"{v['real_clients']} real clients {beside}, {v['seconds']} s (`{v['server_cmd']}`)",
                         f"{v['real_answered']} of {v['real_requests']}", f"{v['real_p50_ms']} / {v['real_p99_ms']}",
                         v["real_answered_per_s"], v["real_not_answered"] or "none"])
    sm = res.get("smoothing")
    lines = "".join(f"\nsmooth={n}: HTTP {v['status']} in {v['seconds']} s" for n, v in sm["by_smooth"].items()) \
        if sm else ""
    ups = "".join(f"\nslow uploads ({v['server_cmd']}): {v['uploads_opened']} opened, answered "
                  f"{v['upload_answers']}, held p50 {v['upload_held_s_p50']} s (max {v['upload_held_s_max']} s), "
                  f"{v['upload_bytes_sent'] / 1e6:.1f} MB sent; real requests refused: {v.get('real_refusals')}"
                  for v in (s, res.get("slow_uploads_variant")) if v)
    return (_util.markdown_table(["", "answered", "p50 / p99 ms", "answered/s", "not answered"], rows)
            + "\n" + ups
              + (f"\n{sm['audio_s']} s of audio in 10 ms windows:" + lines if sm else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, help="concurrent load (default 60, 10 with --quick)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "serve.json",
                    help="JSON result (default benchmarks/results/serve.json; with --quick a file in /tmp)")
    ap.add_argument("--retable", action="store_true", help="only print the table of --out's JSON")
    ap.add_argument("--abuse", action="store_true", help="normal load alone, then with abusers (see above)")
    ap.add_argument("--idle", type=int, default=60, help="--abuse: idle connections (default 60)")
    ap.add_argument("--stalled", type=int, default=12, help="--abuse: stalled uploads (default 12)")
    ap.add_argument("--max-bytes", default="8M", help="--abuse: --max-bytes of the largest request (default 8M)")
    ap.add_argument("--load", action="store_true",
                    help="many clients, then slow uploaders beside real clients (see above)")
    ap.add_argument("--load-clients", type=int, default=50, help="--load: clients posting together (default 50)")
    ap.add_argument("--load-requests", type=int, default=20, help="--load: requests per client (default 20)")
    ap.add_argument("--slow", type=int, default=100, help="--load: slow uploaders (default 100)")
    ap.add_argument("--slow-bytes", type=int, default=40_000_000, help="--load: body of each (default 40 MB)")
    ap.add_argument("--slow-rate", type=int, default=25_000, help="--load: bytes/s of each (default 25,000)")
    ap.add_argument("--real", type=int, default=10, help="--load: real clients beside them (default 10)")
    ap.add_argument("--variant", default="--uploads-per-client 1000",
                    help="--load: server options of a second run of the slow uploads ('' for none; default: "
                         "without the per-client limit, all clients sharing 127.0.0.1)")
    args = ap.parse_args(argv)
    name = "serve_load" if args.load else "serve_abuse" if args.abuse else "serve"
    if args.out == _util.RESULTS / "serve.json":
        args.out = _util.RESULTS / f"{name}.json"
    show = load_table if args.load else abuse_table if args.abuse else table
    if args.retable:
        print(show(json.loads(args.out.read_text())))
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
        if args.load:
            res = run_load(Path(tmp), args.load_clients, args.load_requests, args.slow, args.slow_bytes,
                           args.slow_rate, args.real, args.seconds or (10.0 if quick else 25.0),
                           args.variant.split())
        elif args.abuse:
            res = run_abuse(Path(tmp), args.clients, args.seconds or (10.0 if quick else 30.0), args.idle,
                            args.stalled, args.max_bytes)
        else:
            res = run_bench(Path(tmp), args.clients, seconds, 2.0 if quick else 5.0)
    res = {"benchmark": name, "quick": quick, "machine": info, **res, "loadavg_end": _util.loadavg()}
    out = _util.quick_out(args.out, name) if quick else args.out
    _util.write_json(out, res)
    print(show(res))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
