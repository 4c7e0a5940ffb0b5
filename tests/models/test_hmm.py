"""``hmm``: hmmlearn as the oracle (a sequence's forward and Viterbi log-likelihoods, one
Baum-Welch step), and what a model of time tells apart that a bag of frames cannot."""
from __future__ import annotations

import numpy as np
import pytest

from wavetrain.models import build
from wavetrain.models.hmm import HMMParams, HMMStats, _accumulate, _emissions, _forward_block, _lse, _transitions
from wavetrain.train.array_stream import ArrayStream

hmm = pytest.importorskip("hmmlearn.hmm")


def _random_model(rng, s: int, m: int, d: int, skip: bool):
    w = rng.dirichlet(np.ones(m), size=s)
    mu = rng.normal(size=(s, m, d))
    var = rng.uniform(0.5, 2.0, size=(s, m, d))
    a = _transitions(s, 0.7, skip)
    ref = hmm.GMMHMM(n_components=s, n_mix=m, covariance_type="diag", init_params="", params="tmcw", n_iter=1,
                     implementation="log")
    ref.startprob_, ref.transmat_, ref.weights_, ref.means_, ref.covars_ = np.eye(1, s)[0], a, w, mu, var
    with np.errstate(divide="ignore"):
        ours = HMMParams(np.log(np.eye(1, s)[0]), np.log(a), w, mu, var)
    return ref, ours


@pytest.mark.parametrize("s,m,skip", [(4, 2, True), (5, 1, False), (3, 3, False)])
def test_log_likelihoods_equal_hmmlearn(s, m, skip):
    rng = np.random.default_rng(s * 10 + m)
    ref, p = _random_model(rng, s, m, 3, skip)
    for t in (1, 7, 60):
        x = rng.normal(size=(t, 3))
        lb, _ = _emissions(x, p.weights, p.means, p.variances)
        with np.errstate(divide="ignore"):
            forward = _lse(_forward_block(lb[None, :, None], p.log_start[None], p.log_trans[None], None, False), -1)
            best = np.max(_forward_block(lb[None, :, None], p.log_start[None], p.log_trans[None], None, True), -1)
        assert forward[0, 0] == pytest.approx(ref.score(x), rel=1e-10)
        assert best[0, 0] == pytest.approx(ref.decode(x, algorithm="viterbi")[0], rel=1e-10)


def test_one_baum_welch_step_equals_hmmlearn():
    """Weights, means and transitions as hmmlearn's step; hmmlearn centres the new variances on
    the previous means (``sum g (x - mu_old)^2 / sum g``), this family on the new ones, so they
    differ by exactly ``(mu_new - mu_old)^2``."""
    rng = np.random.default_rng(3)
    s, m, d = 4, 2, 3
    ref, p = _random_model(rng, s, m, d, True)
    xs = [rng.normal(size=(t, d)) for t in (30, 45, 12)]
    st = HMMStats(1, s, m, d)
    with np.errstate(divide="ignore"):
        _accumulate(st, [(x, 0) for x in xs], [p])
    model = build("hmm", {"states": s, "mixtures": m, "skip": True, "reg": 0.0})
    model.labels_, model.feature_dim_ = ["a"], d
    new = model._m_step(st, [p])[0]
    ref.fit(np.concatenate(xs), lengths=[x.shape[0] for x in xs])
    np.testing.assert_allclose(np.exp(new.log_trans), ref.transmat_, atol=1e-12)
    np.testing.assert_allclose(new.weights, ref.weights_, atol=1e-12)
    np.testing.assert_allclose(new.means, ref.means_, atol=1e-12)
    np.testing.assert_allclose(new.variances, ref.covars_ - (new.means - p.means) ** 2, atol=1e-12)
    assert st.loglik[0] == pytest.approx(sum(_score(ref, p, x) for x in xs), rel=1e-10)


def _score(ref, p, x):
    lb, _ = _emissions(x, p.weights, p.means, p.variances)
    with np.errstate(divide="ignore"):
        alpha = _forward_block(lb[None, :, None], p.log_start[None], p.log_trans[None], None, False)
    return float(_lse(alpha, -1)[0, 0])


def _sequences(rng, order: tuple[int, ...], n: int) -> list[np.ndarray]:
    """Windows whose frames visit the means in ``order`` (a few frames each, noisy)."""
    centres = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    out = []
    for _ in range(n):
        parts = [centres[c] + 0.5 * rng.standard_normal((int(rng.integers(8, 14)), 2)) for c in order]
        out.append(np.concatenate(parts).astype(np.float32))
    return out


def test_order_in_time_is_what_it_learns():
    """Two values made of the same frames in opposite order: a GMM (a bag of frames) cannot tell
    them apart; the HMM answers every held-out window right."""
    rng = np.random.default_rng(0)
    train = _sequences(rng, (0, 1, 2), 30) + _sequences(rng, (2, 1, 0), 30)
    test = _sequences(rng, (0, 1, 2), 20) + _sequences(rng, (2, 1, 0), 20)
    y = [0] * 30 + [1] * 30
    truth = ["up"] * 20 + ["down"] * 20
    stream = ArrayStream(train, y, ["up", "down"], batch_size=16)
    h = build("hmm", {"states": 3, "mixtures": 1}).fit(stream)
    assert h.predict(test) == truth
    assert h.history_[-1]["mean_loglik"] > h.history_[0]["mean_loglik"]
    viterbi = build("hmm", {"states": 3, "mixtures": 1, "score": "viterbi"}).fit(stream)
    assert viterbi.predict(test) == truth
    g = build("gmm", {"components": 3}).fit(stream)
    assert np.mean(np.array(g.predict(test)) == np.array(truth)) < 0.8


def test_long_windows_are_scored_in_blocks(monkeypatch):
    """A window longer than the emission block gives the score it gives in one piece."""
    import wavetrain.models.hmm as mod

    rng = np.random.default_rng(1)
    train = _sequences(rng, (0, 1, 2), 12) + _sequences(rng, (2, 1, 0), 12)
    h = build("hmm", {"states": 3, "mixtures": 2}).fit(ArrayStream(train, [0] * 12 + [1] * 12, ["up", "down"]))
    long = [np.concatenate(_sequences(rng, (0, 1, 2), 8))]
    whole = h.decision_function(long)
    monkeypatch.setattr(mod, "EMISSION_BLOCK", 7)
    np.testing.assert_allclose(h.decision_function(long), whole, rtol=1e-12)
