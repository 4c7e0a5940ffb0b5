"""The training loop for the neural classifiers.

The loop is model-agnostic: it gets a ``torch.nn.Module`` that maps a float32 input batch to
logits, and a ``prepare`` function that turns a list of grams into that input batch (numpy). It
draws mini-batches through a bounded shuffle buffer (:mod:`wavetrain.train.shuffle`), prepares
them in a background thread (bounded prefetch), steps Adam or SGD under a learning-rate schedule,
validates on a trigger (every epoch or every N iterations), applies the stopping rules, keeps the
best weights and writes checkpoints that a killed run resumes from exactly.

One step is :func:`train_step`, a plain function of ``(net, optimizer, x, y, device)``: the same
function can run on another device, on a part of a batch (a device group) or in a Spark
``TorchDistributor`` worker.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Iterator

import numpy as np

from wavetrain.errors import UserError
from wavetrain.models.base import WindowStream
from wavetrain.train.checkpoint import save_checkpoint
from wavetrain.train.metrics import macro_f1, topk_accuracy
from wavetrain.train.schedules import LRSchedule
from wavetrain.train.shuffle import Prefetcher, batches_per_epoch, minibatches, shuffled_windows
from wavetrain.train.stopping import StopRules

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Training settings; the fields match the neural families' parameter names."""

    epochs: int = 30
    max_iters: int = 0              # 0 = no limit
    batch_size: int = 32
    lr: float = 1e-3
    optimizer: str = "adam"
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: str = "cosine"
    lr_step_epochs: int = 10
    lr_gamma: float = 0.1
    lr_patience: int = 3
    valid_every_iters: int = 0      # 0 = every epoch
    patience: int = 10              # 0 = no early stopping
    monitor: str = "valid_loss"
    target_score: float | None = None
    min_loss: float | None = None
    shuffle_buffer: int = 2048
    seed: int = 0
    prefetch: int = 2

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names})


@dataclass
class TrainResult:
    history: list[dict]
    stop_reason: str
    iterations: int
    best_iteration: int
    data_wait_fraction: float
    seconds: float
    halted: bool = False
    extra: dict = field(default_factory=dict)


class _Halt(Exception):
    pass


