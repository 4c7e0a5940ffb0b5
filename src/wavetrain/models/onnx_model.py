"""An exported graph (``.onnx``, from ``wavetrain export``) loaded as a model that scores samples
through onnxruntime: ``classify -m model.onnx`` and ``serve -m model.onnx`` check the deployed
artefact with the commands that check the ``.wt`` file.

It answers as the model it was exported from: the same labels, score kind, windows, unknown rule
and detector threshold, read from the graph's metadata (:mod:`wavetrain.models.onnx_export`). Its
windows are clips of samples (:attr:`~wavetrain.models.base.Classifier.scores_samples`), cut as a
live stream's; the graph computes their features.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from wavetrain.core.errors import AudioError, ModelFileError, ParameterError
from wavetrain.models.anomaly import ANOMALY
from wavetrain.models.base import Classifier, is_unknown
from wavetrain.models.gmm import z_rule

__all__ = ["OnnxModel", "load_onnx"]

#: Metadata properties an exported graph must carry.
_REQUIRED = ("labels", "rate", "clip_ms", "clip_shift_ms", "pad", "frames", "min_samples", "score_kind",
             "features", "family")
UNKNOWN = "unknown"


class OnnxModel(Classifier):
    """A model exported to ONNX, scored by onnxruntime on one thread (see the module notes).

    Attributes
    ----------
    meta_ : dict
        The graph's metadata properties (strings), as exported.
    threshold_ : float
        A detector's threshold (NaN for a classifier).
    """

    scores_samples: ClassVar[bool] = True

    def __init__(self, path: str | os.PathLike, session: Any, meta: dict[str, str]):
        try:
            spec = meta["features"]
            self.score_kind = meta["score_kind"]  # type: ignore[misc]  # (per instance: the exported model's)
            self.params = {"features": spec, "clip_ms": int(meta["clip_ms"]),
                           "clip_shift_ms": int(meta["clip_shift_ms"]), "pad": meta["pad"], "augment": ""}
            labels = json.loads(meta["labels"])
            rate, self.min_samples_ = int(meta["rate"]), int(meta["min_samples"])
            self.details_ = list(json.loads(meta.get("outputs", "[]")))
            self.unknown_ = json.loads(meta["unknown"]) if meta.get("unknown") else None
            self.threshold_ = float(meta.get("threshold", "nan"))
            self.feature_dim_ = self.feature_spec.feature_dim(rate)
        except (KeyError, ValueError, TypeError) as e:
            raise ModelFileError(f"{path}: not a graph exported by wavetrain export ({type(e).__name__}: {e}); "
                                 "export the .wt model again") from None
        self.name = f"{meta['family']} (onnx)"  # type: ignore[misc]
        self.detector = self.score_kind == "anomaly"  # type: ignore[misc]
        self.labels_ = [str(v) for v in labels]
        self.label_name_ = meta.get("label_name") or "label"
        self.feature_rate_, self.channels_ = rate, None
        self.history_, self.train_info_ = [], {}
        self.meta_ = dict(meta)
        self.path = str(path)
        self.session = session

    # -- scoring ----------------------------------------------------------------------------------
    def check_clip(self, clip_ms: int) -> None:
        """Refuse windows other than the model's own for a model trained on clips: the graph
        completes a short clip to the model's window, not to another."""
        own = int(self.meta_["clip_ms"]) if self.meta_ else 0
        if own and clip_ms != own:
            raise ParameterError(f"{self.path}: the graph scores windows of the model's {own} ms (clips are completed "
                                 f"to it); {clip_ms} ms windows need the .wt model", param="clip_ms")

    def score_clips(self, clips: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """What :meth:`predict_scores` gives for windows of features, for clips of samples at the
        model's rate: values, scores ``(n, labels)`` and details ``{name: (n,)}``."""
        names: list[str] = []
        rows: list[np.ndarray] = []
        details: dict[str, list[float]] = {k: [] for k in self.details_}
        outputs = ["scores", "best", *self.details_]
        for x in clips:
            x = np.ascontiguousarray(x, dtype=np.float32)
            if x.shape[0] < self.min_samples_:
                raise AudioError(f"a clip of {x.shape[0]} samples is shorter than one feature sub-window of "
                                 f"{self.min_samples_} samples at {self.feature_rate_} Hz")
            res = self.session.run(outputs, {"audio": x})
            values = {k: v[0] for k, v in zip(self.details_, res[2:])}
            for k, v in values.items():
                details[k].append(float(v))
            rows.append(np.asarray(res[0], np.float64))
            names.append(self._answer(res[0], int(res[1][0]), values))
        if self.detector:
            details["threshold"] = [self.threshold_] * len(rows)
        width = 1 if self.detector else len(self.fitted_labels)
        return (names, np.array(rows).reshape(len(rows), width),
                {k: np.asarray(v, dtype=np.float64) for k, v in details.items()})

    def _answer(self, scores: np.ndarray, best: int, details: dict[str, np.float32]) -> str:
        """The value answered from the graph's float32 outputs, each rule compared in float32 (a
        score equal to a threshold in float64 stays equal to it after rounding)."""
        f32 = np.float32
        if self.detector:
            return ANOMALY if scores[0] > f32(self.threshold_) else self.fitted_labels[0]
        if self.unknown_ and is_unknown(self.unknown_, scores, best, details, dtype=f32):
            return UNKNOWN
        return self.fitted_labels[best]

    def unknown_rule(self) -> dict[str, Any] | None:
        """The rule the exported model was trained with (the graph's ``unknown`` metadata), or None."""
        return self.unknown_

    def live_unknown_rule(self, level: float | None = None) -> dict[str, Any] | None:
        """As the exported family's: by its top probability (probabilities), or by its ``z``
        output (a Gaussian mixture's), else none."""
        if self.score_kind == "mean_loglik" and "z" in self.details_:
            return z_rule(self.name, level)
        return super().live_unknown_rule(level)

    def predict_scores(self, grams):
        raise ParameterError(f"{self.path}: an exported graph computes its own features from samples; give it "
                             "audio (classify, serve), not feature windows")

    def __repr__(self) -> str:
        return f"OnnxModel({self.path!r}, family={self.meta_['family'] if self.meta_ else '?'})"


def load_onnx(path: str | os.PathLike) -> OnnxModel:
    """Load an exported graph for scoring (onnxruntime, one thread).

    Raises
    ------
    ModelFileError
        onnxruntime is missing, or the file is not a graph exported by ``wavetrain export``.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        raise ModelFileError(f"{path}: an .onnx model needs onnxruntime: pip install 'wavetrain[export]'") from None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(os.fspath(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types for unreadable graphs
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelFileError(f"{path}: not a readable ONNX graph ({first[:200]})") from None
    meta = dict(session.get_modelmeta().custom_metadata_map)
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise ModelFileError(f"{path}: an ONNX graph without wavetrain's metadata ({', '.join(missing)} missing); "
                             "classify and serve run graphs made by wavetrain export")
    return OnnxModel(path, session, meta)
