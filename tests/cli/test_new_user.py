"""What a new user's trial found, as behaviour: sample rates and channel layouts follow the model,
identical recordings never leak across folds, honest scores, whole-clip specs, padding planned,
the help a user reads, and summaries that fit on a screen."""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from wavetrain.cli.main import build_parser, main
from wavetrain.data.demo import machine_sound


def run(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=4",
                 "-o", str(path)]) == 0
    return path


def _labels(out: str) -> list[str]:
    return [line.split("state=")[1].split()[0] for line in out.strip().splitlines()]


# ---- sample rates and channels ---------------------------------------------------------------------
def test_model_records_its_rate_and_inputs_at_other_rates_are_resampled(capsys, demo_csv, trained, tmp_path):
    from wavetrain.models.modelfile import load_model

    assert load_model(trained).feature_rate_ == 16000
    wavs = sorted(demo_csv.parent.glob("*.wav"))
    code, out16, _ = run(capsys, "classify", "-m", trained, *wavs)
    assert code == 0
    for rate in (44100, 22050):
        folder = tmp_path / str(rate)
        folder.mkdir()
        for w in wavs:
            x, sr = sf.read(w, dtype="float32")
            sf.write(folder / w.name, resample_poly(x, rate // 50, sr // 50).astype(np.float32), rate)
        code, out, err = run(capsys, "classify", "-m", trained, *sorted(folder.glob("*.wav")))
        assert code == 0 and "WARNING" not in err
        same = np.mean(np.array(_labels(out)) == np.array(_labels(out16)))
        assert same >= 0.9, f"{rate} Hz: {same:.2f} of the answers match those at 16 kHz"


def test_lower_rate_inputs_are_resampled_with_a_warning(capsys, demo_csv, trained, tmp_path):
    w = sorted(demo_csv.parent.glob("*.wav"))[0]
    x, sr = sf.read(w, dtype="float32")
    sf.write(tmp_path / "low.wav", resample_poly(x, 1, 2).astype(np.float32), 8000)
    code, out, err = run(capsys, "classify", "-m", trained, tmp_path / "low.wav")
    assert code == 0 and len(out.strip().splitlines()) == 1
    assert "lower sample rate than the model's 16000 Hz" in err and "nothing above 4000 Hz" in err


def test_training_on_mixed_rates_uses_the_most_common_rate(capsys, demo_csv, tmp_path, caplog):
    from wavetrain.models.modelfile import load_model

    rows = demo_csv.read_text().splitlines()
    first = rows[0].split(",")[0]
    x, sr = sf.read(demo_csv.parent / first, dtype="float32")
    sf.write(tmp_path / "odd.wav", resample_poly(x, 441, 160).astype(np.float32), 44100)
    lines = [f"{demo_csv.parent / r.split(',', 1)[0]},{r.split(',', 1)[1]}" for r in rows]
    lines.append(f"odd.wav,{rows[0].split(',', 1)[1]}")
    (tmp_path / "metadata.csv").write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, "train", "--data", tmp_path, "--label", "state", "--model", "gmm", "--set",
                         "components=2", "-o", tmp_path / "m.wt")
    assert code == 0 and "several sample rates" in err and "1 at 44100 Hz" in err
    assert load_model(tmp_path / "m.wt").feature_rate_ == 16000


def test_kfold_reports_low_rate_recordings_once_not_per_fold(capsys, demo_csv, tmp_path):
    rows = demo_csv.read_text().splitlines()
    lines = [f"{demo_csv.parent / r.split(',', 1)[0]},{r.split(',', 1)[1]}" for r in rows]
    for i, r in enumerate(rows[:2]):
        x, sr = sf.read(demo_csv.parent / r.split(",")[0], dtype="float32")
        sf.write(tmp_path / f"low{i}.wav", resample_poly(x, 1, 2).astype(np.float32), 8000)
        lines.append(f"low{i}.wav,{r.split(',', 1)[1]}")
    (tmp_path / "metadata.csv").write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "evaluate", "--data", tmp_path, "--label", "state", "--model", "gmm",
                       "--set", "components=2", "--features", "logmel(bands=16, rate=16000)", "--folds", "3")
    assert code == 0 and err.count("lower sample rate") == 1 and "2 recording(s)" in err


