"""The manual's events example gives the right words: words of speakers the model has not heard,
spliced at random gaps into a noisy room with ``sound splice``, are found and answered by
``classify --events`` and scored by ``evaluate --events`` as the README shows."""
from __future__ import annotations

import json

import pytest

from wavetrain.cli.main import main
from wavetrain.data import load_dataset
from wavetrain.data.demo import copy_demo_words

AUGMENT = "augment=copies(n=2) | pad(before=30:100, after=30:100) | noise(snr=10:25, color=any)"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("events")
    csv = copy_demo_words(folder)
    cache = ["--cache", str(folder / "cache"), "--no-progress"]
    assert main(["sound", "partition", "--data", str(csv), "--label", "word", "--group-by", "speaker",
                 "--ratio", "0.75", "-o", str(folder / "split")]) == 0
    assert main(["train", "--data", str(folder / "split" / "train"), "--label", "word", "--model", "gmm-speech",
                 "--set", AUGMENT, "-o", str(folder / "words.wt"), *cache]) == 0
    assert main(["sound", "splice", "--data", str(folder / "split" / "test"), "--shuffle", "--gap-ms", "200:1500",
                 "--pad-ms", "500", "--noise", "20", "--noise-color", "pink,hum", "-o",
                 str(folder / "long" / "test.wav")]) == 0
    return folder


def test_the_words_are_found_and_answered_right(made, capsys):
    capsys.readouterr()
    assert main(["evaluate", "-m", str(made / "words.wt"), "--data", str(made / "long" / "test.csv"), "--events",
                 "--json", "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["reference_events"] == len(load_dataset(made / "long" / "test.csv")) == 60
    assert res["event_based"]["detection"]["f1"] >= 0.97
    assert res["event_based"]["class_aware"]["f1"] >= 0.95


def test_classify_prints_one_line_per_word(made, capsys):
    capsys.readouterr()
    assert main(["classify", "-m", str(made / "words.wt"), str(made / "long" / "test.wav"), "--events",
                 "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    truth = [r.labels["word"] for r in load_dataset(made / "long" / "test.csv")]
    said = [line.split("word=")[1].split()[0] for line in lines]
    assert len(said) == len(truth)
    assert sum(a == b for a, b in zip(said, truth)) >= 0.95 * len(truth)
