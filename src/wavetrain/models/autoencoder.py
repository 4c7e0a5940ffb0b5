"""``autoencoder``: the DCASE machine-sound task's baseline anomaly detector, a dense autoencoder
of stacked log-mel frames trained on normal sound; a window's anomaly score is the mean
reconstruction error of its frame vectors.

Inputs
------
Each window's frames are normalised per band with the mean and standard deviation of the training
frames (one streaming pass, float64 sums), then every ``stack`` consecutive frames are concatenated
into one vector (frame-major: ``stack * bands`` values; the baseline's 5 x 128 = 640). A window of
``T >= stack`` frames gives ``T - stack + 1`` vectors; a shorter one is completed by repeating its
last frame and gives one.

Network (baseline sizes: ``hidden=128``, ``layers=4``, ``bottleneck=8``)::

    (dense hidden + batch-norm + ReLU) x layers -> dense bottleneck + batch-norm + ReLU
    -> (dense hidden + batch-norm + ReLU) x layers -> dense stack*bands (linear)

trained to reproduce its input (mean squared error, Adam, lr 1e-3, mini-batches of 512 vectors,
100 epochs by default, constant rate).

Training
--------
The wavetrain trainer runs it (:class:`~wavetrain.train.trainer.Trainer`: bounded shuffle
buffer, background prefetch, learning-rate schedules, checkpoints and resume): every stacked vector
is one "window" of the stream the trainer reads (:class:`VectorStream`), so ``shuffle_buffer``
and ``batch_size`` count vectors, and the step strategy's loss is the reconstruction error
(:class:`ReconstructionStep`). Memory is the shuffle buffer plus one stream batch and a few
mini-batches, whatever the data. There is no validation during training (the detector's held-out
normal recordings set the threshold); the last weights are kept. On Spark it trains as
distributed-data-parallel ranks through the same code (the fit's
:class:`~wavetrain.train.steps.Distribution`, see :class:`~wavetrain.models._torch_common.GradientFit`):
the normaliser is computed over every rank's share and each rank trains on as many vectors per
epoch as the fewest any holds. torch is imported only when a model trains, scores or loads.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.graph import DOUBLE, FLOAT, Graph
from wavetrain.core.params import Param
from wavetrain.models._torch_common import (
    NEURAL_PARAMS,
    GradientFit,
    StreamSums,
    import_torch,
    load_net_weights,
    net_graph,
)
from wavetrain.models.anomaly import AnomalyDetector, NormalStream
from wavetrain.models.base import FitOptions
from wavetrain.models.passes import Executor
from wavetrain.stream.batches import Batch, WindowStream
from wavetrain.train.steps import SingleDevice
from wavetrain.train.trainer import PREFETCH, TRAIN_PARAMS

__all__ = ["AutoencoderDetector", "ReconstructionStep", "VectorStream", "build_autoencoder", "stack_frames"]

log = logging.getLogger(__name__)

#: Vectors scored per forward pass.
SCORE_CHUNK = 4096
#: Python bytes of one vector held by the shuffle buffer beside its values (array header, tuple,
#: list slot).
VECTOR_OVERHEAD = 200


def _train_param(name: str, **changes: Any) -> Param:
    p = next(p for p in TRAIN_PARAMS if p.name == name)
    return dataclasses.replace(p, **changes) if changes else p


def stack_frames(g: np.ndarray, mean: np.ndarray, sd: np.ndarray, stack: int) -> np.ndarray:
    """A window's normalised, stacked frame vectors ``(max(1, T - stack + 1), stack * bands)``
    float32 (a window shorter than ``stack`` repeats its last frame)."""
    x = (np.asarray(g, dtype=np.float32) - mean) / sd
    t = x.shape[0]
    if t < stack:
        x = np.concatenate([x, np.repeat(x[-1:], stack - t, axis=0)])
        t = stack
    n = t - stack + 1
    return np.concatenate([x[i:i + n] for i in range(stack)], axis=1)


def vector_count(frames: int, stack: int) -> int:
    """Stacked vectors of a window of ``frames`` frames."""
    return max(1, frames - stack + 1)


class VectorStream:
    """A stream whose windows are the stacked frame vectors of another's labelled windows, one
    vector ``(1, stack * bands)`` per window, all labelled 0 (what the trainer reads).

    Parameters
    ----------
    stream : WindowStream
    mean, sd : np.ndarray [shape=(bands,), float32]
        The input normaliser.
    stack : int
        Frames per vector.
    max_windows : int or None
        Vectors of one pass at most (distributed ranks take equal numbers of steps).
    """

    def __init__(self, stream: WindowStream, mean: np.ndarray, sd: np.ndarray, stack: int,
                 max_windows: int | None = None):
        self.stream, self.mean, self.sd, self.stack = stream, mean, sd, int(stack)
        self.labels = list(stream.labels)
        self.feature_dim = self.stack * int(stream.feature_dim)
        self.rate, self.channels = stream.rate, stream.channels
        self.max_windows = max_windows

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        left = np.inf if self.max_windows is None else self.max_windows
        for b in self.stream.batches(shuffle=shuffle, seed=seed):
            if left <= 0:
                break
            parts = [stack_frames(g, self.mean, self.sd, self.stack) for g, y in zip(b.grams, b.y) if y >= 0]
            if not parts:
                continue
            v = np.concatenate(parts)
            if len(v) > left:
                v = v[:int(left)]
            left -= len(v)
            yield Batch(list(v[:, None, :]), np.zeros(len(v), dtype=np.int64))


def build_autoencoder(n_inputs: int, hidden: int, bottleneck: int, layers: int):
    """The network as a ``torch.nn.Module``: ``(batch, n_inputs)`` -> ``(batch, n_inputs)``."""
    torch = import_torch()
    nn = torch.nn

    def block(n_in: int, n_out: int) -> list:
        return [nn.Linear(n_in, n_out), nn.BatchNorm1d(n_out), nn.ReLU()]

    mods: list = []
    width = n_inputs
    for _ in range(layers):
        mods += block(width, hidden)
        width = hidden
    mods += block(width, bottleneck)
    width = bottleneck
    for _ in range(layers):
        mods += block(width, hidden)
        width = hidden
    mods.append(nn.Linear(width, n_inputs))
    return nn.Sequential(*mods)


def n_weights(n_inputs: int, hidden: int, bottleneck: int, layers: int) -> int:
    """Parameters of :func:`build_autoencoder` (batch-norm scale and shift included)."""
    widths = [n_inputs] + [hidden] * layers + [bottleneck] + [hidden] * layers
    dense = sum(a * b + b for a, b in zip(widths, widths[1:])) + widths[-1] * n_inputs + n_inputs
    return dense + 2 * sum(widths[1:])


def reconstruction_step(net, optimizer, x: np.ndarray, device) -> float:
    """One forward/backward/update of ``net`` (or its distributed wrapper) on the vectors ``x``:
    the mean squared error of ``net(x)`` against ``x`` (before the update)."""
    torch = import_torch()
    net.train()
    xt = torch.from_numpy(x).to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(net(xt), xt)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _error_sums(net, batches, device) -> np.ndarray:
    """``[sum of the vectors' reconstruction errors, vectors]`` of some batches."""
    total, n = 0.0, 0
    for x, _ in batches:
        err = vector_errors(net, x, device)
        total += float(err.sum())
        n += len(err)
    return np.array([total, n], dtype=np.float64)


class ReconstructionStep(SingleDevice):
    """:class:`~wavetrain.train.steps.SingleDevice` with the reconstruction objective: the loss
    of a batch ``x`` is the mean squared error of ``net(x)`` against ``x`` (labels are ignored);
    validation errors are summed over the processes that train together."""

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        return reconstruction_step(self.module, self.optimizer, x, self.device)

    def evaluate(self, batches) -> dict[str, float]:
        total, n = self.reduce_sums(_error_sums(self.net, batches, self.device))
        return {"valid_loss": total / n} if n else {}


def vector_errors(net, x: np.ndarray, device) -> np.ndarray:
    """Mean squared reconstruction error of each row of ``x`` ``(n,)`` float64 (evaluation mode)."""
    torch = import_torch()
    net.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(x), SCORE_CHUNK):
            xt = torch.from_numpy(np.ascontiguousarray(x[s:s + SCORE_CHUNK])).to(device)
            out.append(((net(xt) - xt) ** 2).mean(dim=1).double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


class AutoencoderDetector(AnomalyDetector, GradientFit):
    """Dense autoencoder of stacked log-mel frames (the DCASE task 2 baseline).

    Attributes
    ----------
    net_ : torch.nn.Module
        The fitted network (on the CPU, evaluation mode).
    norm_mean_, norm_sd_ : np.ndarray [shape=(bands,), float32]
        The input normaliser.

    Examples
    --------
    >>> from wavetrain.models import build
    >>> m = build("autoencoder", {"epochs": 20, "stack": 5})
    """

    name: ClassVar[str] = "autoencoder"
    summary: ClassVar[str] = ("anomaly detector: dense autoencoder of stacked log-mel frames (DCASE baseline, torch); "
                              "score = mean reconstruction error")
    default_features: ClassVar[str] = "logmel(bands=128, window_ms=64)"
    runtime_imports: ClassVar[tuple[str, ...]] = ("torch",)
    learns_by: ClassVar[str] = "sgd"
    history_loss: ClassVar[str] = "reconstruction error (mean squared, normalised features)"
    supports_distributed: ClassVar[bool] = True
    #: Gradient steps through the executor: one local process, or distributed ranks on Spark.
    any_executor: ClassVar[bool] = True
    supports_checkpoints: ClassVar[bool] = True
    embeds: ClassVar[bool] = True
    #: The layers its network embeds at (``embedding(model=..., layer=...)``), the default first:
    #: the bottleneck, or the last hidden layer of the decoder (the output layer's input).
    embedding_layers: ClassVar[tuple[str, ...]] = ("bottleneck", "penultimate")
    #: torch's own working memory beyond the import: allocator caches, oneDNN/OpenMP buffers.
    torch_overhead_bytes = 60 << 20
    hyperparams: ClassVar[tuple[Param, ...]] = (
        Param("stack", 5, "consecutive frames concatenated into one input vector", int, low=1, high=64),
        Param("hidden", 128, "units of each hidden dense layer", int, low=1, high=8192),
        Param("bottleneck", 8, "units of the bottleneck layer", int, low=1, high=8192),
        Param("layers", 4, "hidden dense layers on each side of the bottleneck", int, low=1, high=16),
        _train_param("epochs", default=100),
        _train_param("max_iters"),
        _train_param("batch_size", default=512, doc="stacked frame vectors per mini-batch"),
        _train_param("lr"),
        _train_param("optimizer"),
        _train_param("momentum"),
        _train_param("weight_decay"),
        _train_param("schedule", default="constant"),
        _train_param("lr_step_epochs"),
        _train_param("lr_gamma"),
        _train_param("lr_patience"),
        _train_param("min_loss"),
        _train_param("shuffle_buffer", default=16384, doc="stacked frame vectors held by the shuffle buffer "
                     "(memory bound of the shuffle: about shuffle_buffer x stack x bands x 4 bytes)"),
        next(p for p in NEURAL_PARAMS if p.name == "device"),
    )

    # -- network --------------------------------------------------------------------------------
    def _n_inputs(self) -> int:
        return self.params["stack"] * int(self.feature_dim_ or 0)

    def _build(self):
        p = self.params
        return build_autoencoder(self._n_inputs(), p["hidden"], p["bottleneck"], p["layers"])

    # -- fitting --------------------------------------------------------------------------------
    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """Gradient steps on the executor: one local process, or distributed ranks on Spark."""
        data.train_steps(self, None, options)

    def fit_rank(self, stream: WindowStream, valid: WindowStream | None, options: FitOptions) -> None:
        """Gradient steps on every window of one local stream (all normal; the threshold is set
        afterwards, on every rank's scores): the local fit, or one distributed rank's share on
        Spark, as :meth:`Executor.train_steps <wavetrain.models.passes.Executor.train_steps>` runs it."""
        stream = NormalStream(stream, self.fitted_labels[0])
        torch = import_torch()
        p = self.params
        if len(options.devices) > 1:
            log.warning("%s trains on one device; the device-group options are ignored", self.name)
        run = self._start_run(options)
        stack = p["stack"]
        layout = self._input_layout_arrays(stream, run, count=lambda frames: vector_count(frames, stack))
        self.norm_mean_, self.norm_sd_ = layout["norm.mean"], layout["norm.sd"]
        n_vectors = int(layout["n_train"][0])
        torch.manual_seed(p["seed"])
        net = self._build()
        extra_state = {"norm.mean": self.norm_mean_, "norm.sd": self.norm_sd_, "n_train": np.array([n_vectors]),
                       "n_features": np.array([self.feature_dim_])}
        strategy = ReconstructionStep(net, run.device, distribution=run.distribution, **self._optimizer_settings())
        # every process trains on as many vectors per pass as the fewest any holds
        vectors = run.distribution.equal_share(VectorStream(stream, self.norm_mean_, self.norm_sd_, stack), n_vectors)
        result = self._fit_steps(run, net, strategy, lambda grams: np.concatenate(grams, axis=0), vectors, None,
                                 n_train=n_vectors, extra_state=extra_state, options=options)
        self.train_info_ = {"stop_reason": result.stop_reason, "iterations": result.iterations,
                            "vectors": n_vectors, "seconds": result.seconds,
                            "data_wait_fraction": result.data_wait_fraction, "device": str(run.device),
                            "halted": result.halted,
                            "train_loss": result.history[-1]["train_loss"] if result.history else None}

    def _check_train_windows(self, sums: StreamSums) -> None:
        if sums.windows < 2:
            raise UserError(f"{self.name}: needs at least 2 training vectors of {self.params['stack']} frames, "
                            f"got {sums.windows}")

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """Shuffle buffer of vectors, one stream batch as vectors, the mini-batches in flight with
        their activations and gradients, weights with Adam state, and torch's working memory."""
        p = self.params
        d = p["stack"] * feature_dim
        vector = d * 4
        shuffle = min(p["shuffle_buffer"], max(total_frames, 1)) * (vector + VECTOR_OVERHEAD)
        stream_batch = max(batch_frames, 1) * (vector + VECTOR_OVERHEAD + feature_dim * 8)
        widths = 2 * p["layers"] * p["hidden"] + p["bottleneck"]
        per_row = 2 * vector + 2 * 3 * widths * 4     # input and output; dense, BN, ReLU and gradients
        batches = (PREFETCH + 2) * p["batch_size"] * vector + p["batch_size"] * per_row
        weights = 4 * 4 * n_weights(d, p["hidden"], p["bottleneck"], p["layers"])
        return shuffle + stream_batch + batches + weights + self.torch_overhead_bytes

    # -- scoring --------------------------------------------------------------------------------
    def _anomaly_score(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        if len(grams) == 0:
            return np.zeros(0)
        stack = self.params["stack"]
        out = np.empty(len(grams))
        i = 0
        while i < len(grams):   # windows in groups of about SCORE_CHUNK vectors
            parts: list[np.ndarray] = []
            j, n = i, 0
            while j < len(grams) and (not parts or n + vector_count(grams[j].shape[0], stack) <= SCORE_CHUNK):
                parts.append(stack_frames(grams[j], self.norm_mean_, self.norm_sd_, stack))
                n += len(parts[-1])
                j += 1
            err = vector_errors(self.net_, np.concatenate(parts), "cpu")
            starts = np.cumsum([0] + [len(v) for v in parts[:-1]])
            out[i:j] = np.add.reduceat(err, starts) / np.array([len(v) for v in parts])
            i = j
        return out

    # -- export ---------------------------------------------------------------------------------
    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        """Nodes of :meth:`_anomaly_score` for one window: its stacked vectors (:func:`stack_frames`)
        through the network, the mean of their mean squared reconstruction errors."""
        stack = int(self.params["stack"])
        x = g.op("Div", g.op("Sub", gram, g.const(self.norm_mean_)), g.const(self.norm_sd_))
        t = g.dim(x, 0)
        # shorter than `stack`: the last frame repeated
        longer = g.op("Max", t, g.i64(stack))
        rows = g.op("Range", g.const(np.int64(0)), g.scalar(longer), g.const(np.int64(1)))
        x = g.op("Gather", x, g.op("Min", rows, g.scalar(g.op("Sub", t, g.i64(1)))), axis=0)
        n = g.op("Sub", longer, g.i64(stack - 1))
        v = g.op("Concat", *[g.op("Slice", x, g.i64(i), g.op("Add", n, g.i64(i)), g.i64(0)) for i in range(stack)],
                 axis=1)
        recon = net_graph(g, self.net_, v, (1, stack * int(self.feature_dim_ or 0)))
        err = g.op("Sub", recon, v)
        per_vector = g.cast(g.reduce("ReduceMean", g.op("Mul", err, err), [1], keepdims=False), DOUBLE)
        score = g.reduce("ReduceMean", per_vector, [0], keepdims=True)
        return {"scores": g.cast(score, FLOAT), "best": g.i64(0)}

    # -- embeddings (``embedding(model=...)`` features) --------------------------------------------
    def embedding_window(self) -> tuple[int, int]:
        """``(frames, step)`` of the windows a model trained on whole recordings embeds: one stacked
        vector, every frame."""
        return int(self.params["stack"]), 1

    def embedding_net(self, layer: str):
        """The network up to ``layer``: through the bottleneck (its dense, batch-norm and ReLU), or
        every module but the output layer (``penultimate``)."""
        if layer not in self.embedding_layers:
            raise ParameterError(f"{self.name}: embeds at {', '.join(self.embedding_layers)}, not {layer}")
        return self.net_[:3 * (self.params["layers"] + 1)] if layer == "bottleneck" else self.net_[:-1]

    def embedding_dim(self, layer: str) -> int:
        """Values of an embedding at ``layer``."""
        return int(self.params["bottleneck"] if layer == "bottleneck" else self.params["hidden"])

    def graph_embedding(self, g: Graph, windows: str, layer: str) -> str:
        """Nodes of the embeddings ``(n, dim)`` at ``layer`` of windows ``(n, frames, features)``:
        each window's stacked vectors (:func:`stack_frames`) through the network up to ``layer``,
        averaged over the window's vectors."""
        stack, n_features = int(self.params["stack"]), int(self.feature_dim_ or 0)
        x = g.op("Div", g.op("Sub", windows, g.const(self.norm_mean_)), g.const(self.norm_sd_))
        t = g.dim(x, 1)
        # shorter than `stack`: the last frame repeated
        longer = g.op("Max", t, g.i64(stack))
        rows = g.op("Range", g.const(np.int64(0)), g.scalar(longer), g.const(np.int64(1)))
        x = g.op("Gather", x, g.op("Min", rows, g.scalar(g.op("Sub", t, g.i64(1)))), axis=1)
        n = g.op("Sub", longer, g.i64(stack - 1))
        v = g.op("Concat", *[g.op("Slice", x, g.i64(i), g.op("Add", n, g.i64(i)), g.i64(1)) for i in range(stack)],
                 axis=2)                                                      # (windows, vectors, stack * bands)
        flat = g.op("Reshape", v, g.i64(-1, stack * n_features))
        y = net_graph(g, self.embedding_net(layer), flat, (1, stack * n_features))
        y = g.op("Reshape", y, g.op("Concat", g.dim(v, 0), n, g.i64(-1), axis=0))
        return g.reduce("ReduceMean", y, [1], keepdims=False)

    # -- state ----------------------------------------------------------------------------------
    def _state(self) -> dict[str, np.ndarray]:
        return {"norm.mean": np.asarray(self.norm_mean_, np.float32), "norm.sd": np.asarray(self.norm_sd_, np.float32),
                **self._net_arrays()}

    def _load_state(self, state: dict[str, np.ndarray]) -> None:
        import_torch()
        missing = [k for k in ("norm.mean", "norm.sd") if k not in state]
        if missing:
            raise ParameterError(f"{self.name}: state lacks {', '.join(missing)}; not an {self.name} model")
        mean, sd = np.asarray(state["norm.mean"], np.float32), np.asarray(state["norm.sd"], np.float32)
        if mean.shape != (self.feature_dim_,) or sd.shape != (self.feature_dim_,) or (sd <= 0).any():
            raise ParameterError(f"{self.name}: the input normaliser does not fit {self.feature_dim_} features")
        net = self._build()
        load_net_weights(net, state, self.name)
        self.norm_mean_, self.norm_sd_, self.net_ = mean, sd, net.eval()
