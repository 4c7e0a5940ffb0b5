"""Shared code of the neural families (``cnn``, ``dcase``): parameters, input normaliser, fit,
predict and state. torch is imported only inside functions of this module.

Input handling
--------------
Every window is normalised per feature with the mean and standard deviation of the training
stream (one streaming pass, float64 sums), then cropped at its centre or zero-padded at its end to
``frames`` frames (``frames=0``: the longest training window, at most 512 frames, is measured in
that same pass). Padding is applied after normalisation, so padded frames hold the training mean.
Prediction uses the same length, so windows of any length can be passed without padding by hand,
and a window gives the same confidences alone or in a batch.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from wavetrain.errors import ParameterError, UserError
from wavetrain.models.base import Classifier, WindowStream
from wavetrain.models.params import Param

log = logging.getLogger(__name__)

#: Longest input chosen by ``frames=0``.
AUTO_FRAMES_CAP = 512

#: Training parameters shared by the neural families.
TRAIN_PARAMS: tuple[Param, ...] = (
    Param("epochs", 30, "maximum passes over the training windows", int, low=1),
    Param("max_iters", 0, "maximum mini-batch updates; 0 = no limit", int, low=0),
    Param("batch_size", 32, "windows per mini-batch", int, low=1, high=65536),
    Param("lr", 1e-3, "initial learning rate", float, low=1e-7, high=10.0),
    Param("optimizer", "adam", "optimiser", str, choices=("adam", "sgd")),
    Param("momentum", 0.9, "SGD momentum", float, low=0.0, high=0.999),
    Param("weight_decay", 0.0, "L2 weight decay", float, low=0.0, high=1.0),
    Param("schedule", "cosine", "learning-rate schedule: constant, cosine (to lr/100 over the planned steps), "
          "step (x lr_gamma every lr_step_epochs), plateau (x lr_gamma after lr_patience validations "
          "without a lower validation loss)", str, choices=("constant", "cosine", "step", "plateau")),
    Param("lr_step_epochs", 10, "epochs between rate drops of the step schedule", int, low=1),
    Param("lr_gamma", 0.1, "rate factor of the step and plateau schedules", float, low=1e-4, high=1.0),
    Param("lr_patience", 3, "validations without improvement before the plateau schedule drops the rate",
          int, low=1),
    Param("valid_every_iters", 0, "validate (and checkpoint) every N mini-batches; 0 = after every epoch",
          int, low=0),
    Param("patience", 8, "stop after N validations without improving `monitor` (best weights are kept); "
          "0 = never", int, low=0),
    Param("monitor", "valid_loss", "validation value that picks the best weights and drives patience",
          str, choices=("valid_loss", "top1", "macro_f1")),
    Param("target_score", None, "stop when validation top-1 accuracy reaches this", float, low=0.0, high=1.0,
          optional=True),
    Param("min_loss", None, "stop when the mean training loss since the last validation is at or below this",
          float, low=0.0, optional=True),
    Param("valid_fraction", 0.1, "part of the training recordings (or groups) held out for validation when "
          "no validation stream is given; 0 = no validation (the last weights are kept)", float,
          low=0.0, high=0.5),
    Param("shuffle_buffer", 2048, "windows held by the shuffle buffer (memory bound of the shuffle)", int,
          low=1),
    Param("frames", 0, "input length in frames: longer windows are cropped at the centre, shorter ones "
          f"padded at the end; 0 = the longest training window (at most {AUTO_FRAMES_CAP})", int,
          low=0, high=100000),
    Param("seed", 0, "random seed (weights, data order, dropout); same seed, same model", int, low=0),
    Param("device", "auto", "compute device: cpu, cuda, or auto (cuda when available)", str,
          choices=("cpu", "cuda", "auto")),
)

_torch_ready = False


def import_torch():
    """Import torch and apply wavetrain's thread default once."""
    global _torch_ready
    import torch

    if not _torch_ready:
        from wavetrain._threads import limit_torch_threads

        limit_torch_threads(torch)
        _torch_ready = True
    return torch


