"""scikit-learn estimators over wavetrain models: :class:`SoundClassifier` and
:class:`SoundAnomalyDetector`, for ``Pipeline``, ``GridSearchCV``, ``cross_val_score`` and the
rest of scikit-learn.

``X`` is one of:

* a list (or 1-D array) of audio file paths: each file is one recording, read as ``wavetrain
  train`` and ``wavetrain classify`` read it (``rate`` does not apply: a file has its own);
* a list of 1-D float arrays, each one recording's samples at ``rate`` Hz, of any lengths;
* a 2-D float array whose rows are recordings of equal length at ``rate`` Hz.

Float samples are taken as they are (full scale is 1.0); integer samples of the PCM widths are
scaled as ``soundfile`` reads PCM files: ``int16`` divided by 32768, ``int32`` by 2**31, ``int8``
by 128, ``uint8`` centred on 128 (unsigned 8-bit wav). ``int64`` (no audio format has it: NumPy's
type of Python integers) is taken as numbers; other unsigned types and booleans are refused.

Recordings given as arrays of one length set ``n_features_in_`` (their samples), and a 2-D array
given later must have as many columns, as scikit-learn checks a table; a list may hold
recordings of any length, whatever the model was fitted on.

Fitting is ``wavetrain train``: the recordings become a data set and
:func:`~wavetrain.pipeline.jobs.train_model` fits the model (arrays are first written as 32-bit
float wav files, exactly their samples, into a temporary folder that is removed afterwards; the
user's files are only read). The fitted wavetrain model is ``model_``.

Saving: :meth:`SoundClassifier.save` writes the estimator as a wavetrain model file (``.wt``: the
model plus the estimator's settings and ``classes_``), which ``wavetrain classify``, ``serve`` and
``export`` use as any model file, and :meth:`SoundClassifier.load` reads it back (or any model
file ``wavetrain train`` wrote) as a fitted estimator. A model file holds numbers and JSON only and
is validated as a whole when it is read. Pickling an estimator works too, as for any scikit-learn
estimator, but unpickling runs whatever code the pickle names: never unpickle a file you did not
write yourself. Prediction goes through the same path as ``wavetrain classify``: files through the
model's feature stream, arrays through :func:`~wavetrain.pipeline.prediction.classify_samples`,
cut into the model's windows (``clip_ms=0``, the default of most families: one window per
recording). An estimator answers per recording, combining its windows:

* :meth:`SoundClassifier.predict_proba` is the mean over the recording's windows of the model's
  window probabilities (a ``gmm`` or ``hmm``: the softmax over values of a window's mean frame
  log-likelihoods, as the family's own ``predict_proba``; they rank values, they are not
  calibrated), and ``predict`` its argmax (a ``gmm``'s ``unknown`` rule is not applied: a
  scikit-learn classifier answers one of ``classes_``);
* :meth:`SoundAnomalyDetector.score_samples` is minus the mean of the windows' anomaly scores
  (scikit-learn's convention: larger is more normal), ``decision_function`` that minus
  ``offset_`` (minus the model's threshold: negative is anomalous) and ``predict`` +1 (normal) or
  -1 (anomaly). The threshold was set for windows; on recordings of several windows the mean
  score varies less, so usually fewer normal recordings than ``fpr`` raise a false alarm.

Model parameters are keyword arguments (``SoundClassifier("gmm", components=4)``, the ``--set``
of the command line) and take part in ``get_params``/``set_params``, so ``clone`` and
``GridSearchCV(param_grid={"components": [2, 4]})`` work. The model name, every parameter's name
and value and the feature spec are checked when they are given (``__init__``, ``set_params``):
a bad one raises :class:`InvalidParameterError` (a wavetrain ``ParameterError`` that is also a
``ValueError``) with wavetrain's one-line message, and ``set_params`` then changes nothing.
Fitting and predicting use wavetrain's compute thread default (one; ``WAVETRAIN_THREADS``).

What scikit-learn's check_estimator does not pass, and why
----------------------------------------------------------
``check_do_not_raise_errors_in_init_or_set_params``
    wavetrain checks parameters when they are given, so a wrong one is named at once, not at
    ``fit`` (the check passes nonsense values, and a model parameter named ``params``).
"""
from __future__ import annotations