def test_per_axis_model_records_channels_and_training_refuses_mixed_layouts(capsys, tmp_path):
    from wavetrain.models.modelfile import load_model

    rows = []
    for s, state in enumerate(("a", "b")):
        for i in range(3):
            x = np.stack([machine_sound("healthy", seconds=0.5, shaft_hz=20 + 30 * s + i,
                                        rng=np.random.default_rng(10 * s + i))] * 2, axis=1)
            sf.write(tmp_path / f"{state}{i}.wav", x, 16000)
            rows.append(f"{state}{i}.wav,state={state}")
    sf.write(tmp_path / "mono.wav", machine_sound("healthy", seconds=0.5, rng=np.random.default_rng(2)), 16000)
    (tmp_path / "metadata.csv").write_text("\n".join(rows + ["mono.wav,state=a"]) + "\n")
    args = ["train", "--data", tmp_path, "--label", "state", "--model", "gmm", "--set", "components=2",
            "--features", "logmel(bands=16, per_axis=true)", "-o", tmp_path / "m.wt"]
    code, _, err = run(capsys, *args)
    assert code == 2 and "mono.wav" in err and "one channel layout" in err
    code, _, err = run(capsys, *args, "--skip-bad")
    assert code == 0 and "skipped 1 bad recording" in err and "mono.wav" in err
    model = load_model(tmp_path / "m.wt")
    assert model.channels_ == 2 and model.feature_dim_ == 32


# ---- k-fold and duplicates ---------------------------------------------------------------------------
def test_kfold_keeps_copies_together_and_info_reports_them(capsys, demo_csv, tmp_path):
    rows = demo_csv.read_text().splitlines()
    lines = [f"{demo_csv.parent / r.split(',', 1)[0]},{r.split(',', 1)[1]}" for r in rows]
    for r in rows[:6]:  # renamed byte-identical copies of six recordings
        name = r.split(",")[0]
        (tmp_path / f"copy-{name}").write_bytes((demo_csv.parent / name).read_bytes())
        lines.append(f"copy-{name},{r.split(',', 1)[1]}")
    (tmp_path / "metadata.csv").write_text("\n".join(lines) + "\n")
    code, out, _ = run(capsys, "info", tmp_path)
    assert code == 0 and "duplicates: 12 recordings hold the same audio as another (6 groups)" in out
    code, out, _ = run(capsys, "info", tmp_path, "--json")
    assert len(json.loads(out)["duplicates"]) == 6
    from wavetrain.data import load_dataset
    from wavetrain.data.splits import kfold_indices

    ds = load_dataset(tmp_path)
    for seed in range(3):
        folds = kfold_indices(ds, 4, seed=seed)
        fold_of = {i: f for f, idx in enumerate(folds) for i in idx}
        for i, r in enumerate(ds):
            assert all(fold_of[i] == fold_of[j] for j, q in enumerate(ds) if q.id == r.id)


def test_info_summarises_labels_with_many_values(capsys, tmp_path):
    x = machine_sound("healthy", seconds=0.2, rng=np.random.default_rng(3))
    rows = []
    for i in range(40):
        sf.write(tmp_path / f"{i}.wav", x + 0.001 * i, 16000)
        rows.append(f"{i}.wav,speed={100 + i};name=n{i};kind={'ab'[i % 2]}")
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    code, out, _ = run(capsys, "info", tmp_path)
    assert code == 0 and len(out.splitlines()) < 25
    assert "numbers from 100 to 139" in out and "... and 30 more values" in out and "  a " in out
    code, out, _ = run(capsys, "info", tmp_path, "--all")
    assert code == 0 and len(out.splitlines()) > 80


