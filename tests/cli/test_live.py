"""``wavetrain classify -m MODEL -``: a live stream on stdin, raw PCM or a streamed wav, classified
window by window as it arrives, in a subprocess fed through a pipe."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main

WAVETRAIN = [sys.executable, "-m", "wavetrain.cli.main"]
ENV = {**os.environ, "WAVETRAIN_PROGRESS": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def clip_model(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("live") / "clip.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=4",
                 "--clip-ms", "500", "-o", str(path)]) == 0
    return path


def _signal(seconds_each=(1.2, 1.3), rate=16000):
    from wavetrain.data.demo import machine_sound

    x = np.concatenate([machine_sound("healthy", seconds=seconds_each[0], rng=np.random.default_rng(1)),
                        machine_sound("bearing", seconds=seconds_each[1], rng=np.random.default_rng(2))])
    if rate != 16000:
        from wavetrain.features import resample
        x = resample(x, 16000, rate)
    return np.clip(x, -1, 1).astype(np.float32)


def _s16(x):
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def _wav_stream_header(rate, channels=1, bits=16, tag=1, data_size=0xFFFFFFFF):
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * channels * bits // 8, channels * bits // 8, bits)
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"LIST" + struct.pack("<I", 4) + b"INFO" + b"data" + struct.pack("<I", data_size))


def _live(model, *args, data=b"", timeout=120):
    return subprocess.run([*WAVETRAIN, "classify", "-m", str(model), *args, "-"], input=data,
                          capture_output=True, timeout=timeout, env=ENV)


def test_raw_pcm_matches_the_file(clip_model, tmp_path, capsys):
    x = _signal()
    r = _live(clip_model, "--json", data=_s16(x))
    assert r.returncode == 0, r.stderr
    live = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert [(d["start_ms"], d["end_ms"]) for d in live] == [(0, 500), (500, 1000), (1000, 1500), (1500, 2000),
                                                           (2000, 2500)]
    assert all(d["file"] == "-" and d["latency_ms"] >= 0 for d in live)
    # the same samples as a file give the same answers; the scores are close, not equal: the deltas
    # of a window's edge frames see only the window's own frames
    sf.write(tmp_path / "same.wav", np.frombuffer(_s16(x), "<i2"), 16000, subtype="PCM_16")
    assert main(["classify", "-m", str(clip_model), "--json", str(tmp_path / "same.wav")]) == 0
    files = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["value"] for d in live] == [d["value"] for d in files]
    for a, b in zip(live, files):
        assert a["loglik"] == pytest.approx(b["loglik"], rel=0.1, abs=1.0)
    assert [d["value"] for d in live][:2] == ["healthy", "healthy"] and live[-1]["value"] == "bearing"


def test_text_lines_sliding_windows_and_f32(clip_model):
    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline.prediction import classify_samples

    x = _signal()
    r = _live(clip_model, "--format", "f32le", "--clip-ms", "1000", "--clip-shift-ms", "500",
              data=x.astype("<f4").tobytes())
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 0 and lines[0].startswith("-[0-1000]: state=healthy loglik=")
    # the first partial window is the last, padded, as the same request cuts the samples in memory
    assert [ln.split(":")[0] for ln in lines] == ["-[0-1000]", "-[500-1500]", "-[1000-2000]", "-[1500-2500]"]
    same = classify_samples(load_model(clip_model), x, 16000, clip_ms=1000, shift_ms=500)
    assert [f"-[{p.start_ms}-{p.end_ms}]" for p in same] == [ln.split(":")[0] for ln in lines]
    assert all(" latency_ms=" in ln for ln in lines)
    assert "trained on 500 ms windows every 500 ms and is asked for 1000 ms windows every 500 ms" in r.stderr.decode()


def test_wav_stream_of_unknown_size_resampled(clip_model):
    x = _signal(rate=8000)
    data = _wav_stream_header(8000) + _s16(x)
    r = _live(clip_model, "--csv", data=data)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.decode().splitlines()
    assert rows[0] == "file,start_ms,end_ms,value,score:bearing,score:healthy,score:loose,latency_ms"
    assert len(rows) == 1 + 5
    values = [row.split(",")[3] for row in rows[1:]]
    # 8 kHz holds nothing above 4 kHz: unlike the training sound, so live answers may be unknown
    assert set(values) <= {"healthy", "bearing", "loose", "unknown"}
    # a stereo float wav with a known size: averaged, read to the size given
    st = np.stack([x, x], axis=1).astype("<f4").tobytes()
    r = _live(clip_model, data=_wav_stream_header(8000, 2, 32, 3, len(st)) + st + b"junk after the data")
    assert r.returncode == 0 and len(r.stdout.decode().splitlines()) == 5


def test_answers_arrive_while_the_stream_is_open(clip_model):
    """Each window is printed (and flushed) as soon as its samples are in, not at EOF."""
    # (SIGINT back to its default in the child: a test run started in the background, as by nohup,
    # has it ignored, and Python then leaves it ignored)
    p = subprocess.Popen([*WAVETRAIN, "classify", "-m", str(clip_model), "-"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        p.stdin.write(_s16(_signal())[: 2 * 16000 * 1 + 960])    # 1 s and the context of the 2nd window
        p.stdin.flush()
        first = p.stdout.readline().decode()
        second = p.stdout.readline().decode()
        assert first.startswith("-[0-500]") and second.startswith("-[500-1000]")
        assert p.poll() is None                                # still waiting for more
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 130
        assert b"Traceback" not in err and err.decode().strip() == "wavetrain: interrupted"
    finally:
        if p.poll() is None:
            p.kill()


def test_closed_stdout_ends_quietly(clip_model):
    r = subprocess.run(f"{' '.join(WAVETRAIN)} classify -m {clip_model} - | head -n 1", shell=True,
                       input=_s16(_signal(seconds_each=(20.0, 20.0))), capture_output=True, env=ENV, timeout=120)
    assert r.returncode == 0 and r.stdout.decode().count("\n") == 1
    assert b"Traceback" not in r.stderr and b"Broken pipe" not in r.stderr, r.stderr


@pytest.mark.parametrize("args, data, words", [
    (["--compare", "state"], b"", "--compare needs the recordings' metadata"),
    ([], b"", "stdin: no audio arrived"),
    (["--clip-ms", "0"], b"\0\0" * 100, "--clip-ms 0"),
    (["--rate", "0"], b"\0\0", "--rate 0"),
    ([], b"RIFF\xff\xff\xff\xffWAVEfmt \x10\0\0\0\x02\0\x01\0\x80>\0\0\0}\0\0\x02\0\x10\0data\0\0\0\0",
     "wav format 2"),
    ([], _wav_stream_header(16000), "stdin: no audio samples on stdin (a wav header without data)"),
    ([], b"\x01", "stdin: no audio samples on stdin (1 byte(s), less than one s16le sample frame"),
    (["--format", "f32le"], np.where(np.arange(40000) == 20000, np.nan, 0.01).astype("<f4").tobytes(),
     "stdin: sample 20000 is nan (1.250 s in); float samples must be finite"),
    (["--format", "f32le", "--channels", "2"], np.where(np.arange(400) == 247, -np.inf, 0.0).astype("<f4").tobytes(),
     "stdin: sample 123 (channel 2) is -inf"),
    (["--rate", "1"], b"\0\0" * 100, "--rate 1: sampled at 1 Hz, but the features are computed at 16000 Hz"),
    ([], _wav_stream_header(800) + b"\0\0" * 1000, "stdin (a wav stream at 800 Hz): sampled at 800 Hz"),
    (["--clip-ms", "1000000000"], b"\0\0" * 100, "--clip-ms 1000000000: a live window's samples are held in memory"),
    (["--clip-shift-ms", "700000"], b"\0\0" * 100, "--clip-shift-ms 700000: a live window's samples"),
    ([], _wav_stream_header(5_000_000) + b"\0\0" * 100,
     "stdin: its wav header says 1 channels at 5000000 Hz; a live stream has 1 to 64 channels at 1 to 1000000 Hz"),
    ([], _wav_stream_header(16000, channels=100) + b"\0\0" * 100, "stdin: its wav header says 100 channels"),
])
def test_bad_live_settings_are_one_line(clip_model, args, data, words):
    r = _live(clip_model, *args, data=data)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1 and words in err, err


def test_a_truncated_wav_stream_is_classified_with_a_one_line_note(clip_model):
    x = _s16(_signal())
    r = _live(clip_model, "--csv", data=_wav_stream_header(16000, data_size=len(x) + 32000) + x)
    err = r.stderr.decode()
    assert r.returncode == 0 and err.count("\n") == 1, err
    assert f"truncated wav stream: its header gives {len(x) + 32000} bytes of samples, the stream ended after " \
           f"{len(x)}" in err
    assert len(r.stdout.decode().splitlines()) == 1 + 5          # the answers are kept


def test_memory_stays_flat_over_thirty_minutes(clip_model):
    """30 min of 8 kHz PCM generated on the fly: RSS after 3 min and at the end within a few MiB."""
    psutil = pytest.importorskip("psutil")
    rate, seconds, block = 8000, 30 * 60, 8000
    p = subprocess.Popen([*WAVETRAIN, "classify", "-m", str(clip_model), "--rate", str(rate), "--clip-ms", "1000",
                          "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV)
    proc = psutil.Process(p.pid)
    rss: dict[int, int] = {}
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    rng = np.random.default_rng(0)
    t = np.arange(block) / rate
    try:
        for s in range(seconds):
            x = 0.3 * np.sin(2 * np.pi * (300 + 100 * (s // 60 % 3)) * t) + 0.02 * rng.normal(size=block)
            p.stdin.write(_s16(x))
            if s in (180, seconds - 1):
                p.stdin.flush()
                time.sleep(0.5)
                rss[s] = proc.memory_info().rss
        p.stdin.close()
        p.wait(timeout=600)
        reader.join(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0
    assert len(lines) == seconds
    grown = (rss[seconds - 1] - rss[180]) / 2**20
    print(f"RSS after 3 min {rss[180] / 2**20:.1f} MiB, after 30 min {rss[seconds - 1] / 2**20:.1f} MiB; "
          f"latency median {np.median([float(ln.rsplit(b'=', 1)[1]) for ln in lines]):.2f} ms")
    assert grown < 20, f"RSS grew by {grown:.1f} MiB over 27 minutes of audio"


def _machine(state, seconds, seed):
    from wavetrain.data.demo import machine_sound

    return machine_sound(state, seconds=seconds, rng=np.random.default_rng(seed))


def test_sound_unlike_the_training_is_unknown_live_by_default(clip_model, tmp_path, capsys):
    """Near-silence and a pure tone are far from every training window (|z| above 4): answered
    unknown by default, and not with --unknown off; the machine sounds around them stay answered."""
    rng = np.random.default_rng(5)
    x = np.concatenate([_machine("healthy", 1.0, 1), rng.normal(0, 1e-4, 8000),
                        0.3 * np.sin(2 * np.pi * 1000 * np.arange(8000) / 16000), _machine("bearing", 1.0, 2)])
    live = [json.loads(line) for line in _live(clip_model, "--json", data=_s16(x)).stdout.decode().splitlines()]
    off = [json.loads(line) for line in _live(clip_model, "--json", "--unknown", "off", data=_s16(x))
           .stdout.decode().splitlines()]
    assert [d["start_ms"] for d in live] == [d["start_ms"] for d in off] == [0, 500, 1000, 1500, 2000, 2500]
    assert [d["value"] for d in live] == ["healthy", "healthy", "unknown", "unknown", "bearing", "bearing"]
    assert "unknown" not in [d["value"] for d in off]
    assert all(abs(d["z"]) > 4 for d in live[2:4]) and all(abs(d["z"]) < 4 for d in live[:2] + live[4:])
    # the same rule at another level; and files keep the model's own answers unless asked
    assert "unknown" not in [json.loads(line)["value"] for line in _live(
        clip_model, "--json", "--unknown", "1000", data=_s16(x)).stdout.decode().splitlines()]
    sf.write(tmp_path / "x.wav", np.frombuffer(_s16(x), "<i2"), 16000, subtype="PCM_16")
    values = {}
    for args in ([], ["--unknown", "auto"]):
        assert main(["classify", "-m", str(clip_model), "--json", *args, str(tmp_path / "x.wav")]) == 0
        values[len(args)] = [json.loads(line)["value"] for line in capsys.readouterr().out.splitlines()]
    # (a file's windows see their neighbours' frames through the deltas: the edges of the quiet
    # part differ from the stream's)
    assert "unknown" not in values[0] and values[2][2:4] == ["unknown", "unknown"]
    assert values[2][0] == "healthy" and values[2][-1] == "bearing"


def test_smooth_and_hold_on_a_live_stream(clip_model):
    """A one-window blip of another machine sound is smoothed and held away; the change that
    persists is reported once it has held for --hold ms. JSON: the scores are the mean of the
    last --smooth windows' own scores, which `raw` keeps."""
    x = np.concatenate([_machine("healthy", 1.5, 1), _machine("bearing", 0.5, 2), _machine("healthy", 1.0, 3),
                        _machine("bearing", 2.0, 4)])
    plain = [json.loads(line) for line in _live(clip_model, "--json", data=_s16(x)).stdout.decode().splitlines()]
    assert [d["value"] for d in plain] == ["healthy"] * 3 + ["bearing"] + ["healthy"] * 2 + ["bearing"] * 4
    r = _live(clip_model, "--json", "--smooth", "3", "--hold", "500", data=_s16(x))
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert [d["raw"]["value"] for d in got] == [d["value"] for d in plain]
    for i, d in enumerate(got):
        own = [got[j]["raw"]["scores"] for j in range(max(0, i - 2), i + 1)]
        for v, s in d["scores"].items():
            assert s == pytest.approx(np.mean([o[v] for o in own]), abs=2e-6)
    assert [d["smoothed"] for d in got] == [1, 2] + [3] * 8
    # before an answer has held: undecided; the blip never holds; bearing holds 500 ms after the
    # smoothed scores first favour it
    assert [d["value"] for d in got] == ["undecided"] + ["healthy"] * 7 + ["bearing"] * 2
    assert [d["pending"] for d in got] == ["healthy"] + [None] * 6 + ["bearing", None, None]
    text = _live(clip_model, "--smooth", "3", "--hold", "500", data=_s16(x)).stdout.decode().splitlines()
    assert text[0].startswith("-[0-500]: state=undecided loglik=") and " raw=healthy pending=healthy " in text[0]
    assert text[3].startswith("-[1500-2000]: state=healthy ") and " raw=bearing latency_ms=" in text[3]


def test_live_answer_options_are_checked_before_reading(clip_model):
    for args, words in ((["--unknown", "maybe"], "--unknown maybe: expected off, trained, auto or a level"),
                        (["--smooth", "0"], "--smooth: expected an integer >= 1, got 0"),
                        (["--hold", "-5"], "--hold: expected an integer >= 0, got -5")):
        r = _live(clip_model, *args, data=b"")
        err = r.stderr.decode()
        assert r.returncode == 2 and err.count("\n") == 1 and words in err, err
