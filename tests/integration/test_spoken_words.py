"""End-to-end on ../shared/data/spoken-words: folds grouped by speaker, so a fold never sees
its speakers in training. Floors are set below the accuracy measured when they were written
(see README) to leave room for numeric noise, not for regressions."""
import json
import subprocess
import sys

import pytest

from tests.conftest import SPOKEN
from wavetrain.cli.main import main

pytestmark = pytest.mark.skipif(not (SPOKEN / "metadata.csv").exists(), reason="needs ../shared/data/spoken-words")


def test_gmm_grouped_kfold_accuracy_floor(capsys, tmp_path):
    code = main(["evaluate", "--data", str(SPOKEN), "--label", "word", "--model", "gmm", "--folds", "4",
                 "--group-by", "speaker", "--cache", str(tmp_path / "cache"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    res = json.loads(out)
    assert res["windows"] == 1440 and len(res["folds"]) == 4
    assert res["accuracy"] >= 0.97, res["accuracy"]  # measured 0.993 (mfcc 13 + deltas, 8 components)
    assert res["macro_f1"] >= 0.97
    # the store computed each recording once across the 4 folds
    code = main(["cache", "info", "--cache", str(tmp_path / "cache"), "--json"])
    info = json.loads(capsys.readouterr()[0])
    assert info["entries"] == 1440


def test_train_then_evaluate_on_unseen_speakers(capsys, tmp_path):
    from wavetrain.data import load_dataset, write_metadata

    ds = load_dataset(SPOKEN)
    speakers = sorted({r.labels["speaker"] for r in ds})
    test_speakers = set(speakers[::4])
    write_metadata(tmp_path / "train.csv", [r for r in ds if r.labels["speaker"] not in test_speakers])
    write_metadata(tmp_path / "test.csv", [r for r in ds if r.labels["speaker"] in test_speakers])
    model = tmp_path / "words.wt"
    # a fresh process: the planner counts the memory already in use, and pytest's is large
    out = subprocess.run([sys.executable, "-m", "wavetrain.cli.main", "train", "--data", str(tmp_path / "train.csv"),
                          "--label", "word", "--model", "gmm", "-o", str(model), "--memory-limit", "256M"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert main(["evaluate", "-m", str(model), "--data", str(tmp_path / "test.csv"), "--label", "word",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr()[0].strip().splitlines()[-1])
    assert res["accuracy"] >= 0.95, res["accuracy"]