# -- input normaliser ---------------------------------------------------------------------------
def stream_stats(stream: WindowStream) -> tuple[np.ndarray, np.ndarray, int, int]:
    """One pass: per-feature mean and sd [shape=(features,)], labelled window count, longest window."""
    s1 = s2 = None
    frames_total = 0
    n = 0
    longest = 0
    for b in stream.batches(shuffle=False, seed=0):
        for g, y in zip(b.grams, b.y):
            g = np.asarray(g, dtype=np.float64)
            if s1 is None:
                s1 = np.zeros(g.shape[1])
                s2 = np.zeros(g.shape[1])
            if not np.isfinite(g).all():
                raise UserError("training features hold NaN or infinite values; check the feature spec "
                                "(e.g. a log of zero) or the recordings")
            s1 += g.sum(axis=0)
            s2 += np.square(g).sum(axis=0)
            frames_total += g.shape[0]
            longest = max(longest, g.shape[0])
            n += int(y >= 0)
    if s1 is None or frames_total == 0:
        raise UserError("the training stream holds no windows")
    mean = s1 / frames_total
    var = np.maximum(s2 / frames_total - mean ** 2, 0.0)
    sd = np.sqrt(var)
    sd = np.where(sd > 1e-8 * max(1.0, float(np.abs(mean).max())), sd, 1.0)
    return mean.astype(np.float32), sd.astype(np.float32), n, longest


def prepare_input(grams: Sequence[np.ndarray], mean: np.ndarray, sd: np.ndarray, frames: int) -> np.ndarray:
    """Normalise, crop/pad to ``frames`` and stack: ``(batch, 1, frames, features)`` float32."""
    f = mean.shape[0]
    out = np.zeros((len(grams), 1, frames, f), dtype=np.float32)
    for i, g in enumerate(grams):
        g = np.asarray(g, dtype=np.float32)
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


