import numpy as np
import pytest

from wavetrain.models.gmm import GMMClassifier
from wavetrain.models.mixture import (
    FrameKeys,
    KeyedSample,
    LabelEM,
    Stats,
    e_step,
    em_fit,
    frame_loglik,
    gauss_terms,
    kmeans_init,
    m_step,
    responsibilities,
    squared_blocks,
)
from wavetrain.train.array_stream import ArrayStream


def _blobs(seed=0, n_windows=60, frames=40, d=4):
    rng = np.random.default_rng(seed)
    centres = [rng.normal(0, 3, (3, d)) for _ in range(2)]
    grams, y = [], []
    for i in range(n_windows):
        c = i % 2
        comp = rng.integers(0, 3, frames)
        grams.append((centres[c][comp] + rng.normal(0, 0.5, (frames, d))).astype(np.float32))
        y.append(c)
    return grams, y


def test_learns_two_classes_and_confidences_sum_to_one():
    grams, y = _blobs()
    m = GMMClassifier(components=3, features="logmel(bands=4)").fit(ArrayStream(grams, y, ["a", "b"], batch_size=7))
    p = m.predict_proba(grams)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert np.mean(np.array(m.predict(grams)) == np.array(["a", "b"])[y]) == 1.0


def test_streaming_em_matches_sklearn_loglik():
    """On data that fits in memory, each label's final mean log-likelihood is within 1% of
    scikit-learn's GaussianMixture with the same components and covariance type."""
    from sklearn.mixture import GaussianMixture

    grams, y = _blobs(seed=3, n_windows=80, d=6)
    ours = GMMClassifier(components=4, max_iter=300, tol=1e-7, reg=1e-4, features="logmel(bands=6)")
    ours.fit(ArrayStream(grams, y, ["a", "b"], batch_size=5))
    for c in (0, 1):
        x = np.concatenate([g for g, yy in zip(grams, y) if yy == c]).astype(np.float64)
        sk = GaussianMixture(4, covariance_type="diag", reg_covar=1e-4, max_iter=300, tol=1e-7,
                             n_init=3, random_state=0).fit(x)
        ll, _ = frame_loglik(x, ours.weights_[c], ours.means_[c], ours.variances_[c])
        assert abs(ll.mean() - sk.score(x)) <= 0.01 * abs(sk.score(x))


def test_batch_size_does_not_change_the_model():
    grams, y = _blobs(seed=1)
    a = GMMClassifier(components=2, features="logmel(bands=4)").fit(ArrayStream(grams, y, ["a", "b"], batch_size=3))
    b = GMMClassifier(components=2, features="logmel(bands=4)").fit(ArrayStream(grams, y, ["a", "b"], batch_size=60))
    np.testing.assert_allclose(a.means_, b.means_, rtol=1e-9, atol=1e-9)


def test_unknown_threshold():
    grams, y = _blobs(seed=2)
    m = GMMClassifier(components=3, unknown_sd=3.0, features="logmel(bands=4)").fit(ArrayStream(grams, y, ["a", "b"]))
    far = [np.full((30, 4), 50.0, np.float32)]
    assert m.predict(far) == ["unknown"]
    assert m.predict(grams[:4]) == ["a", "b", "a", "b"]


def test_unknown_fpr_is_a_calibrated_unknown_sd():
    from wavetrain.core.errors import ParameterError

    grams, y = _blobs(seed=2)
    data = ArrayStream(grams, y, ["a", "b"])
    a = GMMClassifier(components=3, unknown_fpr=0.05, features="logmel(bands=4)").fit(data)
    b = GMMClassifier(components=3, unknown_sd=1.6448536, features="logmel(bands=4)").fit(data)
    fresh = _blobs(seed=2, n_windows=260)[0][60:]           # the same values, windows unseen in training
    assert a.predict(fresh) == b.predict(fresh) and a.unknown_sd() == pytest.approx(1.6448536, rel=1e-6)
    assert a.predict([np.full((30, 4), 50.0, np.float32)]) == ["unknown"]
    assert 0.0 <= np.mean(np.array(a.predict(fresh)) == "unknown") < 0.2
    with pytest.raises(ParameterError, match="not both"):
        GMMClassifier(unknown_sd=2.0, unknown_fpr=0.05)


def test_frame_loglik_matches_scipy():
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 3))
    w = np.array([0.3, 0.7])
    mu = rng.normal(size=(2, 3))
    var = rng.uniform(0.5, 2, (2, 3))
    ll, resp = frame_loglik(x, w, mu, var)
    ref = np.log(sum(w[k] * multivariate_normal(mu[k], np.diag(var[k])).pdf(x) for k in range(2)))
    np.testing.assert_allclose(ll, ref, rtol=1e-10)
    assert resp.shape == (2, 10)
    np.testing.assert_allclose(resp.sum(0), 1.0)


