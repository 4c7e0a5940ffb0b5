"""Shared code of the torch families: the neural classifiers' (``cnn``, ``dcase``, ``rescnn``)
parameters, input normaliser, fit, predict and state, and what they share with the
``autoencoder`` around the trainer (:class:`GradientFit`: the run a checkpoint resumes, the
input normaliser, the processes that train together). torch is imported only inside functions
of this module.

Input handling
--------------
A family with the ``input_norm`` parameter first normalises each window by itself
(:func:`normalise_window`): ``level`` (the ``cnn``'s default) to zero mean and unit standard
deviation over all its values, so that its loudness does not matter while its spectral shape
stays; ``window`` each feature over the window's frames (per-recording normalisation when a window
is a whole recording: the channel's spectral tilt no longer matters either, nor does a steady
spectrum, which is all that tells some machine sounds apart); ``channel`` the level and the smooth
shape of the window's mean spectrum. Every window is then normalised per feature with the mean and
standard deviation of the training stream (one streaming pass, float64 sums, of the windows as the
first step leaves them), then cropped at its centre or zero-padded at its end to
``frames`` frames (``frames=0``: the longest training window, at most 512 frames, is measured in
that same pass). Padding is applied after normalisation, so padded frames hold the training mean.
Prediction uses the same length, so windows of any length can be passed without padding by hand,
and a window gives the same confidences alone or in a batch.

Distributed training
--------------------
With ``FitOptions(distributed=True)`` each rank of a ``torch.distributed`` group fits on its
share of the data through this same code, which asks the fit's
:class:`~wavetrain.train.steps.Distribution` (chosen once from the options) for what differs: the
normaliser's pass adds every rank's sums (so all ranks normalise alike, as one process over all
the data would), every rank's stream is cut to the labelled windows of the smallest share (so all
take the same steps per epoch, as ``DistributedDataParallel`` needs), each rank takes its part of
the global mini-batch, gradients are averaged, and the state resumed from is rank 0's
checkpoint, sent to the others.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wavetrain.core.devices import TRAIN_DEVICES, select_device
from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.extras import import_extra, require
from wavetrain.core.graph import DOUBLE, FLOAT, Graph
from wavetrain.core.malloc import fix_mmap_threshold
from wavetrain.core.params import Param
from wavetrain.core.threads import limit_torch_threads
from wavetrain.models.base import UNKNOWN, Classifier, FitOptions
from wavetrain.models.passes import Executor
from wavetrain.stream.batches import SplitsValidation, WindowStream
from wavetrain.train.checkpoint import load_checkpoint
from wavetrain.train.device_group import DeviceGroup, make_balancer
from wavetrain.train.shuffle import balanced_rates
from wavetrain.train.steps import Distribution, SingleDevice, StepStrategy, distribution_for, predict_logits
from wavetrain.train.trainer import TRAIN_PARAMS, Trainer, TrainResult, config_from_params

log = logging.getLogger(__name__)

#: Largest magnitude of a stored network weight: trained weights and batch-norm statistics stay
#: far below it; a float32 network with larger ones overflows.
MAX_NET_ABS = 1e8


def load_net_weights(net, state: dict[str, np.ndarray], name: str) -> None:
    """Load the ``net.*`` arrays of a model file's state into ``net``: each must be the tensor the
    network has, of the same kind of number (floats for floats), and of a sane magnitude
    (:data:`MAX_NET_ABS`); a :class:`ParameterError` names the first that is not."""
    torch = import_torch()
    have = net.state_dict()
    weights = {}
    for k, v in state.items():
        if not k.startswith("net."):
            continue
        a = np.asarray(v)
        target = have.get(k[4:])
        if target is not None and target.is_floating_point() != (a.dtype.kind == "f"):
            raise ParameterError(f"{name}: weights {k!r} are of type {a.dtype}, expected {target.dtype}")
        if a.dtype.kind == "f" and a.size and float(np.abs(a).max()) > MAX_NET_ABS:
            raise ParameterError(f"{name}: weights {k!r} hold values as large as {float(np.abs(a).max()):.3g}")
        weights[k[4:]] = torch.from_numpy(np.array(a))
    try:
        net.load_state_dict(weights)
    except RuntimeError as e:
        raise ParameterError(f"{name}: weights do not fit the network ({' '.join(str(e).split())[:200]})") from None


#: Longest input chosen by ``frames=0``.
AUTO_FRAMES_CAP = 512

#: What each window is normalised by before the training stream's normaliser (:func:`normalise_window`).
INPUT_NORMS: tuple[str, ...] = ("global", "window", "level", "channel")

#: Smooth spectral shapes ``channel`` removes: the first this many cosines across the features.
CHANNEL_COSINES = 4


def channel_basis(n: int, k: int = CHANNEL_COSINES) -> np.ndarray:
    """Projection ``(n, n)`` float64 onto the first ``k`` (at most ``n``) orthonormal DCT-II cosines
    across ``n`` features: a window's mean log spectrum times it is its smooth shape (level and tilt)."""
    k = min(k, n)
    b = np.cos(np.pi * (np.arange(n)[:, None] + 0.5) * np.arange(k)[None] / n)
    b /= np.linalg.norm(b, axis=0)
    return b @ b.T


