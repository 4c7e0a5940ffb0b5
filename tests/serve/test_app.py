"""The app in process (ASGI calls, no network): answers equal ``classify_samples``, every input
kind, every error status, the bounded queue, and a failing request that leaves the server up."""
from __future__ import annotations

import asyncio
import hashlib
import threading

import numpy as np
import pytest
import soundfile as sf

from tests.serve.conftest import asgi, asgi_async, multipart, wav_bytes
from wavetrain.data.audio import read_audio
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.prediction import classify_samples
from wavetrain.serve import ModelService, ServeConfig, create_app


def _check_same(res: dict, preds, labels: list[str], unknown_below: float | None = None) -> None:
    """The answer's segments hold exactly the window scores of ``preds`` (and their values, or
    ``unknown`` where the top probability is below ``unknown_below``); the whole input's
    predictions are their mean, best first."""
    assert res["windows"] == len(preds) == len(res["segments"])
    for seg, p in zip(res["segments"], preds):
        value = "unknown" if unknown_below is not None and max(p.scores) < unknown_below else p.label
        assert (seg["start_ms"], seg["end_ms"], seg["label"]) == (p.start_ms, p.end_ms, value)
        got = {d["label"]: d["score"] for d in seg["predictions"]}
        assert got == {v: float(s) for v, s in zip(labels, p.scores) if v in got}
        assert [d["score"] for d in seg["predictions"]] == sorted(got.values(), reverse=True)
    mean = np.stack([p.scores for p in preds]).astype(np.float64).mean(axis=0)
    top = [d["label"] for d in res["predictions"]]
    assert top == [labels[i] for i in np.argsort(-mean, kind="stable")][: len(top)]
    for d in res["predictions"]:
        assert d["score"] == pytest.approx(mean[labels.index(d["label"])], rel=1e-12)


def test_healthz_and_model(gmm_app, gmm_file):
    r = asgi(gmm_app, "GET", "/healthz")
    assert r.status == 200 and r.json()["status"] == "ok"
    m = asgi(gmm_app, "GET", "/v1/model").json()
    model = load_model(gmm_file)
    assert m["sha256"] == hashlib.sha256(gmm_file.read_bytes()).hexdigest()
    assert m["id"] == "gmm.wt" and m["family"] == "gmm" and m["score_kind"] == "mean_loglik"
    assert m["labels"] == model.labels_ and m["label"] == "state" and not m["detector"]
    assert m["feature_spec"] == model.params["features"] and m["parameters"]["components"] == 3
    page = asgi(gmm_app, "GET", "/")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    assert b'id="file"' in page.body and b"/v1/classify" in page.body and b"http" not in page.body.split(
        b"<script>")[0].replace(b"http-equiv", b"")


@pytest.mark.parametrize("clip", [None, 250])
def test_multipart_equals_classify_samples(gmm_app, gmm_file, demo_files, clip):
    model = load_model(gmm_file)
    path = demo_files["bearing"]
    body, ctype = multipart(path.read_bytes())
    q = "?top_k=3" + (f"&clip_ms={clip}" if clip else "")
    r = asgi(gmm_app, "POST", "/v1/classify" + q, body, {"content-type": ctype})
    assert r.status == 200, r.body
    res = r.json()
    x, rate = read_audio(path)
    preds = classify_samples(model, x, rate, clip_ms=clip)      # the one windowing rule
    _check_same(res, preds, model.labels_)
    assert res["label"] == ("bearing" if not clip else res["predictions"][0]["label"])
    assert res["score_kind"] == "mean_loglik"
    assert res["duration_s"] == 1.0 and res["sample_rate"] == 16000 and res["channels"] == 1
    assert res["model"]["sha256"] == hashlib.sha256(gmm_file.read_bytes()).hexdigest()
    assert set(res["timings"]) == {"queue_ms", "decode_ms", "features_ms", "inference_ms", "total_ms"}
    assert len(res["segments"]) == (4 if clip else 1) and "z" in res["segments"][0]["details"]


