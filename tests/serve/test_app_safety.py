"""The app's bounds in process (ASGI calls, no network): per-request cost limits, the multipart part
cap, chunked scoring that stops when the client goes, the Host check and security headers, a
detector's whole-input answer and the refusal of adapting detectors."""
from __future__ import annotations

import asyncio
import logging
import threading
import uuid

import numpy as np
import pytest

from tests.serve.conftest import _train, asgi, asgi_async, multipart, wav_bytes
from wavetrain.core.errors import UserError
from wavetrain.data.audio import read_audio
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.prediction import classify_samples
from wavetrain.serve import ModelService, ServeConfig, create_app, inference


def _post(app, body: bytes, q: str = "", ctype: str = "audio/wav", **kw):
    return asgi(app, "POST", "/v1/classify" + q, body, {"content-type": ctype}, **kw)


def test_hop_finer_than_a_frame_is_a_400(gmm_app, gmm_service, demo_files):
    shift = gmm_service.frame_shift_ms()
    assert shift > 1
    wav = demo_files["healthy"].read_bytes()
    for q in ("?clip_ms=30&clip_shift_ms=1", "?clip_ms=1"):
        r = _post(gmm_app, wav, q)
        assert r.status == 400 and f"{shift:g} ms apart" in r.json()["error"], r.body
        assert r.chunks_read == 0                     # refused before the body is read
    assert _post(gmm_app, wav, f"?clip_ms=30&clip_shift_ms={int(np.ceil(shift))}").status == 200


def test_too_many_windows_or_frames_is_a_422_naming_the_limits(gmm_service, long_wav, monkeypatch):
    app = create_app(gmm_service, ServeConfig(max_windows=500))
    # the tester's case: a one-minute clip every 10 ms (70 s: ~1,000 windows of 6,000 frames each),
    # refused from the file's header, before its samples are decoded
    noise = np.random.default_rng(0).normal(0, 0.1, 70 * 16000).astype(np.float32)
    with monkeypatch.context() as m:
        m.setattr("soundfile.SoundFile.read", lambda *a, **k: pytest.fail("decoded"))
        r = _post(app, wav_bytes(noise, fmt="FLAC"), "?clip_ms=60000&clip_shift_ms=10", "audio/flac")
    err = r.json()["error"]
    assert r.status == 422 and "at most 500 windows of at most 4000000 frames" in err, err
    assert "windows of 6000 feature frames" in err
    body = long_wav.read_bytes()                       # 10 s
    r = _post(app, body, "?clip_ms=100&clip_shift_ms=10")  # ~1,000 short windows: too many
    assert r.status == 422 and "990 windows of 10 feature frames" in r.json()["error"]
    assert _post(app, body, "?clip_ms=1000&clip_shift_ms=500").status == 200


def test_answer_size_is_bounded(knn_file, long_wav):
    service = ModelService.from_file(knn_file)
    app = create_app(service, ServeConfig(max_answer_bytes=20_000))
    r = _post(app, long_wav.read_bytes(), "?clip_ms=100&top_k=5")
    assert r.status == 422 and "answers at most 20000 bytes" in r.json()["error"]
    r = _post(app, long_wav.read_bytes(), "?clip_ms=1000&top_k=5")
    assert r.status == 200 and len(r.body) < 20_000


def test_resampling_up_is_bounded(gmm_service):
    app = create_app(gmm_service, ServeConfig(max_bytes=1 << 20))     # 1 Mi samples
    pcm = np.zeros(400_000, "<i2").tobytes()                        # 400 k samples at 4 kHz: 1.6 M at 16 kHz
    r = _post(app, pcm, "?sample_rate=4000", "application/octet-stream")
    assert r.status == 413 and "resampled" in r.json()["error"]


def test_multipart_parts_are_capped(gmm_app, demo_files):
    boundary = uuid.uuid4().hex
    empty = f"--{boundary}\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\r\n".encode()
    body, _ = multipart(demo_files["healthy"].read_bytes())
    many = empty * 20_000 + f"--{boundary}--\r\n".encode()
    r = _post(gmm_app, many, ctype=f"multipart/form-data; boundary={boundary}")
    assert r.status == 400 and "more than 16 parts" in r.json()["error"]


