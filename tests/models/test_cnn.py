"""cnn-specific behaviour; the shared contract (fit, predict, save/load, batch = single, bad input,
same seed) is tests/models/test_contract.py."""
import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.models import build
from wavetrain.train.array_stream import synthetic_stream

TINY = dict(epochs=2, batch_size=8, frames=12, valid_fraction=0.25, seed=3)


@pytest.fixture(scope="module")
def stream():
    return synthetic_stream(48, 3, features=16)


@pytest.fixture(scope="module")
def fitted(stream):
    return build("cnn", TINY).fit(stream)


def test_params_listed_and_validated():
    names = {p.name for p in build("cnn").param_table()}
    for n in ("epochs", "max_iters", "batch_size", "lr", "optimizer", "schedule", "valid_every_iters", "patience",
              "target_score", "min_loss", "valid_fraction", "shuffle_buffer", "frames", "seed", "dropout", "device"):
        assert n in names
    assert build("cnn", {"epochs": "5"}).params["epochs"] == 5
    with pytest.raises(ParameterError, match="cnn.optimizer"):
        build("cnn", {"optimizer": "rmsprop"})
    with pytest.raises(ParameterError, match="cnn.lr"):
        build("cnn", {"lr": -1})


def test_history_and_training_info(fitted, stream):
    assert fitted.labels_ == stream.labels and fitted.feature_dim_ == 16
    h = fitted.history_
    assert len(h) == 2 and {"epoch", "iteration", "train_loss", "valid_loss", "top1", "top5", "macro_f1", "lr",
                            "samples_per_s", "seconds"} <= set(h[0])
    assert 0.0 <= fitted.train_info_["data_wait_fraction"] <= 1.0
    assert "norm.mean" in fitted.state_dict() and any(k.startswith("net.") for k in fitted.state_dict())


def test_learns_three_classes(stream):
    m = build("cnn", dict(TINY, epochs=6, valid_fraction=0.0)).fit(stream)
    acc = np.mean(np.array(m.predict(stream.grams)) == np.array([stream.labels[i] for i in stream.y]))
    assert acc >= 0.9


def test_another_seed_another_model(fitted, stream):
    c = build("cnn", dict(TINY, seed=4)).fit(stream)
    assert not np.array_equal(fitted.state_dict()["net.0.weight"], c.state_dict()["net.0.weight"])


def test_unknown_fpr_calls_an_unseen_value_unknown(tmp_path):
    from wavetrain.models import load_model, save_model
    from wavetrain.train.array_stream import ArrayStream

    full = synthetic_stream(320, 4, features=16, seed=5)
    known = [i for i, y in enumerate(full.y) if y < 3]
    train = ArrayStream([full.grams[i] for i in known[:180]], [full.y[i] for i in known[:180]], full.labels[:3],
                        batch_size=16, groups=[i // 2 for i in range(180)])
    m = build("cnn", dict(TINY, epochs=8, unknown_fpr=0.1, valid_fraction=0.25)).fit(train)
    assert 0 < m.unknown_threshold_ < 1 and m.train_info_["unknown_threshold"] == m.unknown_threshold_
    fresh_known = [full.grams[i] for i in known[180:]]
    unseen = [g for g, y in zip(full.grams, full.y) if y == 3]
    called_unknown = np.mean(np.array(m.predict(unseen)) == "unknown")
    false_unknown = np.mean(np.array(m.predict(fresh_known)) == "unknown")
    assert called_unknown > 0.5 and false_unknown < 0.3 and called_unknown > 2 * false_unknown
    again = load_model(save_model(m, tmp_path / "u.wt"))
    assert again.predict(unseen) == m.predict(unseen)
    assert "unknown_threshold" not in build("cnn", TINY).fit(train).state_dict()      # never unknown without it
