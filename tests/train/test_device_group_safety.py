"""Device groups: copies a host reads are complete (blocking from a GPU, simulated here with
device objects and a recording tensor), and BatchNorm families are refused in one line (a
replica's rows are not the batch their statistics would need)."""
import inspect

import numpy as np
import pytest

from wavetrain.errors import ParameterError
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


def _bn_net():
    from wavetrain.models.dcase import build_dcase

    torch.manual_seed(0)
    return build_dcase(12, 20, 3, dropout=0.0)


def test_a_device_group_refuses_a_batchnorm_network_in_one_line():
    with pytest.raises(ParameterError, match="batch statistics") as e:
        DeviceGroup(_bn_net(), [CPU, CPU], FixedBalancer([1, 1]))
    assert "\n" not in str(e.value)
    DeviceGroup(_bn_net(), [CPU], FixedBalancer([1])).close()     # one device: its rows are the batch


@pytest.mark.parametrize("family", ["dcase", "rescnn"])
def test_batchnorm_families_declare_it_and_fit_refuses_a_group(family):
    from wavetrain.models import FitOptions, build
    from wavetrain.train import synthetic_stream

    model = build(family, {"epochs": 1, "batch_size": 8, "frames": 10, "valid_fraction": 0.0})
    assert model.batch_statistics and not build("cnn", {}).batch_statistics
    with pytest.raises(ParameterError, match=f"--devices: {family} normalises with batch statistics") as e:
        model.fit(synthetic_stream(16, 3, features=12, frames=(6, 12)), options=FitOptions(devices=("cpu", "cpu")))
    assert "\n" not in str(e.value)


def test_train_refuses_a_batchnorm_family_on_a_device_group_in_one_line(demo_csv, tmp_path, capsys):
    from wavetrain.cli.main import main

    code = main(["train", "--data", str(demo_csv), "--label", "state", "-o", str(tmp_path / "m.wt"),
                 "--model", "dcase", "--devices", "cpu,cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "dcase normalises with batch statistics" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.wt").exists()
