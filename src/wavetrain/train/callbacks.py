"""Training callbacks: what happens around the loop's steps and validations, each with its own
state for resumption (in the spirit of Lightning's callbacks).

The loop (:class:`wavetrain.train.trainer.Trainer`) calls, on every callback in order,
``on_step`` after each step, ``on_validation`` after each validation and ``on_fit_end`` when
training ends. A callback ends training by setting ``loop.stop_reason``, or abruptly (as a
killed run would) by raising :class:`Halt`. ``state_dict()`` returns the checkpoint entries the
callback owns; ``load_state_dict`` restores them when a run resumes.

Built in, in the order the loop runs them: :class:`EarlyStopping` (stopping rules and the best
weights), :class:`History` (one entry per validation), :class:`Checkpointer` (writes the
checkpoint) and :class:`ProgressBar`.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wavetrain.train.checkpoint import save_checkpoint
from wavetrain.train.stopping import StopRules

if TYPE_CHECKING:
    from wavetrain.train.trainer import Loop

log = logging.getLogger(__name__)

__all__ = ["Callback", "Checkpointer", "EarlyStopping", "Halt", "HaltAfter", "History", "ProgressBar"]


class Halt(Exception):  # noqa: N818 (a signal to the loop, not an error)
    """Raised by a callback to end training at once, as a killed run would: the last weights
    are kept (not the best) and nothing more is written."""


class Callback:
    """Base: every hook does nothing; state is empty."""

    def on_step(self, loop: Loop, loss: float, n: int) -> None:
        """After a step on ``n`` windows with mean ``loss``."""

    def on_validation(self, loop: Loop, entry: dict[str, Any]) -> None:
        """After a validation whose figures are ``entry``."""

    def on_fit_end(self, loop: Loop) -> None:
        """When training ends (``loop.halted`` when a :class:`Halt` ended it)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from a checkpoint (the whole checkpoint dict; take the entries this owns)."""


class EarlyStopping(Callback):
    """The stopping rules (:class:`~wavetrain.train.stopping.StopRules`: target score, minimum
    loss, patience) and the best weights by the monitored value, restored at the end."""

    def __init__(self, rules: StopRules):
        self.rules = rules
        self.best: dict | None = None

    def on_validation(self, loop: Loop, entry: dict[str, Any]) -> None:
        improved, reason = self.rules.update(entry)
        if improved:
            self.best = loop.strategy.weights()
        if reason is not None and loop.stop_reason is None:
            loop.stop_reason = reason

    def on_fit_end(self, loop: Loop) -> None:
        if not loop.halted and self.best is not None:
            loop.strategy.load_weights(self.best)

    def state_dict(self) -> dict[str, Any]:
        return {"stop": self.rules.state_dict(), "best": self.best or {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rules.load_state_dict(state["stop"])
        self.best = state["best"] or None


class History(Callback):
    """One entry per validation (losses, scores, learning rate, speed); goes into the model file."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def on_validation(self, loop: Loop, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.entries}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = list(state["history"])


class Checkpointer(Callback):
    """Writes the run's whole state, as ``state()`` returns it, to ``folder`` atomically after
    every validation."""

    def __init__(self, folder: str, state: Callable[[], dict[str, Any]]):
        self.folder = folder
        self.state = state

    def on_validation(self, loop: Loop, entry: dict[str, Any]) -> None:
        save_checkpoint(self.folder, self.state())


class ProgressBar(Callback):
    """A tqdm bar on stderr: steps, epoch, loss, the last validation's top-1, samples/s."""

    def __init__(self, bar: Any):
        self.bar = bar                      # a wavetrain.core.progress.progress_counter bar
        self.top1: float | None = None

    def on_step(self, loop: Loop, loss: float, n: int) -> None:
        self.bar.update(1)
        if loop.iteration % 10 == 0:
            self.bar.set_postfix(epoch=f"{loop.iteration / loop.iters_per_epoch:.2f}", loss=f"{loss:.4f}",
                                 top1="-" if self.top1 is None else f"{self.top1:.3f}",
                                 sps=f"{loop.meter.samples_per_s():.0f}")

    def on_validation(self, loop: Loop, entry: dict[str, Any]) -> None:
        self.top1 = entry["top1"]
        self.bar.set_postfix(epoch=f"{entry['epoch']:.2f}", loss=f"{entry['train_loss'] or 0:.4f}",
                             top1="-" if entry["top1"] is None else f"{entry['top1']:.3f}",
                             sps=f"{entry['samples_per_s']:.0f}")

    def on_fit_end(self, loop: Loop) -> None:
        self.bar.close()


class HaltAfter(Callback):
    """Raises :class:`Halt` once ``iterations`` steps are done: a run killed there (for tests of
    resumption)."""

    def __init__(self, iterations: int):
        self.iterations = iterations

    def on_step(self, loop: Loop, loss: float, n: int) -> None:
        if loop.iteration >= self.iterations:
            raise Halt
