"""``wavetrain.sklearn``: the scikit-learn estimators on generated machine sounds — accuracy, the
per-recording answers against ``wavetrain classify`` on the same audio, parameters through
``clone``/``GridSearchCV``, the detector's ROC AUC, wrong inputs — and scikit-learn's own
estimator checks."""
from __future__ import annotations

import json
import tempfile

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks
from threadpoolctl import threadpool_info, threadpool_limits

import wavetrain.sklearn.estimators as estimators
from wavetrain import AudioError, ParameterError
from wavetrain.cli.main import main
from wavetrain.data import read_audio, write_audio
from wavetrain.data.demo import machine_sound
from wavetrain.models.modelfile import save_model
from wavetrain.sklearn import InvalidParameterError, SoundAnomalyDetector, SoundClassifier

STATES = ("healthy", "bearing", "loose")


def clips(per_state: int, seed: int, states=STATES, seconds: float = 0.5):
    """``per_state`` half-second machine sounds of each state (random speeds and noise levels) and
    their states."""
    rng = np.random.default_rng(seed)
    X, y = [], []
    for _ in range(per_state):
        for s in states:
            X.append(machine_sound(s, seconds=seconds, shaft_hz=rng.uniform(15, 40), snr_db=rng.uniform(5, 20),
                                   rng=rng))
            y.append(s)
    return X, y


@pytest.fixture(scope="module")
def train():
    return clips(6, seed=0)


@pytest.fixture(scope="module")
def test():
    return clips(6, seed=1)


@pytest.fixture(scope="module")
def fitted(train):
    return SoundClassifier("gmm", components=4).fit(*train)


def classify_json(capsys, model, files) -> dict[str, list[dict]]:
    """``wavetrain classify --json`` of ``files`` with a saved model: each file's windows."""
    assert main(["classify", "-m", str(model), "--json", *map(str, files)]) == 0
    out: dict[str, list[dict]] = {str(f): [] for f in files}
    for line in capsys.readouterr().out.splitlines():
        rec = json.loads(line)
        out[rec["file"]].append(rec)
    return out


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# -- classifier ---------------------------------------------------------------------------------
def test_held_out_clips_are_classified_well_above_chance(fitted, test):
    X, y = test
    assert fitted.score(X, y) >= 0.8                       # chance: 1/3
    assert list(fitted.classes_) == sorted(STATES)


def test_probability_rows_sum_to_one_and_their_argmax_is_the_answer(fitted, test):
    p = fitted.predict_proba(test[0])
    assert p.shape == (len(test[0]), 3)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert (fitted.classes_[p.argmax(axis=1)] == fitted.predict(test[0])).all()


def test_classes_keep_the_labels_type_and_sorted_order(train, test):
    codes = {"loose": 7, "healthy": 0, "bearing": 3}
    clf = SoundClassifier(components=4).fit(train[0], [codes[s] for s in train[1]])
    assert clf.classes_.tolist() == [0, 3, 7] and clf.classes_.dtype.kind == "i"
    pred = clf.predict(test[0])
    assert pred.dtype == clf.classes_.dtype
    assert np.mean(pred == np.array([codes[s] for s in test[1]])) >= 0.8
    assert clf.model_.fitted_labels == sorted(["0", "3", "7"])   # a wavetrain model's values are text


def test_answers_are_those_of_wavetrain_classify_on_the_same_audio(capsys, train, test, tmp_path):
    """Fit on arrays with 250 ms windows; the saved model's ``wavetrain classify`` of the same
    samples as files gives each recording's windows, whose mean probability is predict_proba."""
    clf = SoundClassifier("gmm", components=4, clip_ms=250).fit(*train)
    save_model(clf.model_, tmp_path / "m.wt")
    files = [tmp_path / f"{i}.wav" for i in range(len(test[0]))]
    for f, x in zip(files, test[0]):
        write_audio(f, x, 16000, subtype="FLOAT")
    windows = classify_json(capsys, tmp_path / "m.wt", files)
    assert {len(w) for w in windows.values()} == {2}
    columns = list(windows[str(files[0])][0]["scores"])
    order = [columns.index(c) for c in clf.classes_]
    expected = np.array([softmax(np.array([list(w["scores"].values()) for w in windows[str(f)]])).mean(axis=0)[order]
                         for f in files])
    np.testing.assert_allclose(clf.predict_proba(test[0]), expected, atol=1e-4)
    np.testing.assert_allclose(clf.predict_proba(files), expected, atol=1e-4)


