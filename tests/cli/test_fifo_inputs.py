"""Inputs that are no regular file: a named pipe (FIFO) named like a model, a graph, a recording, a
data set or a TOML spec, a device, a checkpoint that is a pipe. Opening a FIFO blocks until someone
writes to it, so each command must refuse it from its ``stat`` in one line (exit code 2), never open
it (the commands run in a child process with a timeout: a command that opens the pipe hangs there)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wavetrain.cli.main import main


@pytest.fixture(scope="module")
def base(tmp_path_factory, demo_csv) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fifo-inputs")
    model = root / "good.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "-o", str(model)]) == 0
    return {"root": root, "csv": Path(demo_csv), "wav": sorted(Path(demo_csv).parent.glob("*.wav"))[0],
            "model": model}


def _fifo(folder: Path, name: str) -> Path:
    path = folder / name
    os.mkfifo(path)
    return path


def _run(argv: list[str]) -> tuple[int, str]:
    """``wavetrain argv`` in a child process: its exit code and stderr; a child that blocks on the
    pipe is killed after a minute (the test then fails)."""
    try:
        r = subprocess.run([sys.executable, "-m", "wavetrain.cli.main", *argv], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1", "WAVETRAIN_PROGRESS": "0"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"wavetrain {' '.join(argv)} blocked on its input")
    return r.returncode, r.stderr


#: name of the pipe -> the command (``{fifo}`` the pipe), and whether it needs onnx.
CASES = {
    "info-wav": ("sound.wav", ["info", "{fifo}"]),
    "info-onnx": ("model.onnx", ["info", "{fifo}"]),
    "info-wt": ("model.wt", ["info", "{fifo}"]),
    "info-csv": ("metadata.csv", ["info", "{fifo}"]),
    "classify-onnx": ("model.onnx", ["classify", "-m", "{fifo}", "{wav}"]),
    "classify-wt": ("model.wt", ["classify", "-m", "{fifo}", "{wav}"]),
    "classify-wav": ("sound.wav", ["classify", "-m", "{model}", "{fifo}"]),
    "evaluate-onnx": ("model.onnx", ["evaluate", "-m", "{fifo}", "--data", "{csv}", "--label", "state"]),
    "train-toml": ("spec.toml", ["train", "--data", "{csv}", "--label", "state", "--model", "{fifo}", "-o",
                                 "{root}/out.wt"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_named_pipe_is_refused_in_one_line(base, tmp_path, case):
    name, argv = CASES[case]
    if name.endswith(".onnx"):
        pytest.importorskip("onnxruntime")
    fifo = _fifo(tmp_path, name)
    code, err = _run([a.format(fifo=fifo, **base) for a in argv])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"{fifo}: is a named pipe (FIFO)" in lines[0], lines[0]
    assert not (base["root"] / "out.wt").exists()


@pytest.mark.parametrize("argv,words", [
    (["info", "/dev/null"], "/dev/null: is a device"),
    (["classify", "-m", "/dev/zero", "{wav}"], "/dev/zero: is a device, expected a model file"),
    (["classify", "-m", "{root}", "{wav}"], "is a folder, expected a model file"),
])
def test_devices_and_folders_are_refused_in_one_line(base, capsys, argv, words):
    capsys.readouterr()
    assert main([a.format(**base) for a in argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_resume_from_a_pipe_is_refused_not_started_over(base, tmp_path, capsys):
    """``train --resume DIR`` whose checkpoint is a named pipe (or a file given for the folder):
    one line, never a run that silently starts from scratch."""
    pytest.importorskip("torch")
    folder = tmp_path / "ck"
    folder.mkdir()
    _fifo(folder, "checkpoint.pt")
    plain = tmp_path / "plain-file"
    plain.write_bytes(b"x")
    for resume, words in ((folder, "checkpoint.pt: is a named pipe (FIFO), expected a checkpoint"),
                          (plain, "is a file; give the checkpoint folder")):
        capsys.readouterr()
        code = main(["train", "--data", str(base["csv"]), "--label", "state", "--model", "cnn",
                     "--features", "logmel(bands=8)", "--set", "epochs=1", "--set", "batch_size=8",
                     "--resume", str(resume), "-o", str(tmp_path / "m.wt")])
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "m.wt").exists()


def test_load_checkpoint_without_one_is_none(tmp_path):
    """(unchanged: no folder, or no checkpoint in it, is a run from scratch)"""
    from wavetrain.train.checkpoint import load_checkpoint

    assert load_checkpoint(tmp_path / "missing") is None and load_checkpoint(tmp_path) is None
