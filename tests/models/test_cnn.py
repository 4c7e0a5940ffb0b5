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


def _channel_and_level(grams, seed=0):
    """The windows as another microphone and level would give them in the log domain: every
    feature moved by its own constant (a spectral tilt plus a gain)."""
    rng = np.random.default_rng(seed)
    shift = (rng.normal(size=grams[0].shape[1]) + 3.0).astype(np.float32)
    return [g + shift for g in grams]


@pytest.fixture(scope="module")
def timed():
    """Three values told apart by where in time a band rises (not by the spectrum's average shape,
    which per-window normalisation removes), windows of 10-13 frames."""
    from wavetrain.train.array_stream import ArrayStream

    rng = np.random.default_rng(7)
    grams, y = [], []
    for i in range(96):
        c = i % 3
        g = rng.normal(size=(int(rng.integers(10, 14)), 16)).astype(np.float32)
        g[c * 3:c * 3 + 3, 4:10] += 3.0
        grams.append(g)
        y.append(c)
    return ArrayStream(grams, y, ["a", "b", "c"], batch_size=16, groups=[i // 2 for i in range(96)])


def test_window_normalisation_ignores_level_and_channel(timed):
    m = build("cnn", dict(TINY, epochs=8, valid_fraction=0.0, input_norm="window")).fit(timed)
    truth = np.array([timed.labels[i] for i in timed.y])
    assert np.mean(np.array(m.predict(timed.grams)) == truth) >= 0.9
    moved = _channel_and_level(timed.grams)
    np.testing.assert_allclose(m.predict_proba(moved), m.predict_proba(timed.grams), atol=1e-5)
    # the per-feature normaliser alone follows the level and channel: other confidences
    g = build("cnn", dict(TINY, epochs=8, valid_fraction=0.0, input_norm="global")).fit(timed)
    assert np.abs(g.predict_proba(moved) - g.predict_proba(timed.grams)).max() > 0.1


def test_level_normalisation_keeps_the_spectral_shape(stream):
    m = build("cnn", dict(TINY, epochs=6, valid_fraction=0.0, input_norm="level")).fit(stream)
    truth = np.array([stream.labels[i] for i in stream.y])
    assert np.mean(np.array(m.predict(stream.grams)) == truth) >= 0.9      # a raised band tells the values
    louder = [g + 4.0 for g in stream.grams]
    np.testing.assert_allclose(m.predict_proba(louder), m.predict_proba(stream.grams), atol=1e-5)


def test_normalise_window_floors_constant_features():
    from wavetrain.models._torch_common import normalise_window

    g = np.zeros((5, 4), np.float32)
    g[:, 1] = np.arange(5)
    g[:, 2] = -23.0                                      # an empty mel band: log of the floor, constant
    out = normalise_window(g, "window")
    assert np.isfinite(out).all() and np.allclose(out[:, [0, 2, 3]], 0.0)
    np.testing.assert_allclose(out[:, 1].std(), 1.0, rtol=1e-5)
    assert np.allclose(normalise_window(g[:1], "window"), 0.0)          # one frame: nothing to scale
    silence = np.full((6, 4), -23.025851, np.float32)                   # log of the floor: rounding only
    silence[2, 1] = np.nextafter(silence[2, 1], np.float32(0))
    for how in ("window", "level", "channel"):
        assert np.abs(normalise_window(silence, how)).max() < 1e-3, how
    np.testing.assert_allclose(normalise_window(g, "level").std(), 1.0, rtol=1e-5)
    # channel: a smooth tilt across the features (a microphone) is gone, a single raised feature is not
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 32))
    x[:, 9] += 3.0
    smooth = np.cos(np.pi * (np.arange(32)[:, None] + 0.5) * np.arange(4)[None] / 32) @ [7.0, 3.0, -2.0, 1.0]
    np.testing.assert_allclose(normalise_window(x + smooth, "channel"), normalise_window(x, "channel"), atol=1e-4)
    tilt = x + np.linspace(-4, 4, 32)                      # a straight tilt: nearly all of it
    assert np.abs(normalise_window(tilt, "channel") - normalise_window(x, "channel")).max() < 0.3
    assert np.abs(normalise_window(tilt, "level") - normalise_window(x, "level")).max() > 1.0
    out = normalise_window(x, "channel")
    assert out[:, 9].mean() > out[:, [8, 10]].mean() + 1.5


def test_input_normalisation_travels_in_the_model_file(timed, tmp_path):
    from wavetrain.models import load_model, save_model

    m = build("cnn", dict(TINY, epochs=2, input_norm="window")).fit(timed)
    again = load_model(save_model(m, tmp_path / "w.wt"))
    assert again.input_norm_ == "window" and again.params["input_norm"] == "window"
    np.testing.assert_allclose(again.predict_proba(timed.grams), m.predict_proba(timed.grams), atol=1e-6)
    # a file written before the parameter existed (no norm.window) predicts as it was trained: global
    g = build("cnn", dict(TINY, epochs=2, input_norm="global")).fit(timed)
    state = g.state_dict()
    assert "norm.window" not in state
    fresh = build("cnn", TINY)
    fresh.labels_, fresh.feature_dim_ = g.labels_, g.feature_dim_
    fresh.load_state_dict(state)
    assert fresh.input_norm_ == "global" and fresh.params["input_norm"] == "global"
    np.testing.assert_allclose(fresh.predict_proba(timed.grams), g.predict_proba(timed.grams), atol=1e-6)


