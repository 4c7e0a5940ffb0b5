"""The processes of a fit (``train.steps.Distribution``), chosen once from its options: one process
leaves sums, batch sizes and streams as they are and reads what it resumes itself; a rank of a
group cuts its passes and needs a stream that can be cut. The collectives of a rank group run in
tests/train/test_distributed.py (two gloo ranks)."""
from __future__ import annotations

import numpy as np
import pytest

from wavetrain.models import FitOptions
from wavetrain.train.array_stream import synthetic_stream
from wavetrain.train.steps import OneProcess, RankGroup, SingleDevice, distribution_for

torch = pytest.importorskip("torch")


class Cappable:
    """A stream with ``max_windows`` (as a Spark table stream)."""

    def __init__(self):
        self.max_windows: int | None = None


def test_the_options_choose_the_distribution_once():
    one = distribution_for(FitOptions(devices=("cpu", "cpu")))
    assert isinstance(one, OneProcess) and one.devices == ("cpu", "cpu")
    ranks = distribution_for(FitOptions(distributed=True, devices=("cpu", "cpu")))
    assert isinstance(ranks, RankGroup) and ranks.devices == ()      # a rank trains on its one device


def test_one_process_leaves_everything_as_it_is():
    one = OneProcess()
    values = np.array([1.5, 2.0, 7.0])
    assert one.reduce_sums(values) is values
    np.testing.assert_array_equal(one.gather(values), values[None])
    stream = synthetic_stream(6, 2)
    assert one.equal_share(stream, 3) is stream and one.batch_size(33) == 33
    assert one.from_first(lambda: "read here") == "read here"
    net = torch.nn.Linear(3, 2)
    assert one.wrap(net, torch.device("cpu")) is net


def test_a_rank_cuts_a_copy_of_its_stream_and_refuses_one_that_cannot_be_cut():
    stream = Cappable()
    share = RankGroup().equal_share(stream, 5)
    assert share.max_windows == 5 and stream.max_windows is None
    with pytest.raises(TypeError, match="cannot"):
        RankGroup().equal_share(synthetic_stream(6, 2), 3)


def test_a_single_device_strategy_steps_the_bare_network_alone():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 2))
    s = SingleDevice(net, torch.device("cpu"))
    assert s.module is s.net and isinstance(s.distribution, OneProcess)
    x, y = np.ones((4, 1, 2, 3), np.float32), np.array([0, 1, 0, 1])
    assert np.isfinite(s.step(x, y)) and set(s.evaluate([(x, y)])) == {"valid_loss", "top1", "top5", "macro_f1"}
