"""rescnn-specific behaviour (residual depthwise-separable CNN, test-time crops); the shared
contract (fit, predict, save/load, batch = single, bad input, same seed) is
tests/models/test_contract.py."""
import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.models import build, load_model, save_model
from wavetrain.models._torch_common import NeuralClassifier
from wavetrain.models.rescnn import build_rescnn, crop_starts, rescnn_parameters
from wavetrain.train.array_stream import synthetic_stream

TINY = dict(epochs=2, batch_size=8, frames=12, valid_fraction=0.25, seed=3, width=8)


@pytest.fixture(scope="module")
def stream():
    return synthetic_stream(48, 3, features=16)


@pytest.fixture(scope="module")
def long_windows():
    """Windows of 14-29 frames, longer than the network's 10-frame input."""
    return synthetic_stream(60, 3, features=16, frames=(14, 30), seed=2)


@pytest.fixture(scope="module")
def cropped(long_windows):
    return build("rescnn", dict(TINY, frames=10, epochs=4, valid_fraction=0.0, tta_crops=3)).fit(long_windows)


def _n_params(net) -> int:
    return sum(p.numel() for p in net.parameters())


def test_params_listed_and_validated():
    names = {p.name for p in build("rescnn").param_table()}
    assert {"epochs", "lr", "frames", "device", "width", "dropout", "tta_crops"} <= names
    assert build("rescnn", {"width": "16"}).params["width"] == 16
    assert build("rescnn").params["tta_crops"] == 1
    with pytest.raises(ParameterError, match="rescnn.tta_crops"):
        build("rescnn", {"tta_crops": 0})
    with pytest.raises(ParameterError, match="rescnn.width"):
        build("rescnn", {"width": 1})


@pytest.mark.parametrize("width,classes", [(32, 10), (32, 2), (16, 35), (8, 3)])
def test_parameter_count(width, classes):
    net = build_rescnn(64, 101, classes, width=width)
    assert _n_params(net) == rescnn_parameters(classes, width, 64, 101)
    assert _n_params(build_rescnn(16, 12, classes, width=width)) == rescnn_parameters(classes, width, 16, 12)
    if width == 32 and classes <= 10:
        assert _n_params(net) <= 110_000                     # the default network stays small (106 k)


def test_any_input_size_gives_logits():
    import torch

    for frames, feats in [(1, 1), (3, 5), (12, 16), (101, 64)]:
        net = build_rescnn(feats, frames, 4, width=8).eval()
        assert net(torch.zeros(2, 1, frames, feats)).shape == (2, 4)


def test_learns_three_classes(stream):
    m = build("rescnn", dict(TINY, epochs=15, lr=0.005, valid_fraction=0.0)).fit(stream)
    acc = np.mean(np.array(m.predict(stream.grams)) == np.array([stream.labels[i] for i in stream.y]))
    assert acc >= 0.9
    assert m.train_info_["iterations"] > 0 and len(m.history_) == 15


def test_save_load_round_trip(cropped, long_windows, tmp_path):
    again = load_model(save_model(cropped, tmp_path / "r.wt"))
    assert again.params["tta_crops"] == 3 and again.params["width"] == 8
    np.testing.assert_allclose(again.predict_proba(long_windows.grams), cropped.predict_proba(long_windows.grams),
                               rtol=1e-5, atol=1e-6)
    assert again.predict(long_windows.grams) == cropped.predict(long_windows.grams)


def test_crop_starts():
    assert crop_starts(10, 10, 3) == [0] and crop_starts(5, 10, 3) == [0]
    assert crop_starts(20, 10, 1) == [5] and crop_starts(21, 10, 1) == [5]   # the centre, as prepare_input
    assert crop_starts(20, 10, 3) == [0, 5, 10]
    assert crop_starts(20, 10, 2) == [0, 10]
    assert crop_starts(12, 10, 5) == [0, 1, 2]                               # fewer frames than crops: no repeats


