"""Events in long recordings: the activity meter, the segmenter's rules, events answered by the
model, and one answer whether the audio comes as a file, samples in memory, blocks of any size or
a live stream on stdin."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from wavetrain.core.errors import ParameterError
from wavetrain.data import load_dataset
from wavetrain.data.recording import Recording
from wavetrain.features.activity import ActivityMeter
from wavetrain.pipeline.events import event_stream, recording_events, sample_events
from wavetrain.pipeline.jobs import RunOptions, train_model
from wavetrain.stream.events import EventOptions, Segmenter

RATE = 16000


def _tone(kind: str, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """A ``low`` buzz (harmonics of ~220 Hz) or a ``high`` whistle (~2.5 kHz), faded in and out."""
    t = np.arange(int(seconds * RATE)) / RATE
    if kind == "low":
        f = 220 * rng.uniform(0.95, 1.05)
        x = sum(np.sin(2 * np.pi * f * k * t) / k for k in range(1, 8))
    else:
        f = 2500 * rng.uniform(0.95, 1.05)
        x = np.sin(2 * np.pi * f * t + 3 * np.sin(2 * np.pi * 5 * t))
    fade = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.02)
    return (0.3 * x / np.max(np.abs(x)) * fade).astype(np.float32)


def _background(n: int, rng: np.random.Generator, level: float = 0.01) -> np.ndarray:
    """Steady background: white noise and a 50 Hz hum."""
    t = np.arange(n) / RATE
    return (level * rng.standard_normal(n) + 3 * level * np.sin(2 * np.pi * 50 * t)).astype(np.float32)


def _long(rng: np.random.Generator, count: int = 8, lead: float = 1.0):
    """A long recording of ``count`` sounds at random gaps in steady background, and the truth
    ``[(start_ms, end_ms, value)]``."""
    pieces, truth, pos = [np.zeros(int(lead * RATE), np.float32)], [], int(lead * RATE)
    for i in range(count):
        kind = ("low", "high")[i % 2]
        x = _tone(kind, rng.uniform(0.25, 0.6), rng)
        truth.append((1000 * pos // RATE, 1000 * (pos + len(x)) // RATE, kind))
        gap = np.zeros(int(rng.uniform(0.3, 1.2) * RATE), np.float32)
        pieces += [x, gap]
        pos += len(x) + len(gap)
    y = np.concatenate(pieces)
    return y + _background(len(y), rng), truth


@pytest.fixture(scope="module")
def tones(tmp_path_factory):
    """A data set of short ``low``/``high`` clips (and ``gap`` clips of background) and a long
    recording of them."""
    root = tmp_path_factory.mktemp("tones")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        kind = ("low", "high", "gap")[i % 3]
        x = np.zeros(int(0.4 * RATE), np.float32) if kind == "gap" else _tone(kind, rng.uniform(0.25, 0.6), rng)
        x = x + _background(len(x), rng)
        sf.write(root / f"{kind}_{i}.wav", x, RATE)
        rows.append(f"{kind}_{i}.wav,sound={kind}")
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    y, truth = _long(np.random.default_rng(1))
    sf.write(root / "long.wav", y, RATE, subtype="FLOAT")
    return root, y, truth


@pytest.fixture(scope="module")
def model(tones):
    root = tones[0]
    ds = load_dataset(root / "metadata.csv", where=[("sound", ["low", "high"])])
    # a model for events sees its sounds with some background around them, as events give them
    m, _ = train_model(ds, "sound", "gmm", {"components": 2, "augment": "pad(before=30:100, after=30:100)"},
                       RunOptions())
    return m


@pytest.fixture(scope="module")
def gap_model(tones):
    """A clip model that knows the background (``gap``): it can decide activity itself."""
    ds = load_dataset(tones[0] / "metadata.csv")
    m, _ = train_model(ds, "sound", "gmm", {"components": 2, "clip_ms": 100, "clip_shift_ms": 50}, RunOptions())
    return m


def _spans(preds):
    return [(p.start_ms, p.end_ms, p.label) for p in preds]


def _matches(found, truth, collar=100):
    """Each true event found once, its onset and offset within ``collar`` ms, with its value."""
    assert len(found) == len(truth), (found, truth)
    for (s, e, v), (ts, te, tv) in zip(found, truth):
        assert abs(s - ts) <= collar and abs(e - te) <= collar and v == tv, ((s, e, v), (ts, te, tv))


# -- the activity meter ---------------------------------------------------------------------------
def test_activity_is_the_same_for_any_block_size():
    rng = np.random.default_rng(3)
    y, _ = _long(rng, count=4)
    whole = ActivityMeter(RATE).push(y)
    for size in (1, 157, 4096, 48_000):
        m = ActivityMeter(RATE)
        parts = [m.push(y[i:i + size]) for i in range(0, len(y), size)] if size > 1 else \
            [m.push(y[i:i + 997]) for i in range(0, len(y), 997)]
        np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-4)


def test_steady_background_is_not_active_and_a_sound_on_it_is():
    rng = np.random.default_rng(4)
    bg = _background(10 * RATE, rng, level=0.05)
    a = ActivityMeter(RATE).push(bg)
    assert np.percentile(a[100:], 99) < EventOptions().on_db     # hum and noise: background
    y = bg.copy()
    y[5 * RATE:int(5.4 * RATE)] += _tone("high", 0.4, rng)
    a = ActivityMeter(RATE).push(y)
    frame = ActivityMeter(RATE).hop
    inside = a[(5 * RATE) // frame + 5:int(5.4 * RATE) // frame - 5]
    assert inside.min() > EventOptions().on_db            # a whistle in one band stands out


# -- the segmenter's rules ------------------------------------------------------------------------
def _segment(levels, options, *, hop=10, block=None, total=None):
    """Events (ms) of frames of ``hop`` ms with these activity levels (rate 1000: samples are ms)."""
    seg = Segmenter(options, 1000, options.on_db, options.off)
    levels = np.asarray(levels, dtype=float)
    n = len(levels)
    block = block or n
    out = []
    for i in range(0, n, block):
        k = np.arange(i, min(n, i + block))
        out += seg.add(k * hop, k * hop + hop, levels[k])
    out += seg.finish(total if total is not None else n * hop)
    return [(s.start, s.end, s.split) for s in out]


def _frames(n, *runs, level=20.0):
    a = np.zeros(n)
    for s, e in runs:
        a[s:e] = level
    return a


def test_hysteresis_takes_the_stretch_above_off_that_reaches_on():
    o = EventOptions(on_db=10, off_db=5, pad_ms=0, gap_ms=0, min_ms=0)
    a = np.zeros(100)
    a[20:30] = 6        # above off, below on: no event
    a[50:55] = 6        # the stretch starts here...
    a[55:60] = 12       # ...reaches on...
    a[60:70] = 6        # ...and lasts while above off
    assert _segment(a, o) == [(500, 700, False)]


def test_gap_merges_min_drops_padding_widens():
    o = EventOptions(on_db=10, off_db=5, pad_ms=30, gap_ms=100, min_ms=50)
    a = _frames(200, (10, 20), (25, 40), (80, 82), (120, 130))
    # 10-20 and 25-40: 50 ms apart < gap: one event; 80-82: 20 ms, dropped; 120-130 alone
    assert _segment(a, o) == [(70, 430, False), (1170, 1330, False)]
    # padding never reaches into the event before
    o = EventOptions(on_db=10, off_db=5, pad_ms=100, gap_ms=100, min_ms=0)
    assert _segment(_frames(100, (10, 20), (31, 40)), o) == [(0, 300, False), (300, 500, False)]


def test_events_longer_than_max_are_cut_and_the_rest_goes_on():
    o = EventOptions(on_db=10, off_db=5, pad_ms=0, gap_ms=0, min_ms=0, max_ms=300)
    assert _segment(_frames(100, (10, 80)), o) == [(100, 400, True), (400, 700, True), (700, 800, False)]


def test_a_stream_that_ends_inside_an_event_closes_it_at_the_end():
    o = EventOptions(on_db=10, off_db=5, pad_ms=50, gap_ms=100, min_ms=0)
    assert _segment(_frames(50, (30, 50)), o) == [(250, 500, False)]


@pytest.mark.parametrize("block", [1, 3, 7, 50])
def test_the_same_events_whatever_the_blocks(block):
    rng = np.random.default_rng(5)
    a = np.where(rng.random(400) < 0.15, 20.0, 0.0)
    a = np.convolve(a, np.ones(3), "same")           # runs of a few frames, some merged
    o = EventOptions(on_db=10, off_db=5, pad_ms=20, gap_ms=40, min_ms=20, max_ms=500)
    assert _segment(a, o, block=block) == _segment(a, o)
    assert _segment(a, o)                             # (there are events to agree on)


def test_options_are_read_from_text_and_refused_in_one_line():
    o = EventOptions.parse("gap_ms=300, on_db=8,detector=energy")
    assert (o.gap_ms, o.on_db, o.detector) == (300, 8.0, "energy")
    assert EventOptions.parse("") == EventOptions.parse("1") == EventOptions()
    for bad in ("gap=3", "gap_ms", "gap_ms=x", "pad_ms=200,gap_ms=100", "on_db=3,off_db=5", "detector=magic",
                "background=gap", "max_ms=50", "min_ms=-1"):
        with pytest.raises(ParameterError) as e:
            EventOptions.parse(bad)
        assert "\n" not in str(e.value)


# -- events answered by the model -------------------------------------------------------------------
def test_events_are_where_the_sounds_are_and_answered_right(tones, model):
    root, y, truth = tones
    found = recording_events(model, Recording(root / "long.wav"))
    _matches(_spans(found), truth)
    assert all(p.recording is not None and p.recording.path == root / "long.wav" for p in found)


def test_a_file_samples_and_blocks_of_any_size_give_the_same_events(tones, model):
    root, y, _ = tones
    want = recording_events(model, Recording(root / "long.wav"))
    got = sample_events(model, y, RATE)
    assert _spans(got) == _spans(want)
    np.testing.assert_allclose([p.scores for p in got], [p.scores for p in want], rtol=1e-6)
    for size in (512, 7001, 3 * RATE):
        blocks = ((y[i:i + size], 0.0) for i in range(0, len(y), size))
        assert _spans(w.prediction for w in event_stream(model, blocks, RATE, unknown="trained")) == _spans(want)


def test_a_segment_row_gives_events_in_file_time(tones, model):
    root, y, truth = tones
    s = truth[2][0] - 300
    found = recording_events(model, Recording(root / "long.wav", segment_ms=(s, len(y) * 1000 // RATE)))
    _matches(_spans(found), truth[2:])


def test_a_sound_at_the_very_start_of_a_stream_is_found(model):
    rng = np.random.default_rng(9)
    y = np.concatenate([_tone("low", 0.4, rng), np.zeros(2 * RATE, np.float32)])
    y = y + _background(len(y), rng)
    found = sample_events(model, y, RATE)
    _matches(_spans(found), [(0, 400, "low")])
    # a stream shorter than the first second is measured too
    assert _spans(sample_events(model, y[:int(0.7 * RATE)], RATE))[0][2] == "low"


def test_silence_and_steady_background_give_no_events(model):
    assert sample_events(model, np.zeros(5 * RATE, np.float32), RATE) == []
    assert sample_events(model, _background(20 * RATE, np.random.default_rng(6)), RATE) == []


def test_a_long_event_is_cut_and_said_once(model, caplog):
    rng = np.random.default_rng(7)
    y = np.concatenate([np.zeros(RATE, np.float32), _tone("low", 2.5, rng), np.zeros(RATE, np.float32)])
    y = y + _background(len(y), rng)
    with caplog.at_level(logging.WARNING):
        found = sample_events(model, y, RATE, options=EventOptions(max_ms=1000))
    assert [p.end_ms - p.start_ms for p in found][:2] == [1000, 1000]
    assert all(p.label == "low" for p in found)
    assert sum("longer than max_ms=1000" in r.getMessage() for r in caplog.records) == 1


def test_a_clip_model_pads_a_short_event_or_says_it_cannot(tones, gap_model):
    rng = np.random.default_rng(8)
    y = np.concatenate([np.zeros(RATE, np.float32), _tone("high", 0.04, rng), np.zeros(RATE, np.float32)])
    y = y + _background(len(y), rng)
    o = EventOptions(pad_ms=0, min_ms=0)
    found = sample_events(gap_model, y, RATE, options=o)
    assert [p.label for p in found] == ["high"] and found[0].end_ms - found[0].start_ms < 100
    gap_model.params = {**gap_model.params, "pad": "none"}
    try:
        assert sample_events(gap_model, y, RATE, options=o) == []
    finally:
        gap_model.params = {**gap_model.params, "pad": "zero"}


def test_a_model_with_a_background_value_decides_activity(tones, gap_model):
    root, y, truth = tones
    found = sample_events(gap_model, y, RATE, options=EventOptions.parse("detector=model"))
    _matches(_spans(found), truth, collar=150)
    with pytest.raises(ParameterError, match="no value 'silence'"):
        sample_events(gap_model, y, RATE, options=EventOptions.parse("detector=model,background=silence"))


# -- the command line: a file, stdin and the label tool agree -------------------------------------------
def _cli(*args, stdin=None):
    env = {**os.environ, "WAVETRAIN_PROGRESS": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "wavetrain.cli.main", *map(str, args)], input=stdin,
                          capture_output=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def model_file(tones, model, tmp_path_factory):
    from wavetrain.models.modelfile import save_model

    path = tmp_path_factory.mktemp("m") / "tones.wt"
    save_model(model, path)
    return path


def test_classify_events_of_a_file_and_of_stdin_are_the_same(tones, model, model_file):
    root, y, truth = tones
    r = _cli("classify", "-m", model_file, root / "long.wav", "--events", "--json")
    assert r.returncode == 0, r.stderr
    from_file = [json.loads(line) for line in r.stdout.decode().splitlines()]
    r = _cli("classify", "-m", model_file, "-", "--events", "--json", "--unknown", "trained",   # (live: auto)
             stdin=(root / "long.wav").read_bytes())
    assert r.returncode == 0, r.stderr
    live = [json.loads(line) for line in r.stdout.decode().splitlines()]
    key = [(e["start_ms"], e["end_ms"], e["value"]) for e in from_file]
    assert key == [(e["start_ms"], e["end_ms"], e["value"]) for e in live]
    assert all("latency_ms" in e for e in live)
    _matches(key, truth)
    assert key == _spans(sample_events(model, y, RATE))


def test_events_before_the_file_and_an_8khz_file_said_once(tones, tmp_path, model_file):
    root, y, truth = tones
    r = _cli("classify", "-m", model_file, "--events", root / "long.wav")     # the file is not settings
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.decode().splitlines()) == len(truth)
    slow = tmp_path / "slow.wav"
    sf.write(slow, y[::2], RATE // 2)
    r = _cli("classify", "-m", model_file, slow, "--events")
    assert r.returncode == 0 and r.stderr.decode().count("resampled up") == 1, r.stderr


def test_classify_events_says_when_there_are_none_and_refuses_window_options(tmp_path, model_file):
    quiet = tmp_path / "quiet.wav"
    sf.write(quiet, np.zeros(3 * RATE, np.float32), RATE)
    r = _cli("classify", "-m", model_file, quiet, "--events")
    assert r.returncode == 0 and r.stdout == b"" and b"no events in quiet.wav" in r.stderr
    for extra in (["--smooth", "3"], ["--hold", "200"], ["--compare", "sound"], ["--events", "gap_ms=x"]):
        r = _cli("classify", "-m", model_file, quiet, "--events", *extra)
        assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and b"Traceback" not in r.stderr


def test_sound_label_events_writes_a_data_set_and_a_label_track(tones, model_file, tmp_path):
    root, y, truth = tones
    out = tmp_path / "labels" / "events.csv"
    r = _cli("sound", "label", "-m", model_file, "--data", root / "long.wav", "--events", "-o", out, "--unknown", "off")
    assert r.returncode == 0, r.stderr
    ds = load_dataset(out)
    _matches([(rec.segment_ms[0], rec.segment_ms[1], rec.labels["sound"]) for rec in ds], truth)
    track = [line.split("\t") for line in out.with_suffix(".txt").read_text().splitlines()]
    assert [(round(float(a) * 1000), round(float(b) * 1000), v) for a, b, v in track] == \
        [(rec.segment_ms[0], rec.segment_ms[1], rec.labels["sound"]) for rec in ds]