# ---- what a score means ---------------------------------------------------------------------------------
def test_gmm_reports_loglik_and_how_typical_not_a_probability(capsys, trained, tmp_path):
    sf.write(tmp_path / "silence.wav", np.zeros(16000, np.float32), 16000)
    sf.write(tmp_path / "dc.wav", np.full(16000, 0.5, np.float32), 16000)
    rng = np.random.default_rng(0)
    sf.write(tmp_path / "noise.wav", (0.3 * rng.normal(size=16000)).astype(np.float32), 16000)
    code, out, _ = run(capsys, "classify", "-m", trained, "--json", tmp_path / "silence.wav",
                       tmp_path / "dc.wav", tmp_path / "noise.wav")
    assert code == 0
    for line in out.strip().splitlines():
        rec = json.loads(line)
        assert "confidence" not in rec and rec["score_kind"] == "mean_loglik"
        # more than 3 training standard deviations below: unlike any training window
        assert rec["z"] < -3, f"{rec['file']}: z={rec['z']} should say it is unlike any training window"


def test_neural_models_report_a_probability(capsys):
    from wavetrain.models import build
    from wavetrain.pipeline.prediction import Prediction
    from wavetrain.train.array_stream import synthetic_stream

    model = build("cnn", dict(epochs=1, batch_size=8, valid_fraction=0, frames=8))
    stream = synthetic_stream(24, 3, features=8)
    model.fit(stream)
    names, scores, details = model.predict_scores(next(stream.batches()).grams)
    assert model.score_kind == "probability" and np.allclose(scores.sum(axis=1), 1) and details == {}
    p = Prediction(None, 0, 10, names[0], scores[0], model.score_kind, model.labels_)
    assert p.describe("word") == f"word={names[0]} confidence={scores[0].max():.2f}"


# ---- whole-clip specs and padding ---------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["logmel(bands=16, window_ms=0)", "mfcc(bands=20, whole=true)",
                                  "stats(whole=true)"])
