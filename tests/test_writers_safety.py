"""Every writer refuses its own inputs: each command's output options, enumerated from the parser
(:func:`wavetrain.cli.common.writes`), are pointed at what the command reads — a data set's
metadata, a recording, a model file, a spec, the folder of a data set — and each must stop in one
line with exit code 2 before anything is written, every input left as it was.

A new path option without a declared role fails :func:`test_every_path_option_declares_its_role`;
a new output option without a case here fails :func:`test_every_output_option_has_a_case`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.common import PATH_ROLES, path_options
from wavetrain.cli.main import build_parser, main
from wavetrain.data.demo import WORDS

RATE = 8000


def _tone(hz: float, seed: int) -> np.ndarray:
    t = np.arange(int(0.5 * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t) + 0.01 * np.random.default_rng(seed).normal(size=t.size)).astype(
        np.float32)


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every (sub-)command's parser by its name as typed: ``train``, ``sound cut``, ``cache info``."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                inner = _commands(sub, full)
                out.update(inner or {full: sub})
    return out


#: Metavars of options that name a file or folder.
_PATHLIKE = re.compile(r"FILE|DIR|PATH|PNG|IMAGE|MODEL|DATA|\.wt|\.onnx|\.txt|\.csv")


def test_every_path_option_declares_its_role():
    undeclared = []
    for name, parser in _commands(build_parser()).items():
        declared = {a for a, role in path_options(parser) if role in PATH_ROLES}
        for a in parser._actions:
            if a.nargs == 0 or a.metavar is None or a in declared:
                continue
            if _PATHLIKE.search(str(a.metavar)):
                undeclared.append(f"{name} {'/'.join(a.option_strings) or a.metavar}")
    assert not undeclared, f"path options without reads()/writes(): {undeclared}"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, Path]:
    return build_env(tmp_path_factory.mktemp("writers"))


def build_env(root: Path) -> dict[str, Path]:
    """A data set with a metadata.csv, a folder of class sub-folders, a classifier and a detector
    (also under image and graph names, as a careless user may name them), a spec file and an
    Audacity label track, in ``root`` (also used by benchmarks/bench_hostile.py)."""
    data = root / "data"
    data.mkdir()
    rows = []
    for i in range(8):
        state = "low" if i % 2 else "high"
        sf.write(data / f"r{i}.wav", _tone(300.0 if state == "low" else 2000.0, i), RATE)
        rows.append(f"r{i}.wav,state={state}\n")
    (data / "metadata.csv").write_text("".join(rows))
    classes = root / "classes"
    for state in ("low", "high"):
        (classes / state).mkdir(parents=True)
        for i in range(2):
            shutil.copyfile(data / f"r{i}.wav", classes / state / f"{state}{i}.wav")
    models = root / "models"
    models.mkdir()
    for name, model in (("m.wt", "gmm"), ("det.wt", "anomaly-gmm")):
        code = main(["train", "--data", str(data), "--label", "state", "--model", model, "--set", "components=2",
                     "--no-cache", "--no-progress", "-o", str(models / name)] +
                    (["--normal", "low"] if model == "anomaly-gmm" else []))
        assert code == 0
    for src, alias in (("m.wt", "m.png"), ("det.wt", "det.png"), ("m.wt", "m.onnx")):
        shutil.copyfile(models / src, models / alias)
    shutil.copyfile(data / "r0.wav", data / "a.png")        # a recording with an image's name
    (models / "spec.toml").write_text('model = "gmm"\ncomponents = 2\n')
    (models / "track.txt").write_text("0.0\t0.2\tlow\n")
    return {"root": root, "data": data, "classes": classes, "models": models}


def _digest(*folders: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


D = "{data}"
M = "{models}"
TRAIN = ["train", "--data", D, "--label", "state", "--model", "gmm"]

#: One case per output option: the command line (paths from the fixture) with that output pointed
#: at an input, and what the one-line refusal says.
CASES: dict[tuple[str, str], tuple[list[str], str]] = {
    ("train", "-o"): ([*TRAIN, "-o", f"{D}/metadata.csv"], "is the input"),
    ("train", "--checkpoint"): (["train", "--data", D, "--label", "state", "--model", "cnn", "-o", f"{M}/x.wt",
                                 "--checkpoint", D], "contains the input"),
    ("train", "--cache"): ([*TRAIN, "-o", f"{M}/x.wt", "--cache", D], "contains the input"),
    ("train", "--table"): ([*TRAIN, "-o", f"{M}/x.wt", "--engine", "spark", "--table", D], "contains the input"),
    ("adapt", "-o"): (["adapt", "-m", f"{M}/det.wt", "--data", D, "-o", f"{M}/det.wt"], "is the input"),
    ("adapt", "--cache"): (["adapt", "-m", f"{M}/det.wt", "--data", D, "-o", "{root}/a.wt", "--cache", D],
                           "contains the input"),
    ("adapt", "--table"): (["adapt", "-m", f"{M}/det.wt", "--data", D, "-o", "{root}/a.wt", "--engine", "spark",
                            "--table", D], "contains the input"),
    ("evaluate", "--plot"): (["evaluate", "--data", D, "--label", "state", "-m", f"{M}/m.png",
                              "--plot", f"{M}/m.png"], "is the input"),
    ("evaluate", "--cache"): (["evaluate", "--data", D, "--label", "state", "--folds", "2", "--cache",
                               f"{D}/.."], "contains the input"),
    ("evaluate", "--table"): (["evaluate", "--data", D, "--label", "state", "--engine", "spark", "--table", D],
                              "contains the input"),
    ("classify", "-o"): (["classify", "-m", f"{M}/m.wt", "--data", D, "-o", f"{D}/metadata.csv"], "is the input"),
    ("classify", "--audacity"): (["classify", "-m", f"{M}/m.wt", "--data", D, "--audacity", D],
                                 "contains the input"),
    ("classify", "--cache"): (["classify", "-m", f"{M}/m.wt", D, "--cache", M], "contains the input"),
    ("classify", "--table"): (["classify", "-m", f"{M}/m.wt", "{classes}", "--engine", "spark", "-o",
                               "{root}/p.parquet", "--table", "{classes}/low"], "lies inside the input"),
    ("features", "-o"): (["features", "--data", "{classes}", "--features", "logmel(bands=8)", "-o",
                          "{classes}/low"], "lies inside the input"),
    ("plot", "-o"): (["plot", f"{D}/a.png", "-o", f"{D}/a.png"], "is the input"),
    ("plot-history", "-o"): (["plot", "history", "-m", f"{M}/m.png", "-o", f"{M}/m.png"], "is the input"),
    ("plot-roc", "-o"): (["plot", "roc", "-m", f"{M}/det.png", "--data", D, "--label", "state", "-o",
                          f"{M}/det.png"], "is the input"),
    ("plot-roc", "--cache"): (["plot", "roc", "-m", f"{M}/det.wt", "--data", D, "--label", "state", "-o",
                               "{root}/roc.png", "--cache", "{root}"], "contains the input"),
    ("export", "-o"): (["export", "-m", f"{M}/m.onnx", "-o", f"{M}/m.onnx"], "is the input"),
    ("demo", "-o"): (["demo", "-o", str(WORDS.parent), "--overwrite"], "contains the input"),
    ("sound partition", "-o"): (["sound", "partition", "--data", D, "--label", "state", "-o", D, "--overwrite"],
                                "contains the input"),
    ("sound cut", "-o"): (["sound", "cut", "--data", D, "--clip-ms", "100", "-o", D, "--overwrite"],
                          "contains the input"),
    ("sound splice", "-o"): (["sound", "splice", "--data", f"{D}/metadata.csv", "-o", f"{D}/r1.wav", "--overwrite"],
                             "is the input"),
    ("sound augment", "-o"): (["sound", "augment", "--data", D, "--gain=-3:3", "-o", "{classes}/high",
                               "--mix", "{classes}", "--overwrite"], "lies inside the input"),
    ("sound label", "-o"): (["sound", "label", "-m", f"{M}/m.wt", "--data", D, "-o", f"{D}/metadata.csv",
                             "--overwrite"], "is the input"),
    ("sound label", "--cache"): (["sound", "label", "-m", f"{M}/m.wt", "--data", D, "-o", "{root}/l.csv",
                                  "--cache", D], "contains the input"),
    ("sound group", "-o"): (["sound", "group", "--data", "{classes}", "--label", "class", "-o", "{classes}/low",
                             "--overwrite"], "lies inside the input"),
    ("sound from-audacity", "-o"): (["sound", "from-audacity", f"{M}/track.txt", "--wav", f"{D}/r0.wav", "-o",
                                     f"{M}/track.txt", "--overwrite"], "is the input"),
    ("sound to-audacity", "-o"): (["sound", "to-audacity", "--data", D, "-o", "{root}", "--overwrite"],
                                  "contains the input"),
}

#: Output options of commands that read nothing they could write over.
NO_INPUTS = {("cache info", "--cache"): "reads only the store it names",
             ("cache clear", "--cache"): "empties only the store it names"}


def test_every_output_option_has_a_case():
    outputs = {(name, a.option_strings[0]) for name, parser in _commands(build_parser()).items()
               for a, role in path_options(parser) if role.startswith("writes-")}
    assert outputs - set(CASES) - set(NO_INPUTS) == set(), "output options without a case in CASES"
    assert set(CASES) - outputs == set(), "cases of options that are not declared outputs"


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: f"{c[0]} {c[1]}")
def test_each_writer_refuses_its_inputs(case, env, capsys):
    template, says = CASES[case]
    argv = [a.format(**{k: str(v) for k, v in env.items()}) for a in template]
    watched = (env["data"], env["classes"], env["models"], WORDS)
    before = _digest(*watched)
    listing = sorted(os.listdir(env["root"]))
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert says in err and "write the output elsewhere" in err, err
    assert len(err.strip().splitlines()) == 1, err
    after = _digest(*watched)
    assert after == before, {k for k in set(after) | set(before) if after.get(k) != before.get(k)}
    assert sorted(os.listdir(env["root"])) == listing          # nothing written beside either


def _spellings(env) -> list[Callable[[], str]]:
    data = env["data"]
    link = env["root"] / "linked"
    if not link.exists():
        link.symlink_to(data, target_is_directory=True)
    return [lambda: str(data / "metadata.csv"),
            lambda: str(data / ".." / data.name / "metadata.csv"),
            lambda: os.path.relpath(data / "metadata.csv"),
            lambda: str(link / "metadata.csv")]


@pytest.mark.parametrize("spelling", range(4), ids=["absolute", "dot-dot", "relative", "linked folder"])
def test_every_spelling_of_an_input_is_refused(spelling, env, capsys):
    out = _spellings(env)[spelling]()
    before = _digest(env["data"])
    capsys.readouterr()
    assert main(["classify", "-m", str(env["models"] / "m.wt"), "--data", str(env["data"]), "-o", out]) == 2
    assert "is the input" in capsys.readouterr().err
    assert _digest(env["data"]) == before


def test_features_over_the_index_it_reads_is_refused(env, tmp_path, capsys):
    feats = tmp_path / "feats"
    assert main(["features", "--data", str(env["data"]), "--features", "logmel(bands=8)", "-o", str(feats),
                 "--no-progress"]) == 0
    before = _digest(feats)
    capsys.readouterr()
    assert main(["features", "--data", str(feats / "index.csv"), "--features", "logmel(bands=8)",
                 "-o", str(feats)]) == 2
    assert "contains the input" in capsys.readouterr().err
    assert _digest(feats) == before


def test_a_spec_file_is_an_input(env, tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    shutil.copyfile(env["models"] / "spec.toml", spec)
    capsys.readouterr()
    assert main(["train", "--data", str(env["data"]), "--label", "state", "--model", str(spec), "-o", str(spec)]) == 2
    assert "is the input" in capsys.readouterr().err
    assert spec.read_text() == (env["models"] / "spec.toml").read_text()


def test_a_checkpoint_folder_may_be_the_one_resumed_from(env, tmp_path):
    """--checkpoint DIR with --resume DIR continues a run (its one exemption); -o inside it is refused."""
    from wavetrain.cli.common import guard_outputs
    from wavetrain.core.outputs import OutputError

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    parser = build_parser()
    args = parser.parse_args(["train", "--data", str(env["data"]), "--label", "state", "--model", "cnn",
                              "-o", str(tmp_path / "m.wt"), "--checkpoint", str(ckpt), "--resume", str(ckpt)])
    guard_outputs(args)
    args.output = str(ckpt / "m.wt")
    with pytest.raises(OutputError, match="lies inside the input"):
        guard_outputs(args)


def test_the_python_writers_refuse_their_inputs(env, tmp_path):
    """The library's writers check too: a script calling them is as safe as the commands."""
    from wavetrain.core.outputs import OutputError
    from wavetrain.data import load_dataset
    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline.export import export_model
    from wavetrain.sound.cut import cut
    from wavetrain.sound.group import group

    ds = load_dataset(env["data"])
    before = _digest(env["data"], env["models"])
    with pytest.raises(OutputError, match="contains the input"):
        cut(ds, env["data"], 100)
    with pytest.raises(OutputError, match="contains the input"):
        group(ds, "state", env["data"].parent)
    with pytest.raises(OutputError, match="is the input"):
        export_model(load_model(env["models"] / "m.wt"), env["models"] / "m.onnx", env["models"] / "m.onnx",
                     opset=17)
    assert _digest(env["data"], env["models"]) == before


