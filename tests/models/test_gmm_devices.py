"""The GMM's E-step on several devices: the fit equals the one-device fit (numpy workers, and the
torch E-step on torch's CPU device standing in for a GPU), blocks go to whichever device is free,
and `train --model gmm --devices cpu,cpu` trains the same model."""
import time

import numpy as np
import pytest

from wavetrain.models import gmm as gmm_module
from wavetrain.models.base import FitOptions
from wavetrain.models.device_pool import DevicePool
from wavetrain.models.estep_devices import EStepPool
from wavetrain.models.gmm import GMMClassifier
from wavetrain.models.mixture import e_step, gauss_terms, m_step, squared_blocks
from wavetrain.train.array_stream import ArrayStream


def _blobs(seed=0, n_windows=80, frames=50, d=5, labels=3):
    rng = np.random.default_rng(seed)
    centres = [rng.normal(0, 3, (3, d)) for _ in range(labels)]
    grams, y = [], []
    for i in range(n_windows):
        c = i % labels
        comp = rng.integers(0, 3, frames)
        grams.append((centres[c][comp] + rng.normal(0, 0.5, (frames, d))).astype(np.float32))
        y.append(c)
    return grams, y


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 300 frames: many per label on a small data set."""
    monkeypatch.setattr(gmm_module, "CHUNK_FRAMES", 300)


def _fit(devices, cache_mb, **params):
    grams, y = _blobs()
    m = GMMClassifier(components=3, frame_cache_mb=cache_mb, features="logmel(bands=5)", **params)
    return m.fit(ArrayStream(grams, y, ["a", "b", "c"], batch_size=9), options=FitOptions(devices=devices))


def _assert_same(a, b, rtol):
    for name in ("weights_", "means_", "variances_", "score_mean_", "score_sd_"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=rtol, atol=rtol, err_msg=name)
    assert len(a.history_) == len(b.history_)


@pytest.mark.parametrize("cache_mb", [64, 0], ids=["in-memory", "streamed"])
def test_two_cpu_devices_fit_the_one_device_model(small_blocks, cache_mb):
    one = _fit((), cache_mb)
    two = _fit(("cpu", "cpu"), cache_mb)
    _assert_same(one, two, 1e-12)               # the blocks' statistics are added in their order
    info = two.train_info_
    assert info["device"] == "cpu,cpu" and len(info["device_blocks"]) == 2 and len(info["device_seconds"]) == 2
    assert sum(info["device_blocks"]) > 10 * info["em_passes"] // 2
    assert "device_blocks" not in one.train_info_


@pytest.mark.parametrize("cache_mb", [64, 0], ids=["in-memory", "streamed"])
def test_the_torch_e_step_fits_the_numpy_model(small_blocks, cache_mb):
    pytest.importorskip("torch")
    one = _fit((), cache_mb)
    _assert_same(one, _fit(("cpu-torch",), cache_mb), 1e-8)
    _assert_same(one, _fit(("cpu", "cpu-torch"), cache_mb), 1e-8)


def test_the_torch_e_step_equals_the_numpy_one():
    pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, (1000, 6))
    theta = m_step(e_step((np.ones(3) / 3, rng.normal(0, 1, (3, 6)), np.ones((3, 6))), squared_blocks(x, 256)), 1e-4)
    want = e_step(theta, squared_blocks(x, 256))
    pool = EStepPool(["cpu-torch"], 3, 6)
    for blocks in (list(squared_blocks(x, 256)), [np.hstack([x, x * x])]):     # pairs and [x, x²]
        got = pool.e_step(gauss_terms(*theta), blocks)
        np.testing.assert_allclose(got.n, want.n, rtol=1e-12)
        np.testing.assert_allclose(got.s, want.s, rtol=1e-12)
        assert got.ll == pytest.approx(want.ll, rel=1e-12) and got.frames == want.frames == 1000
    ll = np.concatenate(pool.loglik(gauss_terms(*theta), list(squared_blocks(x, 256))))
    np.testing.assert_allclose(ll, np.concatenate(EStepPool(["cpu"], 3, 6).loglik(
        gauss_terms(*theta), list(squared_blocks(x, 256)))), rtol=1e-12)
    pool.close()


def test_a_slower_device_takes_fewer_blocks():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (4000, 4))
    theta = (np.ones(2) / 2, rng.normal(0, 1, (2, 4)), np.ones((2, 4)))
    pool = EStepPool(["cpu", "cpu"], 2, 4)
    delays = {id(pool.devices[0]): 0.002, id(pool.devices[1]): 0.01}    # simulated devices: 2 and 10 ms a block
    plain_map = pool.map

    def sleepy_map(items, work, reduce, setup=None):
        def slow(device, context, item):
            time.sleep(delays[id(device)])
            return work(device, context, item)

        return plain_map(items, slow, reduce, setup=setup)

    pool.map = sleepy_map                        # type: ignore[method-assign]
    st = pool.e_step(gauss_terms(*theta), list(squared_blocks(x, 100)))
    pool.close()
    assert st.frames == 4000 and sum(pool.blocks) == 40
    assert pool.blocks[0] > 2 * pool.blocks[1] >= 2
    want = e_step(theta, squared_blocks(x, 100))
    np.testing.assert_array_equal(st.s, want.s)


def test_an_error_on_any_device_reaches_the_caller():
    pool = DevicePool(["cpu", "cpu"])

    def items():
        yield from range(5)
        raise OSError("the stream broke")

    with pytest.raises(OSError, match="the stream broke"):
        pool.map(items(), lambda d, t, item: item, lambda r: None)
    with pytest.raises(ZeroDivisionError):
        pool.map(range(5), lambda d, t, item: 1 / (item - 3), lambda r: None)
    pool.close()


def test_unknown_devices_are_refused():
    from wavetrain.core.errors import ParameterError

    with pytest.raises(ParameterError):
        DevicePool(["cpu", "tpu"])


def test_train_gmm_on_two_cpu_devices_from_the_command_line(demo_csv, tmp_path, capsys):
    from wavetrain.cli.main import main
    from wavetrain.models.modelfile import load_model

    base = ["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2"]
    assert main([*base, "-o", str(tmp_path / "one.wt")]) == 0
    assert main([*base, "-o", str(tmp_path / "two.wt"), "--devices", "cpu,cpu"]) == 0
    capsys.readouterr()
    one, two = load_model(tmp_path / "one.wt"), load_model(tmp_path / "two.wt")
    for key, value in one.state_dict().items():
        np.testing.assert_allclose(two.state_dict()[key], value, rtol=1e-10, atol=1e-12, err_msg=key)


def test_the_model_file_records_each_devices_blocks_and_seconds_and_info_shows_them(demo_csv, tmp_path, capsys):
    from wavetrain.cli.main import main
    from wavetrain.models.modelfile import read_model_file

    out = tmp_path / "two.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "-o", str(out), "--devices", "cpu,cpu"]) == 0
    devices = read_model_file(out)[0]["training"]["devices"]
    parts = devices.split("; ")
    assert len(parts) == 2 and all(p.startswith("cpu ") and " blocks " in p and p.endswith(" s") for p in parts)
    assert sum(int(p.split()[1]) for p in parts) > 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    training = [line for line in capsys.readouterr().out.splitlines() if line.startswith("training")]
    assert len(training) == 1 and f"devices={devices}" in training[0]