def test_whole_clip_specs_train_evaluate_and_plan(capsys, demo_csv, tmp_path, spec):
    common = ["--data", demo_csv, "--label", "state", "--model", "gmm", "--set", "components=1",
              "--features", spec]
    code, _, err = run(capsys, "train", *common, "-o", tmp_path / "m.wt")
    assert code == 0, err
    code, out, err = run(capsys, "evaluate", *common[:-4], "--set", "components=1", "--features", spec,
                         "--folds", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["windows"] == 24
    code, out, err = run(capsys, "memory", *common, "--json")
    assert code == 0, err
    assert json.loads(out)["predicted_peak_mb"] > 0


def test_planner_counts_padded_windows(demo_csv):
    from wavetrain.data import load_dataset
    from wavetrain.models import build
    from wavetrain.pipeline.memory import plan

    ds = load_dataset(demo_csv)  # 1 s recordings
    batches = {}
    for clip in (500, 1000, 2000, 4000):
        p = plan(ds, build("gmm", {"clip_ms": clip}), baseline_rss=0, batch_windows=64)
        batches[clip] = p.components_mb["batches"]
    # a window padded to 4 s holds 4 s of frames, however short the recording
    assert batches[500] < batches[1000] < batches[2000] < batches[4000]
    assert batches[4000] - batches[2000] == pytest.approx(2 * (batches[2000] - batches[1000]), abs=0.11)


# ---- evaluate's output ------------------------------------------------------------------------------
def test_evaluate_json_names_the_confusion_rows_and_columns(capsys, demo_csv, trained):
    code, out, _ = run(capsys, "evaluate", "-m", trained, "--data", demo_csv, "--label", "state", "--json")
    res = json.loads(out)
    assert code == 0 and res["confusion_rows"] == res["labels"]
    assert res["confusion_columns"] == res["labels"] + ["(other)"]
    assert np.asarray(res["confusion"]).shape == (len(res["confusion_rows"]), len(res["confusion_columns"]))


# ---- the help a user reads ------------------------------------------------------------------------------
def _parsers(parser, name="wavetrain"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_option_has_help():
    missing = [f"{name} {action.option_strings or action.dest}" for name, p in _parsers(build_parser())
               for action in p._actions
               if action.help in (None, "") and not isinstance(action, argparse._SubParsersAction)]
    assert not missing, missing


def test_verbose_works_after_the_command():
    p = build_parser()
    for argv in (["-v", "info", "x"], ["info", "x", "-v"], ["cache", "info", "-v"]):
        assert p.parse_args(argv).verbose is True
    assert p.parse_args(["info", "x"]).verbose is False


def test_features_help_lists_every_extractor_and_parameter(capsys):
    from wavetrain.features import describe_specs

    code, out, _ = run(capsys, "features", "--help")
    assert code == 0
    for stage in describe_specs():
        assert f"  {stage['name']}: " in out
        for prm in stage["params"]:
            assert f"{prm['name']}=" in out


def test_features_accepts_features_like_train(capsys, demo_csv, tmp_path):
    code, out, err = run(capsys, "features", "--data", demo_csv, "--features", "logmel(bands=8)", "-o", tmp_path / "f")
    assert code == 0, err
    assert len(list((tmp_path / "f").glob("*.npy"))) == 24 and not list((tmp_path / "f").glob(".partial*"))


def test_empty_mel_bands_are_reported(caplog):
    from wavetrain.features import extract

    with caplog.at_level(logging.WARNING):
        extract(np.zeros(16000, np.float32) + 0.1, 16000, "logmel(bands=1000, window_ms=20)")
    assert any("mel bands are empty" in r.getMessage() for r in caplog.records)


def test_a_copy_of_a_model_keeps_its_neural_attributes(tmp_path):
    """A saved and loaded neural model has every attribute `info` and prediction read."""
    from wavetrain.models import build
    from wavetrain.models.modelfile import load_model, save_model
    from wavetrain.train.array_stream import synthetic_stream

    model = build("cnn", dict(epochs=1, batch_size=8, valid_fraction=0, frames=8))
    assert model.train_info_ == {} and model.net_ is None
    model.fit(synthetic_stream(24, 3, features=8))
    loaded = load_model(save_model(model, tmp_path / "c.wt"))
    assert loaded.train_info_ == {} and loaded.frames_ == 8 and loaded.norm_mean_.shape == (8,)
    assert loaded.feature_rate_ is None and loaded.channels_ is None


@pytest.mark.parametrize("change,expect", [({"lr": 0.01}, "lr 0.001 -> 0.01"), ({"epochs": 3}, "epochs 2 -> 3"),
                                           ({"batch_size": 4}, "batch_size 8 -> 4")])
def test_resume_refuses_other_parameters(tmp_path, change, expect):
    from wavetrain.core.errors import UserError
    from wavetrain.models import FitOptions, build
    from wavetrain.train.array_stream import synthetic_stream

    params = dict(epochs=2, batch_size=8, valid_fraction=0, frames=8)
    stream = synthetic_stream(24, 3, features=8)
    build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(tmp_path)))
    with pytest.raises(UserError, match=expect):
        build("cnn", {**params, **change}).fit(stream, options=FitOptions(resume=str(tmp_path)))


def test_resume_refuses_another_label_set(tmp_path):
    from wavetrain.core.errors import UserError
    from wavetrain.models import FitOptions, build
    from wavetrain.train.array_stream import synthetic_stream

    params = dict(epochs=1, batch_size=8, valid_fraction=0, frames=8)
    build("cnn", params).fit(synthetic_stream(24, 3, features=8), options=FitOptions(checkpoint=str(tmp_path)))
    other = synthetic_stream(24, 3, features=8)
    other.labels = ["x", "y", "z"]
    with pytest.raises(UserError, match="trained on the values class0, class1, class2"):
        build("cnn", params).fit(other, options=FitOptions(resume=str(tmp_path)))


def test_readme_first_session_uses_real_files():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "some.wav" not in readme


