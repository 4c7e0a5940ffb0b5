"""Shuffle buffer, prefetcher, schedules, stopping rules, metrics, array stream, history plot."""
import math

import numpy as np
import pytest

from wavetrain.core.errors import UserError
from wavetrain.evaluation.metrics import macro_f1, topk_accuracy
from wavetrain.train import ArrayStream, LRSchedule, StopRules, plot_history
from wavetrain.train.array_stream import synthetic_stream
from wavetrain.train.shuffle import Prefetcher, batches_per_epoch, minibatches, shuffled_windows


def _ids(stream, **kw):
    return [int(g[0, 0]) for g, _ in shuffled_windows(stream, **kw)]


@pytest.fixture
def id_stream():
    grams = [np.full((2, 3), i, np.float32) for i in range(50)]
    return ArrayStream(grams, [i % 2 for i in range(50)], ["a", "b"], batch_size=7)


def test_shuffle_is_a_deterministic_permutation(id_stream):
    a = _ids(id_stream, buffer=8, seed=1, epoch=0)
    assert sorted(a) == list(range(50)) and a != list(range(50))
    assert a == _ids(id_stream, buffer=8, seed=1, epoch=0)
    assert a != _ids(id_stream, buffer=8, seed=1, epoch=1)
    assert a != _ids(id_stream, buffer=8, seed=2, epoch=0)
    assert _ids(id_stream, buffer=8, seed=1, epoch=0, shuffle=False) == list(range(50))


def test_unlabelled_windows_are_skipped():
    s = ArrayStream([np.zeros((2, 3), np.float32)] * 4, [0, -1, 1, -1], ["a", "b"])
    assert len(list(shuffled_windows(s, buffer=2, seed=0, epoch=0))) == 2


def test_minibatches_match_count():
    for n, bs in [(10, 4), (9, 4), (8, 4), (1, 1), (5, 1)]:
        mb = list(minibatches(((np.zeros((1, 1)), 0) for _ in range(n)), bs))
        assert len(mb) == batches_per_epoch(n, bs)
        assert all(len(b) >= min(2, bs) for b in mb)


def test_prefetcher_keeps_order_and_raises():
    with Prefetcher(lambda: iter(range(100)), depth=3) as pf:
        assert list(pf) == list(range(100))

    def bad():
        yield 1
        raise ValueError("boom")
    pf = Prefetcher(bad, depth=2)
    assert next(pf) == 1
    with pytest.raises(ValueError, match="boom"):
        next(pf)
    pf.close()
    pf = Prefetcher(lambda: iter(range(10**6)), depth=2)  # closing early must not hang
    next(pf)
    pf.close()


def test_schedules():
    cos = LRSchedule("cosine", 1.0, total_iters=100, iters_per_epoch=10)
    assert cos.lr(0) == pytest.approx(1.0) and cos.lr(100) == pytest.approx(0.01) and cos.lr(50) < 1.0
    step = LRSchedule("step", 1.0, 100, 10, step_epochs=2, gamma=0.5)
    assert [step.lr(i) for i in (0, 19, 20, 40)] == [1.0, 1.0, 0.5, 0.25]
    pl = LRSchedule("plateau", 1.0, 100, 10, gamma=0.5, patience=2)
    for v in (1.0, 0.9, 0.95, 0.95):
        pl.observe(v)
    assert pl.lr(0) == 0.5
    pl2 = LRSchedule("plateau", 1.0, 100, 10)
    pl2.load_state_dict(pl.state_dict())
    assert pl2.lr(0) == 0.5
    assert LRSchedule("constant", 0.1, 10, 1).lr(9) == 0.1


def test_stop_rules():
    r = StopRules("valid_loss", patience=2)
    assert r.update({"iteration": 1, "valid_loss": 1.0}) == (True, None)
    assert r.update({"iteration": 2, "valid_loss": 1.1}) == (False, None)
    improved, reason = r.update({"iteration": 3, "valid_loss": 1.2})
    assert not improved and "no improvement" in reason and r.best_iteration == 1
    r = StopRules("top1", target_score=0.9)
    assert r.update({"iteration": 1, "top1": 0.5})[1] is None
    assert "target" in r.update({"iteration": 2, "top1": 0.95})[1]
    r = StopRules(min_loss=0.1)
    assert "minimum loss" in r.update({"iteration": 1, "train_loss": 0.05, "valid_loss": None})[1]
    r2 = StopRules("valid_loss", patience=2)
    r2.load_state_dict({"best": -1.0, "best_iteration": 1, "bad": 1})
    assert r2.update({"iteration": 5, "valid_loss": 2.0})[1] is not None


def test_metrics():
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.5, 0.4, 0.1]])
    y = np.array([0, 1, 1])
    assert topk_accuracy(p, y, 1) == pytest.approx(1 / 3)
    assert topk_accuracy(p, y, 2) == pytest.approx(1.0)
    assert topk_accuracy(p, y, 5) == 1.0
    pytest.importorskip("sklearn")
    from sklearn.metrics import f1_score

    yt, yp = np.array([0, 1, 1, 2, 2, 2]), np.array([0, 1, 2, 2, 2, 0])
    assert macro_f1(yt, yp) == pytest.approx(f1_score(yt, yp, average="macro"))


def test_array_stream_split_by_group():
    s = synthetic_stream(40, 2, group_size=4)
    tr, va = s.split_validation(0.25, seed=0)
    assert len(tr) + len(va) == 40 and len(va) > 0
    assert not set(tr.groups) & set(va.groups)
    assert tr.labels == va.labels == s.labels
    with pytest.raises(UserError):
        s.split_validation(1.5)


def test_array_stream_memmap(tmp_path):
    arr = np.arange(4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3)
    np.save(tmp_path / "g.npy", arr)
    s = ArrayStream(np.load(tmp_path / "g.npy", mmap_mode="r"), [0, 1, 0, 1], ["a", "b"], batch_size=3)
    got = np.concatenate([np.stack(b.grams) for b in s.batches()])
    np.testing.assert_array_equal(got, arr)


def test_plot_history(tmp_path):
    hist = [{"epoch": i + 1, "iteration": 10 * (i + 1), "train_loss": 1 / (i + 1), "valid_loss": 1.2 / (i + 1),
             "top1": 0.5 + 0.1 * i, "top5": 1.0, "macro_f1": 0.4 + 0.1 * i} for i in range(4)]
    out = plot_history(hist, tmp_path / "h.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_history([{"epoch": 1, "train_loss": 1.0, "valid_loss": None, "top1": None}], tmp_path / "h2.png")
    with pytest.raises(UserError):
        plot_history([], tmp_path / "h3.png")
    assert not math.isnan(hist[0]["train_loss"])


def test_shuffle_buffer_does_not_pin_whole_grams():
    from wavetrain.stream.batches import Batch
    from wavetrain.train.shuffle import shuffled_windows

    whole = np.zeros((1000, 8), np.float32)
    clips = [whole[i * 10:(i + 1) * 10] for i in range(20)]

    class Clips:
        labels = ["a"]
        feature_dim = 8

        def batches(self, shuffle=False, seed=0):
            yield Batch(clips, np.zeros(len(clips), np.int64))

    out = [g for g, _ in shuffled_windows(Clips(), buffer=8, seed=0, epoch=0)]
    assert len(out) == 20
    buffered = [g for g in out if not any(g is c for c in clips)]
    assert buffered and all(not np.shares_memory(g, whole) for g in buffered)
