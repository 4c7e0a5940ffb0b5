"""``wavetrain export``: write a fitted model as one ONNX graph (:mod:`wavetrain.models.onnx_export`)
and, on recordings given to check it, compare the graph's answers with the model's — before the
graph is written, so that a check that fails leaves no file.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wavetrain.core.errors import MetadataError, ParameterError, UserError
from wavetrain.core.extras import MissingExtraError, has_module, install_hint
from wavetrain.core.outputs import refuse_inputs, write_atomic
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import file_sha256
from wavetrain.models.anomaly import ANOMALY
from wavetrain.models.base import Classifier
from wavetrain.models.modelfile import load_model
from wavetrain.models.onnx_export import QUANTIZE, model_graph, quantize_int8
from wavetrain.pipeline.jobs import RunOptions, window_predictions
from wavetrain.pipeline.prediction import Prediction, predict_recordings

__all__ = ["Agreement", "ExportReport", "compare_models", "export_model", "need_export_packages"]


def need_export_packages() -> None:
    """Refuse, in one line, when the ``export`` extra (onnx, onnxruntime) is not installed."""
    missing = [m for m in ("onnx", "onnxruntime") if not has_module(m)]
    if missing:
        raise MissingExtraError(f"export needs {' and '.join(missing)}: {install_hint('export')}", extra="export",
                                module=missing[0])


@dataclass
class ExportReport:
    """What was written: the graph's size (and the float graph's, when quantised) and outputs;
    with recordings to check it on, how its answers compare with the model's and the recordings
    skipped as bad (``(recording, reason)``)."""

    path: Path
    bytes: int
    outputs: list[str]
    float_bytes: int | None = None
    agreement: Agreement | None = None
    skipped: list = field(default_factory=list)


def export_model(model: Classifier, model_path: str | os.PathLike, out: str | os.PathLike, *, opset: int,
                 quantize: str | None = None, check: Dataset | None = None, skip_bad: bool = False) -> ExportReport:
    """Write ``model`` (loaded from ``model_path``) to ``out`` as one ONNX graph, atomically.

    With ``check``, every window of its recordings is answered by the model and by the graph
    (:func:`compare_models`) before ``out`` is written: a recording that cannot be read or
    decoded, or a graph that cannot answer, raises and writes nothing (``out`` is left as it
    was). The recordings need no labels: the answers are compared with each other, and where
    they have the model's label, with it.

    Parameters
    ----------
    quantize : {'int8'}, optional
        Dynamic int8 quantisation of the network's weights.
    check : Dataset, optional
        Recordings to compare the graph with the model on.
    skip_bad : bool, default=False
        With ``check``: leave out recordings that cannot be read (in the report's ``skipped``)
        instead of raising :class:`~wavetrain.core.errors.AudioError`.
    """
    if model.scores_samples:
        raise UserError(f"{model_path}: is an exported graph already; export the .wt model it came from")
    refuse_inputs([out], [model_path], option="", files=True)
    if quantize is not None and quantize not in QUANTIZE:
        raise ParameterError(f"--quantize {quantize}: expected {', '.join(QUANTIZE)}", param="quantize")
    result = model_graph(model, opset=opset, sha256=file_sha256(model_path))
    proto = quantize_int8(result.model) if quantize else result.model
    data = proto.SerializeToString()
    report = ExportReport(Path(out), len(data), result.outputs)
    if quantize:
        report.float_bytes = result.model.ByteSize()
    if check is not None:
        names = (".wt", f"{quantize} graph" if quantize else "graph")
        report.agreement, report.skipped = _check(model, data, Path(out).name, check, names=names,
                                                  skip_bad=skip_bad)
    write_atomic(out, lambda f: f.write(data), what="ONNX graph")
    return report


def _check(model: Classifier, data: bytes, name: str, ds: Dataset, *, names: tuple[str, str], skip_bad: bool
           ) -> tuple[Agreement, list]:
    """The graph serialised in ``data`` against ``model`` on every window of ``ds``: the model's
    answers first (each recording read and decoded), then the graph's, from a private copy of it
    (``name``) that is removed after; and the recordings skipped as bad."""
    preds, later = window_predictions(model, ds, RunOptions(skip_bad=skip_bad), warn=False)
    reference = list(preds)
    skipped = list(ds.skipped) + list(later)
    bad = {id(r) for r, _ in skipped}
    with tempfile.TemporaryDirectory(prefix="wavetrain-export-") as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        agreement = compare_models(reference, load_model(path), ds.filter(lambda r: id(r) not in bad),
                                   label=model.label_name_, names=names, skipped=skipped if skip_bad else None)
    return agreement, skipped


@dataclass
class Agreement:
    """How an exported graph's answers compare with another model's on the same windows."""

    windows: int = 0
    same_label: int = 0
    max_rel_diff: float = 0.0
    right: dict[str, int] = field(default_factory=dict)     # per model: windows answered right
    known: int = 0                                          # windows with a true value
    label: str | None = None                                # the label whose values are the truth
    names: tuple[str, str] = ("model", "graph")             # the reference's and the graph's, for people

    def line(self) -> str:
        """The comparison in one line."""
        if not self.windows:
            return "check: no windows to compare"
        text = (f"check: {self.windows} windows, same answer on {self.same_label} "
                f"({100 * self.same_label / self.windows:.1f}%), scores differ by at most "
                f"{self.max_rel_diff:.2e} relative")
        if self.known:
            accs = [f"{n} {100 * self.right[n] / self.known:.2f}%" for n in self.names]
            text += f"; accuracy {accs[0]}, {accs[1]} ({self.known} windows with a value)"
        elif self.label:
            text += f"; no accuracy: no recording has a value of {self.label!r}"
        return text


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-3)
    return float(np.max(np.abs(a - b)) / scale) if a.size else 0.0


def compare_models(reference: Iterable[Prediction], graph: Classifier, ds: Dataset, *, label: str | None,
                   names: tuple[str, str] = ("model", "graph"), skipped: list | None = None) -> Agreement:
    """The answers of an exported graph on every window of ``ds`` compared with ``reference``
    (another model's predictions of the same recordings), window by window: whether they agree,
    and, for the windows whose recording has a value of ``label`` (none when ``ds`` has no such
    label, as plain audio files), whether each is right. ``skipped``: a list recordings the graph
    cannot read are added to (else they raise :class:`~wavetrain.core.errors.AudioError`)."""
    key = _label_key(ds, label)
    out = Agreement(right={n: 0 for n in names}, label=label, names=names)
    theirs = {(p.name, p.start_ms): p for p in reference}
    for q in predict_recordings(graph, ds, skipped=skipped):
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


def _label_key(ds: Dataset, label: str | None) -> str | None:
    """The key of ``label`` in the recordings of ``ds``, or None where they have no such label."""
    if not label:
        return None
    try:
        return ds.resolve_label(label)
    except MetadataError:
        return None
