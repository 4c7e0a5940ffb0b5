"""``wavetrain adapt``: a trained detector learns a new unit's normal sound from a few clips without
retraining — its summary then holds what training on the old and new clips together would give,
the new unit's normal clips stop looking anomalous, the threshold is never lowered — and what it
cannot take (anomalous clips, another rate or label, a family that does not adapt) is refused."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.core.errors import UserError
from wavetrain.data import load_dataset
from wavetrain.data.demo import machine_sound
from wavetrain.models.modelfile import read_model_file
from wavetrain.pipeline.jobs import RunOptions, adapt_model, train_model, window_predictions

RATE = 16000
#: Units of one product line: the same machine at its own shaft speed.
UNITS = {"u1": 20.0, "u2": 24.0, "u3": 33.0}
KNN = {"k": 1, "valid_fraction": 0.0}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Normal clips of three units (six each), faulty test clips of the new unit u3, and an 8 kHz copy."""
    root = tmp_path_factory.mktemp("fleet")
    rows = []
    for unit, hz in UNITS.items():
        for i in range(8):
            state = "normal" if i < 6 else "bearing"
            x = machine_sound("healthy" if state == "normal" else "bearing", seconds=1.0, shaft_hz=hz * (1 + 0.01 * i),
                              rng=np.random.default_rng(hash((unit, i)) % 2**32))
            sf.write(root / f"{unit}_{i}.wav", x, RATE)
            rows.append(f"{unit}_{i}.wav,unit={unit};state={state};split={'train' if i < 4 else 'test'}")
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    x = machine_sound("healthy", rate=8000, seconds=1.0, shaft_hz=UNITS["u3"], rng=np.random.default_rng(9))
    (root / "slow").mkdir()
    sf.write(root / "slow" / "u3.wav", x, 8000)
    return root


def _data(root, **where):
    return load_dataset(root / "metadata.csv", where=[(k, v.split(",")) for k, v in where.items()])


@pytest.fixture(scope="module")
def old(fleet):
    model, _ = train_model(_data(fleet, unit="u1,u2", state="normal", split="train"), "state", "knn-anomaly", KNN,
                           RunOptions())
    return model


def _scores(model, ds):
    preds, _ = window_predictions(model, ds, RunOptions())
    return np.array([float(p.scores[0]) for p in preds])


def test_adapting_equals_training_on_both_and_the_new_unit_stops_looking_anomalous(fleet, old):
    import copy

    model = copy.deepcopy(old)
    new = _data(fleet, unit="u3", state="normal", split="train")
    normal_u3 = _data(fleet, unit="u3", state="normal", split="test")
    before = _scores(model, normal_u3)
    info, prep = adapt_model(model, new, RunOptions())
    assert len(prep.ds) == 4 and info["windows"] == 4
    # the summary holds the old vectors and the new ones (below capacity: nothing merged), as one trained on both
    both, _ = train_model(_data(fleet, state="normal", split="train"), "state", "knn-anomaly", KNN, RunOptions())
    order = np.lexsort(model.vectors_.T)
    np.testing.assert_allclose(model.vectors_[order], both.vectors_[np.lexsort(both.vectors_.T)])
    after = _scores(model, normal_u3)
    assert after.max() < before.min()                  # the new unit's normal sound is now known
    assert info["threshold"] == max(info["threshold_before"], info["threshold_new"]) >= old.threshold_
    faulty = _scores(model, _data(fleet, unit="u3", state="bearing"))
    assert faulty.min() > after.max()                  # and its faults still stand out
    assert model.train_info_["adapted"][-1] == info


def test_the_command_writes_an_adapted_model_and_refuses_what_it_cannot_learn(fleet, tmp_path, capsys):
    csv = str(fleet / "metadata.csv")
    old_wt, new_wt = tmp_path / "old.wt", tmp_path / "new.wt"
    assert main(["train", "--data", csv, "--where", "unit=u1,u2", "--where", "state=normal", "--label", "state",
                 "--model", "knn-anomaly", "--set", "k=1", "-o", str(old_wt)]) == 0
    assert main(["adapt", "-m", str(old_wt), "--data", csv, "--where", "unit=u3", "--where", "split=train",
                 "-o", str(new_wt)]) == 0
    out = capsys.readouterr().out
    assert "adapted knn-anomaly to 4 recordings" in out and str(new_wt) in out
    meta, _ = read_model_file(new_wt)
    assert meta["adapted"][0]["windows"] == 4 and meta["training"]["recordings"] == 12
    assert main(["info", str(new_wt)]) == 0 and "adapted    windows=4" in capsys.readouterr().out
    refusals = [
        (["--data", csv, "--where", "unit=u3"], "have state=bearing, not normal"),           # faulty clips given
        (["--data", str(fleet / "slow")], "recordings at 8000 Hz"),                         # another rate
        (["--data", csv, "--where", "unit=u3", "--where", "state=normal", "--label", "unit"], "--label unit"),
    ]
    for args, says in refusals:
        code = main(["adapt", "-m", str(old_wt), *args, "-o", str(tmp_path / "x.wt")])
        err = capsys.readouterr().err
        assert code == 2 and says in err and err.count("\n") == 1, err
        assert not (tmp_path / "x.wt").exists()
    nd = tmp_path / "nd.wt"
    assert main(["train", "--data", csv, "--where", "state=normal", "--label", "state", "--model", "normal-dist",
                 "-o", str(nd)]) == 0
    capsys.readouterr()
    assert main(["adapt", "-m", str(nd), "--data", csv, "--where", "unit=u3", "--where", "state=normal",
                 "-o", str(tmp_path / "x.wt")]) == 2
    err = capsys.readouterr().err
    assert "normal-dist cannot learn new recordings without retraining" in err and "knn-anomaly" in err


def test_a_classifier_is_refused(fleet):
    model, _ = train_model(_data(fleet), "unit", "gmm", {"components": 1}, RunOptions())
    with pytest.raises(UserError, match="adapt applies to the anomaly detectors"):
        adapt_model(model, _data(fleet, unit="u3"), RunOptions())