def test_too_few_frames_for_components_is_a_user_error():
    from wavetrain.core.errors import UserError

    grams = [np.zeros((3, 2), np.float32) + i for i in range(4)]
    with pytest.raises(UserError, match="fewer than components=8"):
        GMMClassifier(features="logmel(bands=2)").fit(ArrayStream(grams, [0, 1, 0, 1], ["a", "b"]))


def test_in_memory_frames_give_the_same_model_as_streaming():
    grams, y = _blobs(seed=4)
    stream = ArrayStream(grams, y, ["a", "b"])
    a = GMMClassifier(components=3, frame_cache_mb=0, features="logmel(bands=4)").fit(stream)
    b = GMMClassifier(components=3, frame_cache_mb=64, features="logmel(bands=4)").fit(stream)
    np.testing.assert_allclose(a.means_, b.means_)
    np.testing.assert_allclose(a.variances_, b.variances_)
    assert len(a.history_) == len(b.history_)


def test_each_label_stops_on_its_own():
    grams, y = _blobs(seed=5)
    m = GMMClassifier(components=3, features="logmel(bands=4)").fit(ArrayStream(grams, y, ["a", "b"]))
    active = [h["active_labels"] for h in m.history_]
    assert active == sorted(active, reverse=True) and active[-1] == 0 and m.converged_


def test_training_score_statistics_use_each_windows_own_label():
    grams, y = _blobs(seed=4)
    m = GMMClassifier(components=3, features="logmel(bands=4)").fit(ArrayStream(grams, y, ["a", "b"], batch_size=7))
    s = m.decision_function(grams)
    y = np.array(y)
    for c in (0, 1):
        own = s[y == c, c]
        np.testing.assert_allclose(m.score_mean_[c], own.mean(), rtol=1e-9)
        np.testing.assert_allclose(m.score_sd_[c], own.std(), rtol=1e-6)


def test_predict_with_proba_is_predict_and_predict_proba_in_one_pass():
    grams, y = _blobs(seed=5)
    m = GMMClassifier(components=3, unknown_sd=3.0, features="logmel(bands=4)").fit(ArrayStream(grams, y, ["a", "b"]))
    windows = grams[:6] + [np.full((30, 4), 50.0, np.float32)]
    names, proba = m.predict_with_proba(windows)
    assert names == m.predict(windows) and names[-1] == "unknown"
    np.testing.assert_array_equal(proba, m.predict_proba(windows))


def test_scores_of_all_labels_at_once_equal_one_label_at_a_time(monkeypatch):
    from wavetrain.models import gmm

    rng = np.random.default_rng(6)
    grams, y = [], []
    for i in range(40):  # five labels, windows of varying length
        grams.append((rng.normal(i % 5, 1.0, (int(rng.integers(5, 60)), 4))).astype(np.float32))
        y.append(i % 5)
    m = GMMClassifier(components=3, features="logmel(bands=4)").fit(ArrayStream(grams, y, list("abcde")))
    one_by_one = np.stack([m._mean_loglik(grams, c) for c in range(5)], axis=1)
    np.testing.assert_allclose(m._loglik(grams), one_by_one, rtol=1e-10)
    monkeypatch.setattr(gmm, "SCORE_BLOCK_BYTES", 1)  # one label per group
    np.testing.assert_allclose(m._loglik(grams), one_by_one, rtol=1e-10)


