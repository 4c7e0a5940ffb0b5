"""Events through the server (``POST /v1/classify?events=...``): the events of a spliced words file
are those :func:`sample_events` finds in its samples and :func:`iter_recording_events` in the file;
window options beside ``events`` and bad settings are refused in one line before the body is read;
the answer is bounded and the work stops when asked to; the page has the events control and its
helpers draw and score events (in node, where it is installed)."""
from __future__ import annotations

import json
import threading
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from tests.serve.conftest import LiveServer, asgi, multipart, wav_bytes
from tests.serve.test_page import _helpers
from wavetrain.cli.main import main
from wavetrain.data.audio import read_audio
from wavetrain.data.demo import copy_demo_words
from wavetrain.data.recording import Recording
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.events import EventOptions, iter_recording_events, sample_events
from wavetrain.serve import ClassifyOptions, ModelService, ServeConfig, create_app
from wavetrain.serve.decode import Decoded, decode_audio
from wavetrain.serve.inference import Cancelled
from wavetrain.serve.page import PAGE

#: The speaker whose ten words are spliced into the long file (the model never heard this voice).
HELD_OUT = "en-us-nyc+f1"


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> dict[str, Path]:
    """A gmm-speech model of the demo words of every speaker but one, and that speaker's ten words
    spliced into one file with gaps of 400 to 900 ms (``sound splice``)."""
    root = tmp_path_factory.mktemp("events")
    rows = copy_demo_words(root / "words").read_text().splitlines()
    train, test = root / "words" / "train.csv", root / "words" / "test.csv"
    train.write_text("".join(f"{r}\n" for r in rows if f"speaker={HELD_OUT}" not in r))
    test.write_text("".join(f"{r}\n" for r in rows if f"speaker={HELD_OUT}" in r))
    model = root / "words.wt"
    assert main(["train", "--data", str(train), "--label", "word", "--model", "gmm-speech", "-o", str(model)]) == 0
    long = root / "long.wav"
    assert main(["sound", "splice", "--data", str(test), "--gap-ms", "400:900", "--seed", "0", "-o", str(long)]) == 0
    return {"model": model, "long": long}


@pytest.fixture(scope="module")
def service(words) -> ModelService:
    return ModelService.from_file(words["model"])


@pytest.fixture(scope="module")
def app(service):
    return create_app(service, ServeConfig(max_bytes=4 << 20))


def _post(app, path: str, data: bytes, **kw):
    body, ctype = multipart(data)
    return asgi(app, "POST", path, body, {"content-type": ctype}, **kw)


def _spans(events) -> list[tuple[int, int, str]]:
    return [(e["start_ms"], e["end_ms"], e["value"]) if isinstance(e, dict) else (e.start_ms, e.end_ms, e.label)
            for e in events]


# ---- the same events as in process -------------------------------------------------------------
@pytest.mark.parametrize("settings, unknown", [("1", None), ("gap_ms=300,min_ms=120", "off")])
def test_the_server_finds_the_events_of_the_samples_and_of_the_file(words, service, settings, unknown):
    model = load_model(words["model"])
    options = EventOptions.parse(settings)
    rule = unknown or "auto"                   # a request that gives none: as live use
    samples, rate = read_audio(words["long"])
    in_memory = sample_events(model, samples, rate, options=options, unknown=rule)
    from_file = list(iter_recording_events(model, Recording(words["long"]), options, unknown=rule))
    assert len(in_memory) >= 8                 # ten words, a few hundred ms apart
    assert _spans(in_memory) == _spans(from_file)
    query = f"/v1/classify?events={settings}" + (f"&unknown={unknown}" if unknown else "")
    with LiveServer(create_app(service, ServeConfig(max_bytes=4 << 20))) as srv:
        body, ctype = multipart(words["long"].read_bytes(), filename="long.wav")
        r = srv.request("POST", query, body, {"Content-Type": ctype})
        assert r.status == 200, r.body
        res = r.json()
        # a wav body too: the same events
        r2 = srv.request("POST", query, words["long"].read_bytes(), {"Content-Type": "audio/wav"})
        assert r2.status == 200 and _spans(r2.json()["events"]) == _spans(res["events"])
    assert _spans(res["events"]) == _spans(in_memory)
    for got, p in zip(res["events"], in_memory):
        assert got["label"] == "word" and got["score_kind"] == "mean_loglik" and "file" not in got
        assert got["scores"] == pytest.approx({v: float(s) for v, s in zip(p.labels, p.scores)}, abs=1e-5)
        assert got["loglik"] == pytest.approx(p.score, abs=1e-3)
    assert res["event_settings"] == options.describe()
    assert res["answers"]["unknown"] == rule and "segments" not in res and "predictions" not in res
    assert res["duration_s"] == pytest.approx(samples.shape[0] / rate) and res["sample_rate"] == rate
    assert set(res["timings"]) >= {"decode_ms", "features_ms", "inference_ms", "total_ms"}