def test_a_metadata_file_is_never_written_over_a_recording_it_lists(env):
    from wavetrain.core.outputs import OutputError
    from wavetrain.data import load_dataset
    from wavetrain.data.metadata import write_metadata

    ds = load_dataset(env["data"])
    before = _digest(env["data"])
    with pytest.raises(OutputError, match=r"r0\.wav: is the input"):
        write_metadata(env["data"] / "r0.wav", ds.recordings)
    assert _digest(env["data"]) == before


def test_a_file_the_listing_of_a_folder_data_set_skips_may_be_written_beside_its_audio(env, tmp_path):
    """A folder of class sub-folders is read by listing it: a folder written inside it would become a
    class, an audio file a recording — both refused — but a model or a csv beside them is never read."""
    from wavetrain.core.outputs import OutputError, refuse_inputs
    from wavetrain.data.dataset import input_paths

    classes = tmp_path / "classes"
    shutil.copytree(env["classes"], classes)
    assert main(["train", "--data", str(classes), "--label", "class", "--model", "gmm", "--set", "components=2",
                 "--no-cache", "-o", str(classes / "m.wt")]) == 0
    assert sorted(p.name for p in classes.iterdir()) == ["high", "low", "m.wt"]
    inputs = input_paths([classes])
    refuse_inputs([classes / "low" / "predictions.csv"], inputs, files=True)
    for out, files in ((classes / "new.wav", True), (classes / "clips", False), (classes / "low" / "x.flac", True)):
        with pytest.raises(OutputError, match="lies inside the input"):
            refuse_inputs([out], inputs, files=files)