def make_optimizer(net, cfg: TrainConfig):
    import torch

    if cfg.optimizer == "sgd":
        return torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def train_step(net, optimizer, x: np.ndarray, y: np.ndarray, device) -> float:
    """One forward/backward/update on the batch ``x`` [shape=(batch, ...)] with labels ``y``.

    Returns the mean cross-entropy loss of the batch (before the update).
    """
    import torch
    import torch.nn.functional as F

    net.train()
    xt = torch.from_numpy(x).to(device, non_blocking=True)
    yt = torch.from_numpy(y).to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(net(xt), yt)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def predict_logits(net, x: np.ndarray, device, chunk: int = 256) -> np.ndarray:
    """Logits ``(batch, K)`` of ``x`` in evaluation mode, ``chunk`` rows at a time."""
    import torch

    net.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(x), chunk):
            out.append(net(torch.from_numpy(np.ascontiguousarray(x[s:s + chunk])).to(device)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def evaluate(net, batches: Iterator[tuple[np.ndarray, np.ndarray]], device) -> dict[str, float]:
    """Loss, top-1, top-5 and macro-F1 over prepared ``(x, y)`` batches."""
    logits, ys = [], []
    for x, y in batches:
        logits.append(predict_logits(net, x, device))
        ys.append(y)
    if not ys:
        return {}
    z = np.concatenate(logits).astype(np.float64)
    y = np.concatenate(ys)
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    proba = np.exp(logp)
    pred = proba.argmax(axis=1)
    return {"valid_loss": float(-logp[np.arange(len(y)), y].mean()),
            "top1": float((pred == y).mean()),
            "top5": topk_accuracy(proba, y, 5),
            "macro_f1": macro_f1(y, pred)}


def _state_to_cpu(net) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}


class Trainer:
    """Runs the loop for one network.

    Parameters
    ----------
    net : torch.nn.Module
        Maps a float32 batch (what ``prepare`` returns) to logits ``(batch, n_classes)``.
    prepare : callable
        ``prepare(grams: list[np.ndarray]) -> np.ndarray`` float32 network input; runs in the
        prefetch thread.
    config : TrainConfig
    device : torch.device
    extra_state : dict of np.ndarray, optional
        Model state outside the network (e.g. the input normaliser); stored in checkpoints.
    run : dict, optional
        Plain values that identify the run (label values, model parameters); stored in
        checkpoints as ``run``, so that a resumed run can check it is the same.
    """

    def __init__(self, net, prepare: Callable[[list[np.ndarray]], np.ndarray], config: TrainConfig, *, device,
                 extra_state: dict[str, np.ndarray] | None = None, run: dict | None = None):
        self.net = net.to(device)
        self.prepare = prepare
        self.cfg = config
        self.device = device
        self.extra_state = dict(extra_state or {})
        self.run = dict(run or {})
        self.optimizer = make_optimizer(self.net, config)

    # -- data ---------------------------------------------------------------------------------------
    def _train_batches(self, stream: WindowStream, epoch: int, skip: int):
        cfg = self.cfg

        def source():
            mb = minibatches(shuffled_windows(stream, buffer=cfg.shuffle_buffer, seed=cfg.seed, epoch=epoch),
                             cfg.batch_size)
            for i, b in enumerate(mb):
                if i >= skip:
                    yield self.prepare(b.grams), b.y
        return source

    def _valid_batches(self, stream: WindowStream):
        def source():
            for b in stream.batches(shuffle=False, seed=0):
                keep = b.y >= 0
                if keep.any():
                    grams = [g for g, k in zip(b.grams, keep) if k]
                    yield self.prepare(grams), b.y[keep]
        return source

    # -- loop ---------------------------------------------------------------------------------------
    def fit(self, train: WindowStream, valid: WindowStream | None, *, n_train: int, progress: bool = False,
            checkpoint: str | None = None, resume_state: dict | None = None,
            halt_after: int | None = None) -> TrainResult:
        """Train until a stopping rule fires; returns the history and how it ended.

        ``n_train`` is the number of labelled training windows (for the epoch length).
        ``resume_state`` is a checkpoint dict from :func:`wavetrain.train.checkpoint.load_checkpoint`.
        ``halt_after`` (tests) stops abruptly after that many iterations, as a killed run would.
        """
        import torch

        from wavetrain.progress import progress_enabled

        cfg = self.cfg
        ipe = max(1, batches_per_epoch(n_train, cfg.batch_size))
        total = cfg.epochs * ipe
        if cfg.max_iters:
            total = min(total, cfg.max_iters)
        sched = LRSchedule(cfg.schedule, cfg.lr, total, ipe, cfg.lr_step_epochs, cfg.lr_gamma, cfg.lr_patience)
        stop = StopRules(cfg.monitor, cfg.patience, cfg.target_score, cfg.min_loss)
        st = {"epoch": 0, "it_in_epoch": 0, "iteration": 0, "history": [], "best": None, "seconds0": 0.0,
              "wait": 0.0, "busy": 0.0}
        if resume_state is not None:
            try:
                self.net.load_state_dict(resume_state["net"])
                self.optimizer.load_state_dict(resume_state["optimizer"])
            except (RuntimeError, ValueError, KeyError) as e:
                raise UserError(f"the checkpoint does not fit this network ({str(e).splitlines()[0][:160]}); "
                                "resume with the same data and parameters, or give another checkpoint "
                                "folder") from None
            sched.load_state_dict(resume_state["schedule"])
            stop.load_state_dict(resume_state["stop"])
            torch.set_rng_state(resume_state["rng_torch"])
            if resume_state.get("rng_cuda") and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(resume_state["rng_cuda"])
            for k in ("epoch", "it_in_epoch", "iteration"):
                st[k] = int(resume_state[k])
            st["history"] = list(resume_state["history"])
            st["best"] = resume_state["best"] or None
            st["seconds0"] = float(resume_state.get("seconds", 0.0))
            st["wait"] = float(resume_state.get("wait", 0.0))
            st["busy"] = float(resume_state.get("busy", 0.0))
            log.info("resuming at epoch %d, iteration %d", st["epoch"], st["iteration"])

        bar = None
        if progress_enabled(progress):
            from tqdm import tqdm
            import sys
            bar = tqdm(total=total, initial=st["iteration"], desc="train", unit="step", leave=False,
                       dynamic_ncols=True, file=sys.stderr)
        t_start = time.perf_counter()
        acc = {"loss": 0.0, "n": 0, "samples": 0, "t0": time.perf_counter(), "wait": 0.0}

        def seconds() -> float:
            return st["seconds0"] + time.perf_counter() - t_start

        def validate() -> str | None:
            now = time.perf_counter()
            span = max(now - acc["t0"], 1e-9)
            entry: dict[str, Any] = {
                "epoch": round(st["iteration"] / ipe, 4), "iteration": st["iteration"],
                "train_loss": acc["loss"] / acc["n"] if acc["n"] else None,
                "valid_loss": None, "top1": None, "top5": None, "macro_f1": None,
                "lr": sched.lr(max(0, st["iteration"] - 1)),
                "samples_per_s": acc["samples"] / span, "data_wait_fraction": acc["wait"] / span}
            if valid is not None:
                pf = Prefetcher(self._valid_batches(valid), cfg.prefetch)
                try:
                    entry.update(evaluate(self.net, pf, self.device))
                finally:
                    pf.close()
            entry["seconds"] = seconds()
            improved, reason = stop.update(entry)
            sched.observe(entry["valid_loss"] if entry["valid_loss"] is not None else (entry["train_loss"] or math.nan))
            if improved:
                st["best"] = _state_to_cpu(self.net)
            st["history"].append(entry)
            if checkpoint:
                self._save(checkpoint, st, sched, stop, seconds())
            if bar is not None:
                bar.set_postfix(epoch=f"{entry['epoch']:.2f}", loss=f"{entry['train_loss'] or 0:.4f}",
                                top1="-" if entry["top1"] is None else f"{entry['top1']:.3f}",
                                sps=f"{entry['samples_per_s']:.0f}")
            log.info("validation %s", entry)
            acc.update(loss=0.0, n=0, samples=0, t0=time.perf_counter(), wait=0.0)
            return reason

        reason: str | None = None
        halted = False
        try:
            while reason is None and st["epoch"] < cfg.epochs:
                pf = Prefetcher(self._train_batches(train, st["epoch"], st["it_in_epoch"]), cfg.prefetch)
                try:
                    t_prev = time.perf_counter()
                    for x, y in pf:
                        for g in self.optimizer.param_groups:
                            g["lr"] = sched.lr(st["iteration"])
                        loss = train_step(self.net, self.optimizer, x, y, self.device)
                        st["iteration"] += 1
                        st["it_in_epoch"] += 1
                        acc["loss"] += loss * len(y)
                        acc["n"] += len(y)
                        acc["samples"] += len(y)
                        w = pf.wait_seconds
                        acc["wait"] += w
                        st["wait"] += w
                        pf.wait_seconds = 0.0
                        t_now = time.perf_counter()
                        st["busy"] += t_now - t_prev
                        t_prev = t_now
                        if bar is not None:
                            bar.update(1)
                            if st["iteration"] % 10 == 0:
                                bar.set_postfix(epoch=f"{st['iteration'] / ipe:.2f}", loss=f"{loss:.4f}",
                                                top1=("-" if not st["history"] or st["history"][-1]["top1"] is None
                                                      else f"{st['history'][-1]['top1']:.3f}"),
                                                sps=f"{acc['samples'] / max(1e-9, t_now - acc['t0']):.0f}")
                        if halt_after is not None and st["iteration"] >= halt_after:
                            raise _Halt
                        if cfg.valid_every_iters and st["iteration"] % cfg.valid_every_iters == 0:
                            reason = validate()
                        if reason is None and cfg.max_iters and st["iteration"] >= cfg.max_iters:
                            reason = f"maximum iterations reached ({cfg.max_iters})"
                        if reason is not None:
                            break
                        t_prev = time.perf_counter()
                finally:
                    pf.close()
                if reason is None:
                    st["epoch"] += 1
                    st["it_in_epoch"] = 0
                    if not cfg.valid_every_iters:
                        reason = validate()
                    if reason is None and st["epoch"] >= cfg.epochs:
                        reason = f"maximum epochs reached ({cfg.epochs})"
            if not st["history"] or st["history"][-1]["iteration"] != st["iteration"]:
                validate()
        except _Halt:
            halted = True
            reason = f"halted after {st['iteration']} iterations"
        finally:
            if bar is not None:
                bar.close()
        if not halted and st["best"] is not None:
            self.net.load_state_dict(st["best"])
        total_wait = st["wait"]
        frac = total_wait / st["busy"] if st["busy"] > 0 else 0.0
        log.info("training stopped: %s", reason)
        return TrainResult(history=st["history"], stop_reason=reason or "", iterations=st["iteration"],
                           best_iteration=stop.best_iteration, data_wait_fraction=frac, seconds=seconds(),
                           halted=halted)

    def _save(self, folder: str, st: dict, sched: LRSchedule, stop: StopRules, seconds: float) -> None:
        import torch

        state = {
            "net": _state_to_cpu(self.net),
            "optimizer": self.optimizer.state_dict(),
            "schedule": sched.state_dict(), "stop": stop.state_dict(),
            "rng_torch": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "epoch": st["epoch"], "it_in_epoch": st["it_in_epoch"], "iteration": st["iteration"],
            "history": st["history"], "best": st["best"] or {},
            "seconds": seconds, "wait": st["wait"], "busy": st["busy"],
            "extra": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self.extra_state.items()},
            "config": asdict(self.cfg), "run": self.run,
        }
        save_checkpoint(folder, state)
