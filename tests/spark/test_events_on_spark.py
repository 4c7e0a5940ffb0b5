"""Events on the Spark engine (local[2]): each recording's events are found in a Spark task and read
back in data set order, the same events the local engine finds (starts, ends, labels, scores), and
a bad recording is refused, or skipped with ``skip_bad``, as the local engine does."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wavetrain.core.errors import AudioError
from wavetrain.data import load_dataset
from wavetrain.pipeline.jobs import RunOptions, event_predictions, train_model
from wavetrain.stream.events import EventOptions

RATE = 16000
TONES = {"low": 220.0, "high": 900.0}
#: The energy detector's levels here: the buzzes stand 30 dB above the background's floor, the
#: noise between them fluctuates up to about 20 dB above it (the floor is its minimum).
ENERGY = "on_db=28,off_db=20"


def _tone(freq: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """A buzz: the tone and its first harmonics (loud in several of the detector's bands)."""
    t = np.arange(int(RATE * seconds)) / RATE
    x = sum(np.sin(2 * np.pi * h * freq * t + rng.uniform(0, 2 * np.pi)) / h for h in range(1, 6))
    return (0.15 * x).astype(np.float32)


def _noise(seconds: float, rng: np.random.Generator) -> np.ndarray:
    return (0.005 * rng.standard_normal(int(RATE * seconds))).astype(np.float32)


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> Path:
    """Class folders of short clips: the two tones in a little noise, and noise alone (``gap``)."""
    root = tmp_path_factory.mktemp("words")
    rng = np.random.default_rng(0)
    for value in (*TONES, "gap"):
        (root / value).mkdir()
        for i in range(6):
            seconds = 0.3 + 0.04 * i
            x = _noise(seconds, rng)
            if value in TONES:
                x += _tone(TONES[value] * (1 + 0.01 * i), seconds, rng)
            sf.write(root / value / f"{value}{i}.wav", x, RATE)
    return root


@pytest.fixture(scope="module")
def long_recordings(tmp_path_factory) -> list[Path]:
    """Three recordings of a few seconds: tones of 0.25 to 0.5 s with gaps of noise between them."""
    folder = tmp_path_factory.mktemp("long")
    rng = np.random.default_rng(1)
    paths = []
    for k in range(3):
        parts = [_noise(0.6, rng)]
        for j in range(4 + k):
            seconds = rng.uniform(0.25, 0.5)
            parts += [_tone(TONES[("low", "high")[(j + k) % 2]], seconds, rng) + _noise(seconds, rng),
                      _noise(rng.uniform(0.3, 0.8), rng)]
        paths.append(folder / f"long{k}.wav")
        sf.write(paths[-1], np.concatenate(parts), RATE)
    return paths


def _tones(paths: list[Path]) -> list[tuple[Path, str]]:
    """The tones of the long recordings, in order."""
    return [(path, ("low", "high")[(j + k) % 2]) for k, path in enumerate(paths) for j in range(4 + k)]


def _found_the_tones(events, paths: list[Path]) -> None:
    truth = _tones(paths)
    assert [p.recording.path for p in events] == [path for path, _ in truth]
    assert sum(p.label == value for p, (_, value) in zip(events, truth)) >= 0.8 * len(truth)


def _same_events(spark_events, local_events) -> None:
    assert [(p.recording.path, p.start_ms, p.end_ms, p.label) for p in spark_events] == \
        [(p.recording.path, p.start_ms, p.end_ms, p.label) for p in local_events]
    for a, b in zip(spark_events, local_events):
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6, atol=1e-6)
        assert a.score_kind == b.score_kind and a.labels == b.labels and a.details.keys() == b.details.keys()
        np.testing.assert_allclose(list(a.details.values()), list(b.details.values()), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("params, settings", [
    ({}, ENERGY),
    ({"clip_ms": "200", "clip_shift_ms": "100"}, f"{ENERGY},gap_ms=200,pad_ms=30"),
    ({"clip_ms": "200", "clip_shift_ms": "100"}, "detector=model"),
], ids=["whole-energy", "clips-energy", "clips-model"])
def test_events_on_spark_equal_the_local_engines(job, words, long_recordings, params, settings):
    model, _ = train_model(load_dataset(words), "class", "gmm", {"components": "2", **params}, RunOptions())
    ds = load_dataset(long_recordings)
    options = EventOptions.parse(settings)
    local, skipped_local = event_predictions(model, ds, RunOptions(), options, unknown="off")
    local = list(local)
    on_spark, skipped = event_predictions(model, ds, RunOptions(), options, unknown="off", engine=job)
    on_spark = list(on_spark)
    assert not skipped and not skipped_local
    # the local engine finds each tone, and answers most with their value
    _found_the_tones(local, long_recordings)
    assert {id(p.recording) for p in on_spark} == {id(r) for r in ds}      # the data set's own recordings
    _same_events(on_spark, local)


def test_a_bad_recording_is_refused_or_skipped_as_locally(job, words, long_recordings, tmp_path):
    model, _ = train_model(load_dataset(words), "class", "gmm", {"components": "2"}, RunOptions())
    victim = tmp_path / "broken.wav"
    victim.write_bytes(b"RIFF this is not a wave file at all")
    ds = load_dataset([long_recordings[0], victim, long_recordings[1]], check=False)
    options = EventOptions.parse(ENERGY)
    with pytest.raises(AudioError, match=victim.name) as local_error:
        list(event_predictions(model, ds, RunOptions(), options)[0])
    with pytest.raises(AudioError, match=victim.name) as spark_error:
        list(event_predictions(model, ds, RunOptions(), options, engine=job)[0])
    assert str(spark_error.value) == str(local_error.value)

    local, skipped_local = event_predictions(model, ds, RunOptions(skip_bad=True), options)
    local = list(local)
    on_spark, skipped = event_predictions(model, ds, RunOptions(skip_bad=True), options, engine=job)
    on_spark = list(on_spark)
    assert [(r.path, why) for r, why in skipped] == [(r.path, why) for r, why in skipped_local]
    assert [r for r, _ in skipped] == [ds[1]]
    _found_the_tones(local, long_recordings[:2])
    _same_events(on_spark, local)


def test_classify_events_on_spark_writes_what_the_local_engine_writes(spark, words, long_recordings, tmp_path,
                                                                       capsys):
    import pyarrow.parquet as pq

    from wavetrain.cli.main import main

    def run(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert code == 0, err
        return out, err

    run("train", "--data", words, "--label", "class", "--model", "gmm", "--set", "components=2", "-o",
        tmp_path / "m.wt")
    classify = ("classify", "-m", tmp_path / "m.wt", "--data", *long_recordings, "--events", ENERGY)
    run(*classify, "-o", tmp_path / "local.parquet")
    run(*classify, "-o", tmp_path / "spark.parquet", "--engine", "spark", "--master", "local[2]", "--table",
        tmp_path / "table")
    local, on_spark = (pq.read_table(tmp_path / f"{name}.parquet") for name in ("local", "spark"))
    assert on_spark.schema == local.schema and on_spark.num_rows == local.num_rows == len(_tones(long_recordings))
    floats = [c for c in local.column_names if local.schema.field(c).type in ("double", "float")]
    assert floats        # the scores
    for name in local.column_names:
        if name in floats:
            np.testing.assert_allclose(on_spark.column(name).to_numpy(), local.column(name).to_numpy(),
                                       rtol=1e-6, atol=1e-6, err_msg=name)
        else:
            assert on_spark.column(name).to_pylist() == local.column(name).to_pylist(), name
