"""A model trained with a preset (``gmm-speech``) keeps the preset's name: in its model file, in
the metadata of its ONNX graph, and where its family is shown (``info``, the server's model,
``plot roc``'s title, warnings): ``gmm-speech (gmm)``. Files without it read as before."""
from __future__ import annotations

import json

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.core.errors import ModelFileError
from wavetrain.models import build, load_model
from wavetrain.models.modelfile import read_model_file, save_model
from wavetrain.pipeline.prediction import classify_samples

SPEECH = ["--model", "gmm-speech", "--set", "components=2", "--no-cache"]


@pytest.fixture(scope="module")
def speech_model(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("preset") / "speech.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", *SPEECH, "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def family_model(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("preset") / "gmm.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "--no-cache", "-o", str(path)]) == 0
    return path


def test_build_keeps_the_preset_and_a_family_has_none(tmp_path):
    assert build("gmm-speech").preset_ == "gmm-speech" and build("gmm-speech").title == "gmm-speech (gmm)"
    assert build("gmm").preset_ is None and build("gmm").title == "gmm"
    spec = tmp_path / "mine.toml"
    spec.write_text('model = "hmm-speech"\nstates = 3\n')
    assert build(str(spec)).title == "hmm-speech (hmm)"


def test_the_model_file_and_info_name_the_preset(speech_model, family_model, capsys):
    meta, _ = read_model_file(speech_model)
    assert meta["model"] == "gmm" and meta["preset"] == "gmm-speech"
    assert load_model(speech_model).title == "gmm-speech (gmm)"
    capsys.readouterr()
    assert main(["info", str(speech_model)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("model      gmm-speech (gmm)   (file format 1")
    assert main(["info", "--json", str(speech_model)]) == 0
    assert json.loads(capsys.readouterr().out)["preset"] == "gmm-speech"
    # a family's model (and a file written before presets were stored) has no preset
    assert "preset" not in read_model_file(family_model)[0]
    assert load_model(family_model).title == "gmm"
    assert main(["info", str(family_model)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("model      gmm   (file format 1")


def test_a_damaged_preset_is_refused_in_one_line(speech_model, tmp_path):
    model = load_model(speech_model)
    for bad in (5, "", "gmm\x1b[2J", "x" * 101):
        path = save_model(model, tmp_path / "bad.wt", extra={"preset": bad})
        with pytest.raises(ModelFileError, match="preset"):
            load_model(path)


def test_the_onnx_graph_keeps_the_preset(speech_model, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "speech.onnx"
    assert main(["export", "-m", str(speech_model), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("graph      gmm-speech (gmm) exported by wavetrain")
    graph = load_model(out)
    assert graph.meta_["preset"] == "gmm-speech" and graph.title == "gmm-speech (gmm, onnx)"
    pytest.importorskip("starlette")
    from wavetrain.serve import ModelService

    assert ModelService.from_file(out).describe()["preset"] == "gmm-speech"      # (the page names it)


def test_the_server_names_the_preset(speech_model, family_model):
    pytest.importorskip("starlette")
    from wavetrain.serve import ModelService

    assert ModelService.from_file(speech_model).describe()["preset"] == "gmm-speech"
    assert ModelService.from_file(family_model).describe()["preset"] is None


def test_a_warning_names_the_preset(speech_model, caplog):
    m = load_model(speech_model)
    x = np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)
    with caplog.at_level("WARNING", logger="wavetrain.pipeline.prediction"):
        classify_samples(m, x, 16000, clip_ms=300)
    said = [r.getMessage() for r in caplog.records if "asked for" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("gmm-speech (gmm) was trained on whole recordings"), said


def test_plot_roc_titles_a_detector_with_its_preset(demo_csv, tmp_path, monkeypatch):
    from wavetrain.evaluation import detection_plot
    from wavetrain.models.registry import PRESETS

    monkeypatch.setitem(PRESETS, "nd-quiet", ("normal-dist", {}, "a preset of a detector"))
    model = tmp_path / "nd.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--normal", "healthy", "--model", "nd-quiet",
                 "--no-cache", "-o", str(model)]) == 0
    figs = []
    build_fig = detection_plot.build_detection_figure
    monkeypatch.setattr(detection_plot, "build_detection_figure",
                        lambda *a, **k: figs.append(build_fig(*a, **k)) or figs[-1])
    assert main(["plot", "roc", "-m", str(model), "--data", str(demo_csv), "--label", "state",
                 "-o", str(tmp_path / "roc.png")]) == 0
    assert figs[0].get_suptitle().splitlines()[1].startswith("nd-quiet (normal-dist) on ")