def input_norm_param(default: str) -> Param:
    """The ``input_norm`` parameter of a neural family, with the family's default."""
    return Param("input_norm", default, "normalise each window by itself before the training stream's "
                 "per-feature normaliser: window = each feature to zero mean and unit sd over the window's "
                 "frames (per recording with whole-recording windows: level and channel do not matter), "
                 "level = one mean and sd over all its values (keeps the spectral shape), channel = level, and "
                 f"the smooth shape of its mean spectrum ({CHANNEL_COSINES} cosines) subtracted (keeps finer "
                 "spectral detail), global = none",
                 str, choices=INPUT_NORMS)


#: Floor of a window's standard deviation, relative to its largest plus its mean magnitude: a
#: feature constant over the window (an empty mel band, a one-frame window, silence) becomes zeros
#: rather than rounding noise blown up.
WINDOW_SD_FLOOR = 1e-3


def normalise_window(g: np.ndarray, how: str) -> np.ndarray:
    """One window ``(frames, features)`` normalised by itself (``how`` of :data:`INPUT_NORMS`),
    float32: ``window``: per feature over the frames; ``level``: one mean and sd over all values;
    ``channel``: the smooth shape of the mean frame (its projection on :func:`channel_basis`)
    subtracted from every frame, then one sd over all values; ``global``: unchanged. Standard
    deviations are floored at :data:`WINDOW_SD_FLOOR` times the largest plus the mean magnitude of
    the window's values (+1e-12)."""
    if how == "global" or g.size == 0:
        return np.asarray(g, dtype=np.float32)
    x = np.asarray(g, dtype=np.float64)
    magnitude = float(np.abs(x).mean())
    axis = 0 if how == "window" else None
    if how == "channel":
        x = x - x.mean(axis=0) @ channel_basis(x.shape[1])
    else:
        x = x - x.mean(axis=axis)
    sd = x.std(axis=axis)
    sd = np.maximum(sd, WINDOW_SD_FLOOR * (float(np.max(sd)) + magnitude) + 1e-12)
    return (x / sd).astype(np.float32)


def graph_normalise_window(g: Graph, x: str, how: str, n_features: int, *, batch: bool = False) -> str:
    """The nodes of :func:`normalise_window` on a window ``x`` ``(frames, n_features)`` float32
    (with ``batch``: on windows ``(n, frames, n_features)``, each by itself)."""
    if how == "global":
        return x
    b = int(batch)
    every = [b, b + 1]
    axes = [b] if how == "window" else every
    magnitude = g.reduce("ReduceMean", g.op("Abs", x), every)
    if how == "channel":
        basis = g.const(channel_basis(n_features).astype(np.float32))
        shape = g.op("MatMul", g.reduce("ReduceMean", x, [b]), basis)
        x = g.op("Sub", x, shape)
    else:
        x = g.op("Sub", x, g.reduce("ReduceMean", x, axes))
    sd = g.op("Sqrt", g.reduce("ReduceMean", g.op("Mul", x, x), axes))
    floor = g.op("Add", g.op("Mul", g.op("Add", g.reduce("ReduceMax", sd, every), magnitude),
                                     g.const(np.float32(WINDOW_SD_FLOOR))), g.const(np.float32(1e-12)))
    return g.op("Div", x, g.op("Max", sd, floor))


#: Parameters of the neural families: training (:data:`~wavetrain.train.trainer.TRAIN_PARAMS`), the
#: validation split, the input length and the device.
NEURAL_PARAMS: tuple[Param, ...] = TRAIN_PARAMS + (
    Param("valid_fraction", 0.1, "part of the training recordings (or groups) held out for validation when "
          "no validation stream is given; 0 = no validation (the last weights are kept)", float,
          low=0.0, high=0.5),
    Param("frames", 0, "input length in frames: longer windows are cropped at the centre, shorter ones "
          f"padded at the end; 0 = the longest training window (at most {AUTO_FRAMES_CAP})", int,
          low=0, high=100000),
    Param("device", "auto", "compute device: cpu, cuda, or auto (cuda when available)", str,
          choices=TRAIN_DEVICES),
    Param("class_weight", "none", "balanced: weigh each class's loss by n / (classes x its windows), so rare "
          "values count as much as common ones", str, choices=("none", "balanced")),
    Param("sampler", "shuffle", "balanced: draw rare values' windows more often and common ones less, so every "
          "value is drawn equally often per epoch (still one streaming pass)", str, choices=("shuffle", "balanced")),
    Param("unknown_fpr", None, "answer 'unknown' for windows less confident than this share of the held-out "
          "validation windows (e.g. 0.05; none = never)", float, low=0.0, high=0.5, optional=True),
)


_torch_ready = False


def import_torch():
    """Import torch and apply wavetrain's thread default once; without torch, a one-line
    :class:`~wavetrain.core.extras.MissingExtraError` naming the networks extra."""
    global _torch_ready
    torch = import_extra("torch", "a neural network")

    if not _torch_ready:
        limit_torch_threads(torch)
        _torch_ready = True
    return torch


