"""A model's ``augment`` parameter is parsed once (``Classifier.augmenter``): the training streams'
augmenter, the memory plan's and the trainer's mixup are that one object, parsed again only when
the parameter changes, and a model that has parsed it still pickles and copies (a noise folder's
parsed stage holds a lock)."""
from __future__ import annotations

import copy
import pickle

import pytest

from wavetrain.models import base, build
from wavetrain.pipeline.jobs import training_augmenter
from wavetrain.pipeline.memory import training_augment
from wavetrain.train.array_stream import synthetic_stream

pytest.importorskip("torch")
SPEC = "gain(db=-3:3) | specaugment(time=2, freq=2) | mixup(alpha=0.3, p=0.5)"


@pytest.fixture
def parses(monkeypatch):
    """The specs ``Classifier.augmenter`` parses, in order."""
    seen: list[str] = []
    real = base.parse_augment

    def counting(text):
        seen.append(text)
        return real(text)

    monkeypatch.setattr(base, "parse_augment", counting)
    return seen


def test_a_training_run_parses_augment_once(parses):
    m = build("cnn", {"augment": SPEC, "epochs": 1, "batch_size": 8, "frames": 12, "valid_fraction": 0.0})
    assert training_augmenter(m) is training_augment(m) is m.augmenter
    assert m.augmenter.mixup == (0.3, 0.5) and m.augmenter.masks
    m.fit(synthetic_stream(24, 3, features=12, seed=1))      # the trainer mixes as the parsed spec says
    assert parses == [SPEC]
    assert not training_augment(m)      # fitted: its streams are predicted, never augmented


def test_a_changed_parameter_is_parsed_again(parses):
    m = build("rescnn", {"augment": "mixup(alpha=0.2)"})
    first = m.augmenter
    assert m.augmenter is first
    m.params["augment"] = "mixup(alpha=0.4)"
    assert m.augmenter.mixup == (0.4, 1.0) and m.augmenter is not first
    m.params["augment"] = ""
    assert not m.augmenter
    assert parses == ["mixup(alpha=0.2)", "mixup(alpha=0.4)", ""]
    other = build("rescnn", {"augment": "mixup(alpha=0.2)"})       # each model parses its own
    assert other.augmenter is not first and other.augmenter.mixup == first.mixup


def test_a_model_that_parsed_a_noise_folder_pickles_and_copies(tmp_path):
    m = build("cnn", {"augment": f"noise(snr=10, dir={tmp_path})"})
    assert m.augmenter.waveform
    for twin in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m), copy.copy(m)):
        assert twin.augmenter.key == m.augmenter.key


def test_a_parsed_noise_folder_pickles_with_its_listing(tmp_path):
    """A Spark task receives the parsed augmenter itself: its noise files travel (and read) there."""
    import numpy as np
    import soundfile as sf

    from wavetrain.features.augment import parse_augment

    sf.write(tmp_path / "hum.wav", np.sin(np.arange(8000) / 10.0).astype(np.float32), 8000)
    aug = parse_augment(f"noise(snr=10, dir={tmp_path})")
    twin = pickle.loads(pickle.dumps(aug))
    x = np.sin(np.arange(4000) / 3.0).astype(np.float32)
    a, b = (g.apply(x, 8000, seed=1, content_id="r", draw=0) for g in (aug, twin))
    assert np.abs(a - x).max() > 0
    np.testing.assert_array_equal(a, b)