def test_a_detectors_events_carry_the_anomaly_answer(detector_file, demo_files):
    # the demo's machine sounds of every state, a second of faint noise before each and at the end
    rng = np.random.default_rng(0)
    parts = []
    for path in demo_files.values():
        x, rate = read_audio(path)
        parts += [rng.normal(0, 1e-3, rate).astype(np.float32), x]
    data = wav_bytes(np.concatenate([*parts, rng.normal(0, 1e-3, rate).astype(np.float32)]), rate)
    samples = decode_audio(data, max_samples=1 << 24).for_model()       # as 16-bit samples
    model = load_model(detector_file)
    app = create_app(ModelService.from_file(detector_file), ServeConfig(max_bytes=4 << 20))
    r = _post(app, "/v1/classify?events=1", data)
    assert r.status == 200, r.body
    events = r.json()["events"]
    expected = sample_events(model, samples, rate, unknown="auto")
    assert events and _spans(events) == _spans(expected)
    for got, p in zip(events, expected):
        assert got["anomaly"] is p.anomaly and got["value"] in ("anomaly", "healthy")
        assert got["anomaly_score"] == pytest.approx(p.score, rel=1e-5) and got["threshold"] > 0


def test_events_off_answers_windows(app, words):
    r = _post(app, "/v1/classify?events=0", words["long"].read_bytes())
    assert r.status == 200 and "events" not in r.json() and r.json()["windows"] >= 1


# ---- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("query, expect", [
    ("events=1&smooth=3", "smooth is a window option"),
    ("events=1&hold=200", "hold is a window option"),
    ("events=gap_ms=300&clip_ms=500&clip_shift_ms=250", "clip_ms and clip_shift_ms are window options"),
    ("events=loud", "expected name=value pairs"),
    ("events=gap_ms=soon", "gap_ms=soon: expected a number"),
    ("events=speed=3", "names among detector"),
    ("events=min_ms=-5", "min_ms=-5"),
    ("events=pad_ms=400", "pad_ms=400 > gap_ms=150"),
    ("events=detector=sound", "detector='sound'"),
    ("events=detector=model", "no value 'gap' for no event"),
    ("events=detector=model,background=ten", "no value 'ten'"),
])
def test_events_with_window_options_or_bad_settings_are_refused_before_the_body(app, words, query, expect):
    r = _post(app, "/v1/classify?" + query, words["long"].read_bytes())
    assert r.status == 400, r.body
    res = r.json()
    assert res["status"] == 400 and expect in res["error"] and "\n" not in res["error"]
    assert r.chunks_read == 0 and r.headers.get("connection") == "close"      # the body was never read


def test_audio_at_a_rate_no_event_can_be_answered_at_is_refused(app):
    # (each event would be skipped, and the answer say "no events")
    x = (np.random.default_rng(0).normal(0, 0.1, 300) * 32767).astype("<i2")
    r = asgi(app, "POST", "/v1/classify?events=1&sample_rate=100&channels=1&format=s16le", x.tobytes(),
             {"content-type": "application/octet-stream"})
    assert r.status == 422 and "sampled at 100 Hz" in r.json()["error"]
    r = _post(app, "/v1/classify?events=1", wav_bytes(np.zeros(300, np.float32), 100))
    assert r.status == 422 and "sampled at 100 Hz" in r.json()["error"]


def test_the_upload_limit_applies_to_events(service, words):
    app = create_app(service, ServeConfig(max_bytes=100_000))
    r = _post(app, "/v1/classify?events=1", words["long"].read_bytes())
    assert r.status == 413 and "100000" in r.json()["error"]


def test_an_answer_over_the_limit_is_refused_once_its_events_are_found(service, words):
    app = create_app(service, ServeConfig(max_bytes=4 << 20, max_answer_bytes=1500))
    r = _post(app, "/v1/classify?events=1", words["long"].read_bytes())
    assert r.status == 422, r.body
    error = r.json()["error"]
    assert "events, an answer over 1500 bytes" in error and "min_ms" in error and "\n" not in error
    ok = create_app(service, ServeConfig(max_bytes=4 << 20, max_answer_bytes=100_000))
    assert _post(ok, "/v1/classify?events=1", words["long"].read_bytes()).status == 200