@pytest.mark.parametrize("bad", [np.array([7]), np.array([0, 1]), np.array([0.5])])
def test_a_bad_input_normalisation_in_a_file_is_refused(fitted, bad):
    state = dict(fitted.state_dict(), **{"norm.window": bad})
    fresh = build("cnn", TINY)
    fresh.labels_, fresh.feature_dim_ = fitted.labels_, fitted.feature_dim_
    with pytest.raises(ParameterError, match="norm.window"):
        fresh.load_state_dict(state)


def test_history_marks_the_validation_whose_weights_were_kept(timed):
    m = build("cnn", dict(TINY, epochs=5, patience=0, lr=0.02)).fit(timed)
    marked = [h for h in m.history_ if h.get("best")]
    assert len(marked) == 1 and all("best" in h for h in m.history_)
    assert marked[0]["iteration"] == m.train_info_["best_iteration"]
    assert marked[0]["valid_loss"] == min(h["valid_loss"] for h in m.history_)
    none = build("cnn", dict(TINY, epochs=2, valid_fraction=0.0)).fit(timed)
    assert not any("best" in h for h in none.history_)         # no validation: nothing was chosen


@pytest.mark.parametrize("norm", ["window", "level", "channel"])
def test_exported_graph_normalises_as_the_model(timed, norm):
    ort = pytest.importorskip("onnxruntime")
    from wavetrain.core.graph import DOUBLE, FLOAT, Graph

    m = build("cnn", dict(TINY, epochs=2, input_norm=norm)).fit(timed)
    g = Graph()
    g.output("p", m.graph_proba(g, "gram"))
    sess = ort.InferenceSession(g.model([("gram", FLOAT, ["t", 16])], [("p", DOUBLE, [3])]).SerializeToString())
    # a short window (padded), a long one (cropped), a constant feature, one frame
    long = np.random.default_rng(1).normal(size=(30, 16)).astype(np.float32)
    flat = timed.grams[1].copy()
    flat[:, 5] = -23.0
    silence = np.full((9, 16), -23.025851, np.float32)
    for gram in [timed.grams[0], long, flat, timed.grams[2][:1], silence]:
        np.testing.assert_allclose(sess.run(None, {"gram": gram})[0], m.predict_proba([gram])[0], rtol=1e-4, atol=1e-6)


def test_time_bins_and_a_file_of_the_eight_bin_network(timed):
    from wavetrain.models.cnn import build_cnn

    one, eight = build_cnn(16, 12, 3, time_bins=1), build_cnn(16, 12, 3, time_bins=8)
    assert sum(p.numel() for p in one.parameters()) < sum(p.numel() for p in eight.parameters())
    old = build("cnn", dict(TINY, epochs=2, time_bins=8)).fit(timed)
    state = old.state_dict()
    fresh = build("cnn", TINY)                    # as a file written before time_bins: the parameter unset
    fresh.labels_, fresh.feature_dim_ = old.labels_, old.feature_dim_
    fresh.load_state_dict(state)
    assert fresh.params["time_bins"] == 3         # (12 frames, halved twice: at most 3 bins)
    np.testing.assert_allclose(fresh.predict_proba(timed.grams), old.predict_proba(timed.grams), atol=1e-6)
    pinned = build("cnn", dict(TINY, time_bins=1))
    pinned.labels_, pinned.feature_dim_ = old.labels_, old.feature_dim_
    with pytest.raises(ParameterError, match="do not fit"):
        pinned.load_state_dict(state)


def _bursts(n, at, seed):
    """Value c: a burst in features 5c..5c+4 for 3 frames from frame ``at`` (a range), 24 frames."""
    from wavetrain.train.array_stream import ArrayStream

    rng = np.random.default_rng(seed)
    grams, y = [], []
    for i in range(n):
        c = i % 3
        g = rng.normal(size=(24, 16)).astype(np.float32)
        t = int(rng.integers(*at))
        g[t:t + 3, 5 * c:5 * c + 5] += 3.0
        grams.append(g)
        y.append(c)
    return ArrayStream(grams, y, ["a", "b", "c"], batch_size=16)


def test_a_sound_later_in_the_window_is_recognised():
    # trained on bursts in the first frames, tested on bursts near the end: the maximum over time
    # finds them there; the Java framework's 8 time bins learnt where they lay (below chance)
    early, late = _bursts(96, (0, 5), 1), _bursts(60, (16, 21), 2)
    truth = np.array([late.labels[i] for i in late.y])
    acc = {}
    for bins in (1, 8):
        m = build("cnn", dict(TINY, epochs=10, valid_fraction=0.0, frames=24, time_bins=bins)).fit(early)
        acc[bins] = np.mean(np.array(m.predict(late.grams)) == truth)
    assert acc[1] >= 0.8 and acc[8] < 0.5, acc
