"""Detectors that learn what tells normal units apart (``id_labels``, the preset ``knn-id``): a network
learns to tell the units' normal recordings apart, is written beside the detector, and the detector
learns its embeddings — the same detector as training it on ``embedding(model=NET)`` by hand; what
cannot work is refused in one line."""
from __future__ import annotations

import numpy as np
import pytest

from tests.machine_clips import write_clips
from wavetrain.cli.main import main
from wavetrain.core.errors import UserError
from wavetrain.data import load_dataset
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.jobs import RunOptions, evaluate_kfold, train_model, window_predictions

UNITS = {"u1": 18.0, "u2": 26.0, "u3": 37.0}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Per unit 8 normal training clips, 2 normal and 2 faulty test clips; a 2-epoch network spec."""
    root = tmp_path_factory.mktemp("idfleet")
    write_clips(root, ((f"{unit}_{i}", "normal" if i < 10 else "bearing", hz * (1 + 0.01 * i), (u, i), 20.0,
                        {"unit": unit, "hall": "a" if i % 2 else "b", "split": "train" if i < 8 else "test"})
                       for u, (unit, hz) in enumerate(UNITS.items()) for i in range(12)))
    (root / "net.toml").write_text('model = "cnn-id"\nepochs = 2\nseed = 3\n')
    return root


def _data(root, **where):
    return load_dataset(root / "metadata.csv", where=[(k, v.split(",")) for k, v in where.items()])


def test_the_detector_learns_the_embeddings_of_a_network_that_tells_units_apart(fleet, tmp_path):
    net_path = tmp_path / "m.net.wt"
    train = _data(fleet, split="train")
    model, _ = train_model(train, "state", "knn-id", {"id_labels": "unit", "id_network": str(fleet / "net.toml")},
                           RunOptions(), network=net_path)
    net = load_model(net_path)
    assert net.name == "cnn" and net.fitted_labels == ["u1", "u2", "u3"] and net.label_name_ == "unit"
    assert model.params["features"].startswith("embedding(model=") and str(net_path) in model.params["features"]
    assert model.train_info_["id_network"] == {"path": str(net_path), "family": "cnn", "label": "unit", "values": 3}
    # the same detector as the two steps by hand: knn-anomaly on that network's embeddings
    by_hand, _ = train_model(train, "state", "knn-anomaly",
                             {"subwindow_frames": 1, "features": model.params["features"]}, RunOptions())
    np.testing.assert_allclose(model.vectors_, by_hand.vectors_)
    assert model.threshold_ == by_hand.threshold_
    preds, _ = window_predictions(model, _data(fleet, split="test"), RunOptions())
    assert all(np.isfinite(float(p.scores[0])) for p in preds)


def test_several_labels_are_learnt_as_their_combinations(fleet, tmp_path):
    train_model(_data(fleet, split="train"), "state", "knn-anomaly",
                {"id_labels": "unit,hall", "id_network": str(fleet / "net.toml")}, RunOptions(),
                network=tmp_path / "n.wt")
    net = load_model(tmp_path / "n.wt")
    assert net.label_name_ == "unit+hall" and net.fitted_labels == sorted(f"{u}/{h}" for u in UNITS for h in "ab")


def test_the_command_writes_the_network_beside_the_model(fleet, tmp_path, capsys):
    out = tmp_path / "fleet.wt"
    assert main(["train", "--data", str(fleet / "metadata.csv"), "--where", "split=train", "--label", "state",
                 "--model", "knn-id", "--set", "id_labels=unit", "--set", f"id_network={fleet / 'net.toml'}",
                 "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "on the embeddings of a cnn of 3 unit values" in said and str(tmp_path / "fleet.net.wt") in said
    assert (tmp_path / "fleet.net.wt").exists()
    assert main(["classify", "-m", str(out), str(fleet / "u3_11.wav")]) == 0
    assert "anomaly=" in capsys.readouterr().out
    assert main(["info", str(out)]) == 0 and "knn-id (knn-anomaly)" in capsys.readouterr().out


@pytest.mark.parametrize("sets, says", [
    (["id_labels=unit", "id_network=gmm"], "id_network=gmm: gmm models embed no windows"),
    (["id_labels=unit", "id_network=autoencoder"], "autoencoder models learn no labels"),
    (["id_labels=unit", "features=mfcc(coeffs=13)"], "leave its features out"),
    (["id_labels=colour"], "no label named 'colour'"),
])
def test_what_cannot_work_is_refused_in_one_line(fleet, tmp_path, capsys, sets, says):
    args = [a for s in sets for a in ("--set", s)]
    code = main(["train", "--data", str(fleet / "metadata.csv"), "--where", "split=train", "--label", "state",
                 "--model", "knn-anomaly", *args, "-o", str(tmp_path / "x.wt")])
    err = capsys.readouterr().err
    assert code == 2 and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.wt").exists()


def test_one_unit_a_missing_file_and_cross_validation_are_refused(fleet):
    with pytest.raises(UserError, match="one value"):
        train_model(_data(fleet, unit="u1", split="train"), "state", "knn-id", {"id_labels": "unit"}, RunOptions(),
                    network="n.wt")
    with pytest.raises(UserError, match="give the file to write it to"):
        train_model(_data(fleet, split="train"), "state", "knn-id", {"id_labels": "unit"}, RunOptions())
    with pytest.raises(UserError, match="cross-validation does not train id_labels networks"):
        evaluate_kfold(_data(fleet), "state", "knn-id", {"id_labels": "unit"}, RunOptions(), folds=2)