def _one_label_frames(seed=8, n=3000, d=5, k=4):
    """Frames of overlapping clusters: plain EM converges slowly on them."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1.2, (k, d))
    return (centres[rng.integers(0, k, n)] + rng.normal(0, 1.0, (n, d))).astype(np.float32)


def _fit_one_label(x, **params):
    windows = np.split(x, len(x) // 50)
    extra = [np.random.default_rng(1).normal(5, 1, (50, x.shape[1])).astype(np.float32) for _ in range(4)]
    m = GMMClassifier(features=f"logmel(bands={x.shape[1]})", **params)
    return m.fit(ArrayStream(windows + extra, [0] * len(windows) + [1] * len(extra), ["a", "b"]))



def test_accelerated_em_needs_fewer_passes_for_the_same_fit():
    """SQUAREM between EM passes reaches at least the plain EM log-likelihood in fewer passes;
    both are a local maximum (a further plain EM pass hardly moves them)."""
    x = _one_label_frames()
    plain = _fit_one_label(x, components=4, tol=1e-6, max_iter=2000, accelerate=False)
    fast = _fit_one_label(x, components=4, tol=1e-6, max_iter=2000, accelerate=True)
    assert plain.converged_ and fast.converged_
    assert len(fast.history_) < 0.7 * len(plain.history_)
    curve = [h["mean_loglik"] for h in fast.history_]
    assert all(b >= a - 1e-9 for a, b in zip(curve, curve[1:]))      # rejected points not recorded
    ll = {}
    for name, m in (("plain", plain), ("fast", fast)):
        ll[name], _ = frame_loglik(x, m.weights_[0], m.means_[0], m.variances_[0])
    assert ll["fast"].mean() >= ll["plain"].mean() - 1e-3


def test_rejected_extrapolation_falls_back_to_the_plain_em_step():
    x = _one_label_frames(n=600).astype(np.float64)
    xx = (x, x * x)

    def stats_at(theta):
        ll, resp = responsibilities(xx, *gauss_terms(*theta))
        st = Stats(4, x.shape[1])
        st.add(xx, resp, ll)
        return st

    rng = np.random.default_rng(0)
    theta0 = (np.full(4, 0.25), x[rng.choice(len(x), 4, replace=False)], np.ones((4, x.shape[1])))
    em = LabelEM(theta0, tol=0.0, reg=1e-4, accelerate=True)
    em.step(stats_at(em.theta))                       # at theta0
    st1 = stats_at(em.theta)
    em.step(st1)                                      # at theta1: the extrapolated point is next
    theta2 = em._theta2
    assert em.theta is not theta2 and em.result is theta2  # an unchecked point is never the result
    worse = Stats(4, x.shape[1])                     # the extrapolated point turns out worse
    worse.n[:], worse.s[:] = 1.0, 1.0
    worse.ll, worse.frames = -1e9, len(x)
    em.step(worse)
    assert em.theta is theta2 and em.result is theta2 and not em.done
    assert em._prev == st1.ll / st1.frames            # the next step is judged against theta1's
    assert em.loglik[-1] == em.loglik[-2]             # and the history never records the worse point


def test_kmeans_init_stops_at_a_fixed_point():
    """Early stopping returns a fixed point of Lloyd's algorithm: every frame is assigned to its
    nearest centre and every centre is the mean of its frames (so more steps change nothing)."""
    x = _one_label_frames(n=2000).astype(np.float64)
    centres, labels = kmeans_init(x, 4, np.random.default_rng(3), iters=500)
    nearest = ((x[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(labels, nearest)
    for j in range(4):
        np.testing.assert_allclose(centres[j], x[labels == j].mean(0), rtol=1e-10, atol=1e-12)


def test_empty_windows_leave_training_scores_alike_in_memory_and_streamed():
    grams, y = _blobs(seed=9)
    grams = grams + [np.zeros((0, 4), np.float32)] * 2
    y = y + [0, 1]
    fits = [GMMClassifier(components=2, frame_cache_mb=mb, features="logmel(bands=4)").fit(
            ArrayStream(grams, y, ["a", "b"])) for mb in (0, 64)]
    assert np.all(np.isfinite(fits[0].score_mean_)) and np.all(np.isfinite(fits[0].score_sd_))
    np.testing.assert_allclose(fits[0].score_mean_, fits[1].score_mean_, rtol=1e-9)
    np.testing.assert_allclose(fits[0].score_sd_, fits[1].score_sd_, rtol=1e-6)


# ---- EM as map and reduce ---------------------------------------------------------------------------
def _theta(x, k=4, seed=0):
    rng = np.random.default_rng(seed)
    return (np.full(k, 1.0 / k), x[rng.choice(len(x), k, replace=False)].astype(np.float64),
            np.ones((k, x.shape[1])))


def test_statistics_of_parts_add_up_to_those_of_the_whole():
    x = _one_label_frames(n=5000).astype(np.float64)
    theta = _theta(x)
    whole = e_step(theta, squared_blocks(x))
    for cut in (1, 1234, 2500, 4999):
        parts = e_step(theta, squared_blocks(x[:cut])) + e_step(theta, squared_blocks(x[cut:]))
        np.testing.assert_allclose(parts.n, whole.n, rtol=1e-9)
        np.testing.assert_allclose(parts.s, whole.s, rtol=1e-9)
        assert parts.ll == pytest.approx(whole.ll, rel=1e-9) and parts.frames == whole.frames == 5000
    three = sum(e_step(theta, squared_blocks(p)) for p in np.array_split(x, 3))
    np.testing.assert_allclose(three.s, whole.s, rtol=1e-9)
    np.testing.assert_allclose(m_step(three, 1e-4)[1], m_step(whole, 1e-4)[1], rtol=1e-9)


def test_a_fit_from_per_partition_statistics_equals_the_in_process_fit():
    """EM driven by statistics summed over partitions (as a Spark job would) ends where the
    in-process fit ends."""
    grams, y = _blobs(seed=4, n_windows=80, d=5)
    model = GMMClassifier(components=3, tol=1e-6, max_iter=200, features="logmel(bands=5)")
    model.fit(ArrayStream(grams, y, ["a", "b"]))
    frames = [np.concatenate([g for g, c in zip(grams, y) if c == label]).astype(np.float64) for label in (0, 1)]
    partitions = [[np.array_split(f, 3)[p] for f in frames] for p in range(3)]

    def pass_stats(thetas, active):
        return [sum(e_step(thetas[c], squared_blocks(part[c])) for part in partitions) if active[c] else None
                for c in range(2)]

    # the same initial parameters as the model's: samples of the parts, merged
    keys = FrameKeys(model.params["seed"])
    halves = [model.new_samples(), model.new_samples()]
    for n, (g, c) in enumerate(zip(grams, y)):
        halves[n % 2][c].add(np.asarray(g, dtype=np.float64), keys(n, g.shape[0]))
    thetas = model.initial_thetas([KeyedSample.merge(a, b) for a, b in zip(*halves)])
    ems = em_fit(thetas, pass_stats, tol=1e-6, reg=1e-4, accelerate=True, max_iter=200)
    for c, em in enumerate(ems):
        assert em.done
        np.testing.assert_allclose(em.result[1], model.means_[c], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(em.result[2], model.variances_[c], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(em.result[0], model.weights_[c], rtol=1e-6, atol=1e-9)


def test_merged_samples_sample_both_parts_in_proportion():
    keys = FrameKeys(0)
    a, b = KeyedSample(1000, 1), KeyedSample(1000, 1)
    for i in range(30):                       # three times as many frames seen as b
        a.add(np.zeros((1000, 1)), keys(i, 1000))
    for i in range(30, 40):
        b.add(np.ones((1000, 1)), keys(i, 1000))
    merged = KeyedSample.merge(a, b)
    assert merged.size == 1000 and merged.seen == 40_000
    assert 0.2 < merged.sample().mean() < 0.3        # a quarter of the sample from b
    small = KeyedSample.merge(KeyedSample(1000, 1), b)
    assert small.size == 1000 and small.sample().mean() == 1.0


def test_a_keyed_sample_does_not_depend_on_how_the_frames_were_split_or_ordered():
    rng = np.random.default_rng(1)
    recs = [rng.normal(size=(int(rng.integers(50, 400)), 3)) for _ in range(60)]
    keys = FrameKeys(7)
    whole = KeyedSample(500, 3)
    for i, x in enumerate(recs):
        whole.add(x, keys(i, x.shape[0]))
    parts = [KeyedSample(500, 3) for _ in range(3)]
    for i in rng.permutation(len(recs)):       # another order, three parts, a recording's frames in two pieces
        x, part = recs[i], parts[i % 3]
        part.add(x[:20], keys(int(i), 20))
        part.add(x[20:], keys(int(i), x.shape[0] - 20))
    merged = KeyedSample.merge(KeyedSample.merge(parts[0], parts[1]), parts[2])
    np.testing.assert_array_equal(merged.sample(), whole.sample())
    assert whole.size == 500 and whole.seen == sum(x.shape[0] for x in recs)


def test_a_value_with_one_training_window_saves_and_loads(tmp_path):
    """Its training scores have no spread, so its ``z`` is undefined (NaN): the model file still
    loads and scores (it was once refused as damaged when a probe window chose that value)."""
    from wavetrain.models.modelfile import load_model, save_model

    rng = np.random.default_rng(0)
    grams = [rng.normal(size=(20, 3)), rng.normal(size=(20, 3)), rng.normal(5.0, size=(20, 3))]
    m = GMMClassifier(components=1).fit(ArrayStream(grams, [0, 0, 1], ["a", "b"]))
    assert m.score_sd_[1] == 0.0
    save_model(m, tmp_path / "m.wt")
    again = load_model(tmp_path / "m.wt")
    names, _, details = again.predict_scores([rng.normal(5.0, size=(20, 3))])
    assert names == ["b"] and np.isnan(details["z"][0])
