"""Passes of mergeable statistics: the merges are order-free, and a family that learns through an
executor fits the same model whether its data comes as one stream or as shards merged in any
order (what the Spark executor does)."""
import numpy as np
import pytest

from wavetrain.models import build
from wavetrain.models.gmm import GMMClassifier
from wavetrain.models.passes import Moments, ScoreList, StreamExecutor, fit_mixture
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

    def split(self, fraction, seed, group_by):
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
