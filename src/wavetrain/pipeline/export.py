"""``wavetrain export``: write a fitted model as one ONNX graph (:mod:`wavetrain.models.onnx_export`)
and, on recordings given to check it, compare the graph's answers with the model's.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.outputs import refuse_inputs, write_atomic
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import file_sha256
from wavetrain.models.anomaly import ANOMALY
from wavetrain.models.base import Classifier
from wavetrain.models.onnx_export import QUANTIZE, model_graph, quantize_int8
from wavetrain.pipeline.prediction import Prediction, predict_recordings

__all__ = ["Agreement", "ExportReport", "compare_models", "export_model", "need_export_packages"]


def need_export_packages() -> None:
    """Refuse, in one line, when the ``export`` extra (onnx, onnxruntime) is not installed."""
    import importlib.util

    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"export needs {' and '.join(missing)}: pip install 'wavetrain[export]'")


@dataclass
class ExportReport:
    """What was written: the graph's size (and the float graph's, when quantised) and outputs."""

    path: Path
    bytes: int
    outputs: list[str]
    float_bytes: int | None = None


def export_model(model: Classifier, model_path: str | os.PathLike, out: str | os.PathLike, *, opset: int,
                 quantize: str | None = None) -> ExportReport:
    """Write ``model`` (loaded from ``model_path``) to ``out`` as one ONNX graph, atomically.

    Parameters
    ----------
    quantize : {'int8'}, optional
        Dynamic int8 quantisation of the network's weights.
    """
    if model.scores_samples:
        raise UserError(f"{model_path}: is an exported graph already; export the .wt model it came from")
    refuse_inputs([out], [model_path], option="", files=True)
    if quantize is not None and quantize not in QUANTIZE:
        raise ParameterError(f"--quantize {quantize}: expected {', '.join(QUANTIZE)}", param="quantize")
    result = model_graph(model, opset=opset, sha256=file_sha256(model_path))
    proto = quantize_int8(result.model) if quantize else result.model
    data = proto.SerializeToString()
    write_atomic(out, lambda f: f.write(data), what="ONNX graph")
    report = ExportReport(Path(out), len(data), result.outputs)
    if quantize:
        report.float_bytes = result.model.ByteSize()
    return report


@dataclass
class Agreement:
    """How an exported graph's answers compare with another model's on the same windows."""

    windows: int = 0
    same_label: int = 0
    max_rel_diff: float = 0.0
    right: dict[str, int] = field(default_factory=dict)     # per model: windows answered right
    known: int = 0                                          # windows with a true value

    def line(self, names: tuple[str, str]) -> str:
        if not self.windows:
            return "check: no windows to compare"
        text = (f"check: {self.windows} windows, same answer on {self.same_label} "
                f"({100 * self.same_label / self.windows:.1f}%), scores differ by at most "
                f"{self.max_rel_diff:.2e} relative")
        if self.known:
            accs = [f"{n} {100 * self.right[n] / self.known:.2f}%" for n in names]
            text += f"; accuracy {accs[0]}, {accs[1]} ({self.known} windows with a value)"
        return text


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-3)
    return float(np.max(np.abs(a - b)) / scale) if a.size else 0.0


def compare_models(reference: Iterable[Prediction], graph: Classifier, ds: Dataset, *, label: str | None,
                   names: tuple[str, str] = ("model", "graph")) -> Agreement:
    """The answers of an exported graph on every window of ``ds`` compared with ``reference``
    (another model's predictions of the same recordings), window by window."""
    key = ds.resolve_label(label) if label else None
    out = Agreement(right={n: 0 for n in names})
    theirs = {(p.name, p.start_ms): p for p in reference}
    for q in predict_recordings(graph, ds):
        p = theirs.get((q.name, q.start_ms))
        if p is None:
            raise UserError(f"check: the graph answers a window of {q.name} at {q.start_ms} ms that the model "
                            "does not cut")
        out.windows += 1
        out.same_label += p.label == q.label
        out.max_rel_diff = max(out.max_rel_diff, _rel(q.scores, p.scores))
        truth = None if key is None or p.recording is None else p.recording.labels.get(key)
        if truth is not None and graph.detector:    # a detector answers its normal value or anomaly
            truth = truth if truth == graph.fitted_labels[0] else ANOMALY
        if truth is not None:
            out.known += 1
            for n, pred in zip(names, (p, q)):
                out.right[n] += pred.label == truth
    return out