import json
import numbers
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, OutlierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_consistent_length, check_is_fitted, column_or_1d, validate_data
from threadpoolctl import threadpool_limits

from wavetrain.core.errors import AudioError, ModelFileError, ParameterError, SpecError
from wavetrain.core.signal import MAX_RATE
from wavetrain.core.threads import compute_threads
from wavetrain.data.audio import write_audio
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import Recording
from wavetrain.models.anomaly import AnomalyDetector
from wavetrain.models.base import Classifier, plain_text
from wavetrain.models.modelfile import load_model, read_model_file, save_model
from wavetrain.models.registry import build
from wavetrain.pipeline.jobs import RunOptions, train_model, window_predictions
from wavetrain.pipeline.prediction import Prediction, classify_samples
from wavetrain.stream.windows import Windowing

__all__ = ["LABEL", "InvalidParameterError", "SoundAnomalyDetector", "SoundClassifier"]

#: The label name a :class:`SoundClassifier`'s model learns (what its saved model calls its answers)
#: when neither ``label=`` nor the name of ``y`` (a pandas Series') gives one.
LABEL = "label"
#: Characters a label name never holds (a metadata.csv's ``name=value;...``, ``--where`` lists).
_LABEL_SEPARATORS = frozenset("=;,")


class InvalidParameterError(ParameterError, ValueError):
    """A model name, model parameter, feature spec or rate that wavetrain refuses: a
    :class:`~wavetrain.core.errors.ParameterError` that is also the ``ValueError`` scikit-learn's
    tools expect of a bad parameter."""


def _checked_model(model: Any, features: Any, rate: Any, params: dict[str, Any], *, detector: bool) -> Classifier:
    """The unfitted wavetrain model the settings describe, or :class:`InvalidParameterError`."""
    if not isinstance(model, str) or not model:
        raise InvalidParameterError(f"model={model!r}: expected a model name (`wavetrain models`) or a .toml model "
                                    "spec", param="model")
    if features is not None and not isinstance(features, str):
        raise InvalidParameterError(f"features={features!r}: expected a feature spec such as 'logmel(bands=64)', "
                                    "or None for the model's default", param="features")
    if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or not 0 < int(rate) <= MAX_RATE:
        raise InvalidParameterError(f"rate={rate!r}: expected an integer sample rate in Hz from 1 to {MAX_RATE}",
                                    param="rate")
    try:
        built = build(model, _overrides(features, params))
        built.feature_spec  # noqa: B018 (parses the feature spec)
    except (ParameterError, SpecError) as e:
        raise InvalidParameterError(str(e), param=getattr(e, "param", None)) from None
    if built.detector != detector:
        raise InvalidParameterError(f"model={model!r}: " + ("a classifier; use SoundClassifier" if detector else
                                    "an anomaly detector; use SoundAnomalyDetector"), param="model")
    if built.adapts:
        raise InvalidParameterError(f"{built.name} keeps learning while it classifies (adapt="
                                    f"{built.params.get('adapt')}), which an estimator's predict must not do; "
                                    "use adapt=0", param="adapt")
    return built


