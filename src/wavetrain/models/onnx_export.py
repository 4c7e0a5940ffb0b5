"""A fitted model as one ONNX graph, feature front-end included (``wavetrain export``).

The graph's contract:

- input ``audio``: float32 ``(n,)``, mono samples at the model's feature rate: one clip (the whole
  recording for a model trained on whole recordings, ``clip_ms=0``; one window otherwise). A clip
  shorter than the model's window is completed by the model's ``pad`` rule (``zero``: frames of
  silence; ``duplicate``: the clip's frames repeated from its start); a longer one is scored as one
  window of all its frames. Fewer samples than ``min_samples`` (one feature sub-window) have no
  features: the graph fails on them, as ``classify`` refuses them.
- outputs: ``scores`` (float32, one per label value, of the model's ``score_kind``: ``probability``,
  ``mean_loglik`` or a detector's ``anomaly`` score ``(1,)``), ``best`` (int64 ``(1,)``: the index of
  the value answered before the unknown or anomaly rule) and the family's per-window details (``z``
  for a GMM, ``nearest`` for knn, ``agreement`` for an ensemble; float32 ``(1,)``).
- metadata properties: ``labels`` (JSON list), ``label_name``, ``rate``, ``clip_ms``,
  ``clip_shift_ms``, ``pad``, ``frames`` (the window in feature frames, 0 = any), ``window_samples``
  and ``hop_samples`` (window ``k`` is ``audio[k hop : k hop + window]``; 0 for whole recordings),
  ``min_samples``,
  ``score_kind``, ``threshold`` (detectors: a window scoring above it is ``anomaly``), ``unknown``
  (JSON, see :meth:`~wavetrain.models.base.Classifier.unknown_rule`), ``features`` (the feature
  spec), ``family``, ``preset`` (the built-in spec the model was trained with, e.g. ``gmm-speech``;
  only for such a model), ``outputs`` (JSON list of the detail outputs), ``wavetrain_version`` and
  ``model_sha256`` (the ``.wt`` file it was exported from).

Windows of a longer recording are cut outside the graph (``classify -m model.onnx`` cuts them as a
live stream's: :func:`wavetrain.pipeline.prediction.classify_samples`). Processors that look across
frames (deltas, per-recording normalisation, PCEN's smoother) then see the window's own frames, as in
wavetrain's live classification; for a model trained on whole recordings, or on features computed
frame by frame, the graph's answers equal ``classify`` on the ``.wt`` file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import wavetrain
from wavetrain.core.errors import ParameterError
from wavetrain.core.graph import DEFAULT_OPSET, FLOAT, INT64, OPSETS, Graph
from wavetrain.features.graph import min_samples, spec_graph
from wavetrain.features.spec import CombinedSpec
from wavetrain.models.base import Classifier
from wavetrain.stream.windows import Windowing, silence_row

__all__ = ["QUANTIZE", "ExportResult", "model_graph", "quantize_int8", "window_frames"]

#: What ``--quantize`` accepts.
QUANTIZE = ("int8",)


@dataclass
class ExportResult:
    """An exported graph (``onnx.ModelProto``) and what a report says about it."""

    model: Any
    outputs: list[str]


def window_frames(model: Classifier, rate: int) -> int:
    """Feature frames of one of the model's windows (0: a whole recording, any length)."""
    w = Windowing.from_params(model.params)
    if w.clip_ms == 0:
        return 0
    shift = model.feature_spec.frame_shift_s(rate)
    return max(1, int(round(w.clip_ms / 1000.0 / shift)))


def window_samples(model: Classifier, rate: int) -> tuple[int, int]:
    """``(samples of one window, samples between window starts)`` at ``rate`` (0, 0 for a model of
    whole recordings): window ``k`` is ``audio[k hop : k hop + size]``, frame-aligned as wavetrain
    cuts it (a last one may be shorter: the graph completes it)."""
    frames = window_frames(model, rate)
    if frames == 0:
        return 0, 0
    spec = model.feature_spec
    first = spec.parts[0] if isinstance(spec, CombinedSpec) else spec
    ext = first.build_extractor()
    size = ext.frame_size(rate)
    step = ext.frame_step(rate, size)
    w = Windowing.from_params(model.params)
    hop_frames = max(1, int(round((w.shift_ms or w.clip_ms) / 1000.0 / spec.frame_shift_s(rate))))
    return (frames - 1) * step + size, hop_frames * step