def test_chunked_scoring_gives_the_same_answers(gmm_service, gmm_file, long_wav, monkeypatch):
    monkeypatch.setattr(inference, "CHUNK_FRAMES", 250)         # 2 windows of 100 frames per chunk
    calls = []
    extracts = []
    import wavetrain.pipeline.prediction as prediction

    real_extract = prediction.extract
    monkeypatch.setattr(prediction, "extract", lambda *a, **k: extracts.append(1) or real_extract(*a, **k))
    service = ModelService.from_file(gmm_file)
    score = service.model.predict_scores
    service.model.predict_scores = lambda grams: calls.append(len(grams)) or score(grams)
    r = _post(create_app(service, ServeConfig()), long_wav.read_bytes(), "?clip_ms=1000&clip_shift_ms=500")
    assert r.status == 200
    res = r.json()
    assert extracts == [1]                                       # one gram per request
    assert calls == [2] * 9 + [1] and res["windows"] == 19
    model = load_model(gmm_file)
    preds = classify_samples(model, *read_audio(long_wav), clip_ms=1000, shift_ms=500)
    for seg, p in zip(res["segments"], preds):
        assert seg["label"] == p.label
        got = {d["label"]: d["score"] for d in seg["predictions"]}
        assert got == pytest.approx({v: float(s) for v, s in zip(model.labels_, p.scores)}, rel=1e-9)


def _scoring_with(service: ModelService, before) -> ModelService:
    """A service whose model calls ``before(grams)`` before it scores each chunk of windows (to
    make the scoring slow, block or fail)."""
    model = service.model

    class Wrapped(type(model)):
        def predict_scores(self, grams):
            before(grams)
            return super().predict_scores(grams)

    wrapped = object.__new__(Wrapped)
    wrapped.__dict__.update(model.__dict__)
    return ModelService(wrapped, model_id="m")


def test_a_client_that_leaves_stops_the_work(gmm_service, long_wav, monkeypatch, caplog):
    """The client disconnects while its windows are scored: the work stops at the next chunk,
    one INFO line is logged and no error."""
    monkeypatch.setattr(inference, "CHUNK_FRAMES", 100)          # one window per chunk
    started, go = threading.Event(), threading.Event()
    calls = []

    def slow(grams):                  # the first chunk waits until the client has gone
        calls.append(len(grams))
        started.set()
        assert go.wait(20)

    app = create_app(_scoring_with(gmm_service, slow), ServeConfig())
    body = long_wav.read_bytes()
    sent: list[dict] = []

    async def scenario():
        fed = [False]

        async def receive():
            if not fed[0]:
                fed[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            while not started.is_set():
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/classify", "raw_path": b"/v1/classify",
                 "query_string": b"clip_ms=1000", "root_path": "",
                 "headers": [(b"content-type", b"audio/wav"), (b"host", b"127.0.0.1:8000")],
                 "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 8000)}
        await app(scope, receive, send)
        server = app.state.server
        assert server.admitted == 1 and server.buffered == len(body)     # held while the work runs
        go.set()
        await asyncio.wait_for(asyncio.wrap_future(server.workers.submit(lambda: None)), 20)  # the worker is done
        for _ in range(3):
            await asyncio.sleep(0)

    with caplog.at_level(logging.INFO, logger="wavetrain.serve"):
        asyncio.run(scenario())
    assert calls == [1]                                           # 10 windows: only the first was scored
    server = app.state.server
    assert server.disconnected == 1 and server.admitted == 0 and server.buffered == 0
    records = [r for r in caplog.records if r.name.startswith("wavetrain.serve")]
    assert [r.levelno for r in records] == [logging.INFO] and "went away" in records[0].getMessage()
    assert all(r.exc_info is None for r in records)


def test_host_header_and_security_headers(gmm_service):
    app = create_app(gmm_service, ServeConfig(allowed_hosts=("localhost", "127.0.0.1", "::1", "box.lan")))
    for host in ("127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:8000", "box.lan:9", "box.lan",
                 "localhost.:8000", "box.lan."):
        r = asgi(app, "GET", "/healthz", headers={"host": host})
        assert r.status == 200, host
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "[::2]:80", "[::1]evil.example",
                 "[::1]:80x", "localhost:evil"):
        r = asgi(app, "GET", "/", headers={"host": host})
        assert r.status == 421 and r.json()["status"] == 421 and "not served here" in r.json()["error"], host
        assert r.headers["content-type"] == "application/json"
    page = asgi(app, "GET", "/", headers={"host": "127.0.0.1:8000"})
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    anyhost = create_app(gmm_service, ServeConfig(allowed_hosts=None))
    assert asgi(anyhost, "GET", "/healthz", headers={"host": "evil.example"}).status == 200