def test_options_are_never_abbreviated_and_errors_name_the_command(capsys, demo_csv):
    """``memory --cache DIR`` was once taken for ``--cache-limit``: every option is spelled out, and
    an unknown one is named with the help of the command it was given to."""
    code, _, err = run(capsys, "memory", "--model", "gmm", "--data", demo_csv, "--label", "state", "--cache", "x")
    assert code == 2 and err.strip() == ("wavetrain: error: unrecognized arguments: --cache x "
                                         "(see `wavetrain memory --help`)")
    code, _, err = run(capsys, "cache", "info", "--bogus")
    assert code == 2 and "(see `wavetrain cache info --help`)" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "sound", "cut", "--data", demo_csv, "--clip", "500", "-o", "x")
    assert code == 2 and "--clip" in err and "see `wavetrain sound cut --help`" in err
    code, _, err = run(capsys, "--bogus")
    assert code == 2 and "(see `wavetrain --help`)" in err
    parsers = [build_parser()]
    while parsers:
        p = parsers.pop()
        assert p.allow_abbrev is False, p.prog
        parsers += [c for a in p._actions if isinstance(a, argparse._SubParsersAction) for c in a.choices.values()]


def test_counts_read_as_english_and_a_preset_is_named(capsys, tmp_path):
    from wavetrain.cli.common import counted
    from wavetrain.data.audio import write_audio

    assert (counted(1, "recording"), counted(2, "recording"), counted(1, "copy", "copies"),
            counted(0, "copy", "copies")) == ("1 recording", "2 recordings", "1 copy", "0 copies")
    rate, rng = 16000, np.random.default_rng(0)
    for i, f in enumerate([300, 320, 2000, 2100]):
        t = np.arange(rate // 2) / rate
        x = np.sin(2 * np.pi * f * t) * (0.2 + np.sin(2 * np.pi * 3 * t) ** 2) + 0.05 * rng.standard_normal(t.size)
        write_audio(tmp_path / f"{i}.wav", 0.3 * x, rate)
    (tmp_path / "metadata.csv").write_text("".join(f"{i}.wav,pitch={w}\n" for i, w in
                                                   enumerate(["low", "low", "high", "high"])))
    code, out, _ = run(capsys, "train", "--data", tmp_path, "--label", "pitch", "--model", "gmm-speech", "--set",
                       "components=1", "-o", tmp_path / "m.wt")
    assert code == 0 and out.startswith("trained gmm-speech on 4 recordings, 2 values of 'pitch'")
    code, _, err = run(capsys, "classify", "-m", tmp_path / "m.wt", tmp_path / "0.wav", "-o", tmp_path / "p.csv")
    assert code == 0 and "wrote 1 prediction to" in err
    code, out, _ = run(capsys, "info", tmp_path / "0.wav")
    assert code == 0 and out.startswith("1 recording,")


def test_models_lists_one_line_each_and_details_by_name(capsys):
    from wavetrain.models.registry import family_names, preset_names

    code, out, _ = run(capsys, "models")
    lines = [line for line in out.splitlines() if line.strip()]
    names = family_names() + preset_names()
    assert code == 0 and [line.split()[0] for line in lines[:len(names)]] == names
    assert "default " not in out and "`wavetrain models NAME`" in lines[-1]
    code, out, _ = run(capsys, "models", "hmm")
    assert code == 0 and "vtln_warps" in out and "default" in out and out.startswith("hmm: ")


def test_demo_removes_its_temporary_folder_and_keeps_what_o_names(capsys, tmp_path, monkeypatch):
    import functools
    import tempfile

    import wavetrain.data.demo as demo

    small = functools.partial(demo.make_demo_dataset, per_combo=4, speeds=(15.0,), snrs=(10.0,), seconds=0.5)
    monkeypatch.setattr(demo, "make_demo_dataset", lambda folder: small(folder))
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    code, out, err = run(capsys, "demo")
    assert code == 0 and "temporary folder is removed" in out and "wavetrain demo -o DIR" in out, err
    assert list(temp.iterdir()) == []
    code, out, _ = run(capsys, "demo", "-o", tmp_path / "kept")
    assert code == 0 and (tmp_path / "kept" / "machine-state.wt").is_file() and "Try: wavetrain evaluate" in out
    from wavetrain.data import load_dataset

    words = load_dataset(tmp_path / "kept" / "words")          # the shipped word set, as a data set
    assert len(words) == 240 and len(set(words.values("word"))) == 10 and len(set(words.values("speaker"))) == 24
    assert len(load_dataset(tmp_path / "kept" / "machines")) == 4 * 3
    assert "5. 240 spoken words of 24 voices" in out