def test_probability_model_and_long_input(knn_file, long_wav):
    service = ModelService.from_file(knn_file)
    app = create_app(service, ServeConfig())
    r = asgi(app, "POST", "/v1/classify?clip_ms=1000&clip_shift_ms=500&top_k=2", long_wav.read_bytes(),
             {"content-type": "audio/wav"})
    assert r.status == 200, r.body
    res = r.json()
    model = load_model(knn_file)
    x, rate = read_audio(long_wav)
    preds = classify_samples(model, x, rate, clip_ms=1000, shift_ms=500)
    assert len(preds) >= 19
    # the server answers unknown by default: for knn (probabilities, no trained rule), a top
    # probability below half-way between chance (1/3) and 1: some windows across two recordings
    _check_same(res, preds, model.labels_, unknown_below=(1 + 1 / 3) / 2)
    assert "unknown" in [seg["label"] for seg in res["segments"]] and res["answers"]["unknown"] == "auto"
    assert all(seg["label"] != "unknown" for seg in res["segments"] if seg["start_ms"] % 1000 == 0)
    assert res["score_kind"] == "probability" and len(res["predictions"]) == 2
    assert sum(d["score"] for d in res["segments"][0]["predictions"]) <= 1 + 1e-9
    assert res["segments"][1]["start_ms"] == 500 and res["duration_s"] == 10.0


def test_every_body_kind_gives_the_same_answer(gmm_app, demo_files):
    x, rate = sf.read(str(demo_files["loose"]), dtype="float32")
    wav = wav_bytes(x, rate)

    def post(body, ctype, q=""):
        r = asgi(gmm_app, "POST", "/v1/classify" + q, body, {"content-type": ctype})
        assert r.status == 200, r.body
        return r.json()

    ref = post(wav, "audio/wav")
    assert ref["label"] == "loose"
    for ctype in ("audio/x-wav", "audio/wav; codecs=1"):
        assert post(wav, ctype)["predictions"] == ref["predictions"]
    assert post(wav_bytes(x, rate, "FLAC"), "audio/flac")["predictions"] == ref["predictions"]   # lossless
    pcm16 = np.round(x * 32768).astype("<i2").tobytes()
    assert post(pcm16, "application/octet-stream", "?sample_rate=16000&channels=1&format=s16le")[
        "predictions"] == ref["predictions"]
    x16 = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768
    stereo = np.stack([x16, x16], axis=1).astype("<f4")
    res = post(stereo.tobytes(), "application/octet-stream", "?sample_rate=16000&channels=2&format=f32le")
    assert res["channels"] == 2 and res["predictions"] == ref["predictions"]
    ogg = post(wav_bytes(x, rate, "OGG", "VORBIS"), "audio/ogg")
    assert ogg["label"] == "loose" and ogg["duration_s"] == pytest.approx(1.0, abs=0.01)


def test_detector_answer(detector_file, demo_files):
    service = ModelService.from_file(detector_file)
    app = create_app(service, ServeConfig())
    model = load_model(detector_file)
    assert asgi(app, "GET", "/v1/model").json()["threshold"] == model.threshold_
    for state in ("healthy", "bearing"):
        body, ctype = multipart(demo_files[state].read_bytes())
        r = asgi(app, "POST", "/v1/classify?clip_ms=500", body, {"content-type": ctype})
        assert r.status == 200, r.body
        res = r.json()
        m = load_model(detector_file)
        preds = classify_samples(m, *read_audio(demo_files[state]), clip_ms=500)
        score = max(float(p.scores[0]) for p in preds)
        assert res["score_kind"] == "anomaly" and res["threshold"] == model.threshold_
        assert res["anomaly_score"] == score
        assert res["anomaly"] == any(p.anomaly for p in preds) == (score > model.threshold_)
        assert res["label"] == ("anomaly" if res["anomaly"] else "healthy")
        assert res["predictions"] == [{"label": res["label"], "score": res["anomaly_score"]}]
        for seg, p in zip(res["segments"], preds):
            assert seg["anomaly"] == p.anomaly and seg["anomaly_score"] == float(p.scores[0])
            assert seg["label"] == p.label
    assert res["anomaly"] is True                   # a bearing fault is anomalous for this detector


