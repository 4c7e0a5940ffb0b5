"""Device groups: copies a host reads are complete (blocking from a GPU, simulated here with
device objects and a recording tensor), and BatchNorm families are refused in one line (a
replica's rows are not the batch their statistics would need)."""
import inspect

import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.train import device_group
from wavetrain.train.device_group import DeviceGroup, FixedBalancer, blocks_host, copy_to

torch = pytest.importorskip("torch")

CPU, GPU0, GPU1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)


class _Recording:
    """Stands for a tensor on ``device``: records how it is copied."""

    def __init__(self, device):
        self.device = device
        self.calls: list[tuple] = []

    def to(self, device, non_blocking=False):
        self.calls.append((device, non_blocking))
        return _Recording(device)


def test_a_copy_from_a_gpu_to_the_host_blocks_and_one_to_a_gpu_does_not():
    assert blocks_host(GPU0, CPU)
    assert not blocks_host(CPU, GPU0) and not blocks_host(GPU0, GPU1) and not blocks_host(CPU, CPU)
    for source, target, non_blocking in ((GPU0, CPU, False), (CPU, GPU0, True), (GPU1, GPU0, True)):
        t = _Recording(source)
        assert copy_to(t, target).device == target
        assert t.calls == [(target, non_blocking)]
    same = _Recording(CPU)
    assert copy_to(same, CPU) is same and same.calls == []


def test_every_copy_between_replicas_goes_through_the_safe_helper(monkeypatch):
    """No step, average or weight copy of the group issues a copy of its own: they all go
    through copy_to (a GPU replica's gradients or weights reach a CPU replica complete)."""
    source = inspect.getsource(DeviceGroup)
    assert "non_blocking" not in source and ".to(self.device" not in source and ".to(rep.device" not in source
    seen = []

    def recording(t, device):
        seen.append((t.device.type, device.type))
        return copy_to(t, device)

    monkeypatch.setattr(device_group, "copy_to", recording)
    from wavetrain.models.cnn import build_cnn

    torch.manual_seed(0)
    group = DeviceGroup(build_cnn(12, 20, 3, dropout=0.0), [CPU, CPU], FixedBalancer([1, 1]), sync="average:1",
                        optimizer="sgd", lr=0.1)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 20, 12)).astype(np.float32), rng.integers(0, 3, 8)
    n_params = len(list(group.net.parameters()))
    group.step(x, y)                                  # warm-up: gradients added, weights copied
    assert len(seen) >= 2 * n_params
    seen.clear()
    group.step(x, y)                                  # local steps, then the average
    assert len(seen) >= 2 * n_params
    group.close()


def _bn_nets(family):
    from wavetrain.models.dcase import build_dcase
    from wavetrain.models.rescnn import build_rescnn

    torch.manual_seed(0)
    if family == "dcase":
        return build_dcase(12, 20, 3, dropout=0.0)
    return build_rescnn(12, 20, 3, width=4, dropout=0.0)


@pytest.mark.parametrize("family", ["dcase", "rescnn"])
def test_batchnorm_networks_in_a_group_get_the_one_device_gradient(family):
    """BatchNorm over the whole batch: the gradients added over three unequal replicas are the
    one-device gradient to 1e-5 (of each parameter's largest for dcase; of the largest of all for
    rescnn, whose BatchNorm weights near the input get gradients 1e-3 of the others', where float32
    rounding alone differs by that much from a float64 reference), and so are the running statistics."""
    from wavetrain.train.steps import SingleDevice

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 1, 20, 12)).astype(np.float32), rng.integers(0, 3, 16)
    one = SingleDevice(_bn_nets(family), CPU, optimizer="sgd", lr=0.1, momentum=0.0)
    group = DeviceGroup(_bn_nets(family), [CPU, CPU, CPU], FixedBalancer([5, 3, 8]), optimizer="sgd", lr=0.1,
                        momentum=0.0)
    for _ in range(2):
        assert group.step(x, y) == pytest.approx(one.step(x, y), rel=1e-5)
        pairs = list(zip(one.net.named_parameters(), group.net.parameters()))
        scale = max(float(a.grad.abs().max()) for (_, a), _ in pairs)
        for (name, a), b in pairs:
            tol = 1e-5 * (float(a.grad.abs().max()) if family == "dcase" else scale)
            np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), rtol=0, atol=tol, err_msg=name)
    for (name, a), b in zip(one.net.state_dict().items(), group.net.state_dict().values()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
    group.close()
    layers = [m for m in group.net.modules() if "BatchNorm" in type(m).__name__]
    assert layers and all(type(m) is torch.nn.BatchNorm2d for m in layers)     # plain layers again


def test_without_the_exchange_the_replicas_normalise_alone_and_the_gradient_differs():
    """The test above can fail: per-replica statistics give another gradient."""
    from wavetrain.train.steps import SingleDevice

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 1, 20, 12)).astype(np.float32), rng.integers(0, 3, 16)
    one = SingleDevice(_bn_nets("dcase"), CPU, optimizer="sgd", lr=0.1, momentum=0.0)
    group = DeviceGroup(_bn_nets("dcase"), [CPU, CPU], FixedBalancer([1, 3]), optimizer="sgd", lr=0.1, momentum=0.0)
    group._norms = []                                   # no exchange: each replica's own statistics
    one.step(x, y), group.step(x, y)
    worst = max(float((a.grad - b.grad).abs().max() / a.grad.abs().max())
                for a, b in zip(one.net.parameters(), group.net.parameters()))
    assert worst > 1e-3
    group.close()


