"""A model file's network as embedding features read it (:mod:`wavetrain.features.embedding`):
:func:`model_embedder`, registered for ``.wt`` files when :mod:`wavetrain.models` is imported.

The features layer sits below the models and never imports them; it asks the reader registered
for a file's suffix. A family whose fitted network embeds windows says so with its ``embeds``
tag and implements ``embedding_layers``, ``embedding_window``, ``embedding_dim`` and
``graph_embedding``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, cast

from wavetrain.core.errors import ParameterError
from wavetrain.core.graph import FLOAT, Graph
from wavetrain.features.embedding import Embedder, register_reader
from wavetrain.models.base import Classifier
from wavetrain.models.modelfile import load_model
from wavetrain.models.registry import families_with
from wavetrain.stream.windows import Windowing

__all__ = ["Embeds", "embedding_graph", "embedding_windows", "model_embedder"]


class Embeds(Protocol):
    """What a family whose network embeds (its ``embeds`` tag) implements."""

    embedding_layers: tuple[str, ...]

    def embedding_window(self) -> tuple[int, int]: ...

    def embedding_dim(self, layer: str) -> int: ...

    def graph_embedding(self, g: Graph, windows: str, layer: str) -> str: ...


def embedding_windows(model: Classifier, rate: int) -> tuple[int, int]:
    """``(frames, step)``: feature frames of one of the model's windows and between window starts,
    as it cuts them (``clip_ms``, ``clip_shift_ms``; a model of whole recordings: the family's
    ``embedding_window``)."""
    w = Windowing.from_params(model.params)
    if w.clip_ms == 0:
        return cast(Embeds, model).embedding_window()
    shift = model.feature_spec.frame_shift_s(rate)
    return (max(1, int(round(w.clip_ms / 1000.0 / shift))),
            max(1, int(round((w.shift_ms or w.clip_ms) / 1000.0 / shift))))


def embedding_graph(model: Classifier, layer: str, opset: int) -> bytes:
    """The serialised ONNX graph of the model's embeddings at ``layer``: input ``windows`` float32
    ``(n, frames, features)``, output ``embedding`` float32 ``(n, dim)``."""
    fam = cast(Embeds, model)
    dim = int(fam.embedding_dim(layer))
    g = Graph(opset)
    with g.scope("model"):
        out = fam.graph_embedding(g, "windows", layer)
    g.output("embedding", out)
    proto = g.model([("windows", FLOAT, ["n", "frames", int(model.feature_dim_ or 0)])],
                    [("embedding", FLOAT, ["n", dim])],
                    doc=f"wavetrain {model.name} embedding at {layer}: windows (n, frames, features) -> (n, {dim})")
    return proto.SerializeToString()


def model_embedder(path: Path) -> Embedder:
    """What embedding features need of the model file ``path`` (loaded and validated as every
    command loads one).

    Raises
    ------
    ModelFileError
        Not a readable model file.
    ParameterError
        A model whose family does not embed (one line naming those that do), or that does not
        record its feature rate.
    """
    model = load_model(path)
    if not model.embeds:
        raise ParameterError(f"embedding.model: {path} is a {model.name} model, which has no network to embed "
                             f"with; give a model of {', '.join(families_with(embeds=True))}", param="model")
    rate = int(model.feature_spec.rate or model.feature_rate_ or 0)
    if not rate:
        raise ParameterError(f"embedding.model: {path} does not record its feature rate; train it again",
                             param="model")
    window, step = embedding_windows(model, rate)
    fam = cast(Embeds, model)
    layers = tuple(fam.embedding_layers)
    dims = tuple(int(fam.embedding_dim(layer)) for layer in layers)
    return Embedder(model.name, str(model.feature_spec), rate, window, step, layers, dims,
                    lambda layer, opset: embedding_graph(model, layer, opset))


register_reader(".wt", model_embedder)