def test_tta_averages_the_crops(cropped, long_windows):
    grams = long_windows.grams[:12]
    got = cropped.predict_proba(grams)
    assert got.shape == (12, 3) and np.allclose(got.sum(axis=1), 1.0)
    centre = NeuralClassifier.predict_proba(cropped, grams)
    for g, row, c in zip(grams, got, centre):
        starts = crop_starts(len(g), 10, 3)
        assert len(starts) == 3
        crops = [g[s:s + 10] for s in starts]
        manual = NeuralClassifier.predict_proba(cropped, crops).mean(axis=0)
        np.testing.assert_allclose(row, manual, rtol=1e-6, atol=1e-7)
        if (len(g) - 10) % 2 == 0:                                           # the middle crop is the centre
            np.testing.assert_allclose(NeuralClassifier.predict_proba(cropped, [crops[1]])[0], c, rtol=1e-5)
    assert not np.allclose(got, centre)                                      # the crops do differ


def test_one_crop_is_the_centre_crop(cropped, long_windows):
    grams = long_windows.grams[:12] + [np.zeros((4, 16), np.float32)]        # a short window is padded
    one = build("rescnn", dict(cropped.params, tta_crops=1))
    one.__dict__.update({k: v for k, v in cropped.__dict__.items() if k != "params"})
    np.testing.assert_array_equal(one.predict_proba(grams), NeuralClassifier.predict_proba(cropped, grams))
    # a window no longer than the input is scored once whatever tta_crops says
    np.testing.assert_allclose(cropped.predict_proba(grams[-1:]), one.predict_proba(grams[-1:]), rtol=1e-6)
    # a batch gives what each window gives alone
    np.testing.assert_allclose(cropped.predict_proba(grams),
                               np.concatenate([cropped.predict_proba([g]) for g in grams]), rtol=1e-5, atol=1e-7)


def test_activation_allowance_covers_the_layers():
    """Every layer's output, kept for the backward pass, and its gradient, per input cell, fit
    in activation_floats_per_cell at the default width."""
    import torch

    frames, feats = 101, 64
    net = build_rescnn(feats, frames, 10, width=build("rescnn").params["width"])
    total = []
    hooks = [m.register_forward_hook(lambda m, i, o: total.append(o.numel()))
             for m in net.modules() if len(list(m.children())) == 0]
    net(torch.zeros(1, 1, frames, feats))
    for h in hooks:
        h.remove()
    per_cell = 2 * sum(total) / (frames * feats)
    m = build("rescnn")
    assert per_cell <= m.activation_floats_per_cell <= 3 * per_cell


def test_memory_estimate_grows_with_width_and_batch():
    args = (64, 10, 4096, 10**6, 101)
    small = build("rescnn").memory_estimate(*args)
    assert 60 << 20 < small < 1 << 30
    assert build("rescnn", {"width": 64}).memory_estimate(*args) > small
    assert build("rescnn", {"batch_size": 64}).memory_estimate(*args) > small


def test_batchnorm_statistics_are_measured_on_the_final_weights():
    """Trained fast (lr 0.01), the running batch-norm averages trail the weights: this model
    answered 0.5 on the two values it had learnt before fit measured them afresh."""
    from wavetrain.train.array_stream import ArrayStream

    rng = np.random.default_rng(0)
    grams, y = [], []
    for i in range(24):
        g = rng.normal(0, 1, (20 + i % 3, 16)).astype(np.float32)
        g[:, :8] += 2.0 * (i % 2)
        grams.append(g)
        y.append(i % 2)
    stream = ArrayStream(grams, y, ["a", "b"], batch_size=8)
    m = build("rescnn", dict(batch_size=8, width=8, epochs=8, lr=0.01, valid_fraction=0.0)).fit(stream)
    assert np.mean(np.array(m.predict(grams)) == np.array(["a", "b"])[y]) >= 0.75
    before = {k: v.copy() for k, v in m.state_dict().items()}
    m.recalibrate_batchnorm(stream)                                          # the same pass: the same statistics
    after = m.state_dict()
    for k, v in before.items():
        np.testing.assert_allclose(after[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    assert m.net_.training is False