def test_paths_and_arrays_give_the_same_model_and_answers(test, tmp_path, monkeypatch):
    """Files (16-bit) and the samples read from them fit the same model and get the same answers;
    the files are not touched and the arrays' temporary wav files are removed."""
    X, y = clips(4, seed=2)
    files = [tmp_path / f"{s}{i}.wav" for i, s in enumerate(y)]
    for f, x in zip(files, X):
        write_audio(f, x, 16000)
    before = {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in files}
    arrays = [read_audio(f)[0] for f in files]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    by_path = SoundClassifier(components=2).fit([str(f) for f in files], y)
    by_array = SoundClassifier(components=2).fit(arrays, y)
    assert list(scratch.iterdir()) == []
    assert before == {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in files}
    np.testing.assert_allclose(by_path.predict_proba(test[0]), by_array.predict_proba(test[0]), atol=1e-9)
    assert (by_path.predict(files) == by_path.predict(arrays)).all()
    np.testing.assert_allclose(by_path.predict_proba(files), by_path.predict_proba(arrays), atol=1e-9)
    assert not hasattr(by_path, "n_features_in_") and by_array.n_features_in_ == 8000   # arrays of one length


def test_a_2d_array_is_recordings_of_equal_length(train):
    X = np.stack(train[0])
    clf = SoundClassifier(components=4).fit(X, train[1])
    assert clf.n_features_in_ == X.shape[1]
    assert (clf.predict(X) == clf.predict(list(X))).all()
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :4000])                             # a table's columns are checked, as scikit-learn does
    assert clf.predict([X[0][:4000]]).shape == (1,)          # a list may hold recordings of any length


def test_fitting_uses_one_compute_thread(train, monkeypatch):
    seen = []

    def spy(*args, **kwargs):
        seen.extend(p["num_threads"] for p in threadpool_info())
        return train_model(*args, **kwargs)

    train_model = estimators.train_model
    monkeypatch.setattr(estimators, "train_model", spy)
    with threadpool_limits(2):                               # a caller whose numpy runs two threads
        SoundClassifier(components=2).fit(*train)
    assert seen and set(seen) == {1}


# -- parameters ---------------------------------------------------------------------------------
def test_model_parameters_round_trip_through_clone_and_set_params():
    clf = SoundClassifier("gmm", features="mfcc(coeffs=13)", rate=8000, components=3, clip_ms=500)
    assert clf.get_params() == {"model": "gmm", "features": "mfcc(coeffs=13)", "rate": 8000, "label": None,
                                "components": 3, "clip_ms": 500}
    twin = clone(clf)
    assert twin is not clf and twin.get_params() == clf.get_params()
    assert twin.set_params(components=2, rate=16000) is twin
    assert twin.get_params()["components"] == 2 and twin.rate == 16000 and clf.get_params()["components"] == 3
    assert "components=3" in repr(clf)
    with pytest.raises(InvalidParameterError, match=r"gmm\.components: expected an integer in \[1, 1024\], got 0"):
        twin.set_params(components=0, rate=4000)
    assert twin.get_params()["components"] == 2 and twin.rate == 16000          # nothing changed


def test_grid_search_and_cross_validation_reach_the_model():
    """Each grid point's mean score is cross_val_score's of a Pipeline with that parameter (the
    same folds): the parameter reaches the model, which is fitted again for every fold."""
    X, y = clips(8, seed=8)
    search = GridSearchCV(SoundClassifier(), param_grid={"components": [1, 4]}, cv=4).fit(X, y)
    for k, mean in zip(search.cv_results_["param_components"], search.cv_results_["mean_test_score"]):
        scores = cross_val_score(Pipeline([("clf", SoundClassifier(components=k))]), X, y, cv=4)
        assert scores.shape == (4,) and scores.mean() == pytest.approx(mean)
        assert mean >= 0.7                                  # chance: 1/3
    assert search.best_estimator_.model_.params["components"] == search.best_params_["components"]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: SoundClassifier("nope"), "unknown model 'nope'"),
    (lambda: SoundClassifier(componets=4), "gmm: unknown parameter 'componets'"),
    (lambda: SoundClassifier(features="logmel(bandz=4)"), "bandz"),
    (lambda: SoundClassifier(rate=0), "rate=0: expected an integer sample rate in Hz from 1 to 768000"),
    (lambda: SoundClassifier(rate=10**12), "rate=1000000000000: expected an integer sample rate"),
    (lambda: SoundClassifier("anomaly-gmm"), "an anomaly detector; use SoundAnomalyDetector"),
    (lambda: SoundAnomalyDetector("gmm"), "a classifier; use SoundClassifier"),
    (lambda: SoundAnomalyDetector("normal-dist", adapt=10), "keeps learning while it classifies"),
])
def test_wrong_settings_are_refused_when_given(make, message):
    with pytest.raises(InvalidParameterError, match=message) as e:
        make()
    assert isinstance(e.value, ValueError) and isinstance(e.value, ParameterError)
    assert "\n" not in str(e.value)