def test_a_replica_that_fails_releases_the_others_and_its_error_is_raised():
    group = DeviceGroup(_bn_nets("dcase"), [CPU, CPU], FixedBalancer([1, 1]), optimizer="sgd", lr=0.1)

    def broken(module, inputs, output):
        raise RuntimeError("replica 2 broke")

    group.replicas[1].net[4].register_forward_hook(broken)      # after its first BatchNorm exchange
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 20, 12)).astype(np.float32), rng.integers(0, 3, 8)
    with pytest.raises(RuntimeError, match="replica 2 broke"):
        group.step(x, y)
    group.close()


def test_exchange_sums_in_slot_order_and_aborts():
    import threading

    from wavetrain.train.group_norm import Exchange

    ex, out = Exchange(3), {}

    def party(k):
        out[k] = [ex.all_sum(k, np.array([k + 1.0, 10.0 * k])) for _ in range(3)]

    threads = [threading.Thread(target=party, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(np.array_equal(v, [6.0, 30.0]) for k in range(3) for v in out[k])
    lonely = Exchange(2)
    lonely.abort()
    with pytest.raises(threading.BrokenBarrierError):
        lonely.all_sum(0, np.zeros(1))


def test_a_batchnorm_network_needs_each_gpu_once():
    with pytest.raises(ParameterError, match="needs each GPU once") as e:
        DeviceGroup(_bn_nets("dcase"), [CPU, GPU0, GPU0], FixedBalancer([1, 1, 1]))
    assert "\n" not in str(e.value)


def test_dcase_trains_on_two_cpu_replicas_and_keeps_plain_layers():
    from wavetrain.models import FitOptions, build
    from wavetrain.train.array_stream import synthetic_stream

    model = build("dcase", {"epochs": 1, "batch_size": 8, "frames": 10, "valid_fraction": 0.25, "dropout": 0.0})
    model.fit(synthetic_stream(24, 3, features=12, frames=(6, 12)), options=FitOptions(devices=("cpu", "cpu")))
    assert model.train_info_["device"] == "cpu,cpu"
    assert all(type(m) is torch.nn.BatchNorm2d for m in model.net_.modules() if "BatchNorm" in type(m).__name__)
    assert "net.1.running_mean" in model.state_dict()
    grams = [np.random.default_rng(1).standard_normal((10, 12)).astype(np.float32)]
    assert model.predict_proba(grams).shape == (1, 3)


def _group_threads():
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("wavetrain-device")]


def test_a_killed_averaging_run_resumes_to_the_uninterrupted_weights(tmp_path):
    """``average:H``: every replica's weights and optimiser (SGD momentum) are in the checkpoint,
    and reading weights for it changes nothing, so halting between two averages and resuming
    ends where a run without checkpoints ends; no device thread outlives a fit."""
    from wavetrain.models import FitOptions, build
    from wavetrain.train import HaltAfter
    from wavetrain.train.array_stream import synthetic_stream
    from wavetrain.train.checkpoint import load_checkpoint

    stream = synthetic_stream(48, 3, features=12, frames=(6, 12))
    params = dict(batch_size=8, frames=10, valid_fraction=0.25, seed=5, epochs=3, valid_every_iters=3,
                  dropout=0.0, optimizer="sgd", lr=0.05, momentum=0.9)
    group = {"devices": ("cpu", "cpu"), "balance": "fixed:0.25,0.75", "sync": "average:4"}
    full = build("cnn", params).fit(stream, options=FitOptions(**group))
    assert _group_threads() == []
    ck = tmp_path / "ck"
    halted = build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(ck), callbacks=(HaltAfter(8),),
                                                                 **group))
    assert halted.train_info_["halted"] and _group_threads() == []
    state = load_checkpoint(ck)
    assert state["iteration"] == 6 and sum(state["unsynced"]) > 0     # between two averages (steps 4 and 8)
    assert len(state["replicas"]) == 2 and len(state["replica_optimizers"]) == 1
    assert state["replica_optimizers"][0]["state"]           # the second replica's momentum
    resumed = build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(ck), resume=str(ck), **group))
    for k, a in full.state_dict().items():
        np.testing.assert_allclose(resumed.state_dict()[k], a, rtol=1e-6, atol=1e-7, err_msg=k)
    later = [h["train_loss"] for h in full.history_ if h["iteration"] > 6]     # the replicas' losses after it
    assert len(later) >= 3
    np.testing.assert_allclose([h["train_loss"] for h in resumed.history_ if h["iteration"] > 6], later, rtol=1e-6)
    assert _group_threads() == []


