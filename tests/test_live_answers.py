"""Live answers (:mod:`wavetrain.pipeline.smoothing`): smoothing is a moving mean of the windows'
scores, hold keeps an answer until a new one has persisted, and the unknown rule in effect comes
from the model file or the family."""
from __future__ import annotations

import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.models.base import Classifier
from wavetrain.pipeline.prediction import Prediction
from wavetrain.pipeline.smoothing import MAX_SMOOTH, AnswerOptions, LiveAnswers, parse_unknown, unknown_rule


class _Probabilities(Classifier):
    """A fitted model of probabilities over ``labels`` (nothing but what the answers read)."""

    name = "stub"

    def __init__(self, labels=("a", "b"), score_kind="probability", detector=False):
        super().__init__()
        self.labels_, self.feature_dim_ = list(labels), 1
        self.score_kind = score_kind    # type: ignore[misc]
        self.detector = detector        # type: ignore[misc]


def _preds(rows, labels=("a", "b"), step=500, kind="probability", details=None, recording=None):
    out = []
    for i, row in enumerate(rows):
        row = np.asarray(row, dtype=np.float64)
        label = labels[int(np.argmax(row))] if kind != "anomaly" else \
            ("anomaly" if row[0] > details[i]["threshold"] else labels[0])
        out.append(Prediction(recording, i * step, i * step + step, label, row, kind, list(labels),
                              dict(details[i]) if details else {}))
    return out