def test_detector_decides_a_whole_input_as_its_windows(detector_file, demo_files):
    """The input is anomalous when one of its windows is (each against the per-window threshold,
    as ``wavetrain classify`` prints them); a mean would hide one anomalous window."""
    service = ModelService.from_file(detector_file)
    app = create_app(service, ServeConfig())
    x, rate = read_audio(demo_files["healthy"])
    y, _ = read_audio(demo_files["bearing"])
    mixed = np.concatenate([x, x, x, y[: len(y) // 2]])          # 3.5 s, the last half second a fault
    r = _post(app, wav_bytes(mixed, rate), "?clip_ms=500")
    res = r.json()
    flags = [s["anomaly"] for s in res["segments"]]
    scores = [s["anomaly_score"] for s in res["segments"]]
    assert any(flags) and not all(flags)
    assert res["anomaly"] is True and res["label"] == "anomaly"
    assert res["anomaly_score"] == max(scores) > res["threshold"]


def test_adapting_detector_is_refused(demo_csv, tmp_path):
    path = _train(demo_csv, tmp_path / "nd.wt", "--label", "state", "--normal", "healthy", "--model",
                  "normal-dist", "--set", "adapt=10")
    with pytest.raises(UserError, match="adapt=10"):
        ModelService.from_file(path)


def test_a_refused_request_frees_its_audio_at_once(gmm_service):
    """A request refused after decoding leaves nothing behind for the garbage collector (its
    audio would otherwise live in a reference cycle until the next full collection)."""
    import gc
    import tracemalloc

    app = create_app(gmm_service, ServeConfig())
    pcm = np.random.default_rng(0).integers(-3000, 3000, 70 * 16000).astype("<i2").tobytes()   # decoded, refused
    q = "?clip_ms=60000&clip_shift_ms=10&sample_rate=16000"
    assert _post(app, pcm, q, "application/octet-stream").status == 422
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(5):
            assert _post(app, pcm, q, "application/octet-stream").status == 422
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        gc.enable()
    # one request's samples may still be referenced (the last worker's frames); five were before
    assert kept < 8 << 20, f"{kept / 2 ** 20:.1f} MB kept after 5 refused requests (4.5 MB of samples each)"


def test_an_upload_that_trickles_is_answered_408(gmm_service):
    """Bytes that keep coming, but slower than ``min_upload_rate``: 408 once the allowance (the
    read timeout plus the bytes at that rate) is spent; the body is not read to its end."""
    app = create_app(gmm_service, ServeConfig(read_timeout_s=0.3, min_upload_rate=1000))
    sent: list[dict] = []
    fed = [0]

    async def receive():
        await asyncio.sleep(0.05)                # 10 bytes every 50 ms: 200 bytes/s
        fed[0] += 1
        return {"type": "http.request", "body": b"x" * 10, "more_body": fed[0] < 200}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/classify", "raw_path": b"/v1/classify", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"audio/wav")], "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 80)}
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    assert start["status"] == 408 and (b"connection", b"close") in start["headers"]
    assert fed[0] < 200 and "stopped arriving" in sent[1]["body"].decode()


def test_cross_origin_requests_are_refused_before_any_work(gmm_service, demo_files, monkeypatch):
    """A page of another site posting a form (or calling fetch) sends its Origin: 403 before the
    body is read or the model called; the server's own page (its Origin is the Host it was sent
    to) and clients without an Origin are answered. A CORS preflight is answered 204 with no
    Access-Control-Allow-* header (the browser then sends nothing), or 403 from another origin."""
    app = create_app(gmm_service, ServeConfig())
    wav = demo_files["healthy"].read_bytes()
    calls = []
    monkeypatch.setattr(gmm_service, "classify", lambda *a, **k: calls.append(1) or pytest.fail("computed"))
    for origin in ("http://evil.example", "http://127.0.0.1:9000", "null", "https://127.0.0.1:8000.evil.example",
                   "http://localhost:8000", "file://"):
        r = asgi(app, "POST", "/v1/classify", wav, {"content-type": "audio/wav", "host": "127.0.0.1:8000",
                                                    "origin": origin})
        assert r.status == 403 and r.json()["status"] == 403 and "cross-origin" in r.json()["error"], origin
        assert r.chunks_read == 0 and r.headers["connection"] == "close"
        pre = asgi(app, "OPTIONS", "/v1/classify", headers={"host": "127.0.0.1:8000", "origin": origin,
                                                            "access-control-request-method": "POST"})
        assert pre.status == 403, origin
        assert not any(k.startswith("access-control-") for k in pre.headers)
    assert calls == []
    r = asgi(app, "GET", "/healthz", headers={"host": "127.0.0.1:8000", "origin": "http://evil.example"})
    assert r.status == 403
    pre = asgi(app, "OPTIONS", "/v1/classify", headers={"host": "127.0.0.1:8000"})
    assert pre.status == 204 and pre.headers["allow"] == "GET, POST, OPTIONS" and pre.body == b""
    assert not any(k.startswith("access-control-") for k in pre.headers)
    monkeypatch.undo()
    for origin in ("http://127.0.0.1:8000", "HTTP://127.0.0.1:8000", None):
        hdrs = {"content-type": "audio/wav", "host": "127.0.0.1:8000", **({"origin": origin} if origin else {})}
        r = asgi(app, "POST", "/v1/classify", wav, hdrs)
        assert r.status == 200 and r.json()["label"] == "healthy", origin
    # behind a TLS proxy: the page's origin is https on the default port, the Host has no port
    r = asgi(create_app(gmm_service, ServeConfig(allowed_hosts=None)), "POST", "/v1/classify", wav,
             {"content-type": "audio/wav", "host": "box.example", "origin": "https://box.example"})
    assert r.status == 200


def test_a_multipart_boundary_out_of_rfc_2046_is_a_400_without_a_traceback(gmm_app, demo_files, caplog):
    wav = demo_files["healthy"].read_bytes()
    for boundary in ("x" * 257, "x" * 300, "x" * 71, "a b ", "b\u00e9"):
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
                .encode() + wav + f"\r\n--{boundary}--\r\n".encode())
        with caplog.at_level(logging.INFO):
            r = _post(gmm_app, body, ctype=f"multipart/form-data; boundary=\"{boundary}\"".encode()
                      .decode("latin-1"))
        assert r.status == 400 and "multipart boundary" in r.json()["error"] and "RFC 2046" in r.json()["error"]
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR or rec.exc_info]
    body, ctype = multipart(wav)
    boundary = "-" * 20 + "Ab0'()+_,-./:=? z" + "x" * 33                   # 70 characters: accepted
    assert len(boundary) == 70
    ok = body.replace(ctype.split("=", 1)[1].encode(), boundary.encode())
    assert _post(gmm_app, ok, ctype=f"multipart/form-data; boundary=\"{boundary}\"").status == 200