def test_a_failed_fit_still_stops_the_device_threads():
    from wavetrain.models import FitOptions, build
    from wavetrain.train.array_stream import synthetic_stream
    from wavetrain.train.callbacks import Callback

    class Boom(Callback):
        def on_step(self, loop, loss, n):
            raise OSError("disk gone")

    model = build("cnn", dict(batch_size=8, frames=10, valid_fraction=0.0, epochs=1))
    with pytest.raises(OSError, match="disk gone"):
        model.fit(synthetic_stream(16, 3, features=12, frames=(6, 12)),
                  options=FitOptions(devices=("cpu", "cpu"), callbacks=(Boom(),)))
    assert _group_threads() == []


def test_the_history_names_the_devices_and_the_plot_uses_the_names():
    from wavetrain.train.history_plot import build_history_figure, device_names

    group = DeviceGroup(_bn_nets("dcase"), [CPU, CPU], FixedBalancer([1, 3]), optimizer="sgd", lr=0.1)
    rng = np.random.default_rng(0)
    group.step(rng.standard_normal((8, 1, 20, 12)).astype(np.float32), rng.integers(0, 3, 8))
    assert group.report()["devices"] == "cpu,cpu"
    group.close()

    def legend(devices):
        history = [{"epoch": float(e), "train_loss": 1.0 / e, "device_shares": [0.7, 0.3],
                    "device_seconds": [0.01, 0.01], **({"devices": devices} if devices else {})} for e in (1, 2)]
        fig = build_history_figure(history)
        return [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]

    assert legend("cpu,cuda:0") == ["cpu", "cuda:0"]
    assert legend("cpu,cpu") == ["cpu #1", "cpu #2"]
    assert legend(None) == ["device 1", "device 2"]                  # a history written before the names
    assert device_names([{"devices": "cpu"}], 2) == ["device 1", "device 2"]     # names that do not fit


def test_train_records_a_neural_groups_devices_for_info(demo_csv, tmp_path, capsys):
    from wavetrain.cli.main import main
    from wavetrain.models.modelfile import read_model_file

    out = tmp_path / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "cnn", "-o", str(out),
                 "--set", "features=logmel(bands=16)", "--set", "epochs=1", "--set", "batch_size=8",
                 "--devices", "cpu,cpu", "--balance", "fixed:0.25,0.75"]) == 0
    meta = read_model_file(out)[0]
    import re

    found = re.fullmatch(r"cpu (\d+)% of each batch [\d.]+ ms/step; cpu (\d+)% of each batch [\d.]+ ms/step",
                         meta["training"]["devices"])
    assert found and int(found[1]) < int(found[2]) and abs(int(found[1]) + int(found[2]) - 100) <= 1
    assert meta["history"][-1]["devices"] == "cpu,cpu"
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert f"devices={meta['training']['devices']}" in capsys.readouterr().out
