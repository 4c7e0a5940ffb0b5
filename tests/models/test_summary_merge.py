"""Merging the knn summaries of parts of the data (what the Spark executor does with each part
file's summary): exactly commutative, the local summary bit for bit while every label's
vectors fit the ``2 x capacity`` buffer whatever the split and merge tree, and beyond the buffer
a function of the parts and of the tree's shape only."""
import contextlib
import copy
import functools

import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.models import build
from wavetrain.models.knn import SummaryPass
from wavetrain.models.passes import ScoreList
from wavetrain.models.vector_summary import PLACE_BITS, VectorSummary
from wavetrain.train.array_stream import ArrayStream


def _windows(n, d=4, labels=2, frames=(1, 4), seed=0):
    """``n`` windows (float32 grams of 1-3 frames), label ``i % labels``, classes apart."""
    rng = np.random.default_rng(seed)
    grams, ys = [], []
    for i in range(n):
        c = i % labels
        grams.append((rng.normal(size=(int(rng.integers(*frames)), d)) + 2.5 * c).astype(np.float32))
        ys.append(c)
    return grams, ys


def _split(n, parts, how, seed=0):
    """Window indices of each part: contiguous runs, interleaved, or random sets read in a random
    order (a part file's recordings need not come in ordinal order)."""
    if how == "contiguous":
        return np.array_split(np.arange(n), parts)
    if how == "interleaved":
        return [np.arange(k, n, parts) for k in range(parts)]
    perm = np.random.default_rng(seed).permutation(n)
    return np.array_split(perm, parts)


# -- merge trees: each takes a pass's merge and the leaves (which it may consume) ------------------
def left_fold(merge, leaves):
    return functools.reduce(merge, leaves)


def left_fold_swapped(merge, leaves):
    """The left fold's tree with every node's operands swapped."""
    return functools.reduce(lambda acc, leaf: merge(leaf, acc), leaves)


def right_fold(merge, leaves):
    acc = leaves[-1]
    for leaf in reversed(leaves[:-1]):
        acc = merge(leaf, acc)
    return acc


def balanced(merge, leaves, swap=False):
    if len(leaves) == 1:
        return leaves[0]
    h = len(leaves) // 2
    a, b = balanced(merge, leaves[:h], swap), balanced(merge, leaves[h:], swap)
    return merge(b, a) if swap else merge(a, b)


def random_tree(shape_seed, order_seed):
    """Random pairs merged until one is left (the tree's shape from ``shape_seed``), each node's
    operands in an order drawn from ``order_seed``."""

    def tree(merge, leaves):
        shape, order = np.random.default_rng(shape_seed), np.random.default_rng(order_seed)
        parts = list(leaves)
        while len(parts) > 1:
            i, j = sorted(shape.choice(len(parts), 2, replace=False))
            b, a = parts.pop(j), parts.pop(i)
            parts.append(merge(a, b) if order.random() < 0.5 else merge(b, a))
        return parts[0]

    return tree


TREES = {"left": left_fold, "left-swapped": left_fold_swapped, "right": right_fold, "balanced": balanced,
         "balanced-swapped": functools.partial(balanced, swap=True), "random-1": random_tree(1, 1),
         "random-2": random_tree(2, 7), "random-3": random_tree(3, 3)}


class PartsExecutor:
    """Windows (each its own recording, ordinal = its index, as a local ArrayStream numbers them)
    read by ``parts``, each part's statistics built in batches of ``batch`` windows, the parts
    merged by ``tree``; ``bound`` checks every merged summary."""

    def __init__(self, grams, ys, labels, parts, tree, batch=5, bound=None):
        self.grams, self.ys, self.labels = list(grams), np.asarray(ys, dtype=np.int64), list(labels)
        self.feature_dim, self.rate, self.channels = grams[0].shape[1], None, None
        self.parts, self.tree, self.batch, self.bound = parts, tree, batch, bound

    def leaves(self, p):
        out = []
        for idx in self.parts:
            state = p.new()
            for s in range(0, len(idx), self.batch):
                b = idx[s:s + self.batch]
                state = p.add(state, [self.grams[i] for i in b], self.ys[b], [int(i) for i in b])
            out.append(state)
        return out

    def run(self, p):
        def merge(a, b):
            out = p.merge(a, b)
            if self.bound is not None:
                self.bound(out)
            return out

        return self.tree(merge, self.leaves(p))

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