def test_the_events_work_stops_when_asked(service, words):
    samples, rate = read_audio(words["long"])
    decoded = Decoded(samples[:, None], rate)
    options = ClassifyOptions.from_query({"events": "1"})
    cancel = threading.Event()
    rows, _, _ = service.events(decoded, options, cancel=cancel)
    assert rows
    cancel.set()
    with pytest.raises(Cancelled):
        service.events(decoded, options, cancel=cancel)
    # set while the events are being answered: the work stops at the next one
    calls = [0]
    score = service.model.predict_scores

    def counted(grams):
        calls[0] += 1
        cancel.set()
        return score(grams)

    cancel.clear()
    service.model.predict_scores = counted      # type: ignore[method-assign]
    try:
        with pytest.raises(Cancelled):
            service.events(decoded, options, cancel=cancel)
    finally:
        del service.model.predict_scores
    assert calls[0] == 1


# ---- the page ----------------------------------------------------------------------------------
class _Inputs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.inputs: dict[str, dict] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "input" and a.get("id"):
            self.inputs[a["id"]] = a


def test_the_page_has_an_events_box_that_asks_for_events():
    page = _Inputs()
    page.feed(PAGE)
    assert page.inputs["events"]["type"] == "checkbox" and "checked" not in page.inputs["events"]
    script = PAGE.split("<script>", 1)[1].split("</script>", 1)[0]
    assert 'q.set("events", "1")' in script and "drawEvents(" in script and "showEvents(res)" in script


def test_the_pages_event_boxes_and_scores():
    events = [{"start_ms": 500, "end_ms": 1500, "value": "seven", "loglik": -41.5},
              {"start_ms": 1900, "end_ms": 1902, "value": "unknown", "confidence": 0.4},
              {"start_ms": 3000, "end_ms": 4200, "value": "anomaly", "anomaly": True, "anomaly_score": 5.5}]
    boxes, scores = _helpers(f"const ev = {json.dumps(events)}; console.log(JSON.stringify("
                             "[eventBoxes(ev, 4000, 50, 800), ev.map(eventScore)]))")
    assert [(b["x0"], b["x1"], b["text"]) for b in boxes] == [(150, 350, "seven"), (430, 431, "unknown"),
                                                            (650, 850, "anomaly")]   # the last: to the plot's end
    assert [b["anomaly"] for b in boxes] == [False, False, True]
    assert scores == [-41.5, 0.4, 5.5]
    assert _helpers("console.log(JSON.stringify(eventBoxes([], 0, 0, 100)))") == []


def test_the_page_lists_and_draws_events_in_a_browser(service, words):
    from tests.serve.test_browser import CHROMIUM, open_page

    if CHROMIUM is None:
        pytest.skip("chromium is not installed")

    app = create_app(service, ServeConfig(max_bytes=4 << 20))
    with open_page(app) as tab:
        tab.wait_for("document.readyState === 'complete' && !!document.getElementById('events')")
        tab.wait_for("document.getElementById('model').textContent.includes('words.wt')")
        tab.evaluate("document.getElementById('clip').value = '500'; "
                     "document.getElementById('events').click()")
        assert tab.evaluate("document.getElementById('clip').disabled")
        tab.upload(words["long"])
        r = _post(app, "/v1/classify?events=1", words["long"].read_bytes())
        expected = r.json()["events"]
        rows = tab.evaluate("[...document.querySelectorAll('#segments tr')].map(r => "
                            "[...r.cells].map(c => c.textContent))")
        assert rows[0] == ["start s", "end s", "value", "score"]
        assert [v for _, _, v, _ in rows[1:]] == [e["value"] for e in expected]
        # (times in s to 2 places: the page rounds as JavaScript does, 4.625 to 4.63)
        assert np.allclose([(float(a), float(b)) for a, b, _, _ in rows[1:]],
                           [(e["start_ms"] / 1000, e["end_ms"] / 1000) for e in expected], atol=0.0051)
        assert "event(s)" in tab.evaluate("document.getElementById('status').textContent")
        drawn = tab.wait_for("document.getElementById('spec').dataset.events", timeout=20).split()
        assert [d.split(":", 1)[1] for d in drawn] == [e["value"] for e in expected]
        spans = [tuple(map(int, d.split(":", 1)[0].split("-"))) for d in drawn]
        assert all(a < b for a, b in spans) and spans == sorted(spans)
        assert "events found" in tab.evaluate("document.getElementById('speccaption').textContent")
        # a box is tinted, not opaque: the spectrogram shows through it
        a, b = spans[0]
        tinted = tab.evaluate(f"Array.from(document.getElementById('spec').getContext('2d')"
                              f".getImageData({(a + b) // 2}, 150, 1, 1).data)")
        assert tinted[2] > 0 and tinted != [0, 0, 0, 255]


def test_decoded_samples_are_those_read_from_the_file(words):
    # (what the equality above rests on: the server's decoder and read_audio agree)
    samples, rate = read_audio(words["long"])
    d = decode_audio(words["long"].read_bytes(), max_samples=1 << 24)
    assert d.rate == rate and np.array_equal(d.for_model(), samples)
