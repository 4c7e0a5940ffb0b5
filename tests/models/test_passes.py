"""Passes of mergeable statistics: the merges are order-free, and a family that learns through an
executor fits the same model whether its data comes as one stream or as shards merged in any
order (what the Spark executor does)."""
import contextlib

import numpy as np
import pytest

from wavetrain.models import build
from wavetrain.models.base import FitOptions
from wavetrain.models.gmm import GMMClassifier
from wavetrain.models.mixture_fit import fit_mixture
from wavetrain.models.passes import Moments, ScoreList, StreamExecutor
from wavetrain.train.array_stream import ArrayStream


def _float64(g):
    return np.asarray(g, dtype=np.float64)


def _grams(n=40, d=5, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(1.0, 1.0, (rng.integers(6, 20), d)) * np.linspace(0.5, 3, d)).astype(np.float32)
            for _ in range(n)]


class ShardedExecutor:
    """Windows split into shards (each window its recording, ordinal = its index), every shard's
    statistics computed on its own in batches of ``batch`` windows and merged in ``order``."""

    def __init__(self, grams, ys, labels, shards=3, batch=4, order_seed=0):
        self.grams, self.ys, self.labels = list(grams), np.asarray(ys, dtype=np.int64), list(labels)
        self.feature_dim, self.rate, self.channels = grams[0].shape[1], None, None
        self.shards, self.batch, self.order_seed = shards, batch, order_seed

    def run(self, p):
        parts = []
        for idx in np.array_split(np.arange(len(self.grams)), self.shards):
            state = p.new()
            for s in range(0, len(idx), self.batch):
                b = idx[s:s + self.batch]
                state = p.add(state, [self.grams[i] for i in b], self.ys[b], [int(i) for i in b])
            parts.append(state)
        rng = np.random.default_rng(self.order_seed)
        while len(parts) > 1:                       # merge random pairs: any tree, any order
            i, j = sorted(rng.choice(len(parts), 2, replace=False))
            b, a = parts.pop(j), parts.pop(i)
            parts.append(p.merge(a, b) if rng.random() < 0.5 else p.merge(b, a))
        return parts[0]

    def using(self, *, cache_bytes=0, devices=()):
        return contextlib.nullcontext(self)

    def report(self):
        return {}

    def split(self, fraction, seed, group_by, strata=()):
        return None

    def recording_values(self, names):
        return None

    def scores(self, model):
        return self.run(ScoreList(model)).scores()