def _summary(model, executor, n_labels):
    """The finished summary of one pass (vectors, weights, labels, keys label by label)."""
    s = executor.run(SummaryPass(model, n_labels))
    s.finish()
    keys = np.concatenate([s.label_keys(c) for c in range(n_labels)])
    return (*s.arrays(), keys, s.merges, s.seen.copy())


def _knn(params, labels, feature_dim):
    model = build("knn", params)
    model.labels_, model.feature_dim_ = list(labels), feature_dim
    return model


def _assert_same(a, b, msg=""):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y, err_msg=msg)


# -- while it fits the buffer: the local summary, whatever the split and tree ----------------------
@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_any_split_and_merge_tree_gives_the_local_knn_summary_while_it_fits(parts):
    grams, ys = _windows(60)
    params = {"k": 3, "capacity": 40}
    local = build("knn", params).fit(ArrayStream(grams, ys, ["a", "b"], batch_size=8))
    per_label = np.bincount(ys, weights=[g.shape[0] for g in grams])
    assert per_label.min() > 40 and per_label.max() <= 2 * 40            # fits the buffer of each label...
    assert local.train_info_["merges"] > 0                                 # ...and the finish reduces
    test, _ = _windows(30, seed=1)
    for how in ("contiguous", "interleaved", "random"):
        for name, tree in TREES.items():
            model = build("knn", params).learn(PartsExecutor(grams, ys, ["a", "b"], _split(60, parts, how), tree))
            np.testing.assert_array_equal(model.vectors_, local.vectors_, err_msg=f"{how}, {name}")
            np.testing.assert_array_equal(model.weights_, local.weights_)
            np.testing.assert_array_equal(model.vector_labels_, local.vector_labels_)
            assert model.train_info_ == local.train_info_
            np.testing.assert_array_equal(model.predict_proba(test), local.predict_proba(test))


@pytest.mark.parametrize("parts", [2, 3, 7])
def test_knn_anomaly_scores_are_the_local_ones_on_any_split_while_it_fits(parts):
    grams, _ = _windows(50, d=5, labels=1, frames=(3, 9))
    valid, _ = _windows(12, d=5, labels=1, frames=(3, 9), seed=2)
    test, _ = _windows(20, d=5, labels=1, frames=(3, 9), seed=3)
    params = {"k": 3, "capacity": 150, "subwindow_frames": 2, "valid_fraction": 0}
    local = build("knn-anomaly", params).fit(ArrayStream(grams, [0] * 50, ["normal"]),
                                             ArrayStream(valid, [0] * 12, ["normal"]))
    assert 150 < local.train_info_["vectors_seen"] <= 300
    for name, tree in TREES.items():
        model = build("knn-anomaly", params).learn(
            PartsExecutor(grams, [0] * 50, ["normal"], _split(50, parts, "random", seed=parts), tree),
            PartsExecutor(valid, [0] * 12, ["normal"], _split(12, 2, "contiguous"), tree))
        np.testing.assert_array_equal(model.vectors_, local.vectors_, err_msg=name)
        np.testing.assert_array_equal(model.anomaly_score(test), local.anomaly_score(test))
        assert model.threshold_ == local.threshold_