def test_wrong_inputs_get_one_line_errors(train, tmp_path):
    X, y = train
    clf = SoundClassifier(components=2)
    with pytest.raises(NotFittedError):
        clf.predict(X)
    cases = [
        (([], []), ValueError, "X is empty"),
        ((X, y[:-1]), ValueError, "inconsistent numbers of samples"),
        ((X, None), ValueError, "requires y"),
        ((X, ["healthy"] * len(X)), ValueError, "1 class"),
        ((str(tmp_path / "a.wav"), ["healthy"]), ValueError, "one path"),
        (([str(tmp_path / "a.wav"), X[0]], ["a", "b"]), ValueError, "all recordings as paths or all as arrays"),
        (([X[0], X[1][:0]], ["a", "b"]), ValueError, r"X\[1\]: expected a non-empty 1-D array"),
        (([X[0], np.full(100, np.nan)], ["a", "b"]), ValueError, r"X\[1\]: holds NaN"),
        (([str(tmp_path / "missing.wav"), str(tmp_path / "b.wav")], ["a", "b"]), AudioError,
         "missing.wav: file not found"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message) as e:
            clf.fit(*args)
        assert "\n" not in str(e.value)
    fitted = clf.fit(X, y)
    with pytest.raises(AudioError, match=r"X\[1\]: signal of 3 samples"):
        fitted.predict([X[0], X[1][:3]])


def test_integer_samples_are_pcm_scaled_as_soundfile_reads_them(fitted, test, tmp_path):
    import soundfile as sf

    X, _ = test
    pcm = [np.round(np.clip(x, -1, 1 - 2 ** -15) * 32768).astype(np.int16) for x in X]
    sf.write(tmp_path / "a.wav", pcm[0], 16000, subtype="PCM_16")
    read, _ = sf.read(tmp_path / "a.wav", dtype="float32")
    np.testing.assert_array_equal(estimators._pcm(pcm[0], "X[0]"), read)
    as_float = [sf.read(tmp_path / "a.wav", dtype="float32")[0]] + [p.astype(np.float32) / 32768 for p in pcm[1:]]
    np.testing.assert_allclose(fitted.predict_proba(pcm), fitted.predict_proba(as_float), atol=1e-6)
    np.testing.assert_allclose(fitted.predict_proba(np.stack(pcm)), fitted.predict_proba(np.stack(as_float)),
                               atol=1e-6)
    u8 = np.array([0, 128, 255], np.uint8)
    np.testing.assert_allclose(estimators._pcm(u8, "x"), [-1.0, 0.0, 127 / 128])
    for bad in (np.zeros(800, np.uint16), np.zeros(800, bool), np.zeros(800, np.complex64)):
        with pytest.raises(ValueError, match=r"X\[0\]: (uint16|bool|complex64) samples; expected float samples"):
            fitted.predict([bad])


def test_save_and_load_through_a_model_file(fitted, test, tmp_path, capsys):
    X, _ = test
    path = fitted.save(tmp_path / "clf.wt")
    back = SoundClassifier.load(path)
    np.testing.assert_array_equal(back.predict_proba(X), fitted.predict_proba(X))
    assert back.get_params() == fitted.get_params() and list(back.classes_) == list(fitted.classes_)
    capsys.readouterr()
    assert main(["info", str(path)]) == 0 and "gmm" in capsys.readouterr().out
    ints = SoundClassifier("gmm", components=2).fit(X, [{"healthy": 0, "bearing": 1, "loose": 2}[s]
                                                        for s in test[1]])
    back = SoundClassifier.load(ints.save(tmp_path / "ints.wt"))
    assert back.classes_.dtype == ints.classes_.dtype and list(back.classes_) == [0, 1, 2]
    assert (back.predict(X) == ints.predict(X)).all()
    with pytest.raises(estimators.ModelFileError, match="anomaly detector"):
        det = SoundAnomalyDetector(components=2).fit(X)
        SoundClassifier.load(det.save(tmp_path / "det.wt"))
    back_det = SoundAnomalyDetector.load(tmp_path / "det.wt")
    np.testing.assert_array_equal(back_det.decision_function(X), det.decision_function(X))
    with pytest.raises(NotFittedError):
        SoundClassifier().save(tmp_path / "x.wt")


def test_load_wraps_a_model_file_that_wavetrain_train_wrote(train, test, tmp_path):
    X, y = train
    files = []
    for i, x in enumerate(X):
        files.append(tmp_path / f"{i}.wav")
        write_audio(files[-1], x, 16000, subtype="FLOAT")
    (tmp_path / "metadata.csv").write_text("".join(f"{f.name},state={s}\n" for f, s in zip(files, y)))
    assert main(["train", "--data", str(tmp_path), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "--no-cache", "-o", str(tmp_path / "m.wt")]) == 0
    clf = SoundClassifier.load(tmp_path / "m.wt")
    assert list(clf.classes_) == sorted(STATES) and clf.score(*test) >= 0.8


# -- anomaly detector ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def detector():
    return SoundAnomalyDetector(components=4).fit(clips(12, seed=3, states=("healthy",))[0])


def test_detector_scores_bearing_faults_below_healthy_machines(detector):
    normal = clips(10, seed=4, states=("healthy",))[0]
    faulty = clips(10, seed=5, states=("bearing",))[0]
    d = detector.decision_function(normal + faulty)
    assert roc_auc_score([1] * 10 + [0] * 10, d) > 0.9
    np.testing.assert_allclose(d, detector.score_samples(normal + faulty) - detector.offset_)
    assert (detector.predict(normal + faulty) == np.where(d >= 0, 1, -1)).all()
    assert (detector.predict(faulty) == -1).mean() >= 0.8
    assert detector.offset_ == -detector.model_.threshold_


def test_detector_scores_are_those_of_wavetrain_classify(capsys, detector, tmp_path):
    X = clips(2, seed=6)[0]
    files = [tmp_path / f"{i}.wav" for i in range(len(X))]
    for f, x in zip(files, X):
        write_audio(f, x, 16000, subtype="FLOAT")
    save_model(detector.model_, tmp_path / "d.wt")
    windows = classify_json(capsys, tmp_path / "d.wt", files)
    cli = np.array([np.mean([w["anomaly_score"] for w in windows[str(f)]]) for f in files])
    np.testing.assert_allclose(-detector.score_samples(X), cli, atol=1e-4)
    flags = [any(w["anomaly"] for w in windows[str(f)]) for f in files]     # one window a recording
    assert flags == list(detector.predict(files) == -1)


def test_fit_predict_is_fit_then_predict():
    X = clips(8, seed=7, states=("healthy",))[0]
    det = SoundAnomalyDetector(components=2)
    assert (det.fit_predict(X) == det.predict(X)).all()
    assert set(det.predict(X)) <= {-1, 1}


# -- scikit-learn's checks ----------------------------------------------------------------------
#: Rows of the checks' tables are clips of a few samples: each is one frame of its raw samples
#: (identity(whole=true)), modelled by one Gaussian per class (or of normal rows).
CHECKED = [SoundClassifier("gmm", features="identity(whole=true)", rate=1000, components=1),
           SoundAnomalyDetector("anomaly-gmm", features="identity(whole=true)", rate=1000, components=1)]


def expected_failures(estimator) -> dict[str, str]:
    """The checks that do not apply, as listed in :mod:`wavetrain.sklearn.estimators`."""
    return {"check_do_not_raise_errors_in_init_or_set_params":
            "wavetrain checks parameters when they are given, naming a wrong one at once"}


@parametrize_with_checks(CHECKED, expected_failed_checks=expected_failures)
@pytest.mark.filterwarnings("ignore:.*delay parameter validation until fit:UserWarning")   # (checked when given)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)