class NeuralClassifier(Classifier):
    """Base of the torch families: subclasses implement :meth:`build_net`."""

    params = TRAIN_PARAMS
    runtime_imports = ("torch",)
    supports_checkpoints = True
    #: float32 values held per input cell (frame x band) of one window while training: activations
    #: of every layer kept for the backward pass plus their gradients (a property of the network).
    activation_floats_per_cell = 160
    #: torch's own working memory beyond the import: allocator caches, oneDNN/OpenMP buffers.
    torch_overhead_bytes = 60 << 20

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

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.norm_mean_: np.ndarray | None = None
        self.norm_sd_: np.ndarray | None = None
        self.frames_: int | None = None
        self.net_ = None
        self.train_info_: dict[str, Any] = {}

    # -- subclass hook --------------------------------------------------------------------------
    def build_net(self, n_features: int, n_frames: int, n_classes: int):
        """Return a ``torch.nn.Module`` mapping ``(batch, 1, frames, features)`` to logits."""
        raise NotImplementedError

    # -- fitting --------------------------------------------------------------------------------
    def _fit(self, stream: WindowStream, valid: WindowStream | None, **options: Any) -> None:
        torch = import_torch()
        from wavetrain._malloc import fix_mmap_threshold
        from wavetrain.train.checkpoint import load_checkpoint
        from wavetrain.train.devices import select_device
        from wavetrain.train.trainer import TrainConfig, Trainer

        p = self.params
        fix_mmap_threshold()  # flat resident memory over long runs (see wavetrain._malloc)
        device = select_device(options.get("device") or p["device"])
        if valid is None and p["valid_fraction"] > 0:
            split = getattr(stream, "split_validation", None)
            if split is None:
                log.warning("%s: the stream cannot hold out a validation part; training without validation",
                            self.name)
            else:
                group_by = options.get("group_by")
                stream, valid = (split(p["valid_fraction"], p["seed"], group_by=group_by) if group_by
                                 else split(p["valid_fraction"], p["seed"]))
        resume_state = None
        if options.get("resume"):
            resume_state = load_checkpoint(options["resume"])
            if resume_state is None:
                log.warning("%s: no checkpoint in %s; starting from scratch", self.name, options["resume"])
        run = {"labels": list(self.labels_), "params": self.get_params()}
        if resume_state is not None:
            extra = {k: v.numpy() for k, v in resume_state["extra"].items()}
            if int(extra["n_features"][0]) != self.feature_dim_:
                raise UserError(f"{options['resume']}: checkpoint was trained on {int(extra['n_features'][0])} "
                                f"features, the stream has {self.feature_dim_}; resume with the same features")
            _check_same_run(options["resume"], resume_state.get("run") or {}, run)
            self.norm_mean_, self.norm_sd_ = extra["norm.mean"], extra["norm.sd"]
            self.frames_, n_train = int(extra["frames"][0]), int(extra["n_train"][0])
        else:
            self.norm_mean_, self.norm_sd_, n_train, longest = stream_stats(stream)
            self.frames_ = p["frames"] or min(longest, AUTO_FRAMES_CAP)
        if n_train == 0:
            raise UserError(f"{self.name}: the training stream has no labelled windows")
        torch.manual_seed(p["seed"])
        net = self.build_net(self.feature_dim_, self.frames_, len(self.labels_))
        mean, sd, frames = self.norm_mean_, self.norm_sd_, self.frames_
        extra_state = {"norm.mean": mean, "norm.sd": sd, "frames": np.array([frames]),
                       "n_train": np.array([n_train]), "n_features": np.array([self.feature_dim_])}
        trainer = Trainer(net, lambda grams: prepare_input(grams, mean, sd, frames),
                          TrainConfig.from_params(p), device=device, extra_state=extra_state, run=run)
        result = trainer.fit(stream, valid, n_train=n_train, progress=bool(options.get("progress", False)),
                             checkpoint=options.get("checkpoint"), resume_state=resume_state,
                             halt_after=options.get("_halt_after_iters"))
        self.net_ = trainer.net.to("cpu").eval()
        self.history_ = result.history
        self.train_info_ = {"stop_reason": result.stop_reason, "iterations": result.iterations,
                            "best_iteration": result.best_iteration, "seconds": result.seconds,
                            "data_wait_fraction": result.data_wait_fraction, "device": str(device),
                            "halted": result.halted}

    # -- prediction -----------------------------------------------------------------------------
    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Confidences ``(n_windows, n_labels)`` float64, each row summing to 1."""
        self._check_grams(grams)
        if len(grams) == 0:
            return np.zeros((0, len(self.labels_)))
        import_torch()
        from wavetrain.train.trainer import predict_logits

        out = []
        for s in range(0, len(grams), 256):
            x = prepare_input(grams[s:s + 256], self.norm_mean_, self.norm_sd_, self.frames_)
            out.append(predict_logits(self.net_, x, "cpu"))
        z = np.concatenate(out).astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        d = {"norm.mean": np.asarray(self.norm_mean_, np.float32), "norm.sd": np.asarray(self.norm_sd_, np.float32),
             "frames": np.array([self.frames_], dtype=np.int64)}
        for k, v in self.net_.state_dict().items():
            d["net." + k] = v.detach().cpu().numpy().copy()
        return d

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        torch = import_torch()
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
        self.norm_mean_, self.norm_sd_, self.frames_ = mean, sd, int(frames[0])
        net = self.build_net(self.feature_dim_, self.frames_, len(self.labels_))
        sd = {k[4:]: torch.from_numpy(np.array(v)) for k, v in state.items() if k.startswith("net.")}
        try:
            net.load_state_dict(sd)
        except RuntimeError as e:
            raise ParameterError(f"{self.name}: weights do not fit the network ({str(e)[:200]})") from None
        self.net_ = net.eval()