def test_smoothing_is_the_mean_of_the_last_windows():
    rows = [[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [1.0, 0.0], [0.6, 0.4]]
    preds = _preds(rows, details=[{"d": v} for v in (1.0, 2.0, 3.0, 4.0, 5.0)])
    got = list(LiveAnswers(_Probabilities(), AnswerOptions(smooth=3, unknown="off"))(preds))
    # by hand: the mean of the last three windows (of those so far at the start)
    want = [[0.9, 0.1], [0.55, 0.45], [1.4 / 3, 1.6 / 3], [0.5, 0.5], [1.9 / 3, 1.1 / 3]]
    np.testing.assert_allclose([p.scores for p in got], want, rtol=1e-12)
    assert [p.details["d"] for p in got] == pytest.approx([1.0, 1.5, 2.0, 3.0, 4.0])
    assert [p.smoothed for p in got] == [1, 2, 3, 3, 3]
    # the answer is the best smoothed value (a tie: the first); the window's own is kept as raw
    assert [p.label for p in got] == ["a", "a", "b", "a", "a"]
    assert [p.raw.label for p in got] == ["a", "b", "b", "a", "a"]
    np.testing.assert_array_equal(got[1].raw.scores, rows[1])
    row = got[1].to_json("x")
    assert row["scores"] == {"a": 0.55, "b": 0.45} and row["raw"] == {"value": "b", "scores": {"a": 0.2, "b": 0.8}}
    assert row["confidence"] == 0.55 and row["smoothed"] == 2 and row["pending"] is None


def _reference_means(rows: list[np.ndarray], n: int) -> list[np.ndarray]:
    """The mean of the last ``n`` rows, by ``np.mean`` of them (the definition)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return [np.mean(np.stack(rows[max(0, i + 1 - n):i + 1]), axis=0) for i in range(len(rows))]


@pytest.mark.parametrize("smooth", [2, 3, 7, 50, 1000])
def test_smoothing_equals_the_moving_mean_with_nan_and_infinities(smooth):
    """Scores and details of 1,200 windows, among them NaN, infinities and huge values: each
    answer is the mean of the last `smooth` windows to rounding, a NaN or an infinity counts while
    its window is in the window and not after, and a detail a window lacks counts as NaN."""
    rng = np.random.default_rng(smooth)
    n = 1200
    scores = rng.normal(0, 1, (n, 3))
    scores[rng.random((n, 3)) < 0.002] = np.inf
    scores[rng.random((n, 3)) < 0.002] = -np.inf
    scores[rng.random((n, 3)) < 0.002] = np.nan
    scores[rng.random((n, 3)) < 0.002] = 1e300
    z = rng.normal(0, 1, n)
    z[rng.random(n) < 0.003] = np.nan
    details = [{"z": float(z[i])} if i % 97 else {} for i in range(n)]      # some windows lack z
    for i in range(n // 2, n):                                               # a detail that appears later
        details[i]["d"] = float(i)
    preds = [Prediction(None, i * 10, i * 10 + 10, "a", scores[i], "mean_loglik", ["a", "b", "c"], details[i])
             for i in range(n)]
    got = list(LiveAnswers(_Probabilities(labels=("a", "b", "c"), score_kind="mean_loglik"),
                           AnswerOptions(smooth=smooth, unknown="off"))(preds))
    np.testing.assert_allclose([p.scores for p in got], _reference_means(list(scores), smooth), rtol=1e-9,
                               atol=1e-12)
    assert [p.smoothed for p in got] == [min(i + 1, smooth) for i in range(n)]
    want_z = _reference_means([np.array([d.get("z", np.nan)]) for d in details], smooth)
    want_d = _reference_means([np.array([d.get("d", np.nan)]) for d in details], smooth)
    for i, p in enumerate(got):
        assert set(p.details) == set(details[i])
        if "z" in p.details:
            np.testing.assert_allclose(p.details["z"], want_z[i][0], rtol=1e-9, atol=1e-12)
        if "d" in p.details:
            np.testing.assert_allclose(p.details["d"], want_d[i][0], rtol=1e-12)


def test_smoothing_costs_the_same_per_window_whatever_its_length(monkeypatch):
    """The rows of scores the smoothing stacks, averages or sums, counted over 3,000 windows: a
    few per window with smooth=1000 as with smooth=10 (a mean recomputed per window would touch
    all 1,000 each time: 3 million)."""
    import wavetrain.pipeline.smoothing as smoothing

    touched = [0]

    class Counting:
        def __getattr__(self, name):
            real = getattr(np, name)
            if name not in ("stack", "mean", "cumsum", "sum", "add", "concatenate"):
                return real

            def counted(a, *args, **kw):
                touched[0] += len(a) if isinstance(a, (list, tuple)) or getattr(a, "ndim", 0) > 1 else 1
                return real(a, *args, **kw)
            return counted

    monkeypatch.setattr(smoothing, "np", Counting())
    rows = np.random.default_rng(0).random((3000, 2))
    preds = _preds(rows, step=10, details=[{"z": float(v)} for v in rows[:, 0]])
    counts = {}
    for smooth in (10, 1000):
        touched[0] = 0
        list(LiveAnswers(_Probabilities(), AnswerOptions(smooth=smooth, unknown="off"))(preds))
        counts[smooth] = touched[0]
    assert counts[1000] <= 3 * len(preds) and counts[10] <= 3 * len(preds), counts


def test_smooth_is_bounded():
    assert AnswerOptions(smooth=MAX_SMOOTH).smooth == MAX_SMOOTH == 1000
    with pytest.raises(ParameterError, match="smooth=1001: expected windows 1 to 1000"):
        AnswerOptions(smooth=MAX_SMOOTH + 1)


def test_each_recording_is_a_stream_of_its_own():
    first, second = object(), object()
    preds = _preds([[0.9, 0.1], [0.1, 0.9]], recording=first) + _preds([[0.2, 0.8]], recording=second)
    got = list(LiveAnswers(_Probabilities(), AnswerOptions(smooth=2, unknown="off"))(preds))
    np.testing.assert_allclose([p.scores for p in got], [[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]])
    assert [p.smoothed for p in got] == [1, 2, 1] and [p.recording for p in got] == [first, first, second]


def test_hold_suppresses_a_blip_and_reports_a_change_that_persists():
    a, b = [0.9, 0.1], [0.1, 0.9]
    preds = _preds([a, a, a, b, a, a, b, b, b])          # windows start every 500 ms
    got = list(LiveAnswers(_Probabilities(), AnswerOptions(hold_ms=500, unknown="off"))(preds))
    # an answer is reported once windows starting 500 ms apart have given it; until then the one
    # before stands (at the start: undecided)
    assert [p.label for p in got] == ["undecided", "a", "a", "a", "a", "a", "a", "b", "b"]
    assert [p.pending for p in got] == ["a", None, None, "b", None, None, "b", None, None]
    assert [p.raw.label for p in got] == ["a", "a", "a", "b", "a", "a", "b", "b", "b"]
    # the line says the held answer with its probability in this window, and what is pending
    assert got[3].describe("x") == "x=a confidence=0.10 raw=b pending=b"
    # a longer hold needs more windows; none reports a blip
    longer = list(LiveAnswers(_Probabilities(), AnswerOptions(hold_ms=1000, unknown="off"))(preds))
    assert [p.label for p in longer] == ["undecided", "undecided", "a", "a", "a", "a", "a", "a", "b"]


def test_not_decided_yet_is_not_unlike_the_training():
    """Before any answer has held, a classifier's answer is ``undecided``; ``unknown`` (a window
    unlike the training) is an answer like any other, held as long as the others."""
    a, far = [0.9, 0.1], [0.55, 0.45]                     # auto: unknown below a top probability of 0.75
    preds = _preds([far, far, far, a, a, a])
    got = list(LiveAnswers(_Probabilities(), AnswerOptions(hold_ms=1000, unknown="auto"))(preds))
    assert [p.label for p in got] == ["undecided", "undecided", "unknown", "unknown", "unknown", "a"]
    assert [p.pending for p in got] == ["unknown", "unknown", None, "a", "a", None]
    # the window's own answer (raw) is the model's, without the live rule
    assert got[0].describe("x") == "x=undecided confidence=0.55 raw=a pending=unknown"
    assert got[0].to_json("x")["value"] == "undecided" and got[0].to_json("x")["pending"] == "unknown"
    # a detector has no such state: its normal value stands until an alarm has held
    detector = _Probabilities(labels=("normal",), score_kind="anomaly", detector=True)
    alarms = _preds([[5.0], [5.0]], labels=("normal",), kind="anomaly",
                    details=[{"threshold": 2.0}] * 2)
    assert [p.label for p in LiveAnswers(detector, AnswerOptions(hold_ms=500))(alarms)] == ["normal", "anomaly"]


def test_without_smoothing_hold_or_another_rule_predictions_pass_unchanged():
    preds = _preds([[0.9, 0.1], [0.55, 0.45]])
    answers = LiveAnswers(_Probabilities(), AnswerOptions())
    assert not answers.active and list(answers(preds)) == preds
    assert all(p.raw is None and "raw" not in p.to_json("x") for p in preds)


def test_unknown_rules_of_a_probability_model():
    model = _Probabilities()
    preds = _preds([[0.9, 0.1], [0.7, 0.3], [0.6, 0.4]])
    # auto without a trained rule: top probability below half-way between chance (1/2) and 1
    assert unknown_rule(model, "auto")["value"] == 0.75
    assert [p.label for p in LiveAnswers(model, AnswerOptions(unknown="auto"))(preds)] == ["a", "unknown", "unknown"]
    assert [p.label for p in LiveAnswers(model, AnswerOptions(unknown=0.65))(preds)] == ["a", "a", "unknown"]
    # after smoothing: (0.7 + 0.6) / 2 = 0.65 is below 0.75, (0.9 + 0.7) / 2 = 0.8 is not
    smoothed = LiveAnswers(model, AnswerOptions(smooth=2, unknown="auto"))(preds)
    assert [p.label for p in smoothed] == ["a", "a", "unknown"]
    assert [p.label for p in LiveAnswers(model, AnswerOptions(unknown="off"))(preds)] == ["a", "a", "a"]
    with pytest.raises(ParameterError, match="between 0 and 1"):
        LiveAnswers(model, AnswerOptions(unknown=2))


def test_a_trained_rule_wins_under_auto_and_off_drops_it():
    model = _Probabilities()
    model.unknown_rule = lambda: {"rule": "top_below", "value": 0.95}     # type: ignore[method-assign]
    preds = _preds([[0.9, 0.1], [0.99, 0.01]])
    preds[0].label = "unknown"              # what the model answers under its rule
    assert [p.label for p in LiveAnswers(model, AnswerOptions(unknown="auto"))(preds)] == ["unknown", "a"]
    assert [p.label for p in LiveAnswers(model, AnswerOptions(unknown="off"))(preds)] == ["a", "a"]
    assert [p.label for p in LiveAnswers(model, AnswerOptions(unknown=0.5))(preds)] == ["a", "a"]


def test_a_detector_smooths_its_score_and_holds_its_alarm():
    model = _Probabilities(labels=("normal",), score_kind="anomaly", detector=True)
    scores = [[1.0], [5.0], [1.0], [1.0], [4.0], [4.0], [4.0]]
    preds = _preds(scores, labels=("normal",), kind="anomaly", details=[{"threshold": 2.0}] * len(scores))
    assert [p.anomaly for p in preds] == [False, True, False, False, True, True, True]
    held = list(LiveAnswers(model, AnswerOptions(hold_ms=500))(preds))
    assert [p.label for p in held] == ["normal", "normal", "normal", "normal", "normal", "anomaly", "anomaly"]
    assert [p.anomaly for p in held] == [False, False, False, False, False, True, True]
    smoothed = list(LiveAnswers(model, AnswerOptions(smooth=2))(preds))
    assert [p.score for p in smoothed] == [1.0, 3.0, 3.0, 1.0, 2.5, 4.0, 4.0]
    assert [p.anomaly for p in smoothed] == [False, True, True, False, True, True, True]
    assert smoothed[1].to_json("x")["anomaly_score"] == 3.0
    # a detector's answer for unlike sound is anomaly: no unknown level
    assert unknown_rule(model, "auto") is None
    with pytest.raises(ParameterError, match="anomaly detector"):
        LiveAnswers(model, AnswerOptions(unknown=3))


def test_a_family_without_a_live_rule_refuses_a_level():
    model = _Probabilities(score_kind="mean_loglik")
    assert unknown_rule(model, "auto") is None
    with pytest.raises(ParameterError, match="knows no rule"):
        unknown_rule(model, 3.0)


def test_options_are_checked():
    assert parse_unknown("AUTO") == "auto" and parse_unknown("2.5") == 2.5
    for bad in ("sometimes", "0", "-1", "nan", "inf"):
        with pytest.raises(ParameterError, match="expected off, trained, auto or a level"):
            parse_unknown(bad)
    with pytest.raises(ParameterError, match="unknown=x:"):
        parse_unknown("x", option="unknown")
    with pytest.raises(ParameterError, match="smooth=0"):
        AnswerOptions(smooth=0)
    with pytest.raises(ParameterError, match="hold=-1"):
        AnswerOptions(hold_ms=-1)


def test_a_gaussian_mixture_and_its_graph_share_their_rules(demo_csv, tmp_path):
    """gmm's live rule is |z| above 4 (training sd); an exported graph declares the same rule from its
    z output, and the rule the model file was trained with (unknown_sd) from its metadata."""
    pytest.importorskip("onnxruntime")
    from wavetrain.cli.main import main
    from wavetrain.data.demo import machine_sound
    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline.prediction import classify_samples

    rules = {}
    x = np.concatenate([machine_sound("loose", seconds=1.0, rng=np.random.default_rng(1)),
                        np.random.default_rng(2).normal(0, 1e-4, 16000)]).astype(np.float32)
    for name, extra in (("plain", []), ("trained", ["--set", "unknown_sd=2"])):
        wt, graph = tmp_path / f"{name}.wt", tmp_path / f"{name}.onnx"
        assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                     "--clip-ms", "500", *extra, "-o", str(wt)]) == 0
        assert main(["export", "-m", str(wt), "-o", str(graph)]) == 0
        both = [load_model(wt), load_model(graph)]
        rules[name] = [unknown_rule(m, "auto") for m in both]
        answers = [[p.label for p in LiveAnswers(m, AnswerOptions(unknown="auto"))(classify_samples(m, x, 16000))]
                   for m in both]
        assert answers[0] == answers[1] and answers[0][0] == "loose" and answers[0][-1] == "unknown"
    assert rules["plain"][0] == rules["plain"][1] == {
        "rule": "outside", "output": "z", "low": -4.0, "high": 4.0, "level": 4.0,
        "text": "|z| above 4 (more than 4 training sd from the value's training windows)"}
    assert rules["trained"][0]["rule"] == "best_below"
    np.testing.assert_allclose(rules["trained"][1]["floors"], rules["trained"][0]["floors"], rtol=1e-6)
