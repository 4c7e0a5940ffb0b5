"""Labels from file names (``--labels-from-name``, ``load_dataset(labels_from_name=...)``), ``classify
--where`` and ``train``'s default model: a folder of ``0_george_0.wav`` files without a metadata.csv is
a labelled data set for every command that takes ``--data``."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import build_parser, main
from wavetrain.core.errors import MetadataError, ParameterError
from wavetrain.data import load_dataset
from wavetrain.data.name_labels import NamePattern, suggest_pattern

RATE = 8000
DIGITS = ("0", "1", "2")
SPEAKERS = ("george", "jackson")
PATTERN = "{digit}_{speaker}_{take}"


def run(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _tone(digit: int, seed: int) -> np.ndarray:
    t = np.arange(RATE // 2) / RATE
    noise = 0.01 * np.random.default_rng(seed).normal(size=t.size)
    return (0.3 * np.sin(2 * np.pi * (300.0 + 500.0 * digit) * t) + noise).astype(np.float32)


def _digits(folder: Path, takes: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for d in DIGITS:
        for s, speaker in enumerate(SPEAKERS):
            for k in range(takes):
                sf.write(folder / f"{d}_{speaker}_{k}.wav", _tone(int(d), 100 * int(d) + 10 * s + k), RATE)
    return folder


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """A folder of spoken-digit style files, ``<digit>_<speaker>_<take>.wav``, and no metadata.csv."""
    return _digits(tmp_path_factory.mktemp("lfn") / "digits")


@pytest.fixture(scope="module")
def listed(digits, tmp_path_factory) -> Path:
    """The same files listed in a metadata.csv, labels ``digit`` and ``speaker``."""
    csv = tmp_path_factory.mktemp("lfn-csv") / "metadata.csv"
    csv.write_text("".join(f"{f},digit={f.name[0]};speaker={f.name.split('_')[1]}\n"
                           for f in sorted(digits.glob("*.wav"))))
    return csv


@pytest.fixture(scope="module")
def model(listed, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lfn-model") / "digits.wt"
    assert main(["train", "--data", str(listed), "--label", "digit", "--model", "gmm", "--set", "components=2",
                 "-o", str(path)]) == 0
    return path


# ---- the pattern -------------------------------------------------------------------------------------
def test_fields_take_the_shortest_run_that_lets_the_rest_match():
    assert NamePattern(PATTERN).labels(Path("x/0_george_12.wav")) == {"digit": "0", "speaker": "george",
                                                                      "take": "12"}
    assert NamePattern("{a}_{b}").labels(Path("x_y_z.wav")) == {"a": "x", "b": "y_z"}       # the last takes the rest
    assert NamePattern("{a}{b}").labels(Path("xyz.flac")) == {"a": "x", "b": "yz"}
    assert NamePattern("{word}_{accent}_{voice}_{_}").labels(Path("zero_en-us-nyc_f1_0.flac")) == {
        "word": "zero", "accent": "en-us-nyc", "voice": "f1"}
    assert NamePattern("rec-{n}").labels(Path("rec-7.wav")) == {"n": "7"}


def test_ignored_fields_missing_parts_and_extensions():
    p = NamePattern("{digit}_{}_{_}")
    assert p.labels(Path("3_anna_1.wav")) == {"digit": "3"} and p.names == ["digit"]
    assert NamePattern(PATTERN).labels(Path("3_anna.wav")) is None            # a field matches one character at least
    assert NamePattern(PATTERN).labels(Path("3__1.wav")) is None
    assert NamePattern("{a}_{b}").labels(Path("x_y.wav.wav")) == {"a": "x", "b": "y.wav"}   # the stem only
    with_ext = NamePattern("{a}_{b}.wav")                 # a pattern that ends in an audio extension: the whole name
    assert with_ext.labels(Path("x_y.wav")) == {"a": "x", "b": "y"} and with_ext.labels(Path("x_y.flac")) is None


def test_a_hostile_pattern_is_answered_without_trying_every_split():
    # 40 fields against a 400-character name that cannot match (backtracking would try C(200, 40) splits)
    p = NamePattern("_".join(f"{{f{i}}}" for i in range(40)) + "Q")
    assert p.labels(Path("_".join(["x"] * 200) + ".wav")) is None
    assert p.labels(Path("_".join(["x"] * 200) + "Q.wav")) is not None


@pytest.mark.parametrize("text, says", [
    ("", "empty"), ("  ", "empty"), ("digits", "no field"), ("{_}_{}", "every field is ignored"),
    ("{digit", "unmatched {"), ("digit}_{a}", "unmatched }"), ("{a}/{b}", "path separator"),
    ("{a b}", "field {a b}"), ("{a=b}", "field {a=b}"), ("{a}_{a}", "appears twice"),
])
def test_bad_patterns_are_refused_in_one_line(text, says):
    with pytest.raises(ParameterError, match="name pattern") as e:
        NamePattern(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_suggested_pattern_follows_the_name():
    assert suggest_pattern("0_george_0", "digit") == "{digit}_{_}_{_}"
    assert suggest_pattern("zero_en-us-nyc_f1_0", "word") == "{word}_{_}_{_}_{_}"
    assert suggest_pattern("dog1", "animal") == "{animal}"
    assert NamePattern(suggest_pattern("0_george_0", "digit")).labels(Path("0_george_0.wav")) == {"digit": "0"}


# ---- the data set ------------------------------------------------------------------------------------
def test_load_dataset_labels_a_folder_of_audio_files(digits):
    ds = load_dataset(digits, labels_from_name=PATTERN)
    assert len(ds) == 12 and ds.label_names() == ["digit", "speaker", "take"]
    assert sorted(ds.counts("digit").items()) == [("0", 4), ("1", 4), ("2", 4)]
    for r in ds:
        assert r.path.stem == "_".join(r.labels[k] for k in ("digit", "speaker", "take"))
    assert len(load_dataset(sorted(digits.glob("1_*.wav")), labels_from_name=PATTERN).counts("speaker")) == 2


def test_where_filters_on_labels_from_names(digits):
    ds = load_dataset(digits, labels_from_name=PATTERN, where=[("speaker", ["george"]), ("digit", ["1", "2"])])
    assert sorted(r.path.name for r in ds) == ["1_george_0.wav", "1_george_1.wav", "2_george_0.wav",
                                               "2_george_1.wav"]


def test_names_join_the_metadata_labels_and_a_clash_is_refused(digits, tmp_path):
    rows = [f"{digits / f'{d}_george_0.wav'},split={'train' if d != '2' else 'test'}" for d in DIGITS]
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    ds = load_dataset(tmp_path, labels_from_name="{digit}_{_}_{_}")
    assert [dict(r.labels) for r in ds] == [{"split": "train", "digit": "0"}, {"split": "train", "digit": "1"},
                                            {"split": "test", "digit": "2"}]
    (tmp_path / "metadata.csv").write_text(f"{digits / '1_george_0.wav'},digit=1\n"
                                           f"{digits / '2_george_0.wav'},digit=7\n")
    with pytest.raises(MetadataError) as e:
        load_dataset(tmp_path, labels_from_name="{digit}_{_}_{_}")
    msg = str(e.value)
    assert "2_george_0.wav" in msg and "digit=2" in msg and "digit=7" in msg and "metadata.csv:2" in msg
    assert "1_george_0.wav" not in msg and "\n" not in msg


def test_the_same_value_from_the_metadata_and_the_name_is_no_clash(digits, tmp_path):
    (tmp_path / "metadata.csv").write_text(f"{digits / '1_george_0.wav'},digit=1;split=train\n")
    (r,) = load_dataset(tmp_path, labels_from_name=PATTERN)
    assert dict(r.labels) == {"digit": "1", "split": "train", "speaker": "george", "take": "0"}


def test_class_sub_folders_keep_their_label_and_answer_to_other_names(digits, tmp_path):
    for d in DIGITS:
        (tmp_path / f"digit{d}").mkdir()
        for f in digits.glob(f"{d}_*.wav"):
            (tmp_path / f"digit{d}" / f.name).symlink_to(f)
    ds = load_dataset(tmp_path, labels_from_name="{_}_{speaker}_{_}")
    assert ds.label_names() == ["class", "speaker"]
    assert sorted(ds.counts("speaker").values()) == [6, 6]
    assert sorted(ds.counts("word")) == ["digit0", "digit1", "digit2"]        # any other name: the sub-folder
    with pytest.raises(MetadataError, match="sub-folder gives class=digit0"):
        load_dataset(tmp_path, labels_from_name="{class}_{_}_{_}")


def test_a_name_that_does_not_match_is_refused_or_skipped(digits, tmp_path):
    _digits(tmp_path, takes=1)
    sf.write(tmp_path / "notes.wav", _tone(0, 9), RATE)
    with pytest.raises(MetadataError) as e:
        load_dataset(tmp_path, labels_from_name=PATTERN)
    msg = str(e.value)
    assert "notes.wav" in msg and PATTERN in msg and "--skip-bad" in msg and "\n" not in msg
    ds = load_dataset(tmp_path, labels_from_name=PATTERN, skip_bad=True)
    assert len(ds) == 6 and [r.path.name for r, _ in ds.skipped] == ["notes.wav"]
    with pytest.raises(MetadataError, match="no file's name matches"):
        load_dataset(tmp_path, labels_from_name="{a}-{b}", skip_bad=True)


def test_an_unlabelled_data_set_says_how_to_label_it_from_names(digits):
    ds = load_dataset(digits)
    with pytest.raises(MetadataError) as e:
        ds.resolve_label("digit")
    msg = str(e.value)
    assert "no label named 'digit'" in msg and "(none)" in msg
    assert "--labels-from-name '{digit}_{_}_{_}'" in msg and "look like 0_george_0.wav" in msg


# ---- the commands ------------------------------------------------------------------------------------
def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                out.update(_commands(sub, full) or {full: sub})
    return out


def test_every_command_that_takes_data_takes_labels_from_name():
    taking = {name: {o for a in p._actions for o in a.option_strings} for name, p in _commands(build_parser()).items()}
    with_data = sorted(n for n, opts in taking.items() if "--data" in opts)
    assert {"train", "evaluate", "classify", "features", "memory", "adapt", "plot-roc", "sound partition",
            "sound label"} <= set(with_data)
    assert [n for n in with_data if "--labels-from-name" not in taking[n]] == []
    assert "--where" in taking["classify"]


def test_train_on_a_folder_without_labels_shows_the_pattern_to_give(capsys, digits, tmp_path):
    code, out, err = run(capsys, "train", "--data", digits, "--label", "digit", "--model", "gmm", "-o",
                         tmp_path / "m.wt")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "no label named 'digit'" in err and "--labels-from-name '{digit}_{_}_{_}'" in err
    assert "0_george_0.wav" in err
    assert not (tmp_path / "m.wt").exists()


def test_train_learns_labels_from_names(capsys, digits, tmp_path):
    from wavetrain.models.modelfile import load_model

    code, out, err = run(capsys, "train", "--data", digits, "--labels-from-name", PATTERN, "--label", "digit",
                         "--model", "gmm", "--set", "components=2", "-o", tmp_path / "m.wt")
    assert code == 0, err
    assert "on 12 recordings, 3 values of 'digit' (0, 1, 2)" in out
    m = load_model(tmp_path / "m.wt")
    assert m.label_name_ == "digit" and list(m.labels_) == list(DIGITS)


def test_a_bad_pattern_or_name_is_one_line_exit_2(capsys, digits, tmp_path):
    code, _, err = run(capsys, "train", "--data", digits, "--labels-from-name", "{digit", "--label", "digit",
                       "--model", "gmm", "-o", tmp_path / "m.wt")
    assert code == 2 and "--labels-from-name" in err and "unmatched {" in err and "Traceback" not in err
    code, _, err = run(capsys, "train", "--data", digits, "--labels-from-name", "{digit}-{speaker}", "--label",
                       "digit", "--model", "gmm", "-o", tmp_path / "m.wt")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "0_george_0.wav" in err and "'{digit}-{speaker}'" in err and not (tmp_path / "m.wt").exists()


def test_skip_bad_skips_names_that_do_not_match_and_says_so_once(capsys, tmp_path):
    data = _digits(tmp_path / "d", takes=1)
    for i in range(7):
        sf.write(data / f"notes{i}.wav", _tone(0, 50 + i), RATE)
    code, out, err = run(capsys, "train", "--data", data, "--labels-from-name", PATTERN, "--label", "digit",
                         "--model", "gmm", "--set", "components=2", "--skip-bad", "-o", tmp_path / "m.wt")
    assert code == 0 and "on 6 recordings" in out
    assert err.count("skipped 7 bad recordings") == 1 and "and 2 more" in err
    assert err.count("does not match --labels-from-name") == 5


def test_evaluate_classify_features_and_sound_tools_read_labels_from_names(capsys, digits, model, tmp_path):
    code, out, _ = run(capsys, "evaluate", "-m", model, "--data", digits, "--labels-from-name", PATTERN,
                       "--label", "digit", "--json")
    assert code == 0 and json.loads(out)["accuracy"] == 1.0
    code, out, _ = run(capsys, "classify", "-m", model, digits, "--labels-from-name", PATTERN, "--compare", "digit")
    assert code == 0 and "accuracy 1.000 (12 of 12 windows right)" in out
    code, _, _ = run(capsys, "features", "--data", digits, "--labels-from-name", "{digit}_{_}_{_}",
                     "--features", "mfcc(coeffs=5)", "-o", tmp_path / "f")
    assert code == 0
    index = (tmp_path / "f" / "index.csv").read_text()
    assert "digit=0" in index and "speaker" not in index
    code, _, _ = run(capsys, "sound", "group", "--data", digits, "--labels-from-name", PATTERN, "--label", "speaker",
                     "-o", tmp_path / "g")
    assert code == 0 and sorted(p.name for p in (tmp_path / "g").iterdir()) == list(SPEAKERS)
    assert "digit=1;speaker=george;take=0" in (tmp_path / "g" / "george" / "metadata.csv").read_text()


# ---- classify --where --------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["paths", "--data"])
def test_classify_takes_where(capsys, listed, model, how):
    inputs = [listed] if how == "paths" else ["--data", listed]
    code, out, err = run(capsys, "classify", "-m", model, *inputs, "--where", "speaker=jackson", "--where",
                         "digit=1,2", "--json")
    assert code == 0, err
    files = sorted(Path(json.loads(line)["file"]).name for line in out.splitlines())
    assert files == ["1_jackson_0.wav", "1_jackson_1.wav", "2_jackson_0.wav", "2_jackson_1.wav"]
    code, _, err = run(capsys, "classify", "-m", model, *inputs, "--where", "speaker=anna")
    assert code == 2 and "--where speaker=anna: no recording left" in err and "george, jackson" in err


def test_classify_where_on_labels_from_names(capsys, digits, model):
    code, out, err = run(capsys, "classify", "-m", model, digits, "--labels-from-name", PATTERN, "--where",
                         "take=1", "--compare", "digit")
    assert code == 0, err
    assert len(out.splitlines()) == 7 and "accuracy 1.000 (6 of 6 windows right)" in out


def test_classify_where_refuses_a_live_stream(capsys, model):
    for option in (["--where", "digit=1"], ["--labels-from-name", PATTERN]):
        code, _, err = run(capsys, "classify", "-m", model, "-", *option)
        assert code == 2 and f"drop {option[0]}" in err and "live stream" in err


# ---- train's default model ---------------------------------------------------------------------------
def test_train_without_model_trains_the_default_model(capsys, listed, tmp_path):
    from wavetrain.models.modelfile import load_model
    from wavetrain.models.registry import DEFAULT_MODEL

    code, out, err = run(capsys, "train", "--data", listed, "--label", "digit", "-o", tmp_path / "m.wt")
    assert code == 0, err
    assert load_model(tmp_path / "m.wt").name == DEFAULT_MODEL and out.startswith(f"trained {DEFAULT_MODEL} ")
    code, out, _ = run(capsys, "train", "--help")
    assert code == 0 and f"(default {DEFAULT_MODEL})" in " ".join(out.split())