def _pad(g: Graph, gram: str, model: Classifier, rate: int) -> str:
    """The gram completed to the model's window by its ``pad`` rule (shorter grams only)."""
    frames = window_frames(model, rate)
    pad = Windowing.from_params(model.params).pad
    if frames == 0 or pad == "none":
        return gram
    missing = g.op("Max", g.op("Sub", g.i64(frames), g.dim(gram, 0)), g.i64(0))
    if pad == "zero":
        row = g.const(silence_row(model.feature_spec, rate)[None, :], hint="silence")
        fill = g.op("Tile", row, g.op("Concat", missing, g.i64(1), axis=0))
    else:   # duplicate: the window's frames repeated from its start
        reps = g.op("Add", g.op("Div", missing, g.dim(gram, 0)), g.i64(1))
        tiled = g.op("Tile", gram, g.op("Concat", reps, g.i64(1), axis=0))
        fill = g.op("Slice", tiled, g.i64(0), missing, g.i64(0))
    return g.op("Concat", gram, fill, axis=0)


def model_graph(model: Classifier, *, opset: int = DEFAULT_OPSET, sha256: str = "") -> ExportResult:
    """The ONNX graph of a fitted model (see the module notes for its contract).

    Raises
    ------
    ParameterError
        An opset outside :data:`~wavetrain.core.graph.OPSETS`, features no graph of a mono clip
        can compute, or a family (or setting) that cannot be exported: one line naming it.
    """
    if opset not in OPSETS:
        raise ParameterError(f"--opset {opset}: expected {OPSETS.start} to {OPSETS.stop - 1}", param="opset")
    labels = model.fitted_labels
    rate = int(model.feature_spec.rate or model.feature_rate_ or 0)
    if not rate:
        raise ParameterError(f"export: the {model.name} model does not record its feature rate; retrain it")
    g = Graph(opset)
    with g.scope("features"):
        gram = _pad(g, spec_graph(g, "audio", model.feature_spec, rate), model, rate)
    with g.scope("model"):
        outs = model.graph_scores(g, gram)
    for key, value in outs.items():
        g.output(key, value)
    w = Windowing.from_params(model.params)
    meta: dict[str, Any] = {
        "labels": json.dumps(list(labels)), "label_name": model.label_name_ or "label", "rate": rate,
        "clip_ms": w.clip_ms, "clip_shift_ms": w.shift_ms, "pad": w.pad, "frames": window_frames(model, rate),
        "window_samples": window_samples(model, rate)[0], "hop_samples": window_samples(model, rate)[1],
        "min_samples": min_samples(model.feature_spec, rate), "score_kind": model.score_kind,
        "features": str(model.feature_spec), "family": model.name,
        **({"preset": model.preset_} if model.preset_ else {}),
        "outputs": json.dumps([k for k in outs if k not in ("scores", "best")]),
        "wavetrain_version": wavetrain.__version__, "model_sha256": sha256}
    if model.detector:
        meta["threshold"] = repr(float(getattr(model, "threshold_", "nan")))
    unknown = model.unknown_rule()
    if unknown is not None:
        meta["unknown"] = json.dumps(unknown)
    n_scores = len(labels) if not model.detector else 1
    shapes = {"scores": [n_scores], "best": [1]}
    proto = g.model([("audio", FLOAT, ["n"])],
                    [(k, INT64 if k == "best" else FLOAT, shapes.get(k, [1])) for k in outs],
                    {k: str(v) for k, v in meta.items()},
                    doc=f"wavetrain {model.title} model: audio (n,) float32 at {rate} Hz -> scores")
    return ExportResult(proto, list(outs))


def quantize_int8(proto) -> Any:
    """Dynamic int8 quantisation of the model's weights (``onnxruntime.quantization``): the
    matrix products and convolutions of the model part; the feature front-end stays float."""
    import logging
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if not any("/net/" in n.name for n in proto.graph.node):
        raise ParameterError("--quantize int8: the model has no network weights to quantise (it is not a neural "
                             "network); export it without --quantize")
    keep = [n.name for n in proto.graph.node if "/net/" not in n.name]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)        # (the quantiser's advice goes to the root logger)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "int8.onnx")
            onnx.save(proto, src)
            quantize_dynamic(src, dst, weight_type=QuantType.QInt8, nodes_to_exclude=keep,
                             op_types_to_quantize=["MatMul", "Gemm", "Conv"])
            out = onnx.load(dst)
            del out.graph.value_info[:]     # (shape notes the quantiser adds: the runtime infers them)
            return out
    finally:
        root.setLevel(level)

