"""Distributed-data-parallel fitting without Spark: two gloo ranks on this machine fit a cnn on
shares of unequal size through ``FitOptions(distributed=True)`` and end with the same weights,
the same validation figures, equal steps and the normaliser of all the data. About 10 s."""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest

from wavetrain.models import FitOptions, build
from wavetrain.models._torch_common import stream_stats
from wavetrain.stream.batches import Batch
from wavetrain.train import ArrayStream
from wavetrain.train.array_stream import synthetic_stream
from wavetrain.train.shuffle import batches_per_epoch
from wavetrain.train.steps import evaluate, evaluation_sums, metrics_from_sums

PARAMS = dict(epochs=2, batch_size=6, frames=12, valid_fraction=0.0, seed=5, lr=0.003)
SHARES = (slice(0, 28), slice(28, 48))          # rank 0 holds 28 windows, rank 1 20
VALID = (slice(0, 10), slice(10, 16))


class Capped:
    """An :class:`ArrayStream` whose passes end after ``max_windows`` windows (as a
    :class:`~wavetrain.spark.shards.TableStream` does)."""

    def __init__(self, stream: ArrayStream):
        self.stream, self.labels, self.feature_dim = stream, stream.labels, stream.feature_dim
        self.rate = self.channels = None
        self.max_windows: int | None = None

    def batches(self, *, shuffle: bool = False, seed: int = 0):
        left = len(self.stream) if self.max_windows is None else self.max_windows
        for b in self.stream.batches(shuffle=shuffle, seed=seed):
            if left <= 0:
                return
            yield Batch(b.grams[:left], b.y[:left])
            left -= len(b)


def _data():
    train, valid = synthetic_stream(48, 3, features=12, seed=1), synthetic_stream(16, 3, features=12, seed=2)
    return train, valid


def _rank_main(rank: int, world: int, out: str) -> None:
    import torch.distributed as dist

    # a file rendezvous: no port chosen in advance that another process could take meanwhile
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, 'rendezvous')}", rank=rank,
                            world_size=world)
    try:
        train, valid = _data()
        share = Capped(train.subset(range(48)[SHARES[rank]]))
        m = build("cnn", PARAMS).fit(share, valid.subset(range(16)[VALID[rank]]),
                                     FitOptions(device="cpu", distributed=True))
        with open(os.path.join(out, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump({"state": m.state_dict(), "history": m.history_, "info": m.train_info_}, f)
    finally:
        dist.destroy_process_group()


def _run_ranks(out) -> list[int | None]:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, 2, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    codes = _run_ranks(out := tmp_path_factory.mktemp("ranks"))
    if any(c is not None and c < 0 for c in codes):
        # a rank killed by a signal (an intermittent SIGABRT at start-up, about 1 run in 10 under a
        # full suite, cause not found) is started once more; an error exit is never retried
        codes = _run_ranks(out := tmp_path_factory.mktemp("ranks"))
    assert codes == [0, 0]
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(2)]


def test_ranks_end_with_the_same_weights(ranks):
    a, b = ranks[0]["state"], ranks[1]["state"]
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_ranks_see_the_same_figures_and_take_equal_steps(ranks):
    keys = ("iteration", "train_loss", "valid_loss", "top1", "top5", "macro_f1", "lr")
    h0, h1 = ([{k: h[k] for k in keys} for h in r["history"]] for r in ranks)
    assert h0 == h1 and all(h["valid_loss"] is not None for h in h0)
    # the smaller share's windows, each rank taking half of the global mini-batch a step
    steps = batches_per_epoch(20, -(-PARAMS["batch_size"] // 2))
    assert [h["iteration"] for h in h0] == [steps, 2 * steps]


def test_the_normaliser_is_that_of_all_the_data(ranks):
    train, _ = _data()
    mean, sd, _, _ = stream_stats(train, build("cnn", PARAMS).params["input_norm"])
    np.testing.assert_allclose(ranks[0]["state"]["norm.mean"], mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ranks[0]["state"]["norm.sd"], sd, rtol=1e-5)


def test_evaluation_sums_of_parts_give_evaluate():
    from wavetrain.models.cnn import build_cnn

    rng = np.random.default_rng(0)
    net = build_cnn(8, 10, 4)
    batches = [(rng.normal(size=(n, 1, 10, 8)).astype(np.float32), rng.integers(0, 4, n)) for n in (7, 5, 9)]
    whole = evaluate(net, batches, "cpu")
    parts = evaluation_sums(net, batches[:1], "cpu", 4) + evaluation_sums(net, batches[1:], "cpu", 4)
    summed = metrics_from_sums(parts, 4)
    assert summed.keys() == whole.keys()
    for k in whole:
        assert summed[k] == pytest.approx(whole[k], rel=1e-12), k
    assert metrics_from_sums(evaluation_sums(net, [], "cpu", 4), 4) == {}
