"""``wavetrain export --check PATH...``: the graph is compared with the model before it is written —
on plain audio files (no labels) the answers against each other, on labelled recordings the
accuracies too — and a check that fails leaves no graph (and an earlier file as it was)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from wavetrain.cli.main import main  # noqa: E402


@pytest.fixture(scope="module")
def model(demo_csv, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("export-check") / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "--no-cache", "-o", str(path)]) == 0
    return path


@pytest.fixture
def plain(demo_csv, tmp_path) -> list[Path]:
    """Two audio files of the demo set copied where no metadata gives them labels."""
    out = []
    for name in ("bearing_15hz_10db_m0.wav", "healthy_30hz_20db_m1.wav"):
        shutil.copy(Path(demo_csv).parent / name, tmp_path / name)
        out.append(tmp_path / name)
    return out


def _export(capsys, model, out, *check):
    capsys.readouterr()
    code = main(["export", "-m", str(model), "-o", str(out), "--check", *map(str, check)])
    return code, capsys.readouterr().err


def test_plain_audio_files_are_checked_answer_against_answer(capsys, model, plain, tmp_path):
    out = tmp_path / "m.onnx"
    code, err = _export(capsys, model, out, *plain)
    assert code == 0, err
    assert out.is_file()
    check = [line for line in err.splitlines() if line.startswith("check: ")]
    assert len(check) == 1 and "windows, same answer on " in check[0]
    assert "no accuracy: no recording has a value of 'state'" in check[0] and "accuracy .wt" not in check[0]


def test_labelled_recordings_give_both_accuracies(capsys, model, demo_csv, tmp_path):
    code, err = _export(capsys, model, tmp_path / "m.onnx", demo_csv)
    assert code == 0, err
    assert "accuracy .wt " in err and ", graph " in err and "windows with a value" in err


@pytest.mark.parametrize("labelled", [True, False])
def test_a_recording_that_cannot_be_decoded_leaves_no_graph(capsys, model, plain, tmp_path, labelled):
    """A file whose header reads but whose samples are too few for one feature sub-window: found
    when the recordings are decoded, before the graph is written."""
    tiny = tmp_path / "tiny.wav"
    sf.write(tiny, np.zeros(20, np.float32), 16000)
    check = [plain[0], tiny]
    if labelled:
        (tmp_path / "metadata.csv").write_text(f"{plain[0].name},state=bearing\ntiny.wav,state=healthy\n")
        check = [tmp_path / "metadata.csv"]
    out = tmp_path / "m.onnx"
    code, err = _export(capsys, model, out, *check)
    assert code == 2 and "tiny.wav" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m.onnx")]      # no temporary file either
    earlier = b"an earlier file"
    out.write_bytes(earlier)
    code, _ = _export(capsys, model, out, *check)
    assert code == 2 and out.read_bytes() == earlier
    # --skip-bad leaves it out, names it, and writes the graph checked on the rest
    capsys.readouterr()
    assert main(["export", "-m", str(model), "-o", str(out), "--check", *map(str, check), "--skip-bad"]) == 0
    err = capsys.readouterr().err
    assert out.read_bytes() != earlier and "skipped 1 bad recording" in err and "tiny.wav" in err
    assert "check: 1 windows, same answer on 1 " in err


def test_an_unreadable_path_leaves_no_graph(capsys, model, plain, tmp_path):
    out = tmp_path / "m.onnx"
    code, err = _export(capsys, model, out, plain[0], tmp_path / "missing.wav")
    assert code == 2 and "missing.wav" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
