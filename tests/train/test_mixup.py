"""Mixup (``--set augment="... | mixup(alpha=0.2)"``): mixed mini-batches with soft targets for the
neural classifiers, drawn from the seed; every other family refuses it."""
import copy

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.core.errors import SpecError
from wavetrain.features.augment import mix_batch, parse_augment
from wavetrain.models import build
from wavetrain.train.array_stream import synthetic_stream

torch = pytest.importorskip("torch")
TINY = dict(epochs=6, batch_size=8, frames=12, valid_fraction=0.0, seed=3)


def test_a_mixed_batch_is_a_convex_pair_of_inputs_and_labels():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 1, 4, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1, 2])
    xm, t = mix_batch(x, y, 3, 0.4, 1.0, np.random.default_rng(1))
    assert t.dtype == np.float32 and t.shape == (6, 3) and np.allclose(t.sum(axis=1), 1)
    again = np.random.default_rng(1)
    again.random()
    lam = np.float32(again.beta(0.4, 0.4))
    perm = again.permutation(6)
    np.testing.assert_allclose(xm, lam * x + (1 - lam) * x[perm], rtol=1e-6)
    np.testing.assert_allclose(t, lam * np.eye(3)[y] + (1 - lam) * np.eye(3)[y[perm]], rtol=1e-6)
    same, onehot = mix_batch(x, y, 3, 0.4, 0.0, np.random.default_rng(1))      # p = 0: never mixed
    assert same is x and np.array_equal(onehot, np.eye(3)[y])


def test_the_spec_takes_mixup_last_with_one_alpha():
    a = parse_augment("noise(snr=10) | specaugment(time=1, freq=1) | mixup(alpha=0.3, p=0.5)")
    assert a.mixup == (0.3, 0.5) and a.waveform and a.masks
    only = parse_augment("mixup")
    assert only.mixup == (0.2, 1.0) and not only.waveform and not only.masks
    assert parse_augment(a.key).mixup == a.mixup
    with pytest.raises(SpecError, match="at column 18: mixup mixes the mini-batches and must come last"):
        parse_augment("mixup(alpha=1) | gain")
    with pytest.raises(SpecError, match="mixup takes one alpha and one p, not ranges"):
        parse_augment("mixup(alpha=0.1:0.4)")


def test_soft_target_loss_adds_up_over_a_device_group():
    from wavetrain.train.device_group import DeviceGroup, FixedBalancer
    from wavetrain.train.steps import SingleDevice

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(20, 3))
    x = np.random.default_rng(0).normal(size=(12, 1, 4, 5)).astype(np.float32)
    x, t = mix_batch(x, np.arange(12) % 3, 3, 0.4, 1.0, np.random.default_rng(2))
    one = SingleDevice(copy.deepcopy(net), torch.device("cpu"), optimizer="sgd", lr=0.1, class_weights=[1, 2, 3])
    group = DeviceGroup(copy.deepcopy(net), [torch.device("cpu")] * 2, FixedBalancer([0.25, 0.75]),
                        optimizer="sgd", lr=0.1, class_weights=[1, 2, 3])
    assert one.step(x, t) == pytest.approx(group.step(x, t), rel=1e-5)
    for a, b in zip(one.net.parameters(), group.net.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=1e-6)
    group.close()


def test_a_cnn_learns_with_mixup_reproducibly():
    stream = synthetic_stream(48, 3, features=16)
    mixed = build("cnn", dict(TINY, augment="mixup(alpha=0.4)")).fit(stream)
    plain = build("cnn", TINY).fit(stream)
    truth = np.array([stream.labels[i] for i in stream.y])
    assert np.mean(np.array(mixed.predict(stream.grams)) == truth) >= 0.9
    assert not np.array_equal(mixed.state_dict()["net.0.weight"], plain.state_dict()["net.0.weight"])
    again = build("cnn", dict(TINY, augment="mixup(alpha=0.4)")).fit(stream)
    np.testing.assert_array_equal(mixed.state_dict()["net.0.weight"], again.state_dict()["net.0.weight"])


def test_a_gmm_refuses_mixup_in_one_line(demo_csv, tmp_path, capsys):
    rc = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "augment=mixup",
               "-o", str(tmp_path / "m.wt")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "mixup mixes the mini-batches of a neural classifier" in err