# -- beyond the buffer ------------------------------------------------------------------------------
@pytest.mark.parametrize("parts", [2, 3, 7])
def test_beyond_the_buffer_the_operand_order_never_matters_and_the_buffer_bounds_every_merge(parts):
    """Capacity 4, hundreds of vectors: each tree shape gives one summary whatever the order of
    the operands at its nodes, and no merged summary holds more than 2 x capacity rows a label."""
    grams, ys = _windows(120, frames=(2, 6), seed=4)
    split = _split(120, parts, "random", seed=parts)
    model = _knn({"k": 3, "capacity": 4}, ["a", "b"], 4)

    def bound(s):
        assert all(s.label_vectors(c)[0].shape[0] <= 8 for c in range(2))

    def run(tree):
        return _summary(model, PartsExecutor(grams, ys, ["a", "b"], split, tree, bound=bound), 2)

    left = run(left_fold)
    assert left[4] > 0 and left[0].shape == (8, 4)
    seen = sum(g.shape[0] for g in grams)
    assert left[4] == seen - 8 and left[1].sum() == seen                 # every vector stands in the summary
    _assert_same(run(left_fold_swapped), left)
    _assert_same(run(functools.partial(balanced, swap=True)), run(balanced))
    for shape in (1, 2):
        ref = run(random_tree(shape, 0))
        for order in (1, 2, 3):
            _assert_same(run(random_tree(shape, order)), ref)


def test_beyond_the_buffer_the_predictions_do_not_depend_on_the_operand_order():
    grams, ys = _windows(120, frames=(2, 6), seed=5)
    test, _ = _windows(40, seed=6)
    split = _split(120, 7, "interleaved")
    knn = [build("knn", {"k": 3, "capacity": 4, "vote": "weight"}).learn(
        PartsExecutor(grams, ys, ["a", "b"], split, random_tree(4, order))) for order in (0, 1, 2)]
    normal = [g for g, y in zip(grams, ys) if y == 0]
    detectors = [build("knn-anomaly", {"k": 2, "capacity": 4, "subwindow_frames": 1, "valid_fraction": 0}).learn(
        PartsExecutor(normal, [0] * len(normal), ["normal"], _split(len(normal), 7, "interleaved"), tree),
        PartsExecutor(test, [0] * 40, ["normal"], _split(40, 3, "contiguous"), tree))
        for tree in (left_fold, left_fold_swapped)]
    for m in knn[1:]:
        np.testing.assert_array_equal(m.predict_proba(test), knn[0].predict_proba(test))
    np.testing.assert_array_equal(detectors[1].anomaly_score(test), detectors[0].anomaly_score(test))
    assert detectors[1].threshold_ == detectors[0].threshold_


@pytest.mark.parametrize("parts,capacity,per_part", [(3, 4, 3), (4, 3, 2)])
def test_when_only_the_last_merge_reduces_every_tree_gives_the_same_summary(parts, capacity, per_part):
    """Parts whose vectors fit the buffer together until the last merge: that merge reduces the
    union of all of them, whatever the tree."""
    rng = np.random.default_rng(parts)
    grams = [rng.normal(size=(1, 3)).astype(np.float32) + (i % 2) for i in range(2 * parts * per_part)]
    ys = [i % 2 for i in range(len(grams))]
    split = _split(len(grams), parts, "contiguous")           # per_part vectors of each label a part
    model = _knn({"capacity": capacity}, ["a", "b"], 3)
    runs = {name: _summary(model, PartsExecutor(grams, ys, ["a", "b"], split, tree, batch=2), 2)
            for name, tree in TREES.items()}
    ref = runs["left"]
    assert ref[4] == len(grams) - 2 * capacity and ref[0].shape[0] == 2 * capacity
    for name, got in runs.items():
        _assert_same(got, ref, name)


# -- the keys and the merge itself ------------------------------------------------------------------
def test_vectors_are_keyed_by_recording_and_place_and_a_merged_row_keeps_the_lower_key():
    s = VectorSummary(1, 1, capacity=2)
    first = s.keys_for(7, 2)
    np.testing.assert_array_equal(np.r_[first, s.keys_for(7, 1), s.keys_for(3, 1)],
                                  [(7 << PLACE_BITS), (7 << PLACE_BITS) + 1, (7 << PLACE_BITS) + 2, 3 << PLACE_BITS])
    s.add(0, np.array([[10.0], [10.5]]), keys=first)
    s.add(0, np.array([[0.0], [11.5]]), keys=np.array([3 << PLACE_BITS, (7 << PLACE_BITS) + 2]))
    s.finish()                                      # as the hand example of test_knn, in key order
    np.testing.assert_allclose(s.label_vectors(0)[0][:, 0], [0.0, (2 * 10.25 + 11.5) / 3])
    np.testing.assert_array_equal(s.label_keys(0), [3 << PLACE_BITS, 7 << PLACE_BITS])
    with pytest.raises(ParameterError, match="ordinal"):
        s.keys_for(-1, 1)


