"""One windowing rule for the same audio: a file, a live stream (raw PCM and wav on stdin) and
samples in memory (what the server classifies) get the same windows, labels and scores."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.data import load_dataset
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.jobs import RunOptions, prediction_stream
from wavetrain.pipeline.prediction import classify_samples, classify_stream, predict
from wavetrain.stream.windows import Windowing

MACHINES = "/work/shared/data/machines"
FAN_U1 = ["--where", "machine=fan", "--where", "unit=u1"]
ENV = {**os.environ, "WAVETRAIN_PROGRESS": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
pytestmark = pytest.mark.skipif(not os.path.isdir(MACHINES), reason="needs the machines data set")


def _train(tmp_path_factory, family, clip_ms):
    path = tmp_path_factory.mktemp("agree") / f"fan{clip_ms}.wt"
    assert main(["train", "--data", MACHINES, *FAN_U1, "--where", "split=train", "--label", "state",
                 "--model", family, "--clip-ms", str(clip_ms), "--no-cache", "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def whole_model(tmp_path_factory):
    return _train(tmp_path_factory, "anomaly-gmm", 0)


@pytest.fixture(scope="module")
def clip_model(tmp_path_factory):
    return _train(tmp_path_factory, "normal-dist", 500)


def _normal_test_clips(n):
    ds = load_dataset([MACHINES], where=[("machine", ["fan"]), ("unit", ["u1"]), ("split", ["test"]),
                                         ("state", ["normal"])])
    return [r.path for r in list(ds)[:n]]


def _s16(path, seconds=None):
    x, rate = sf.read(path, dtype="int16")
    return (x if seconds is None else x[:int(seconds * rate)]), rate


def _wav_stream(pcm, rate):
    data = pcm.astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", 1, 1, rate, 2 * rate, 2, 16)
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", 0xFFFFFFFF) + data)


def _live(model, data, *args):
    r = subprocess.run([sys.executable, "-m", "wavetrain.cli.main", "classify", "-m", str(model), "--json", *args,
                        "-"], input=data, capture_output=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.decode().splitlines()], r.stderr.decode()


def _from_file(model, path):
    m = load_model(model)
    return list(predict(m, prediction_stream(m, load_dataset([str(path)]), RunOptions())))


def test_short_recording_is_one_window_everywhere(whole_model, tmp_path):
    """A 450 ms recording and a clip_ms=0 model: the file is one window; so are the stream on
    stdin (raw and wav; live windows are 1000 ms) and the samples with a 1000 ms clip asked."""
    pcm, rate = _s16(_normal_test_clips(1)[0], seconds=0.45)
    sf.write(tmp_path / "short.wav", pcm, rate, subtype="PCM_16")
    (f,) = _from_file(whole_model, tmp_path / "short.wav")
    assert (f.start_ms, f.end_ms) == (0, 450)
    x = pcm.astype(np.float32) / 32768
    m = load_model(whole_model)
    (s,) = classify_samples(m, x, rate, clip_ms=1000)            # the server's clip_ms=1000
    (w,) = [w.prediction for w in classify_stream(m, [(x, 0.0)], rate)]
    for p in (s, w):
        assert (p.start_ms, p.end_ms, p.label) == (0, 450, f.label)
        np.testing.assert_allclose(p.scores, f.scores, rtol=1e-6)
    for data, args in ((pcm.astype("<i2").tobytes(), ("--rate", "16000", "--format", "s16le")),
                       (_wav_stream(pcm, rate), ())):
        (d,), err = _live(whole_model, data, *args)
        assert (d["start_ms"], d["end_ms"], d["value"]) == (0, 450, f.label)
        assert d["anomaly_score"] == pytest.approx(float(f.scores[0]), rel=1e-5)
        assert "asked for" not in err              # one window, as the file: nothing to warn about


def test_whole_recording_model_last_live_window_is_not_padded(whole_model):
    """Streamed normal 2 s clips in 1000 ms windows: the last window scores like the first (it
    was padded with silence, which a clip_ms=0 model never saw, and flagged)."""
    m = load_model(whole_model)
    first, last, padded = [], [], []
    for path in _normal_test_clips(8):
        pcm, rate = _s16(path)
        x = pcm.astype(np.float32) / 32768
        ws = [w.prediction for w in classify_stream(m, [(x, 0.0)], rate)]
        assert [(p.start_ms, p.end_ms) for p in ws] == [(0, 1000), (1000, 2000)]
        first.append(ws[0].score)
        last.append(ws[-1].score)
        (pad,) = classify_samples(m, x[rate:], rate, windowing=Windowing(1000, 0, "zero"))
        padded.append(pad.score)
        same = classify_samples(m, x, rate, clip_ms=1000)
        np.testing.assert_allclose([p.score for p in same], [p.score for p in ws], rtol=1e-6)
    assert np.mean(last) < 1.25 * np.mean(first)
    assert np.mean(padded) > 1.4 * np.mean(first)      # what completing it with silence did
    assert np.sum(np.array(last) > m.threshold_) <= len(last) // 2 < np.sum(np.array(padded) > m.threshold_)


def test_clip_model_same_windows_and_scores_file_stream_samples(clip_model):
    """A clip_ms=500 model: every window of normal clips, the padded last one included, scores
    the same from the file, the stream and the samples; the last window is not flagged more."""
    m = load_model(clip_model)
    flagged_last = 0
    paths = _normal_test_clips(6)
    for path in paths:
        pcm, rate = _s16(path)
        x = pcm.astype(np.float32) / 32768
        files = _from_file(clip_model, path)
        stream = [w.prediction for w in classify_stream(m, [(x[i:i + 3000], 0.0) for i in range(0, x.size, 3000)],
                                                        rate)]
        samples = classify_samples(m, x, rate)
        for preds in (stream, samples):
            assert [(p.start_ms, p.end_ms, p.label) for p in preds] == \
                   [(p.start_ms, p.end_ms, p.label) for p in files]
            np.testing.assert_allclose([p.score for p in preds], [p.score for p in files], rtol=1e-5)
        flagged_last += bool(stream[-1].anomaly)
    assert flagged_last <= 1
    pcm, rate = _s16(paths[0])
    live, _ = _live(clip_model, pcm.astype("<i2").tobytes(), "--rate", "16000")
    files = _from_file(clip_model, paths[0])
    assert [(d["start_ms"], d["end_ms"], d["value"]) for d in live] == \
           [(p.start_ms, p.end_ms, p.label) for p in files]
    np.testing.assert_allclose([d["anomaly_score"] for d in live], [p.score for p in files], rtol=1e-5)


def test_with_windows_cuts_files_by_the_same_rule(whole_model, tmp_path):
    """What ``sound label --clip-ms`` and a server request classify with: a copy of the model,
    the model itself untouched; a file then gets the windows the samples get."""
    from wavetrain.pipeline.prediction import with_windows

    m = load_model(whole_model)
    pcm, rate = _s16(_normal_test_clips(1)[0], seconds=1.45)
    sf.write(tmp_path / "s.wav", pcm, rate, subtype="PCM_16")
    asked = with_windows(m, 1000)
    assert asked is not m and m.params["clip_ms"] == 0 and asked.params["pad"] == "keep"
    assert with_windows(m) is m
    files = list(predict(asked, prediction_stream(asked, load_dataset([str(tmp_path / "s.wav")]), RunOptions())))
    samples = classify_samples(m, pcm.astype(np.float32) / 32768, rate, clip_ms=1000)
    assert [(p.start_ms, p.end_ms) for p in files] == [(p.start_ms, p.end_ms) for p in samples] == \
           [(0, 1000), (1000, 1450)]
    np.testing.assert_allclose([p.score for p in files], [p.score for p in samples], rtol=1e-5)


def test_other_windows_than_trained_warn_once(clip_model, caplog):
    m = load_model(clip_model)
    x = np.random.default_rng(0).normal(0, 0.1, 32000).astype(np.float32)
    with caplog.at_level("WARNING", logger="wavetrain.pipeline.prediction"):
        classify_samples(m, x, 16000, clip_ms=700)
        classify_samples(m, x, 16000, clip_ms=700)
        classify_samples(m, x, 16000, clip_ms=500)          # the model's own: no warning
    said = [r.getMessage() for r in caplog.records if "asked for" in r.getMessage()]
    assert said == ["normal-dist was trained on 500 ms windows every 500 ms and is asked for 700 ms windows every "
                    "700 ms: its scores and threshold may differ from those on its own windows"]