def test_answer_options(gmm_app, gmm_file, long_wav):
    """smooth, hold and unknown as query options: each window's scores are the mean of the last
    `smooth` windows' own scores (kept under raw), and a new answer is reported once it has held."""
    wav = long_wav.read_bytes()
    model = load_model(gmm_file)
    x, rate = read_audio(long_wav)
    preds = classify_samples(model, x, rate, clip_ms=500)
    r = asgi(gmm_app, "POST", "/v1/classify?clip_ms=500&top_k=3&smooth=3&hold=1000&unknown=off", wav,
             {"content-type": "audio/wav"})
    assert r.status == 200, r.body
    res = r.json()
    assert res["answers"] == {"smooth": 3, "hold": 1000, "unknown": "off", "unknown_rule": "never"}
    segs = res["segments"]
    assert len(segs) == len(preds) == 20
    for i, (seg, p) in enumerate(zip(segs, preds)):
        assert seg["raw"]["label"] == p.label
        assert {d["label"]: d["score"] for d in seg["raw"]["predictions"]} == dict(zip(model.labels_, p.scores))
        mean = np.mean([q.scores for q in preds[max(0, i - 2):i + 1]], axis=0)
        got = {d["label"]: d["score"] for d in seg["predictions"]}
        assert got == pytest.approx(dict(zip(model.labels_, mean)), rel=1e-12)
        assert seg["smoothed"] == min(i + 1, 3)
    # the hold: an answer is reported once windows starting 1000 ms apart gave it (at the start: undecided)
    labels = [seg["label"] for seg in segs]
    assert labels[:2] == ["undecided", "undecided"] and "undecided" not in labels[2:]
    smoothed = [max(seg["predictions"], key=lambda d: d["score"])["label"] for seg in segs]
    for i in range(2, len(segs)):
        run = smoothed[i - 2:i + 1]
        assert labels[i] == (run[-1] if len(set(run)) == 1 else labels[i - 1])
    assert len(set(labels[2:])) > 1               # the recordings' states change every second
    # the whole input: the mean of the windows' own scores
    own = np.mean([p.scores for p in preds], axis=0)
    assert res["predictions"][0]["label"] == model.labels_[int(np.argmax(own))] == res["label"]
    # /v1/model lists the options and their defaults, and the rule a request gets by default
    m = asgi(gmm_app, "GET", "/v1/model").json()
    assert m["options"] == {"top_k": 5, "clip_ms": 0, "clip_shift_ms": 0, "smooth": 1, "hold": 0, "unknown": "auto"}
    assert m["unknown_rule"].startswith("|z| above 4")


def test_unknown_by_default_on_the_server(gmm_app, demo_files):
    """Near-silence is unlike every training recording: the server answers it unknown by default,
    the whole input too; unknown=off gives the best value; a machine sound stays answered."""
    quiet = wav_bytes(np.random.default_rng(0).normal(0, 1e-4, 16000).astype(np.float32))
    h = {"content-type": "audio/wav"}
    res = asgi(gmm_app, "POST", "/v1/classify", quiet, h).json()
    assert res["label"] == res["segments"][0]["label"] == "unknown" and res["answers"]["unknown"] == "auto"
    assert abs(res["segments"][0]["details"]["z"]) > 4
    off = asgi(gmm_app, "POST", "/v1/classify?unknown=off", quiet, h).json()
    assert off["label"] == off["predictions"][0]["label"] == off["segments"][0]["label"] != "unknown"
    assert asgi(gmm_app, "POST", "/v1/classify?unknown=1000", quiet, h).json()["label"] != "unknown"
    for state, path in demo_files.items():
        assert asgi(gmm_app, "POST", "/v1/classify", path.read_bytes(), h).json()["label"] == state


