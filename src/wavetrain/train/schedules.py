"""Learning-rate schedules as small, serialisable state machines (no torch needed).

``constant`` keeps the rate; ``cosine`` anneals from ``lr`` to ``lr * 0.01`` over the planned
iterations; ``step`` multiplies by ``gamma`` every ``step_epochs`` epochs; ``plateau`` multiplies
by ``gamma`` after ``patience`` validations without improvement of the monitored value.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

SCHEDULES = ("constant", "cosine", "step", "plateau")


@dataclass
class LRSchedule:
    kind: str
    base_lr: float
    total_iters: int
    iters_per_epoch: int
    step_epochs: int = 10
    gamma: float = 0.1
    patience: int = 3
    min_factor: float = 0.01
    # plateau state
    factor: float = 1.0
    best: float = math.inf
    bad: int = 0

    def lr(self, iteration: int) -> float:
        """Learning rate for the (0-based) ``iteration``."""
        if self.kind == "cosine":
            t = min(1.0, iteration / max(1, self.total_iters))
            f = self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * t))
            return self.base_lr * f
        if self.kind == "step":
            epoch = iteration // max(1, self.iters_per_epoch)
            return self.base_lr * self.gamma ** (epoch // max(1, self.step_epochs))
        if self.kind == "plateau":
            return self.base_lr * self.factor
        return self.base_lr

    def observe(self, loss: float) -> None:
        """Tell the schedule a validation result (lower is better)."""
        if self.kind != "plateau" or loss != loss:
            return
        if loss < self.best - 1e-12:
            self.best, self.bad = loss, 0
        else:
            self.bad += 1
            if self.bad >= self.patience:
                self.factor = max(self.factor * self.gamma, self.min_factor * 1e-2)
                self.bad = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, d: dict) -> None:
        for k in ("factor", "best", "bad"):
            setattr(self, k, type(getattr(self, k))(d[k]))