class _Blocking:
    """A model's scoring that waits for ``release`` on its first ``block`` calls (a call that
    never returns until then) and scores normally after."""

    def __init__(self, service: ModelService, block: int = 1):
        self.release, self.started = threading.Event(), threading.Event()
        self.calls = 0

        def blocking(grams):
            self.calls += 1
            if self.calls <= block:
                self.started.set()
                self.release.wait(60)

        self.service = _scoring_with(service, blocking)


def test_a_work_past_its_deadline_is_answered_504_and_its_worker_replaced(gmm_service, demo_files, caplog):
    """The model's scoring never returns (until the test releases it): the request is answered
    504 at the work deadline, its thread is retired and another takes its place, so that the
    next request is answered while the first is still stuck; the stuck one ends in time."""
    slow = _Blocking(gmm_service)
    app = create_app(slow.service, ServeConfig(work_timeout_s=0.5))
    wav = demo_files["healthy"].read_bytes()
    server = app.state.server
    hdrs = {"content-type": "audio/wav"}

    async def scenario():
        try:
            r = await asgi_async(app, "POST", "/v1/classify", wav, hdrs)
            assert r.status == 504 and r.json()["status"] == 504 and "within 0.5 s" in r.json()["error"]
            assert slow.started.is_set() and server.workers.stuck == 1 and server.timed_out == 1
            health = (await asgi_async(app, "GET", "/healthz")).json()
            assert health["workers_stuck"] == 1 and health["timed_out"] == 1
            r = await asgi_async(app, "POST", "/v1/classify", wav, hdrs)       # a new thread serves it
            assert r.status == 200 and r.json()["label"] == "healthy"
            assert server.admitted == 1                  # the stuck work keeps its slot and body
        finally:
            slow.release.set()
        for _ in range(500):
            if server.workers.stuck == 0 and server.admitted == 0:
                break
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.WARNING, logger="wavetrain.serve"):
        asyncio.run(scenario())
    assert not [rec for rec in caplog.records if rec.exc_info]
    assert server.workers.stuck == 0 and server.admitted == 0 and server.buffered == 0
    assert server.workers.serving == 1