def test_a_detector_holds_its_alarm(detector_file, demo_files):
    app = create_app(ModelService.from_file(detector_file), ServeConfig())
    bearing = demo_files["bearing"].read_bytes()
    h = {"content-type": "audio/wav"}
    plain = asgi(app, "POST", "/v1/classify?clip_ms=250", bearing, h).json()
    assert plain["anomaly"] is True and "raw" not in plain["segments"][0]
    held = asgi(app, "POST", "/v1/classify?clip_ms=250&hold=5000", bearing, h).json()
    # no answer holds 5 s in a 1 s recording: the normal value stands, the windows' own alarms under raw
    assert held["anomaly"] is False and held["label"] == "healthy"
    assert [s["label"] for s in held["segments"]] == ["healthy"] * len(plain["segments"])
    assert [s["raw"]["label"] for s in held["segments"]] == [s["label"] for s in plain["segments"]]
    r = asgi(app, "POST", "/v1/classify?unknown=2", bearing, h)
    assert r.status == 400 and "anomaly detector" in r.json()["error"] and "\n" not in r.json()["error"]


# ---- errors ------------------------------------------------------------------------------------
def _status(app, body: bytes, ctype: str | None, q: str = "", **kw):
    r = asgi(app, "POST", "/v1/classify" + q, body, {"content-type": ctype} if ctype else {}, **kw)
    assert r.headers["content-type"] == "application/json"
    res = r.json()
    assert res["status"] == r.status and res["error"]
    return r.status, res["error"]


