"""The training loop for the neural classifiers.

The loop is model-agnostic and device-agnostic. It draws mini-batches through a bounded shuffle
buffer (:mod:`wavetrain.train.shuffle`), prepares them in a background thread (bounded
prefetch), hands each to a step strategy (:mod:`wavetrain.train.steps`: one device, or one rank
of a distributed-data-parallel group, without touching the loop) under a learning-rate
schedule, and validates on a trigger (every epoch or every N iterations). What happens around
the steps — stopping rules and best weights, history, checkpoints, progress — are callbacks
(:mod:`wavetrain.train.callbacks`), each with its own state, so a killed run resumes exactly.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, make_dataclass
from typing import Any

import numpy as np

from wavetrain.core.errors import UserError
from wavetrain.core.params import Param
from wavetrain.core.progress import progress_counter
from wavetrain.features.augment import mix_batch
from wavetrain.stream.batches import WindowStream
from wavetrain.train.callbacks import Callback, Checkpointer, EarlyStopping, Halt, History, ProgressBar
from wavetrain.train.schedules import LRSchedule
from wavetrain.train.shuffle import Prefetcher, batches_per_epoch, minibatches, shuffled_windows
from wavetrain.train.steps import StepStrategy
from wavetrain.train.stopping import StopRules

log = logging.getLogger(__name__)

__all__ = ["TRAIN_PARAMS", "Loop", "TrainConfig", "TrainResult", "Trainer"]

#: Training parameters shared by the neural families (``--set`` names; the single source of
#: :class:`TrainConfig`'s fields and defaults).
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
    Param("shuffle_buffer", 2048, "windows held by the shuffle buffer (memory bound of the shuffle)", int,
          low=1),
    Param("seed", 0, "random seed (weights, data order, dropout); same seed, same model", int, low=0),
)
#: Mini-batches the loader thread prepares ahead of the step (not a hyper-parameter).
PREFETCH = 2
_MIXUP_SALT = 0x313C5

TrainConfig = make_dataclass(
    "TrainConfig", [(p.name, p.type if not p.optional else p.type | None, field(default=p.default))
                    for p in TRAIN_PARAMS] + [("prefetch", int, field(default=PREFETCH))])
TrainConfig.__doc__ = "Training settings: one field per entry of :data:`TRAIN_PARAMS`, plus ``prefetch``."


def config_from_params(params: dict[str, Any]) -> Any:
    """A :class:`TrainConfig` from a model's parameters (other names are ignored)."""
    names = {p.name for p in TRAIN_PARAMS}
    return TrainConfig(**{k: v for k, v in params.items() if k in names})


@dataclass
class TrainResult:
    history: list[dict]
    stop_reason: str
    iterations: int
    best_iteration: int
    data_wait_fraction: float
    seconds: float
    halted: bool = False


class Meter:
    """Training loss, windows and input waits since the last validation."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss, self.n, self.wait, self.t0 = 0.0, 0, 0.0, time.perf_counter()

    def add(self, loss: float, n: int, wait: float) -> None:
        self.loss += loss * n
        self.n += n
        self.wait += wait

    def samples_per_s(self) -> float:
        return self.n / max(1e-9, time.perf_counter() - self.t0)

    def entry(self, strategy: StepStrategy) -> dict[str, Any]:
        """Mean training loss and windows per second of every replica (summed by ``strategy``),
        and this replica's input-wait fraction."""
        loss, n = (float(v) for v in strategy.reduce_sums(np.array([self.loss, float(self.n)])))
        span = max(time.perf_counter() - self.t0, 1e-9)
        return {"train_loss": loss / n if n else None, "samples_per_s": n / span,
                "data_wait_fraction": self.wait / span}


@dataclass
class Loop:
    """Where a training run is, what it runs on, and how it ends; the callbacks' view of it."""

    strategy: StepStrategy
    iters_per_epoch: int
    epoch: int = 0
    it_in_epoch: int = 0
    iteration: int = 0
    stop_reason: str | None = None
    halted: bool = False
    seconds0: float = 0.0          # time of earlier runs of this training (resumed)
    wait: float = 0.0              # time the step waited for input, all runs
    busy: float = 0.0              # time from step to step, all runs
    last_validated: int = -1
    meter: Meter = field(default_factory=Meter)
    t_start: float = field(default_factory=time.perf_counter)

    def seconds(self) -> float:
        return self.seconds0 + time.perf_counter() - self.t_start

    COUNTERS = ("epoch", "it_in_epoch", "iteration")