def test_moments_merge_in_any_order_equal_numpy():
    grams = _grams()
    v = np.concatenate(grams).astype(np.float64)
    for seed in range(3):
        m = ShardedExecutor(grams, [0] * len(grams), ["normal"], shards=4, order_seed=seed).run(Moments(_float64))
        assert m.n == v.shape[0]
        np.testing.assert_allclose(m.mean, v.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(m.m2 / m.n, v.var(axis=0), rtol=1e-10)


def test_moments_ignore_a_batch_without_vectors():
    grams = _grams(n=6)
    empty = [np.zeros((0, 5), dtype=np.float32)] * 4
    m = ShardedExecutor(grams[:3] + empty + grams[3:], [0] * 10, ["normal"], shards=3, batch=4).run(Moments(_float64))
    v = np.concatenate(grams).astype(np.float64)
    assert m.n == v.shape[0]
    np.testing.assert_allclose(m.mean, v.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(m.m2 / m.n, v.var(axis=0), rtol=1e-10)


def test_score_list_is_in_data_set_order_whatever_the_shards():
    grams = _grams(n=23)
    model = build("normal-dist", {"valid_fraction": 0}).fit(ArrayStream(grams, [0] * 23, ["normal"]))
    want = model.anomaly_score(grams)
    for seed in range(3):
        got = ShardedExecutor(grams, [0] * 23, ["normal"], shards=5, order_seed=seed).scores(model)
        np.testing.assert_array_equal(got, want)


def test_stream_executor_counts_only_labelled_windows_unless_every_window():
    grams = _grams(n=10)
    stream = ArrayStream(grams, [0, -1] * 5, ["a"], batch_size=3)
    count = Moments(_float64)
    assert StreamExecutor(stream).run(count).n == sum(g.shape[0] for g in grams[::2])
    assert StreamExecutor(stream, every_window=True).run(count).n == sum(g.shape[0] for g in grams)


@pytest.mark.parametrize("compress", ["none", "time", "both"])
def test_normal_dist_learns_the_same_on_shards(compress):
    grams, valid = _grams(seed=1), _grams(n=15, seed=2)
    params = {"compress": compress, "valid_fraction": 0}
    local = build("normal-dist", params).fit(ArrayStream(grams, [0] * 40, ["normal"]),
                                             ArrayStream(valid, [0] * 15, ["normal"]))
    sharded = build("normal-dist", params).learn(ShardedExecutor(grams, [0] * 40, ["normal"], order_seed=1),
                                                 ShardedExecutor(valid, [0] * 15, ["normal"], shards=2))
    np.testing.assert_allclose(sharded.mean_, local.mean_, rtol=1e-9)
    np.testing.assert_allclose(sharded.var_, local.var_, rtol=1e-9)
    assert sharded.count_ == local.count_
    assert sharded.threshold_ == pytest.approx(local.threshold_, rel=1e-9)
    assert sharded.train_info_["threshold_method"] == local.train_info_["threshold_method"]


def test_anomaly_gmm_learns_the_same_on_shards():
    grams, valid = _grams(seed=3), _grams(n=15, seed=4)
    params = {"components": 3, "valid_fraction": 0, "max_iter": 30, "init_frames": 200}
    local = build("anomaly-gmm", params).fit(ArrayStream(grams, [0] * 40, ["normal"]),
                                             ArrayStream(valid, [0] * 15, ["normal"]))
    sharded = build("anomaly-gmm", params).learn(ShardedExecutor(grams, [0] * 40, ["normal"]),
                                                 ShardedExecutor(valid, [0] * 15, ["normal"], shards=2))
    for a, b in zip(local.mixture_.state_dict().values(), sharded.mixture_.state_dict().values()):
        np.testing.assert_allclose(np.asarray(b, dtype=np.float64), np.asarray(a, dtype=np.float64),
                                   rtol=1e-6, atol=1e-9)
    assert sharded.threshold_ == pytest.approx(local.threshold_, rel=1e-6)


def test_fit_mixture_equals_the_local_gmm_with_several_labels():
    grams = _grams(n=45, seed=5)
    ys = [i % 3 for i in range(45)]
    for i, g in enumerate(grams):
        g[:, ys[i]] += 3.0
    params = {"components": 2, "max_iter": 25, "init_frames": 150}
    local = GMMClassifier(**params).fit(ArrayStream(grams, ys, ["a", "b", "c"], batch_size=8))
    sharded = fit_mixture(GMMClassifier(**params), ShardedExecutor(grams, ys, ["a", "b", "c"], shards=4))
    np.testing.assert_allclose(sharded.means_, local.means_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sharded.variances_, local.variances_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sharded.weights_, local.weights_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sharded.score_mean_, local.score_mean_, rtol=1e-6)


def _rows(x):
    return x[np.lexsort(x.T[::-1])]


def test_knn_anomaly_summary_is_the_same_set_on_shards_while_it_fits_its_buffer():
    grams, valid = _grams(n=30, seed=6), _grams(n=12, seed=7)
    params = {"valid_fraction": 0, "subwindow_frames": 2, "capacity": 200}
    local = build("knn-anomaly", params).fit(ArrayStream(grams, [0] * 30, ["normal"]),
                                             ArrayStream(valid, [0] * 12, ["normal"]))
    assert local.train_info_["vectors_seen"] <= 2 * 200                 # no merge before the finish
    sharded = build("knn-anomaly", params).learn(ShardedExecutor(grams, [0] * 30, ["normal"], order_seed=2),
                                                 ShardedExecutor(valid, [0] * 12, ["normal"], shards=2))
    assert sharded.train_info_ == local.train_info_
    np.testing.assert_allclose(_rows(sharded.vectors_), _rows(local.vectors_), rtol=1e-12)
    np.testing.assert_allclose(np.sort(sharded.weights_), np.sort(local.weights_))
    np.testing.assert_allclose(sharded.anomaly_score(valid), local.anomaly_score(valid), rtol=1e-9)
    assert sharded.threshold_ == pytest.approx(local.threshold_, rel=1e-9)


def test_knn_anomaly_summary_beyond_its_buffer_keeps_every_vectors_weight():
    """Past ``2 x capacity`` vectors, which pairs merge depends on the split: the summary differs,
    but it still has ``capacity`` vectors standing for every vector seen."""
    grams = _grams(n=30, seed=8)
    params = {"valid_fraction": 0, "subwindow_frames": 1, "capacity": 20}
    local = build("knn-anomaly", params).fit(ArrayStream(grams, [0] * 30, ["normal"]))
    sharded = build("knn-anomaly", params).learn(ShardedExecutor(grams, [0] * 30, ["normal"]))
    seen = sum(g.shape[0] for g in grams)
    for m in (local, sharded):
        assert m.vectors_.shape[0] == 20 and m.weights_.sum() == pytest.approx(seen)
        assert m.train_info_["vectors_seen"] == seen and m.train_info_["merges"] == seen - 20


def test_knn_classifier_summary_merges_every_label_on_shards():
    grams = _grams(n=24, seed=9)
    ys = [i % 2 for i in range(24)]
    model = build("knn", {"capacity": 500})
    model.labels_, model.feature_dim_ = ["a", "b"], grams[0].shape[1]
    local = build("knn", {"capacity": 500}).fit(ArrayStream(grams, ys, ["a", "b"]))
    model._learn_from(ShardedExecutor(grams, ys, ["a", "b"], shards=4), 2)
    for c in (0, 1):
        np.testing.assert_allclose(_rows(model.vectors_[model.vector_labels_ == c]),
                                   _rows(local.vectors_[local.vector_labels_ == c]), rtol=1e-12)
    np.testing.assert_array_equal(model.predict(grams), local.predict(grams))


# -- the local executor: its frame cache and its devices ------------------------------------------
class CountingStream(ArrayStream):
    """An ArrayStream that counts its passes; with ``reuse``, every batch's grams are views of one
    buffer it fills again for the next batch (as a reader with a fixed buffer may), and with
    ``say`` it reports that many frames per pass (None: it cannot say)."""

    def __init__(self, *args, reuse=False, say="count", **kw):
        super().__init__(*args, **kw)
        self.passes, self.reuse, self.say = 0, reuse, say

    def expected_frames(self):
        return super().expected_frames() if self.say == "count" else self.say

    def batches(self, *, shuffle=False, seed=0):
        self.passes += 1
        for b in super().batches(shuffle=shuffle, seed=seed):
            if self.reuse:
                buf = np.concatenate(b.grams)
                cut = np.cumsum([0] + [len(g) for g in b.grams])
                b.grams[:] = [buf[cut[i]:cut[i + 1]] for i in range(len(b.grams))]
                yield b
                buf[:] = np.nan                    # the reader fills its buffer again
            else:
                yield b


def _moments(ex):
    return ex.run(Moments(_float64))


@pytest.mark.parametrize("reuse", [False, True], ids=["own-arrays", "reused-buffer"])
def test_the_frame_cache_serves_later_passes_from_memory(reuse):
    grams = _grams(n=30)
    ys = [0, -1, 1] * 10
    stream = CountingStream(grams, ys, ["a", "b"], batch_size=4, reuse=reuse)
    want = _moments(StreamExecutor(CountingStream(grams, ys, ["a", "b"], batch_size=4)))
    with StreamExecutor(stream).using(cache_bytes=1 << 20) as ex:
        first, again, third = _moments(ex), _moments(ex), _moments(ex)
        scores = ex.run(ScoreList(type("M", (), {"anomaly_score": lambda self, g: [x.sum() for x in g]})()))
    assert stream.passes == 1                      # one read of the stream, the other passes from memory
    for m in (first, again, third):
        assert m.n == want.n and np.all(np.isfinite(m.mean))
        np.testing.assert_array_equal(m.mean, want.mean)
        np.testing.assert_array_equal(m.m2, want.m2)
    labelled = [g for g, y in zip(grams, ys) if y >= 0]
    np.testing.assert_allclose(scores.scores(), [g.astype(np.float32).sum() for g in labelled], rtol=1e-6)


def test_without_a_budget_or_beyond_it_every_pass_reads_the_stream():
    grams = _grams(n=30)
    need = sum(g.nbytes for g in grams)
    for budget, say in ((0, "count"), (need // 2, None)):       # none asked; too small, found out while reading
        stream = CountingStream(grams, [0] * 30, ["a"], batch_size=4, say=say)
        with StreamExecutor(stream).using(cache_bytes=budget) as ex:
            for _ in range(3):
                _moments(ex)
        assert stream.passes == 3


def test_windows_are_not_gathered_when_the_stream_says_they_will_not_fit(monkeypatch):
    from wavetrain.models import passes

    held = []

    class Spy(passes._FrameCache):
        def add(self, grams, ys, ordinals):
            super().add(grams, ys, ordinals)
            held.append(self.bytes if self.batches is not None else 0)

    monkeypatch.setattr(passes, "_FrameCache", Spy)
    grams = [np.ones((400, 40), np.float32)] * 40                  # 16,000 frames x 40 x 4 bytes = 2.56 MB
    for budget, gathers in ((2 << 20, False), (4 << 20, True)):
        held.clear()
        stream = CountingStream(grams, [0] * 40, ["a"])
        with StreamExecutor(stream).using(cache_bytes=budget) as ex:
            _moments(ex)
            _moments(ex)
        assert (max(held, default=0) > 0) == gathers
        assert stream.passes == (1 if gathers else 2)


def test_a_split_keeps_the_cache_for_training_and_reads_the_held_out_part_once():
    grams = _grams(n=20)
    stream = CountingStream(grams, [0] * 20, ["a"], batch_size=3)
    with StreamExecutor(stream).using(cache_bytes=1 << 20) as ex:
        train, valid = ex.split(0.25, 0, None)
        assert train.cache_bytes == 1 << 20 and valid.cache_bytes == 0
        assert _moments(train).n + _moments(valid).n == sum(g.shape[0] for g in grams)


class SquareSums:
    """A kernel pass: the sum of squares of every label's frames, a piece per window pair, with
    the device each piece ran on."""

    pieces_key = None

    def new(self):
        return {"sums": np.zeros(2), "devices": []}

    def add(self, state, grams, ys, ordinals):
        from wavetrain.models.passes import add_by_kernel

        return add_by_kernel(self, state, zip(grams, ys, ordinals))

    def merge(self, a, b):
        return {"sums": a["sums"] + b["sums"], "devices": a["devices"] + b["devices"]}

    def pieces(self, windows):
        pending = []
        for w in windows:                          # pairs of windows: pieces span the stream's batches
            pending.append(w)
            if len(pending) == 2:
                yield pending
                pending = []
        if pending:
            yield pending

    def setup(self, device):
        return device.name

    def compute(self, device, context, piece):
        assert context == device.name
        return device.name, [(int(y), float((g.astype(np.float64) ** 2).sum())) for g, y, _ in piece]

    def fold(self, state, result):
        name, parts = result
        for y, v in parts:
            state["sums"][y] += v
        state["devices"].append(name)
        return state


def test_a_kernel_pass_is_spread_over_the_devices_and_folded_in_order():
    grams = _grams(n=41)
    ys = [i % 2 for i in range(41)]
    stream = ArrayStream(grams, ys, ["a", "b"], batch_size=3)
    want = SquareSums().add(SquareSums().new(), grams, np.array(ys), list(range(41)))
    alone = StreamExecutor(stream).run(SquareSums())
    with StreamExecutor(stream).using(devices=("cpu", "cpu")) as ex:
        shared = ex.run(SquareSums())
        info = ex.report()
    np.testing.assert_array_equal(alone["sums"], want["sums"])
    np.testing.assert_array_equal(shared["sums"], want["sums"])        # the one-device sums, to the bit
    assert len(shared["devices"]) == 21 and set(shared["devices"]) == {"cpu"}
    assert info["device"] == "cpu,cpu" and sum(info["device_blocks"]) == 21
    assert StreamExecutor(stream).report() == {}


def test_a_wrong_device_is_refused_before_the_stream_is_read():
    from wavetrain.core.errors import ParameterError

    stream = CountingStream(_grams(n=4), [0, 1] * 2, ["a", "b"])
    with pytest.raises(ParameterError, match="tpu"):
        GMMClassifier(components=2).fit(stream, options=FitOptions(devices=("cpu", "tpu")))
    assert stream.passes == 0


def test_a_gmm_reads_the_stream_once_when_its_frames_fit_and_fits_the_same_model_either_way():
    grams = _grams(n=45, seed=5)
    ys = [i % 3 for i in range(45)]
    for i, g in enumerate(grams):
        g[:, ys[i]] += 3.0
    params = {"components": 2, "max_iter": 25, "init_frames": 150}
    kept, streamed = (CountingStream(grams, ys, ["a", "b", "c"], batch_size=8) for _ in range(2))
    a = GMMClassifier(**params, frame_cache_mb=64).fit(kept)
    b = GMMClassifier(**params, frame_cache_mb=0).fit(streamed)
    assert kept.passes == 1 and streamed.passes == len(b.history_) + 2       # sample, EM passes, scores
    for name in ("weights_", "means_", "variances_", "score_mean_", "score_sd_"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