def test_error_statuses(gmm_app, demo_files):
    wav = demo_files["healthy"].read_bytes()
    pcm = "application/octet-stream"
    cases = [
        # 415: no or another content type
        (wav, None, "", 415, "not supported"),
        (wav, "text/plain", "", 415, "not supported"),
        (wav, "audio/mpeg", "", 415, "not supported"),
        # 400: bad options, bad multipart
        (wav, "audio/wav", "?top_k=0", 400, "top_k=0"),
        (wav, "audio/wav", "?top_k=abc", 400, "top_k='abc'"),
        (wav, "audio/wav", "?clip_ms=-5", 400, "clip_ms=-5"),
        (wav, "audio/wav", "?colour=red", 400, "expected top_k, clip_ms, clip_shift_ms, smooth, hold, unknown"),
        (wav, "audio/wav", "?smooth=0", 400, "smooth=0: expected 1 to 1000"),
        (wav, "audio/wav", "?hold=soon", 400, "hold='soon': expected an integer"),
        (wav, "audio/wav", "?unknown=maybe", 400, "unknown=maybe: expected off, trained, auto or a level"),
        (*multipart(wav, field="upload"), "", 400, "without a 'file' field"),
        (b"--x\r\nnot a part", "multipart/form-data; boundary=y", "", 400, "multipart"),
        (wav, "multipart/form-data", "", 400, "boundary"),
        # 422: unreadable, empty, truncated, too short, bad PCM
        (b"RIFF....WAVEjunk" * 10, "audio/wav", "", 422, "not readable audio"),
        (b"", "audio/wav", "", 422, "empty"),
        (*multipart(b""), "", 422, "empty"),
        (wav[: len(wav) // 2], "audio/wav", "", 422, "truncated"),
        (wav_bytes(np.zeros(40, np.float32)), "audio/wav", "", 422, ""),
        (b"\0\0" * 100, pcm, "", 422, "sample_rate"),
        (b"\0\0" * 100, pcm, "?sample_rate=abc", 422, "sample_rate='abc'"),
        (b"\0\0" * 100, pcm, "?sample_rate=16000&format=u8", 422, "format='u8'"),
        (b"\0\0" * 100, pcm, "?sample_rate=16000&channels=0", 422, "channels=0"),
        (b"\0\0\0", pcm, "?sample_rate=16000", 422, "whole number"),
        (np.full(100, np.nan, "<f4").tobytes(), pcm, "?sample_rate=16000&format=f32le", 422, "NaN"),
        (b"", pcm, "?sample_rate=16000", 422, "empty"),
    ]
    for body, ctype, q, status, words in cases:
        got, msg = _status(gmm_app, body, ctype, q)
        assert (got, words in msg) == (status, True), (ctype, q, got, msg)
    r = asgi(gmm_app, "GET", "/nowhere")
    assert r.status == 404 and r.json()["status"] == 404
    assert asgi(gmm_app, "GET", "/v1/classify").status == 405


def test_too_large_is_refused_while_reading(gmm_service, demo_files):
    app = create_app(gmm_service, ServeConfig(max_bytes=10_000))
    wav = demo_files["healthy"].read_bytes()          # 32 kB
    assert len(wav) > 10_000
    # Content-Length says so: refused before a byte is read
    r = asgi(app, "POST", "/v1/classify", wav, {"content-type": "audio/wav"})
    assert r.status == 413 and r.chunks_read == 0 and "at most 10000" in r.json()["error"]
    # streamed without a length: refused at the chunk that goes over, the rest never read
    r = asgi(app, "POST", "/v1/classify", wav, {"content-type": "audio/wav"}, chunk=1000)
    assert r.status == 413 and r.chunks_read == 11 < len(wav) // 1000


def test_decoded_size_is_bounded(gmm_service):
    app = create_app(gmm_service, ServeConfig(max_bytes=2 << 20))        # 2 Mi samples at most
    flac = wav_bytes(np.zeros(3 << 20, np.float32), 16000, "FLAC")       # silence compresses to little
    assert len(flac) < 2 << 20
    r = asgi(app, "POST", "/v1/classify", flac, {"content-type": "audio/flac"})
    assert r.status == 413 and "samples" in r.json()["error"]


class _Blocking(ModelService):
    """A service whose classify waits for ``release`` (or raises when ``fail`` is set)."""

    def __init__(self, base: ModelService):
        super().__init__(base.model, model_id=base.model_id, sha256=base.sha256)
        self.release = threading.Event()
        self.fail = False

    def classify(self, decoded, options, *, cancel=None):
        if self.fail:
            raise RuntimeError("boom")
        assert self.release.wait(30)
        return super().classify(decoded, options, cancel=cancel)


def test_requests_beyond_the_queue_get_503(gmm_service, demo_files):
    service = _Blocking(gmm_service)
    app = create_app(service, ServeConfig(workers=1, queue=1))
    wav = demo_files["healthy"].read_bytes()
    h = {"content-type": "audio/wav"}

    async def scenario():
        first = asyncio.create_task(asgi_async(app, "POST", "/v1/classify", wav, h))     # runs (blocked)
        second = asyncio.create_task(asgi_async(app, "POST", "/v1/classify", wav, h))    # waits in the queue
        await asyncio.sleep(0.05)
        third = await asgi_async(app, "POST", "/v1/classify", wav, h)                  # over the bound
        health = (await asgi_async(app, "GET", "/healthz")).json()
        service.release.set()
        return await first, await second, third, health

    first, second, third, health = asyncio.run(scenario())
    assert third.status == 503 and third.headers["retry-after"] == "1" and "busy" in third.json()["error"]
    assert health["admitted"] == 2 and health["refused_busy"] == 1
    assert first.status == second.status == 200
    assert asgi(app, "GET", "/healthz").json()["admitted"] == 0


def test_a_failing_request_leaves_the_server_up(gmm_service, demo_files):
    service = _Blocking(gmm_service)
    service.release.set()
    app = create_app(service, ServeConfig())
    wav = demo_files["healthy"].read_bytes()
    service.fail = True
    r = asgi(app, "POST", "/v1/classify", wav, {"content-type": "audio/wav"})
    assert r.status == 500 and r.json()["error"].startswith("internal error")
    service.fail = False
    r = asgi(app, "POST", "/v1/classify", wav, {"content-type": "audio/wav"})
    assert r.status == 200 and asgi(app, "GET", "/healthz").json()["admitted"] == 0


def test_clip_on_whole_recording_features_is_a_400(demo_csv, tmp_path, demo_files):
    from wavetrain.cli.main import main

    path = tmp_path / "whole.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "knn", "--features",
                 "mfcc(bands=40, coeffs=13, whole=true)", "-o", str(path)]) == 0
    app = create_app(ModelService.from_file(path), ServeConfig())
    r = asgi(app, "POST", "/v1/classify?clip_ms=200", demo_files["healthy"].read_bytes(),
             {"content-type": "audio/wav"})
    assert r.status == 400 and "clip_ms=200" in r.json()["error"]