# -- input normaliser ---------------------------------------------------------------------------
@dataclass
class StreamSums:
    """What the normaliser's pass over a training stream adds up: per-feature sums of the values
    and of their squares (float64), frames, labelled windows and the longest window (frames)."""

    s1: np.ndarray
    s2: np.ndarray
    frames: int
    windows: int
    longest: int
    #: Labelled windows per class index (float64, for the class weights and the balanced sampler).
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def across(self, distribution: Distribution) -> StreamSums:
        """The sums of every process's share (the same on every process): values, squares and
        frames added, the longest window of all, and as ``windows`` the fewest of any process:
        those every process trains on per pass (one process: its own sums)."""
        d = self.s1.shape[0]
        rows = distribution.gather(np.concatenate([self.s1, self.s2, [self.frames, self.windows, self.longest],
                                                   self.counts]))
        total, windows = rows.sum(axis=0), rows[:, 2 * d + 1]
        if windows.min() == 0 < windows.sum():
            raise UserError(f"rank {int(windows.argmin())} of {len(rows)} has no labelled training windows in its "
                            "share of the data; train with fewer processes")
        return StreamSums(total[:d], total[d:2 * d], int(total[2 * d]), int(windows.min()),
                          int(rows[:, 2 * d + 2].max()), total[2 * d + 3:])

    def stats(self) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Per-feature mean and sd [shape=(features,), float32], labelled windows, longest window."""
        if self.frames == 0:
            raise UserError("the training stream holds no windows")
        mean = self.s1 / self.frames
        var = np.maximum(self.s2 / self.frames - mean ** 2, 0.0)
        sd = np.sqrt(var)
        sd = np.where(sd > 1e-8 * max(1.0, float(np.abs(mean).max())), sd, 1.0)
        return mean.astype(np.float32), sd.astype(np.float32), self.windows, self.longest


def stream_sums(stream: WindowStream, count: Callable[[int], int] | None = None,
                input_norm: str = "global") -> StreamSums:
    """One pass over ``stream``: the normaliser's sums, a labelled window of ``t`` frames counting
    as ``count(t)`` training windows (default: one), of the windows as :func:`normalise_window`
    leaves them with ``input_norm``."""
    d = stream.feature_dim
    s1, s2 = np.zeros(d), np.zeros(d)
    counts = np.zeros(len(stream.labels))
    frames_total = n = longest = 0
    for b in stream.batches(shuffle=False, seed=0):
        labelled = b.y[b.y >= 0]
        if labelled.size:
            counts += np.bincount(labelled, minlength=counts.size)[:counts.size]
        for g, y in zip(b.grams, b.y):
            g = np.asarray(g, dtype=np.float64)
            if not np.isfinite(g).all():
                raise UserError("training features hold NaN or infinite values; check the feature spec "
                                "(e.g. a log of zero) or the recordings")
            if input_norm != "global":
                g = normalise_window(g, input_norm).astype(np.float64)
            s1 += g.sum(axis=0)
            s2 += np.square(g).sum(axis=0)
            frames_total += g.shape[0]
            longest = max(longest, g.shape[0])
            if y >= 0:
                n += 1 if count is None else count(g.shape[0])
    return StreamSums(s1, s2, frames_total, n, longest, counts)


def stream_stats(stream: WindowStream, input_norm: str = "global") -> tuple[np.ndarray, np.ndarray, int, int]:
    """One pass: per-feature mean and sd [shape=(features,)] of the windows normalised by
    themselves as ``input_norm`` says, labelled window count, longest window."""
    return stream_sums(stream, input_norm=input_norm).stats()


def prepare_input(grams: Sequence[np.ndarray], mean: np.ndarray, sd: np.ndarray, frames: int,
                  input_norm: str = "global") -> np.ndarray:
    """Normalise (each window by itself as ``input_norm`` says, then by ``mean`` and ``sd``),
    crop/pad to ``frames`` and stack: ``(batch, 1, frames, features)`` float32."""
    f = mean.shape[0]
    out = np.zeros((len(grams), 1, frames, f), dtype=np.float32)
    for i, g in enumerate(grams):
        g = normalise_window(g, input_norm)
        t = g.shape[0]
        if t >= frames:
            s = (t - frames) // 2
            g = g[s:s + frames]
        out[i, 0, :g.shape[0]] = (g - mean) / sd
    return out


def _check_same_run(folder: str, saved: dict, now: dict) -> None:
    """A checkpoint resumes only the run that wrote it: same label values, same parameters
    (``device`` aside). Raises :class:`UserError` naming what differs."""
    if "labels" in saved and list(saved["labels"]) != now["labels"]:
        raise UserError(f"{folder}: the checkpoint was trained on the values {', '.join(saved['labels'])}, this "
                        f"data has {', '.join(now['labels'])}; resume with the same data, or give another "
                        "checkpoint folder to start afresh")
    before = saved.get("params") or {}
    changed = [f"{k} {before[k]!r} -> {v!r}" for k, v in now["params"].items()
               if k != "device" and k in before and before[k] != v]
    if changed:
        raise UserError(f"{folder}: the checkpoint was written with other parameters ({'; '.join(changed)}); "
                        "resume with the same ones, or give another checkpoint folder to start afresh")


def resume_checkpoint(name: str, folder: str | None, feature_dim: int | None, run: dict[str, Any],
                      distribution: Distribution) -> dict | None:
    """The checkpoint in ``folder`` (None without one), checked to be of the run ``run`` (label
    values and parameters) on ``feature_dim`` features, read by the first of the processes that
    train together and sent to the others."""
    if not folder:
        return None
    state = distribution.from_first(lambda: load_checkpoint(folder))
    if state is None:
        log.warning("%s: no checkpoint in %s; starting from scratch", name, folder)
        return None
    n_features = int(state["extra"]["n_features"].numpy()[0])
    if n_features != feature_dim:
        raise UserError(f"{folder}: checkpoint was trained on {n_features} features, the stream has "
                        f"{feature_dim}; resume with the same features")
    _check_same_run(folder, state.get("run") or {}, run)
    return state


def net_graph(g: Graph, net, x: str, shape: tuple[int, ...]) -> str:
    """Inline ``net`` (a ``torch.nn.Module``, evaluation mode) into ``g`` on the input ``x`` (float32,
    ``shape`` with any length along axis 0) by ``torch.onnx``'s TorchScript exporter, at the
    graph's opset; returns the name of its output."""
    import io
    import warnings

    import onnx

    torch = import_torch()
    buf = io.BytesIO()
    net = _static_pools(torch, copy.deepcopy(net).eval())
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")         # (the TorchScript exporter is marked deprecated)
        torch.onnx.export(net, (torch.zeros(shape),), buf, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=g.opset)
    sub = onnx.load_from_string(buf.getvalue()).graph
    return g.inline(sub, {"x": x}, "net")["y"]