def _label_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a label name (a line of text without ``=``, ``;`` or ``,``), or None."""
    if not isinstance(name, str) or not name.strip():
        return "expected a label name such as 'digit'"
    if name != name.strip() or not plain_text(name) or _LABEL_SEPARATORS & set(name):
        return "a label name is one line of text without leading or trailing spaces, '=', ';' or ','"
    return None


def _overrides(features: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """The model parameters handed to the model spec (``--set`` and ``--features``)."""
    return dict(params) if features is None else {**params, "features": features}


def _audio(est: BaseEstimator, X: Any, *, reset: bool) -> tuple[list[Path] | None, list[np.ndarray] | None]:
    """``X`` as file paths or as recordings' samples (float32), checked. ``n_features_in_`` is set
    (``reset``) when every recording is an array of the same length, else dropped, and checked
    for a 2-D array only (a list of arrays may hold recordings of any length)."""
    if isinstance(X, (str, os.PathLike)):
        raise ValueError(f"X is one path ({X}); expected a list of recordings, e.g. [{str(X)!r}]")
    kind = getattr(getattr(X, "dtype", None), "kind", None)
    if (hasattr(X, "shape") or hasattr(X, "__array__")) and not (kind in ("U", "S", "O") and np.ndim(X) == 1):
        if kind is None:
            kind = np.asarray(X).dtype.kind
        if kind in ("i", "u", "b"):
            X = _pcm(np.asarray(X), "X")
        rows = validate_data(est, X, reset=reset, dtype=np.float32)
        return None, list(rows)
    items = list(X)
    if not items:
        raise ValueError("X is empty: expected audio file paths, 1-D arrays of samples or a 2-D array of clips")
    if reset:
        for name in ("n_features_in_", "feature_names_in_"):
            if hasattr(est, name):
                delattr(est, name)
    paths = [isinstance(x, (str, os.PathLike)) for x in items]
    if all(paths):
        return [Path(x) for x in items], None
    if any(paths):
        raise ValueError(f"X[{paths.index(False)}] is not a path while X[{paths.index(True)}] is: give all "
                         "recordings as paths or all as arrays of samples")
    clips = []
    for i, x in enumerate(items):
        a = np.asarray(x)
        a = _pcm(a, f"X[{i}]") if a.dtype.kind in ("i", "u", "b", "c") else a.astype(np.float32)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"X[{i}]: expected a non-empty 1-D array of samples, got shape {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError(f"X[{i}]: holds NaN or infinite samples")
        clips.append(a)
    if reset and len({len(a) for a in clips}) == 1:      # a table of equal rows, as scikit-learn sees a list of lists
        validate_data(est, np.stack(clips), reset=True)
    return None, clips


def _pcm(a: np.ndarray, where: str) -> np.ndarray:
    """Integer PCM samples as float32 in [-1, 1), scaled as soundfile reads PCM files (other
    types, complex ones among them, are refused)."""
    kind, size = a.dtype.kind, a.dtype.itemsize
    if kind == "i" and size == 8:
        return a.astype(np.float32)
    if kind == "i":
        return (a.astype(np.float64) / float(1 << (8 * size - 1))).astype(np.float32)
    if kind == "u" and size == 1:
        return ((a.astype(np.float32) - 128.0) / 128.0).astype(np.float32)
    raise ValueError(f"{where}: {a.dtype} samples; expected float samples (full scale 1.0) or signed integer PCM "
                     "(int16, int32) or unsigned 8-bit PCM")


class _SoundEstimator(BaseEstimator):
    """What both estimators share: the settings (model parameters among them), fitting through
    the pipeline and the windows' predictions of each recording."""

    _detector = False
    #: Constructor arguments that are not model parameters.
    _settings: tuple[str, ...] = ("model", "features", "rate")

    def _keep(self, model: Any, features: Any, rate: Any, params: dict[str, Any], **more: Any) -> None:
        """Check and keep the settings (``more``: the estimator's own beyond model, features and
        rate, e.g. a classifier's ``label``) and model parameters."""
        _checked_model(model, features, rate, params, detector=self._detector)
        label = more.get("label")
        if label is not None and _label_problem(label):
            raise InvalidParameterError(f"label={label!r}: {_label_problem(label)}", param="label")
        self.model, self.features, self.rate = model, features, rate
        for k in self._settings[3:]:
            setattr(self, k, more.get(k))
        self._params = dict(params)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The settings (``model``, ``features``, ``rate``; a classifier's ``label``) and the model
        parameters given."""
        return {**{k: getattr(self, k) for k in self._settings}, **self._params}

    def set_params(self, **params: Any) -> _SoundEstimator:
        """Change settings and model parameters (checked together first: on an error nothing
        changes); returns the estimator."""
        own = {k: params.get(k, getattr(self, k)) for k in self._settings}
        model_params = {**self._params, **{k: v for k, v in params.items() if k not in self._settings}}
        self._keep(params=model_params, **own)
        return self

    def _fit_model(self, paths: list[Path] | None, clips: list[np.ndarray] | None,
                   values: list[str] | None, label: str = LABEL) -> Classifier:
        """``wavetrain train`` on the recordings (``values``: each one's value of ``label``; None
        for a detector, which learns them all as normal)."""
        with tempfile.TemporaryDirectory(prefix="wavetrain-sklearn-") as tmp:
            if paths is None:
                assert clips is not None
                paths = [Path(tmp) / f"{i:06d}.wav" for i in range(len(clips))]
                for p, x in zip(paths, clips):
                    write_audio(p, x, int(self.rate), subtype="FLOAT")
            labels = [{} for _ in paths] if values is None else [{label: v} for v in values]
            ds = Dataset([Recording(p, lab) for p, lab in zip(paths, labels)], Path(tmp)).check()
            with threadpool_limits(compute_threads()):
                model, _ = train_model(ds, None if values is None else label, self.model,
                                       _overrides(self.features, self._params), RunOptions())
        return model

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fitted estimator as a wavetrain model file (``.wt``): the model, the
        estimator's settings and its ``classes_``; :meth:`load` reads it back, and ``wavetrain
        classify``, ``serve`` and ``export`` use it as any model file. Returns the path.

        Raises
        ------
        NotFittedError
            Before :meth:`fit`.
        ValueError
            Settings or classes that a model file cannot hold (values that are not numbers,
            text or booleans).
        """
        check_is_fitted(self, "model_")
        own: dict[str, Any] = {"estimator": type(self).__name__, "model": self.model, "features": self.features,
                               "rate": int(self.rate), "params": self._params,
                               **{k: getattr(self, k) for k in self._settings[3:]}}
        classes = getattr(self, "classes_", None)
        if classes is not None and classes.dtype.kind == "O" and all(isinstance(c, str) for c in classes):
            classes = classes.astype(str)       # (text classes of a pandas Series: stored as text)
        if classes is not None:
            if classes.dtype.kind not in "biufU":
                raise ValueError(f"classes_ of dtype {classes.dtype}: a model file holds classes that are numbers, "
                                 "text or booleans")
            own["classes"], own["classes_dtype"] = classes.tolist(), classes.dtype.str
        if hasattr(self, "n_features_in_"):
            own["n_features_in"] = int(self.n_features_in_)
        try:
            json.dumps(own, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"the estimator's settings cannot be written to a model file ({e})") from None
        return save_model(self.model_, path, extra={"sklearn": own})

    @classmethod
    def load(cls, path: str | os.PathLike):
        """A fitted estimator from a model file that :meth:`save` (or ``wavetrain train``) wrote.

        Raises
        ------
        ModelFileError
            Not a valid model file, or one of the other kind (a detector for a classifier).
        """
        meta, _ = read_model_file(path)
        model = load_model(path)
        if model.detector != cls._detector:
            kind = "an anomaly detector" if model.detector else "a classifier"
            raise ModelFileError(f"{path}: holds {kind} ({model.name}); load it with "
                                 f"{'SoundAnomalyDetector' if model.detector else 'SoundClassifier'}")
        stored = meta.get("sklearn")
        own: dict[str, Any] = stored if isinstance(stored, dict) else {}
        rate = own.get("rate", model.feature_rate_ or 16000)
        est = cls.__new__(cls)
        try:
            est._keep(own.get("model", model.name), own.get("features"), rate, dict(own.get("params", {})),
                      **{k: own.get(k) for k in cls._settings[3:]})
        except InvalidParameterError:       # settings the model file was not written with: the model's own
            est._keep(model.name, None, model.feature_rate_ or 16000, {})
        est.model_ = model
        if "n_features_in" in own:
            est.n_features_in_ = int(own["n_features_in"])
        if model.detector:
            est.offset_ = -float(model.threshold_)  # type: ignore[attr-defined]  # (a detector's)
        else:
            try:
                classes = np.array(own["classes"], dtype=np.dtype(own["classes_dtype"])) if "classes" in own \
                    else np.array(sorted(model.fitted_labels))
            except (TypeError, ValueError):
                raise ModelFileError(f"{path}: its classes_ cannot be read back") from None
            if sorted(str(c) for c in classes) != sorted(model.fitted_labels):
                raise ModelFileError(f"{path}: its classes_ ({', '.join(map(str, classes))}) are not the model's "
                                     f"label values ({', '.join(model.fitted_labels)})")
            est.classes_ = classes
            est.label_ = model.label_name_ or LABEL
        return est

    def _windows(self, X: Any) -> list[list[Prediction]]:
        """Each recording's window predictions, as ``wavetrain classify`` gives them."""
        check_is_fitted(self, "model_")
        paths, clips = _audio(self, X, reset=False)
        model = self.model_
        with threadpool_limits(compute_threads()):
            if paths is not None:
                ds = Dataset([Recording(p) for p in paths], Path(".")).check()
                out: dict[int, list[Prediction]] = {id(r): [] for r in ds}
                preds, _ = window_predictions(model, ds, RunOptions())
                for p in preds:
                    out[id(p.recording)].append(p)
                windows = [out[id(r)] for r in ds]
            else:
                assert clips is not None
                windows = []
                for i, x in enumerate(clips):
                    try:
                        windows.append(classify_samples(model, x, int(self.rate)))
                    except (AudioError, ParameterError) as e:      # samples the model cannot score
                        raise type(e)(f"X[{i}]: {e}") from None
        for i, w in enumerate(windows):
            if not w:
                clip = Windowing.from_params(model.params).clip_ms
                raise ValueError(f"X[{i}]: no window to score: shorter than the model's {clip} ms clip, and pad=none")
        return windows


class SoundClassifier(ClassifierMixin, _SoundEstimator):
    """A wavetrain classifier as a scikit-learn classifier (see the module's notes).

    Parameters
    ----------
    model : str, default="gmm"
        A model family or preset (``wavetrain models``), or a TOML model spec; a classifier.
    features : str or None, default=None
        A feature spec (``wavetrain features --help``); None: the model's default.
    rate : int, default=16000
        Sample rate in Hz of recordings given as arrays.
    label : str or None, default=None
        The name of what ``y`` holds (``"digit"``): the label the saved model answers with
        (``wavetrain classify`` prints ``digit=3``). None: the name of ``y`` when it is a pandas
        Series with a text name, else ``"label"``.
    **params
        Model parameters (``components=4``, ``clip_ms=500``; ``wavetrain models NAME`` lists them).

    Attributes
    ----------
    classes_ : ndarray
        The label values, sorted (as ``np.unique(y)``), of ``y``'s type.
    label_ : str
        The label name the model learnt (``label``, the name of ``y`` or ``"label"``).
    model_ : wavetrain.models.base.Classifier
        The fitted wavetrain model; its label values are ``str`` of ``classes_``.
    n_features_in_ : int
        Samples per recording, when fitted on arrays of one length.

    Examples
    --------
    >>> from wavetrain.sklearn import SoundClassifier
    >>> clf = SoundClassifier("gmm", components=4).fit(paths, states)       # doctest: +SKIP
    >>> clf.predict(["new.wav"])                                            # doctest: +SKIP
    """

    _settings = ("model", "features", "rate", "label")

    def __init__(self, model: str = "gmm", features: str | None = None, rate: int = 16000, label: str | None = None,
                 **params: Any):
        self._keep(model, features, rate, params, label=label)

    def fit(self, X: Any, y: Any) -> SoundClassifier:
        """Fit the model on the recordings ``X`` labelled ``y`` (one value per recording; the
        label's name is ``label``, else the name of ``y`` when it is a pandas Series named with
        text, else ``"label"``)."""
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        label = self._label_of(y)
        paths, clips = _audio(self, X, reset=True)
        y = column_or_1d(y, warn=True)
        check_consistent_length(paths or clips, y)
        check_classification_targets(y)
        classes = np.unique(y)
        names = [str(c) for c in classes]
        if len(set(names)) < len(names) or "" in names:
            raise ValueError(f"y: the label values {', '.join(map(repr, classes))} must have distinct, non-empty "
                             "text forms (a wavetrain model's label values are text)")
        model = _checked_model(self.model, self.features, self.rate, self._params, detector=False)
        if len(classes) < model.min_labels:
            raise ValueError(f"y has {len(classes)} class(es) ({', '.join(names)}); {model.name} needs at least "
                             f"{model.min_labels} classes")
        self.model_ = self._fit_model(paths, clips, [str(v) for v in y], label)
        self.classes_ = classes
        self.label_ = label
        return self

    def _label_of(self, y: Any) -> str:
        """The label name to learn: ``label``, else the text name of ``y`` (a pandas Series'),
        else :data:`LABEL`."""
        if self.label is not None:
            return self.label
        name = getattr(y, "name", None) if hasattr(y, "to_numpy") else None
        if not isinstance(name, str):       # (a Series without a name, or one named by a column number)
            return LABEL
        problem = _label_problem(name)
        if problem:
            raise ValueError(f"y is named {name!r}, which cannot be a label name ({problem}); pass label='...' "
                             "or rename y")
        return name

    def predict_proba(self, X: Any) -> np.ndarray:
        """``(recordings, classes)``: per recording the mean of its windows' probabilities
        (columns in ``classes_`` order)."""
        windows = self._windows(X)
        columns = [self.model_.fitted_labels.index(str(c)) for c in self.classes_]
        return np.array([_probabilities(w).mean(axis=0)[columns] for w in windows])

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of each recording (argmax of :meth:`predict_proba`)."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]


def _probabilities(windows: list[Prediction]) -> np.ndarray:
    """The windows' probabilities ``(windows, values)``: their scores, or for mean frame
    log-likelihoods their softmax over values (as a ``gmm``'s or ``hmm``'s ``predict_proba``)."""
    s = np.array([p.scores for p in windows], dtype=np.float64)
    if windows[0].score_kind == "mean_loglik":
        e = np.exp(s - s.max(axis=1, keepdims=True))
        s = e / e.sum(axis=1, keepdims=True)
    return s


class SoundAnomalyDetector(OutlierMixin, _SoundEstimator):
    """A wavetrain anomaly detector as a scikit-learn outlier detector (see the module's notes).

    Parameters
    ----------
    model : str, default="anomaly-gmm"
        An anomaly detector family (``wavetrain models``) or a TOML model spec of one.
    features, rate, **params
        As :class:`SoundClassifier`'s (e.g. ``fpr=0.05``: the false-alarm rate the threshold is
        set for).

    Attributes
    ----------
    model_ : wavetrain.models.anomaly.AnomalyDetector
        The fitted wavetrain detector.
    offset_ : float
        Minus the model's threshold: ``decision_function = score_samples - offset_``.
    n_features_in_ : int
        Samples per recording, when fitted on arrays of one length.
    """

    _detector = True

    def __init__(self, model: str = "anomaly-gmm", features: str | None = None, rate: int = 16000, **params: Any):
        self._keep(model, features, rate, params)

    def fit(self, X: Any, y: Any = None) -> SoundAnomalyDetector:
        """Learn normal sound from the recordings ``X`` (all taken as normal; ``y`` is ignored)."""
        paths, clips = _audio(self, X, reset=True)
        _checked_model(self.model, self.features, self.rate, self._params, detector=True)
        model = self._fit_model(paths, clips, None)
        assert isinstance(model, AnomalyDetector)
        self.model_ = model
        self.offset_ = -float(model.threshold_)
        return self

    def score_samples(self, X: Any) -> np.ndarray:
        """Minus the mean anomaly score of each recording's windows: larger is more normal."""
        return -np.array([np.mean([p.scores[0] for p in w]) for w in self._windows(X)], dtype=np.float64)

    def decision_function(self, X: Any) -> np.ndarray:
        """``score_samples - offset_``: negative for recordings scoring above the model's threshold."""
        return self.score_samples(X) - self.offset_

    def predict(self, X: Any) -> np.ndarray:
        """+1 for a normal recording, -1 for an anomalous one (``decision_function < 0``)."""
        return np.where(self.decision_function(X) >= 0, 1, -1)