def test_a_long_work_stops_at_its_deadline(gmm_service, long_wav, monkeypatch):
    """Work that goes on chunk after chunk (each 0.2 s) is stopped at the next chunk after the
    deadline: few chunks are scored, and no thread stays stuck."""
    monkeypatch.setattr(inference, "CHUNK_FRAMES", 100)          # one window per chunk
    calls = []

    def slow(grams):
        calls.append(1)
        threading.Event().wait(0.2)

    app = create_app(_scoring_with(gmm_service, slow), ServeConfig(work_timeout_s=0.5))
    server = app.state.server

    async def scenario():
        r = await asgi_async(app, "POST", "/v1/classify?clip_ms=500", long_wav.read_bytes(),
                             {"content-type": "audio/wav"})         # 19 windows: ~4 s of work
        assert r.status == 504
        for _ in range(500):
            if server.admitted == 0:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert server.admitted == 0 and server.workers.stuck == 0 and len(calls) < 10


def test_smooth_beyond_its_bound_is_refused(gmm_app, gmm_file, demo_files, capsys):
    from wavetrain.cli.main import main

    r = _post(gmm_app, demo_files["healthy"].read_bytes(), "?smooth=1001")
    assert r.status == 400 and r.json()["error"] == "smooth=1001: expected 1 to 1000"
    assert _post(gmm_app, demo_files["healthy"].read_bytes(), "?smooth=1000").status == 200
    assert main(["serve", "-m", str(gmm_file), "--port", "0", "--smooth", "1001"]) == 2
    err = capsys.readouterr().err
    assert "smooth=1001: expected windows 1 to 1000" in err and len(err.strip().splitlines()) == 1, err


def test_a_model_that_fails_on_a_request_is_a_500_in_one_line(gmm_service, demo_files, caplog):
    """A model's own failure on a request (an exported graph's run past its deadline raises a
    ModelFileError) is answered 500 with its reason, logged in one line without a traceback; the
    server answers the next request."""
    from wavetrain.core.errors import ModelFileError

    calls = []

    def failing(grams):
        calls.append(1)
        if len(calls) == 1:
            raise ModelFileError("m.onnx: a run of the graph took longer than 30 s and was stopped")

    app = create_app(_scoring_with(gmm_service, failing), ServeConfig())
    with caplog.at_level(logging.INFO, logger="wavetrain.serve"):
        r = _post(app, demo_files["healthy"].read_bytes())
    assert r.status == 500 and "took longer than 30 s" in r.json()["error"]
    assert [rec.levelno for rec in caplog.records if rec.name.startswith("wavetrain.serve")] == [logging.WARNING]
    assert not [rec for rec in caplog.records if rec.exc_info]
    assert _post(app, demo_files["healthy"].read_bytes()).status == 200
