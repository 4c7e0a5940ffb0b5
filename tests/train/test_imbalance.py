"""Class imbalance in neural training: balanced loss weights and the balanced sampler."""
import numpy as np
import pytest

from wavetrain.models import build
from wavetrain.train.array_stream import ArrayStream
from wavetrain.train.shuffle import balanced_rates, shuffled_windows

torch = pytest.importorskip("torch")


def _imbalanced(n_common=180, n_rare=12, seed=0, d=16):
    """Two values, 15:1: an unweighted model ignores the rare one."""
    rng = np.random.default_rng(seed)
    grams, y = [], []
    for i in range(n_common + n_rare):
        c = int(i >= n_common)
        g = rng.normal(0, 1, (10, d)).astype(np.float32)
        g[:, :4] += 1.0 * c
        grams.append(g)
        y.append(c)
    order = rng.permutation(len(y))
    return [grams[i] for i in order], [y[i] for i in order]


def test_balanced_rates_keep_the_epoch_length():
    r = balanced_rates(np.array([90.0, 10.0, 0.0]))
    np.testing.assert_allclose(r, [100 / (2 * 90), 100 / (2 * 10), 0.0])
    assert (r[:2] * [90, 10]).sum() == pytest.approx(100)


def test_balanced_sampler_draws_every_value_equally_often():
    grams, y = _imbalanced()
    stream = ArrayStream(grams, y, ["common", "rare"], batch_size=16)
    rates = balanced_rates(np.bincount(y).astype(float))
    drawn = []
    for epoch in range(5):
        drawn += [c for _, c in shuffled_windows(stream, buffer=64, seed=1, epoch=epoch, class_rates=rates)]
    counts = np.bincount(drawn)
    assert abs(counts[1] / counts.sum() - 0.5) < 0.05 and abs(counts.sum() / 5 - len(y)) < 0.1 * len(y)
    again = [c for _, c in shuffled_windows(stream, buffer=64, seed=1, epoch=0, class_rates=rates)]
    assert again == drawn[:len(again)]                     # the same seed and epoch, the same draws


def test_class_weighted_loss_is_the_weighted_mean():
    from wavetrain.train.steps import class_weighted_loss

    logits = torch.randn(6, 3)
    yt = torch.tensor([0, 1, 2, 0, 0, 1])
    w = torch.tensor([0.5, 2.0, 3.0])
    per_row = torch.nn.functional.cross_entropy(logits, yt, reduction="none")
    expected = (per_row * w[yt]).sum() / 6
    assert float(class_weighted_loss(logits, yt, w, 6)) == pytest.approx(float(expected), rel=1e-6)
    assert float(class_weighted_loss(logits, yt, None, 6)) == pytest.approx(float(per_row.mean()), rel=1e-6)


@pytest.mark.parametrize("setting", [{"class_weight": "balanced"}, {"sampler": "balanced"}])
def test_balancing_finds_the_rare_value(setting):
    grams, y = _imbalanced()
    test_grams, test_y = _imbalanced(100, 100, seed=1)
    params = dict(epochs=15, batch_size=16, frames=10, valid_fraction=0, seed=0, features="logmel(bands=16)")
    plain = build("cnn", params).fit(ArrayStream(grams, y, ["common", "rare"], batch_size=16))
    balanced = build("cnn", dict(params, **setting)).fit(ArrayStream(grams, y, ["common", "rare"], batch_size=16))

    def rare_recall(m):
        pred = np.array(m.predict(test_grams))
        return float(np.mean(pred[np.array(test_y) == 1] == "rare"))

    assert rare_recall(plain) < 0.2 and rare_recall(balanced) > 0.8        # (measured: 0.0; 0.97 and 1.0)
    np.testing.assert_array_equal(balanced.class_counts_, [180, 12])


def test_class_weighted_group_gradient_equals_one_device():
    from wavetrain.train.device_group import DeviceGroup, FixedBalancer
    from wavetrain.train.steps import SingleDevice

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(20, 3))
    x = np.random.default_rng(0).normal(size=(12, 1, 4, 5)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 0, 1, 2, 2, 0, 1, 0, 0])
    w = [0.5, 2.0, 3.0]
    one = SingleDevice(__import__("copy").deepcopy(net), torch.device("cpu"), optimizer="sgd", lr=0.1, class_weights=w)
    group = DeviceGroup(__import__("copy").deepcopy(net), [torch.device("cpu")] * 2, FixedBalancer([0.25, 0.75]),
                        optimizer="sgd", lr=0.1, class_weights=w)
    assert one.step(x, y) == pytest.approx(group.step(x, y), rel=1e-5)
    for a, b in zip(one.net.parameters(), group.net.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=1e-6)
    group.close()