def _static_pools(torch, net):
    """``net`` with its adaptive max-pools written as max-pools of fixed regions (ONNX has no
    adaptive pool, and torch exports one only when the output divides the input): the regions are
    ``adaptive_max_pool2d``'s, ``[floor(i H / h), ceil((i + 1) H / h))``, for the input size the
    exported graph gives the layer."""
    nn = torch.nn

    class FixedRegionsMax(nn.Module):  # type: ignore[name-defined]  # (nn is imported at run time)
        def __init__(self, size):
            super().__init__()
            self.size = (size, size) if isinstance(size, int) else tuple(size)

        def forward(self, x):          # a maximum over a rectangle: over its columns, then its rows
            h, w = int(x.shape[-2]), int(x.shape[-1])
            oh, ow = (h if s is None else s for s in self.size)
            x = self.pool(x, w, ow, -1)
            return self.pool(x, h, oh, -2)

        @staticmethod
        def pool(x, n: int, out: int, dim: int):
            if n == out:
                return x
            if n % out == 0:        # equal regions side by side: one max-pool
                k = n // out
                kernel = (1, k) if dim == -1 else (k, 1)
                return torch.nn.functional.max_pool2d(x, kernel, kernel)
            starts = [(i * n) // out for i in range(out)]
            stops = [-(-((i + 1) * n) // out) for i in range(out)]
            parts = [x.narrow(dim, a, b - a).amax(dim=dim, keepdim=True) for a, b in zip(starts, stops)]
            return torch.cat(parts, dim=dim)

    for name, child in list(net.named_children()):
        if isinstance(child, nn.AdaptiveMaxPool2d):
            setattr(net, name, FixedRegionsMax(child.output_size))
        else:
            _static_pools(torch, child)
    return net


@dataclass(frozen=True)
class Run:
    """Where one fit's gradient steps run: the compute device, the processes that train together,
    and the checkpoint state resumed from (None: a fresh start)."""

    device: Any
    distribution: Distribution
    resume_state: dict | None


class GradientFit(Classifier):
    """What the torch families (the neural classifiers, the ``autoencoder``) share around the
    trainer: the run a checkpoint records and resumes, the input normaliser, the processes that
    train together (:meth:`_start_run`), and the trainer's run on a step strategy
    (:meth:`_fit_steps`). A family never asks whether it trains distributed: the run's
    :class:`~wavetrain.train.steps.Distribution` does what differs.

    Attributes
    ----------
    net_ : torch.nn.Module
        The fitted network (on the CPU, evaluation mode).
    norm_mean_, norm_sd_ : np.ndarray [shape=(features,), float32]
        The input normaliser.
    """

    def __init__(self, **params: Any):
        for module in self.runtime_imports:     # refused now, in one line, not after the features are extracted
            require(module, self.name)
        super().__init__(**params)
        self.norm_mean_: np.ndarray = np.zeros(0, np.float32)
        self.norm_sd_: np.ndarray = np.ones(0, np.float32)
        self.net_: Any = None

    def _net_arrays(self) -> dict[str, np.ndarray]:
        """The network's weights and buffers (batch-norm statistics too) as ``net.*`` arrays."""
        return {"net." + k: v.detach().cpu().numpy().copy() for k, v in self.net_.state_dict().items()}

    def _run_identity(self) -> dict[str, Any]:
        """What a checkpoint records to resume only the same run: label values and parameters."""
        return {"labels": list(self.fitted_labels), "params": self.get_params()}

    def _start_run(self, options: FitOptions) -> Run:
        """The device and processes of a fit (chosen once from ``options``) and the checkpoint of
        ``options.resume`` (read by the first process, sent to the others)."""
        import_torch()
        fix_mmap_threshold()  # flat resident memory over long runs (see wavetrain.core.malloc)
        distribution = distribution_for(options)
        resume = resume_checkpoint(self.name, options.resume, self.feature_dim_, self._run_identity(), distribution)
        return Run(select_device(options.device or self.params["device"]), distribution, resume)

    def _input_layout_arrays(self, stream: WindowStream, run: Run, count: Callable[[int], int] | None = None,
                             input_norm: str = "global") -> dict[str, np.ndarray]:
        """The input normaliser and what a pass trains on, as a checkpoint records them: the
        arrays of the checkpoint resumed from, else measured in one pass over every process's
        stream (:func:`stream_sums`, a window counting ``count(frames)``, each normalised by
        itself as ``input_norm`` says): ``norm.mean``,
        ``norm.sd`` (float32), ``n_train`` (training windows of a pass, of each process),
        ``longest`` (frames) and ``class_counts``."""
        if run.resume_state is not None:
            return {k: v.numpy() for k, v in run.resume_state["extra"].items()}
        sums = stream_sums(stream, count, input_norm).across(run.distribution)
        self._check_train_windows(sums)
        mean, sd, n_train, longest = sums.stats()
        return {"norm.mean": mean, "norm.sd": sd, "n_train": np.array([n_train]), "longest": np.array([longest]),
                "class_counts": sums.counts}

    def _check_train_windows(self, sums: StreamSums) -> None:
        """Refuse (:class:`UserError`) training sums with too few windows to train on."""

    def _optimizer_settings(self) -> dict[str, Any]:
        p = self.params
        return {"optimizer": p["optimizer"], "lr": p["lr"], "momentum": p["momentum"],
                "weight_decay": p["weight_decay"]}

    def _fit_steps(self, run: Run, net, strategy: StepStrategy, prepare: Callable[[list[np.ndarray]], np.ndarray],
                   stream: WindowStream, valid: WindowStream | None, *, n_train: int,
                   extra_state: dict[str, np.ndarray], options: FitOptions, **trainer: Any) -> TrainResult:
        """Train ``net`` by ``strategy`` on ``stream`` (validating on ``valid``) with the
        parameters' settings, ``batch_size`` being the global mini-batch shared by the processes;
        the fitted network (on the CPU, evaluation mode) and the history are kept. ``trainer``:
        further :class:`~wavetrain.train.trainer.Trainer` arguments."""
        cfg = config_from_params(self.params)
        cfg = dataclasses.replace(cfg, batch_size=run.distribution.batch_size(cfg.batch_size))
        result = Trainer(strategy, prepare, cfg, extra_state=extra_state, run=self._run_identity(), **trainer).fit(
            stream, valid, n_train=n_train, progress=options.progress, checkpoint=options.checkpoint,
            resume_state=run.resume_state, callbacks=options.callbacks)
        self.net_ = net.to("cpu").eval()            # the strategy's first (or only) replica
        self.history_ = result.history
        if result.best_iteration >= 0 and not result.halted:    # the validation whose weights were kept
            for h in self.history_:
                h["best"] = h["iteration"] == result.best_iteration
        return result


class NeuralClassifier(GradientFit):
    """Base of the torch families: subclasses implement :meth:`build_net`."""

    hyperparams = NEURAL_PARAMS
    runtime_imports = ("torch",)
    learns_by = "sgd"
    embeds = True
    #: The layers its network embeds at (``embedding(model=..., layer=...)``), the default first.
    embedding_layers: tuple[str, ...] = ("penultimate",)
    supports_distributed = True
    #: Gradient steps through the executor: one local process, or distributed ranks on Spark.
    any_executor = True
    supports_checkpoints = True
    supports_device_groups = True
    mixes_batches = True
    #: float32 values held per input cell (frame x band) of one window while training: activations
    #: of every layer kept for the backward pass plus their gradients (a property of the network).
    activation_floats_per_cell = 160
    #: torch's own working memory beyond the import: allocator caches, oneDNN/OpenMP buffers.
    torch_overhead_bytes = 60 << 20

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.frames_: int = 0
        #: Labelled training windows per value (the class weights and the balanced sampler).
        self.class_counts_ = np.zeros(0)
        #: Windows whose top probability is below it are ``unknown`` (NaN: never).
        self.unknown_threshold_ = float("nan")
        #: How each window is normalised by itself (``input_norm`` of the fit; ``global``: not at all).
        self.input_norm_: str = "global"

    # -- pickling -------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """A fitted network travels as its weights (``net.*`` arrays of :meth:`state_dict`), so a
        fitted model pickles whatever classes its network is built from (some families build
        theirs inside a function): the Spark engine sends fitted models to its executors."""
        state = dict(self.__dict__)
        if state.get("net_") is not None:
            state["net_"] = None
            state["_net_weights"] = self._net_arrays()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        weights = state.pop("_net_weights", None)
        self.__dict__.update(state)
        if weights is not None:
            self._load_net(weights)

    def _load_net(self, state: dict[str, np.ndarray]) -> None:
        """Build the network for the fitted labels and features and load the ``net.*`` arrays of ``state``."""
        import_torch()
        net = self.build_net(int(self.feature_dim_ or 0), self.frames_, len(self.fitted_labels))
        load_net_weights(net, state, self.name)
        self.net_ = net.eval()

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """Shuffle buffer, one mini-batch's activations and gradients, weights with Adam state,
        and torch's working memory."""
        p = self.params
        frames = p["frames"] or min(max(window_frames, 1), AUTO_FRAMES_CAP)
        cell_bytes = frames * feature_dim * 4
        n_windows = max(1, total_frames // max(window_frames, 1))
        shuffle = min(p["shuffle_buffer"], n_windows) * max(window_frames, 1) * feature_dim * 4
        batch = p["batch_size"] * cell_bytes * (1 + self.activation_floats_per_cell)
        weights = 4 * 4 * 600_000  # parameters, gradients and two Adam moments (~0.6 M parameters)
        return shuffle + batch + weights + self.torch_overhead_bytes

    # -- subclass hook --------------------------------------------------------------------------
    def build_net(self, n_features: int, n_frames: int, n_classes: int):
        """Return a ``torch.nn.Module`` mapping ``(batch, 1, frames, features)`` to logits."""
        raise NotImplementedError

    # -- fitting --------------------------------------------------------------------------------
    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """Hold out ``valid_fraction`` of the recordings (by group with ``group_by``) as the local
        fit does, then train by gradient steps on the executor (:meth:`Executor.train_steps`)."""
        if valid is None and self.params["valid_fraction"] > 0:
            parts = data.split(self.params["valid_fraction"], self.params["seed"], options.group_by)
            if parts is not None:             # (else the local fit warns that it cannot hold any out)
                data, valid = parts
        data.train_steps(self, valid, options)

    def fit_rank(self, stream: WindowStream, valid: WindowStream | None, options: FitOptions) -> None:
        """Gradient steps on one local stream, the layout taken, validating on ``valid`` (without
        one, ``valid_fraction`` of ``stream`` held out): the local fit, or one distributed rank's
        share on Spark (``options.distributed``), as :meth:`Executor.train_steps
        <wavetrain.models.passes.Executor.train_steps>` runs it."""
        torch = import_torch()
        p = self.params
        if valid is None and p["valid_fraction"] > 0:
            stream, valid = self._split(stream, options.group_by)
        run = self._start_run(options)
        n_train = self._input_layout(stream, run)
        stream = run.distribution.equal_share(stream, n_train)
        torch.manual_seed(p["seed"])
        net = self.build_net(self.feature_dim_ or 0, self.frames_, len(self.fitted_labels))
        mean, sd, frames, norm = self.norm_mean_, self.norm_sd_, self.frames_, self.input_norm_
        extra_state = {"norm.mean": mean, "norm.sd": sd, "frames": np.array([frames]),
                       "n_train": np.array([n_train]), "n_features": np.array([self.feature_dim_]),
                       "class_counts": self.class_counts_}
        rates = balanced_rates(self.class_counts_) if p["sampler"] == "balanced" else None
        result = self._fit_steps(run, net, self._strategy(net, run, options),
                                 lambda grams: prepare_input(grams, mean, sd, frames, norm), stream, valid,
                                 n_train=n_train,
                                 extra_state=extra_state, options=options, class_rates=rates,
                                 mixup=self.augmenter.mixup, n_classes=len(self.fitted_labels))
        devices = run.distribution.devices
        self.train_info_ = {"stop_reason": result.stop_reason, "iterations": result.iterations,
                            "best_iteration": result.best_iteration, "seconds": result.seconds,
                            "data_wait_fraction": result.data_wait_fraction,
                            "device": ",".join(devices) if len(devices) > 1 else str(run.device),
                            "halted": result.halted}
        self._calibrate_unknown(valid if valid is not None else stream)

    def _calibrate_unknown(self, stream: WindowStream) -> None:
        """With ``unknown_fpr``: the top-probability threshold that about ``unknown_fpr`` of the
        validation windows (known values, unseen in training) fall below."""
        fpr = self.params["unknown_fpr"]
        if fpr is None:
            return
        top = [self.predict_proba([g for g, y in zip(b.grams, b.y) if y >= 0]).max(axis=1)
               for b in stream.batches() if (b.y >= 0).any()]
        if not top:
            raise UserError(f"{self.name}: no windows to calibrate unknown_fpr on")
        if self.params["valid_fraction"] == 0:
            log.warning("%s: unknown_fpr is calibrated on the training windows (no validation part): new windows "
                        "of known values will be called unknown more often than %g", self.name, fpr)
        self.unknown_threshold_ = float(np.quantile(np.concatenate(top), fpr))
        self.train_info_["unknown_threshold"] = self.unknown_threshold_

    def _strategy(self, net, run: Run, options: FitOptions) -> StepStrategy:
        """How steps run: on one device (alone, or as one rank of a distributed-data-parallel
        group: the run's distribution), or on a group of devices sharing each step."""
        opt = self._optimizer_settings()
        weights = self.class_weights()
        group = run.distribution.devices
        if len(group) > 1:
            devices = [select_device(d) for d in group]
            return DeviceGroup(net, devices, make_balancer(options.balance, len(devices)), sync=options.sync,
                               class_weights=weights, **opt)
        return SingleDevice(net, run.device, class_weights=weights, distribution=run.distribution,
                            n_classes=len(self.fitted_labels), **opt)

    def class_weights(self) -> np.ndarray | None:
        """With ``class_weight=balanced``: n / (K · n_c) per class present (0 for a class with no
        training windows); else None."""
        if self.params["class_weight"] != "balanced":
            return None
        return balanced_rates(self.class_counts_)

    def _split(self, stream: WindowStream, group_by: str | None) -> tuple[WindowStream, WindowStream | None]:
        """``(train, valid)``: ``valid_fraction`` of the stream held out (by group with ``group_by``)."""
        if not isinstance(stream, SplitsValidation):
            log.warning("%s: the stream cannot hold out a validation part; training without validation", self.name)
            return stream, None
        return stream.split_validation(self.params["valid_fraction"], self.params["seed"], group_by=group_by)

    def _input_layout(self, stream: WindowStream, run: Run) -> int:
        """Set the input normaliser, length and class counts (from the checkpoint, or one pass
        over every process's stream); returns the labelled training windows a pass trains on (of
        each process)."""
        self.input_norm_ = self.params.get("input_norm", "global")
        a = self._input_layout_arrays(stream, run, input_norm=self.input_norm_)
        self.norm_mean_, self.norm_sd_ = a["norm.mean"], a["norm.sd"]
        if "frames" in a:                      # (the checkpoint's input length)
            self.frames_ = int(a["frames"][0])
        else:
            self.frames_ = self.params["frames"] or min(int(a["longest"][0]), AUTO_FRAMES_CAP)
        self.class_counts_ = a.get("class_counts", np.zeros(0))
        return int(a["n_train"][0])

    def _check_train_windows(self, sums: StreamSums) -> None:
        if sums.frames and not sums.windows:    # (no frames at all: the normaliser says so)
            raise UserError(f"{self.name}: the training stream has no labelled windows")

    # -- prediction -----------------------------------------------------------------------------
    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Confidences ``(n_windows, n_labels)`` float64, each row summing to 1."""
        self._check_grams(grams)
        if len(grams) == 0:
            return np.zeros((0, len(self.fitted_labels)))
        import_torch()

        out = []
        for s in range(0, len(grams), 256):
            x = self.prepare(grams[s:s + 256])
            out.append(predict_logits(self.net_, x, "cpu"))
        z = np.concatenate(out).astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)

    def predict_with_proba(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
        """Predicted values (``unknown`` below the ``unknown_fpr`` threshold) and probabilities."""
        p = self.predict_proba(grams)
        labels = self.fitted_labels
        names = [labels[i] for i in p.argmax(axis=1)]
        if np.isfinite(self.unknown_threshold_):
            names = [UNKNOWN if top < self.unknown_threshold_ else n for n, top in zip(names, p.max(axis=1))]
        return names, p

    def prepare(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """The network's input of ``grams`` (:func:`prepare_input` with the fitted normaliser and length)."""
        return prepare_input(grams, self.norm_mean_, self.norm_sd_, self.frames_, self.input_norm_)

    # -- export ---------------------------------------------------------------------------------
    def graph_normalised(self, g: Graph, gram: str) -> str:
        """Nodes of :func:`prepare_input`'s normalisation of one window ``(frames, features)``."""
        x = graph_normalise_window(g, gram, self.input_norm_, int(self.feature_dim_ or 0))
        return g.op("Div", g.op("Sub", x, g.const(self.norm_mean_)), g.const(self.norm_sd_))

    def graph_crops(self, g: Graph, gram: str) -> str:
        """Nodes of :func:`prepare_input` for one window: ``(1, 1, frames, features)`` float32,
        normalised, the centre ``frames`` frames (or padded at the end with zeros)."""
        x = self.graph_normalised(g, gram)
        t = g.dim(x, 0)
        start = g.op("Div", g.op("Max", g.op("Sub", t, g.i64(self.frames_)), g.i64(0)), g.i64(2))
        x = g.op("Slice", x, start, g.op("Add", start, g.i64(self.frames_)), g.i64(0))
        missing = g.op("Sub", g.i64(self.frames_), g.dim(x, 0))
        x = g.op("Pad", x, g.op("Concat", g.i64(0, 0), missing, g.i64(0), axis=0))
        return g.op("Unsqueeze", x, g.i64(0, 1))

    def graph_proba(self, g: Graph, gram: str) -> str:
        """:meth:`predict_proba` of one window, float64 ``(labels,)``: the network exported by
        ``torch.onnx`` inlined, its softmax averaged over the crops."""
        logits = net_graph(g, self.net_, self.graph_crops(g, gram), (1, 1, self.frames_, int(self.feature_dim_ or 0)))
        p = g.op("Softmax", g.cast(logits, DOUBLE), axis=1)
        return g.reduce("ReduceMean", p, [0], keepdims=False)

    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        p = self.graph_proba(g, gram)
        return {"scores": g.cast(p, FLOAT), "best": g.op("ArgMax", p, axis=0, keepdims=1)}

    # -- embeddings (``embedding(model=...)`` features) --------------------------------------------
    def embedding_window(self) -> tuple[int, int]:
        """``(frames, step)`` of the windows a model trained on whole recordings embeds: its input
        length, back to back."""
        return self.frames_, self.frames_

    def embedding_net(self, layer: str):
        """The network up to ``layer``: every module but the output layer (``penultimate``)."""
        if layer not in self.embedding_layers:
            raise ParameterError(f"{self.name}: embeds at {', '.join(self.embedding_layers)}, not {layer}")
        return self.net_[:-1]

    def embedding_dim(self, layer: str) -> int:
        """Values of an embedding at ``layer``."""
        torch = import_torch()
        with torch.no_grad():
            y = self.embedding_net(layer).eval()(torch.zeros(1, 1, self.frames_, int(self.feature_dim_ or 0)))
        return int(y.reshape(1, -1).shape[1])

    def graph_embedding(self, g: Graph, windows: str, layer: str) -> str:
        """Nodes of the embeddings ``(n, dim)`` at ``layer`` of windows ``(n, frames, features)``:
        each prepared as :func:`prepare_input` prepares it (normalised, the centre ``frames_``
        frames or padded at the end with zeros), then the network up to ``layer``."""
        n_features = int(self.feature_dim_ or 0)
        x = graph_normalise_window(g, windows, self.input_norm_, n_features, batch=True)
        x = g.op("Div", g.op("Sub", x, g.const(self.norm_mean_)), g.const(self.norm_sd_))
        t = g.dim(x, 1)
        start = g.op("Div", g.op("Max", g.op("Sub", t, g.i64(self.frames_)), g.i64(0)), g.i64(2))
        x = g.op("Slice", x, start, g.op("Add", start, g.i64(self.frames_)), g.i64(1))
        missing = g.op("Sub", g.i64(self.frames_), g.dim(x, 1))
        x = g.op("Pad", x, g.op("Concat", g.i64(0, 0, 0, 0), missing, g.i64(0), axis=0))
        x = g.op("Unsqueeze", x, g.i64(1))
        y = net_graph(g, self.embedding_net(layer), x, (1, 1, self.frames_, n_features))
        return g.op("Reshape", y, g.i64(0, -1))

    def unknown_rule(self) -> dict[str, Any] | None:
        t = self.unknown_threshold_
        return {"rule": "top_below", "value": float(t)} if np.isfinite(t) else None

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        d: dict[str, np.ndarray] = {"norm.mean": np.asarray(self.norm_mean_, np.float32),
                                    "norm.sd": np.asarray(self.norm_sd_, np.float32),
                                    "frames": np.array([self.frames_], dtype=np.int64)}
        if np.isfinite(self.unknown_threshold_):
            d["unknown_threshold"] = np.array([self.unknown_threshold_])
        if self.input_norm_ != "global":      # (absent: global, as files written before input_norm)
            d["norm.window"] = np.array([INPUT_NORMS.index(self.input_norm_)], dtype=np.int64)
        d.update(self._net_arrays())
        return d

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        import_torch()
        if self.labels_ is None or self.feature_dim_ is None:
            raise UserError(f"{self.name}: set labels_ and feature_dim_ before load_state_dict "
                            f"(use wavetrain.models.load_model)")
        missing = [k for k in ("norm.mean", "norm.sd", "frames") if k not in state]
        if missing:
            raise ParameterError(f"{self.name}: state lacks {', '.join(missing)}; not a {self.name} model")
        mean, sd = np.asarray(state["norm.mean"], np.float32), np.asarray(state["norm.sd"], np.float32)
        frames = np.asarray(state["frames"]).reshape(-1)
        if mean.shape != (self.feature_dim_,) or sd.shape != (self.feature_dim_,) or (sd <= 0).any():
            raise ParameterError(f"{self.name}: the input normaliser does not fit {self.feature_dim_} features")
        if frames.size != 1 or not 1 <= int(frames[0]) <= 100000:
            raise ParameterError(f"{self.name}: frames={frames.tolist()} is not an input length")
        window = np.asarray(state.get("norm.window", [0])).reshape(-1)
        if window.size != 1 or window.dtype.kind not in "iu" or not 0 <= int(window[0]) < len(INPUT_NORMS):
            raise ParameterError(f"{self.name}: norm.window={window.tolist()} is not an input normalisation")
        self.norm_mean_, self.norm_sd_, self.frames_ = mean, sd, int(frames[0])
        self.input_norm_ = INPUT_NORMS[int(window[0])]
        if "input_norm" in self.params:       # (the file's, whatever the family's default now)
            self.params["input_norm"] = self.input_norm_
        # (no threshold stored: unknown_fpr was not set, or the file predates it: never unknown)
        self.unknown_threshold_ = float(np.asarray(state.get("unknown_threshold", [np.nan])).reshape(-1)[0])
        self._load_net(state)