class Trainer:
    """Runs the loop for one network.

    Parameters
    ----------
    strategy : StepStrategy
        How a step runs (e.g. :class:`~wavetrain.train.steps.SingleDevice`).
    prepare : callable
        ``prepare(grams: list[np.ndarray]) -> np.ndarray`` float32 network input; runs in the
        prefetch thread.
    config : TrainConfig
    extra_state : dict of np.ndarray, optional
        Model state outside the network (e.g. the input normaliser); stored in checkpoints.
    run : dict, optional
        Plain values that identify the run (label values, model parameters); stored in
        checkpoints as ``run``, so that a resumed run can check it is the same.
    class_rates : np.ndarray, optional
        Mean draws per epoch of a window of each class (:func:`~wavetrain.train.shuffle.balanced_rates`:
        a balanced sampler).
    mixup : (alpha, p), optional
        Mix each training mini-batch with a shuffled copy of itself
        (:func:`~wavetrain.features.augment.mix_batch`; drawn from ``seed``, epoch and batch, so a
        resumed run mixes alike); the steps then get soft targets ``(batch, n_classes)``.
    n_classes : int
        Label values (needed with ``mixup``).
    """

    def __init__(self, strategy: StepStrategy, prepare: Callable[[list[np.ndarray]], np.ndarray], config, *,
                 extra_state: dict[str, np.ndarray] | None = None, run: dict | None = None,
                 class_rates: np.ndarray | None = None, mixup: tuple[float, float] | None = None,
                 n_classes: int = 0):
        self.strategy = strategy
        self.prepare = prepare
        self.mixup = mixup
        self.n_classes = n_classes
        self.cfg = config
        self.extra_state = dict(extra_state or {})
        self.run = dict(run or {})
        #: Per class, the mean draws of each window per epoch (a balanced sampler); None: once each.
        self.class_rates = class_rates

    # -- data ---------------------------------------------------------------------------------------
    def _train_batches(self, stream: WindowStream, epoch: int, skip: int):
        cfg = self.cfg

        def source():
            mb = minibatches(shuffled_windows(stream, buffer=cfg.shuffle_buffer, seed=cfg.seed, epoch=epoch,
                                              class_rates=self.class_rates), cfg.batch_size)
            for i, b in enumerate(mb):
                if i < skip:
                    continue
                if self.mixup is None:
                    yield self.prepare(b.grams), b.y
                else:
                    rng = np.random.default_rng([cfg.seed, epoch, i, _MIXUP_SALT])
                    yield mix_batch(self.prepare(b.grams), b.y, self.n_classes, *self.mixup, rng)
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
            callbacks: tuple[Callback, ...] = ()) -> TrainResult:
        """Train until a stopping rule fires; returns the history and how it ended.

        ``n_train`` is the number of labelled training windows (for the epoch length).
        ``resume_state`` is a checkpoint dict from :func:`wavetrain.train.checkpoint.load_checkpoint`.
        ``callbacks`` run after the built-in ones (a :class:`~wavetrain.train.callbacks.Halt`
        they raise ends the run as a kill would).
        """
        cfg = self.cfg
        ipe = max(1, batches_per_epoch(n_train, cfg.batch_size))
        total = min(cfg.epochs * ipe, cfg.max_iters) if cfg.max_iters else cfg.epochs * ipe
        sched = LRSchedule(cfg.schedule, cfg.lr, total, ipe, cfg.lr_step_epochs, cfg.lr_gamma, cfg.lr_patience)
        stopping = EarlyStopping(StopRules(cfg.monitor, cfg.patience, cfg.target_score, cfg.min_loss))
        history = History()
        loop = Loop(self.strategy, ipe)
        cbs: list[Callback] = [stopping, history]
        if checkpoint:
            cbs.append(Checkpointer(checkpoint, lambda: self._state(loop, sched, cbs)))
        cbs += list(callbacks)
        if resume_state is not None:
            self._restore(resume_state, loop, sched, cbs)
        bar = progress_counter(desc="train", total=total, unit="step", enable=progress, initial=loop.iteration)
        if bar is not None:
            cbs.append(ProgressBar(bar))
        try:
            self._epochs(loop, train, valid, sched, cbs)
        except Halt:
            loop.halted = True
            loop.stop_reason = f"halted after {loop.iteration} iterations"
        finally:
            try:
                for cb in cbs:
                    cb.on_fit_end(loop)
            finally:
                self.strategy.close()       # its threads end with the run, whatever ended it
        log.info("training stopped: %s", loop.stop_reason)
        return TrainResult(history=history.entries, stop_reason=loop.stop_reason or "", iterations=loop.iteration,
                           best_iteration=stopping.rules.best_iteration,
                           data_wait_fraction=loop.wait / loop.busy if loop.busy > 0 else 0.0,
                           seconds=loop.seconds(), halted=loop.halted)

    def _epochs(self, loop: Loop, train: WindowStream, valid: WindowStream | None, sched: LRSchedule,
                cbs: list[Callback]) -> None:
        cfg = self.cfg
        while loop.stop_reason is None and loop.epoch < cfg.epochs:
            self._epoch(loop, train, valid, sched, cbs)
            if loop.stop_reason is None:
                loop.epoch += 1
                loop.it_in_epoch = 0
                if not cfg.valid_every_iters:
                    self._validate(loop, valid, sched, cbs)
                if loop.stop_reason is None and loop.epoch >= cfg.epochs:
                    loop.stop_reason = f"maximum epochs reached ({cfg.epochs})"
        if loop.last_validated != loop.iteration:
            self._validate(loop, valid, sched, cbs)

    def _epoch(self, loop: Loop, train: WindowStream, valid: WindowStream | None, sched: LRSchedule,
               cbs: list[Callback]) -> None:
        """Steps until the epoch ends or a stopping rule fires."""
        cfg = self.cfg
        pf = Prefetcher(self._train_batches(train, loop.epoch, loop.it_in_epoch), cfg.prefetch)
        try:
            t_prev = time.perf_counter()
            for x, y in pf:
                self.strategy.set_lr(sched.lr(loop.iteration))
                loss = self.strategy.step(x, y)
                loop.iteration += 1
                loop.it_in_epoch += 1
                wait, pf.wait_seconds = pf.wait_seconds, 0.0
                loop.meter.add(loss, len(y), wait)
                loop.wait += wait
                t_now = time.perf_counter()
                loop.busy += t_now - t_prev
                for cb in cbs:
                    cb.on_step(loop, loss, len(y))
                if cfg.valid_every_iters and loop.iteration % cfg.valid_every_iters == 0:
                    self._validate(loop, valid, sched, cbs)
                if loop.stop_reason is None and cfg.max_iters and loop.iteration >= cfg.max_iters:
                    loop.stop_reason = f"maximum iterations reached ({cfg.max_iters})"
                if loop.stop_reason is not None:
                    return
                t_prev = time.perf_counter()
        finally:
            pf.close()

    def _validate(self, loop: Loop, valid: WindowStream | None, sched: LRSchedule, cbs: list[Callback]) -> None:
        m = loop.meter.entry(self.strategy)
        entry: dict[str, Any] = {"epoch": round(loop.iteration / loop.iters_per_epoch, 4),
                                 "iteration": loop.iteration, "train_loss": m["train_loss"], "valid_loss": None,
                                 "top1": None, "top5": None, "macro_f1": None,
                                 "lr": sched.lr(max(0, loop.iteration - 1)), "samples_per_s": m["samples_per_s"],
                                 "data_wait_fraction": m["data_wait_fraction"], **self.strategy.report()}
        if valid is not None:
            pf = Prefetcher(self._valid_batches(valid), self.cfg.prefetch)
            try:
                entry.update(self.strategy.evaluate(pf))
            finally:
                pf.close()
        entry["seconds"] = loop.seconds()
        sched.observe(entry["valid_loss"] if entry["valid_loss"] is not None else (entry["train_loss"] or math.nan))
        loop.last_validated = loop.iteration
        for cb in cbs:
            cb.on_validation(loop, entry)
        log.info("validation %s", entry)
        loop.meter.reset()

    # -- checkpoints ---------------------------------------------------------------------------------
    def _state(self, loop: Loop, sched: LRSchedule, cbs: list[Callback]) -> dict[str, Any]:
        import torch

        state: dict[str, Any] = dict(self.strategy.state_dict())
        for cb in cbs:
            state.update(cb.state_dict())
        state.update({k: getattr(loop, k) for k in Loop.COUNTERS})
        state.update(schedule=sched.state_dict(), rng_torch=torch.get_rng_state(),
                     rng_cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                     seconds=loop.seconds(), wait=loop.wait, busy=loop.busy,
                     extra={k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self.extra_state.items()},
                     config=asdict(self.cfg), run=self.run)
        return state

    def _restore(self, state: dict[str, Any], loop: Loop, sched: LRSchedule, cbs: list[Callback]) -> None:
        import torch

        try:
            self.strategy.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError) as e:
            raise UserError(f"the checkpoint does not fit this network ({str(e).splitlines()[0][:160]}); "
                            "resume with the same data and parameters, or give another checkpoint "
                            "folder") from None
        sched.load_state_dict(state["schedule"])
        for cb in cbs:
            cb.load_state_dict(state)
        torch.set_rng_state(state["rng_torch"])
        if state.get("rng_cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        for k in Loop.COUNTERS:
            setattr(loop, k, int(state[k]))
        loop.seconds0 = float(state.get("seconds", 0.0))
        loop.wait = float(state.get("wait", 0.0))
        loop.busy = float(state.get("busy", 0.0))
        loop.last_validated = int(state["history"][-1]["iteration"]) if state.get("history") else -1
        log.info("resuming at epoch %d, iteration %d", loop.epoch, loop.iteration)
