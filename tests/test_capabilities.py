"""What a family can do is data on its class (capability tags), never a list of names in the
engines or the command line."""
from __future__ import annotations

import json

import pytest

from wavetrain.cli.main import main
from wavetrain.models.base import LEARNS_BY, TAGS, Classifier
from wavetrain.models.registry import DEFAULT_MODEL, PRESETS, family, family_names


def _families() -> list[type[Classifier]]:
    return [family(n) for n in family_names()]


@pytest.mark.parametrize("name", family_names())
def test_every_family_declares_valid_tags(name):
    cls = family(name)
    tags = cls.tags()
    assert set(tags) == set(TAGS)
    assert tags["learns_by"] in LEARNS_BY, f"{name}: learns_by {tags['learns_by']!r}"
    for t in TAGS[1:]:
        assert isinstance(tags[t], bool), f"{name}.{t} is not a bool"


@pytest.mark.parametrize("name", family_names())
def test_tags_are_consistent(name):
    cls = family(name)
    if cls.supports_distributed or cls.mixes_batches:
        assert cls.learns_by == "sgd", f"{name}: distributed ranks and mixup are for gradient-step training"
    if cls.supports_device_groups:
        # gradient steps split over the devices, or an E-step whose blocks of frames they share
        assert cls.learns_by == "sgd" or (cls.learns_by == "statistics" and callable(getattr(cls, "pass_stats", None)))
    if cls.detector:
        assert cls.min_labels == 1 and cls.score_kind == "anomaly"
    else:
        assert cls.score_kind != "anomaly"


def test_tags_name_the_ways_of_learning():
    by = {n: family(n).learns_by for n in family_names()}
    assert {v for v in by.values()} == set(LEARNS_BY)
    # the ways of learning the engines must handle, each by at least one classifier and one detector
    # where the project has both
    assert any(family(n).detector for n, v in by.items() if v == "statistics")
    assert any(family(n).detector for n, v in by.items() if v == "sgd")
    assert any(not family(n).detector for n, v in by.items() if v == "sgd")


def test_default_model_is_registered():
    assert DEFAULT_MODEL in family_names() or DEFAULT_MODEL in PRESETS


@pytest.mark.parametrize("name", [family_names()[0], next(iter(PRESETS))])
def test_models_command_shows_tags(name, capsys):
    assert main(["models", name, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["tags"] == family(out[0]["family"]).tags()
    assert main(["models", name]) == 0
    text = capsys.readouterr().out
    assert f"learns by {family(out[0]['family']).learns_by};" in text