def test_a_reduction_depends_on_the_rows_not_on_their_arrival_order():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(9, 3))
    keys = np.arange(9, dtype=np.int64) << PLACE_BITS
    done = []
    for order in (np.arange(9), np.r_[7, 2, 5, 0, 3, 1, 6, 4, 8]):
        s = VectorSummary(1, 3, capacity=4)
        s.add(0, x[order[:4]], keys=keys[order[:4]])
        s.add(0, x[order[4:]], keys=keys[order[4:]])     # the 9th row finds the buffer full: a reduction
        s.finish()
        done.append((*s.label_vectors(0), s.label_keys(0)))
    _assert_same(done[1], done[0])
    assert np.all(np.diff(done[0][2]) > 0)


def test_merge_is_commutative_and_leaves_its_argument_alone():
    rng = np.random.default_rng(9)

    def part(ordinals):
        s = VectorSummary(2, 3, capacity=5)
        for o in ordinals:
            s.add(o % 2, rng.normal(size=(4, 3)), keys=s.keys_for(o, 4))
        return s

    a, b = part([0, 2, 5]), part([4, 6, 9])                  # label 0: 8 + 8 rows, beyond 10; label 1: 4 + 4
    ab, ba = copy.deepcopy(a), copy.deepcopy(b)
    b_before = (*b.arrays(), b.label_keys(0))
    ab.merge(b)
    ba.merge(a)
    _assert_same((*ab.arrays(), ab.label_keys(0), ab.label_keys(1), ab.seen, ab.merges),
                 (*ba.arrays(), ba.label_keys(0), ba.label_keys(1), ba.seen, ba.merges))
    _assert_same((*b.arrays(), b.label_keys(0)), b_before)
    assert ab.merges == 16 - 5 and ab.label_vectors(1)[0].shape[0] == 8


def test_merge_refuses_a_recording_in_two_parts_and_other_settings():
    a, b = VectorSummary(1, 2, capacity=3), VectorSummary(1, 2, capacity=3)
    a.add(0, np.zeros((2, 2)), keys=a.keys_for(4, 2))
    b.add(0, np.ones((2, 2)), keys=b.keys_for(4, 2))
    with pytest.raises(ParameterError, match="one recording"):
        a.merge(b)
    with pytest.raises(ParameterError, match="other settings"):
        a.merge(VectorSummary(1, 2, capacity=4))


def test_a_recordings_vectors_are_numbered_across_batches():
    grams, _ = _windows(6, labels=1, frames=(2, 3))
    model = _knn({"capacity": 50}, ["a"], 4)
    p = SummaryPass(model, 1)
    s = p.new()
    s = p.add(s, grams[:2], np.zeros(2, np.int64), [5, 5])
    s = p.add(s, grams[2:5], np.zeros(3, np.int64), [5, 2, 2])
    s = p.add(s, grams[5:], np.zeros(1, np.int64), [5])
    s.finish()
    n = [g.shape[0] for g in grams]
    five = np.arange(n[0] + n[1] + n[2] + n[5]) + (5 << PLACE_BITS)
    two = np.arange(n[3] + n[4]) + (2 << PLACE_BITS)
    np.testing.assert_array_equal(s.label_keys(0), np.r_[two, five])
    np.testing.assert_array_equal(s.label_vectors(0)[0], np.concatenate([grams[i] for i in (3, 4, 0, 1, 2, 5)]))
