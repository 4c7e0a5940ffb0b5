"""A trained wavetrain network as a feature extractor: ``embedding(model=PATH.wt)``.

Each output frame is the network's embedding of one of its windows: the activations of its
penultimate layer (the input of a classifier's output layer) or of an autoencoder's bottleneck.
The extractor runs the model's own front-end (its feature spec, at its rate) over the samples,
cuts the network's windows as the model cuts them (``clip_ms`` and ``clip_shift_ms``; a model
trained on whole recordings: windows of its input length), and runs the network from each
window's features (normalised as the model normalises its input) to its embedding. So the
extractor is a framed extractor of ``size`` samples every ``hop`` samples (a window and the step
between windows), and clips, long recordings read a block at a time, the feature store, Spark and
exported graphs treat it as any extractor. A clip shorter than one window is zero-padded at its
end to one.

The features layer reads no model file itself: the layer that owns them (:mod:`wavetrain.models`)
registers a reader (:func:`register_reader`) that turns a model file into an :class:`Embedder`:
the model's feature spec and rate, its windows, the layers it embeds at, and an ONNX graph from
a batch of windows' features to their embeddings. The graph runs in onnxruntime with one thread,
a chunk of frames at a time (memory bounded by :data:`CHUNK_VALUES` and :data:`RUN_VALUES`, not
by the recording).

The model's features must compute each frame from its own samples (see
:func:`~wavetrain.features.onnx_chain.front_end`), so that the frames of a chunk equal those of
the whole recording. A config carries the SHA-256 of the model file (``model_sha``), so the
feature store keys features by the network's content, and a spec written with another file is
refused rather than answered with different features.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError, UserError
from wavetrain.core.graph import DEFAULT_OPSET
from wavetrain.features import spec as _spec  # (the parser: spec.py imports this module to register it)
from wavetrain.features._params import format_value, param
from wavetrain.features.base import Extractor, FramedConfig
from wavetrain.features.onnx_chain import CHUNK_VALUES, front_end, quote
from wavetrain.features.registry import register_extractor

__all__ = ["CHUNK_VALUES", "Embedder", "EmbeddingConfig", "EmbeddingExtractor", "READERS", "RUN_VALUES",
           "embedder_of", "pinned_text", "register_reader"]

#: Feature values of the windows in one run of the network (its activations are some tens of
#: times this).
RUN_VALUES = 1 << 16


@dataclass(frozen=True)
class Embedder:
    """What a model file gives embedding features (made by the reader registered for its suffix).

    Attributes
    ----------
    family : str
        The model's family.
    spec : str
        The model's feature spec (canonical text): the network's front-end.
    rate : int
        Sample rate in Hz its features are computed at.
    window, step : int
        Feature frames of one of the network's windows, and between window starts.
    layers : tuple of str
        The layers it embeds at, its default first.
    dims : tuple of int
        Values of an embedding at each of ``layers``.
    graph : callable ``(layer, opset) -> bytes``
        A serialised ONNX graph of that opset: input ``windows`` float32 ``(n, frames, features)``
        (the windows' features as the front-end gives them), output ``embedding`` float32
        ``(n, dim)``.
    """

    family: str
    spec: str
    rate: int
    window: int
    step: int
    layers: tuple[str, ...]
    dims: tuple[int, ...]
    graph: Callable[[str, int], bytes]

    def dim(self, layer: str) -> int:
        """Values of an embedding at ``layer``."""
        return self.dims[self.layers.index(layer)]


#: Readers of model files by suffix (``.wt``), filled by the layer that owns the files
#: (:mod:`wavetrain.models` registers its reader when it is imported).
READERS: dict[str, Callable[[Path], Embedder]] = {}

_made: dict[tuple[str, int, int], tuple[str, Embedder]] = {}
_graphs: dict[tuple[str, str, int], bytes] = {}
_sessions: dict[tuple[str, str], Any] = {}
_lock = threading.RLock()


def register_reader(suffix: str, reader: Callable[[Path], Embedder]) -> None:
    """Read model files ending in ``suffix`` (e.g. ``.wt``) with ``reader``: a function of the
    file's path returning its :class:`Embedder`, raising a one-line
    :class:`~wavetrain.core.errors.UserError` for a file it cannot embed with."""
    READERS[suffix.lower()] = reader


def embedder_of(ref: str) -> tuple[str, Embedder]:
    """``(digest, embedder)`` of the model file ``ref``: 16 hex digits of the SHA-256 of its bytes,
    and what its reader makes of it, its front-end checked (once per process and file version:
    path, size and modification time).

    Raises
    ------
    ParameterError
        A missing file, one no reader is registered for, one its reader refuses, or a model whose
        features are no frame-by-frame front-end: one line, naming the file.
    """
    path = Path(os.path.expanduser(ref))
    if not path.is_file():
        raise ParameterError(f"embedding.model: {path} does not exist (or is not a file)", param="model")
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        if READERS:
            raise ParameterError(f"embedding.model: {path} is not a model file ({', '.join(sorted(READERS))}); an "
                                 "ONNX network is an extractor through onnx(graphs=..., input=...)", param="model")
        raise ParameterError("embedding.model: no model reader is loaded; import wavetrain.models first (the "
                             "command line does)", param="model")
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _made:
            return _made[key]
        sha = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        try:
            made = reader(path)
            front_end(made.spec, made.rate, f"embedding: {path}'s features")
        except ParameterError:
            raise
        except UserError as e:
            raise ParameterError(f"embedding.model: {e}", param="model") from None
        _made[key] = (sha, made)
        return sha, made


def pinned_text(spec: _spec.FeatureSpec) -> str | None:
    """The canonical text of a feature spec with embedding features in it (it names the model file's
    digest: a model that keeps this text refuses a changed file rather than embed with it), else None."""
    parts = spec.parts if isinstance(spec, _spec.CombinedSpec) else (spec,)
    return str(spec) if any(isinstance(p.extractor, EmbeddingConfig) for p in parts) else None


# ---- config -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EmbeddingConfig(FramedConfig):
    """Config of :class:`EmbeddingExtractor`."""

    trailing: ClassVar[tuple[str, ...]] = ("layer", "rate", "model_sha")
    #: the model sets the framing, and takes mono audio
    hidden: ClassVar[tuple[str, ...]] = ("window_ms", "shift_pct", "whole", "per_axis")

    model: str = param("", "the wavetrain model file (.wt) whose network embeds each of its windows (quote a "
                       "path with characters other than letters, digits and _ . ~ / -)", kind=str)
    layer: str | None = param(None, "the layer whose activations are the features: penultimate (a classifier's, "
                              "the input of its output layer) or bottleneck (an autoencoder's); none = the "
                              "family's own", kind=str, optional=True)
    rate: int | None = param(None, "sample rate in Hz, set from the model (the rate of its features); a different "
                             "value is refused", kind=int, low=1, optional=True)
    model_sha: str | None = param(None, "SHA-256 of the model file (16 hex digits), set from the file; a different "
                                  "value is refused", kind=str, optional=True)

    def _check(self) -> None:
        if self.whole or self.window_ms != 40.0 or self.shift_pct != 50.0 or self.per_axis:
            raise ParameterError("embedding: the model sets the window and step (window_ms, shift_pct and whole do "
                                 "not apply), and takes mono audio (per_axis=false)")
        if not self.model.strip():
            raise ParameterError("embedding.model: name a wavetrain model file, e.g. model='sections.wt'",
                                 param="model")
        sha, made = embedder_of(self.model)
        if self.model_sha is not None and self.model_sha.lower() != sha:
            raise ParameterError(f"embedding: the model file {self.model} (sha {sha}) differs from the one these "
                                 f"features were made with (sha {self.model_sha}); give that file back, or train "
                                 "again on the new one's embeddings", param="model_sha")
        layer = self.layer or made.layers[0]
        if layer not in made.layers:
            raise ParameterError(f"embedding.layer: the {made.family} model embeds at {', '.join(made.layers)}, "
                                 f"not {layer}", param="layer")
        if self.rate is not None and self.rate != made.rate:
            raise ParameterError(f"embedding.rate: the model's features are computed at {made.rate} Hz, not "
                                 f"{self.rate}", param="rate")
        object.__setattr__(self, "model_sha", sha)
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "rate", made.rate)

    def __str__(self) -> str:
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        args = []
        for name in self.field_order():
            value = getattr(self, name)
            if name in self.hidden and value == defaults[name]:
                continue
            # the path and the digest print quoted (the spec grammar's names are identifiers)
            args.append(f"{name}={quote(value) if name in ('model', 'model_sha') else format_value(value)}")
        return f"{self.stage}({', '.join(args)})"


# ---- the extractor ------------------------------------------------------------------------------
@register_extractor
class EmbeddingExtractor(Extractor):
    """A trained wavetrain network's embedding of each of its windows (model=PATH.wt, layer=)."""

    name = "embedding"
    config_type = EmbeddingConfig
    config: EmbeddingConfig

    def __init__(self, config: FramedConfig) -> None:
        super().__init__(config)
        sha, self._made = embedder_of(self.config.model)
        if sha != self.config.model_sha:
            raise ParameterError(f"embedding: the model file {self.config.model} changed (sha {sha}, these features "
                                 f"were made with {self.config.model_sha}); extract the features again",
                                 param="model_sha")
        self._sha = sha
        self._layer = str(self.config.layer)
        self._rate = self._made.rate
        self._front = front_end(self._made.spec, self._rate, f"embedding: {self.config.model}'s features")
        ext = self._front.build_extractor()
        size = ext.frame_size(self._rate)
        hop = ext.frame_step(self._rate, size)
        self._size = (self._made.window - 1) * hop + size
        self._hop = self._made.step * hop

    # ---- what the export reads ----------------------------------------------------------------
    @property
    def front(self) -> _spec.FeatureSpec:
        """The network's front-end (its model's feature spec)."""
        return self._front

    @property
    def window(self) -> tuple[int, int]:
        """``(frames, step)``: the front-end's frames of one window, and between window starts."""
        return self._made.window, self._made.step

    def graph_bytes(self, opset: int = DEFAULT_OPSET) -> bytes:
        """The network's graph from windows to embeddings (see :class:`Embedder`), at ``opset``
        (made once per process, model and layer)."""
        key = (self._sha, self._layer, int(opset))
        with _lock:
            if key not in _graphs:
                _graphs[key] = self._made.graph(self._layer, int(opset))
            return _graphs[key]

    # ---- geometry -----------------------------------------------------------------------------
    def frame_size(self, rate: int, n: int | None = None) -> int:
        return self._size

    def frame_step(self, rate: int, size: int) -> int:
        return self._hop

    def pad_to(self, n: int, rate: int) -> int:
        """Samples after padding a clip of ``n`` samples: at least one window."""
        return max(n, self._size)

    def _dim(self, rate: int, size: int | None) -> int:
        return self._made.dim(self._layer)

    # ---- extraction ---------------------------------------------------------------------------
    def extract_batch(self, x: np.ndarray, rate: int) -> np.ndarray:
        """Features ``(batch, frames, features)`` float32 of equally long signals ``(batch, n)``."""
        n = x.shape[-1]
        if n == 0:
            raise AudioError(f"an empty signal has no {self.name} features")
        x = np.asarray(x, np.float32)
        padded = self.pad_to(n, rate)
        if padded > n:
            x = np.pad(x, ((0, 0), (0, padded - n)))
        count = 1 + (padded - self._size) // self._hop
        batch = x.shape[0]
        window, step = self.window
        width = self._front.feature_dim(self._rate)
        out = np.empty((batch, count, self._dim(rate, None)), np.float32)
        # output frames per chunk: the front-end's frames of a chunk stay within CHUNK_VALUES
        chunk = max(1, (CHUNK_VALUES // (batch * width) - window) // step + 1)
        for t0 in range(0, count, chunk):
            t1 = min(count, t0 + chunk)
            span = x[:, t0 * self._hop:(t1 - 1) * self._hop + self._size]
            gram = self._front.build_extractor().extract_batch(span, self._rate)
            if self._front.processors:
                gram = self._front.build_pipeline().process(gram)
            wins = np.lib.stride_tricks.sliding_window_view(gram, window, axis=1)[:, ::step][:, :t1 - t0]
            rows = np.ascontiguousarray(np.moveaxis(wins, -1, 2), np.float32).reshape(-1, window, width)
            out[:, t0:t1] = self._embed(rows).reshape(batch, t1 - t0, -1)
        return out

    def _embed(self, rows: np.ndarray) -> np.ndarray:
        """The network's embeddings ``(n, dim)`` of windows ``(n, frames, features)``, a few at a time."""
        sess = self._session()
        per_run = max(1, RUN_VALUES // (rows.shape[1] * rows.shape[2]))
        ys = [np.asarray(sess.run(None, {"windows": rows[i:i + per_run]})[0], np.float32)
              for i in range(0, len(rows), per_run)]
        return np.concatenate(ys)

    def _session(self) -> Any:
        """An onnxruntime session of the network's graph (one thread; one per process, model and layer)."""
        key = (self._sha, self._layer)
        with _lock:
            if key in _sessions:
                return _sessions[key]
            try:
                import onnxruntime as ort
            except ImportError:
                raise ParameterError("embedding features need onnx and onnxruntime: pip install "
                                     "'wavetrain[export]'") from None
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3
            sess = ort.InferenceSession(self.graph_bytes(), opts, providers=["CPUExecutionProvider"])
            _sessions[key] = sess
            return sess

    def _kernel(self, frames: np.ndarray, state: Any, out: np.ndarray) -> None:  # pragma: no cover
        raise AssertionError("embedding features run by extract_batch")
