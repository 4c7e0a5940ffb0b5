"""Real servers on 127.0.0.1 and an ephemeral port: uvicorn in a thread, and ``wavetrain serve`` in
its own process (whose memory must not grow over a few hundred requests)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.serve.conftest import LiveServer, http_request, multipart
from wavetrain.data.audio import read_audio
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.prediction import classify_samples
from wavetrain.serve import ServeConfig, create_app


def test_uvicorn_in_a_thread(gmm_service, gmm_file, demo_files):
    app = create_app(gmm_service, ServeConfig(max_bytes=1 << 20))
    model = load_model(gmm_file)
    with LiveServer(app) as srv:
        assert srv.request("GET", "/healthz").json()["status"] == "ok"
        for state, path in demo_files.items():
            body, ctype = multipart(path.read_bytes(), filename=path.name)
            r = srv.request("POST", "/v1/classify?top_k=3", body, {"Content-Type": ctype})
            assert r.status == 200, r.body
            res = r.json()
            (p,) = classify_samples(model, *read_audio(path))
            assert res["label"] == p.label == state
            assert {d["label"]: d["score"] for d in res["predictions"]} == {
                v: float(s) for v, s in zip(model.labels_, p.scores)}
        # a declared length over the limit: answered at once, the body never sent
        r = srv.request("POST", "/v1/classify", None, {"Content-Type": "audio/wav", "Content-Length": str(10 ** 9)})
        assert r.status == 413 and r.json()["status"] == 413
        r = srv.request("POST", "/v1/classify", b"abc", {"Content-Type": "video/mp4"})
        assert r.status == 415
        r = srv.request("POST", "/v1/classify", b"abc", {"Content-Type": "audio/wav"})
        assert r.status == 422
        assert srv.request("GET", "/healthz").json()["admitted"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(proc: subprocess.Popen, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "server exited"
        try:
            if http_request(port, "GET", "/healthz", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("wavetrain serve did not start")


def test_cli_server_memory_is_flat(gmm_file, demo_files, long_wav):
    """A few hundred requests (good and bad) to ``wavetrain serve``: its RSS stays put."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "wavetrain.cli.main", "serve", "-m", str(gmm_file), "--port",
                             str(port), "--max-bytes", "2M"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env)
    try:
        _wait_up(proc, port)
        wav = demo_files["bearing"].read_bytes()
        long = long_wav.read_bytes()
        body, ctype = multipart(wav)

        def burst(n: int) -> None:
            for i in range(n):
                if i % 10 == 9:
                    r = http_request(port, "POST", "/v1/classify", b"junk" * 100, {"Content-Type": "audio/wav"})
                    assert r.status == 422
                elif i % 10 == 8:
                    r = http_request(port, "POST", "/v1/classify?clip_ms=1000", long, {"Content-Type": "audio/wav"})
                    assert r.status == 200 and r.json()["windows"] == 10
                else:
                    r = http_request(port, "POST", "/v1/classify", body, {"Content-Type": ctype})
                    assert r.status == 200 and r.json()["label"] == "bearing"

        burst(60)
        rss0 = psutil.Process(proc.pid).memory_info().rss
        burst(300)
        rss1 = psutil.Process(proc.pid).memory_info().rss
        health = json.loads(http_request(port, "GET", "/healthz").body)
        assert health["served"] == 360 - 36 and health["admitted"] == 0
        print(f"server RSS {rss0 / 2 ** 20:.1f} MB -> {rss1 / 2 ** 20:.1f} MB over 300 requests")
        assert rss1 - rss0 < 20 << 20, f"RSS grew {(rss1 - rss0) / 2 ** 20:.1f} MB over 300 requests"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -15), proc.returncode


def test_cli_errors(capsys, tmp_path):
    from wavetrain.cli.main import main

    assert main(["serve", "-m", str(tmp_path / "none.wt"), "--port", "0"]) == 2
    assert "none.wt" in capsys.readouterr().err
    (tmp_path / "m.wt").write_bytes(b"x")
    assert main(["serve", "-m", str(Path(tmp_path / "m.wt")), "--max-bytes", "lots"]) == 2
    assert "--max-bytes" in capsys.readouterr().err
    assert main(["serve", "--help"]) == 0
    assert "/v1/classify" in capsys.readouterr().out
