"""When training stops, and which weights are the best.

Rules, checked after each validation: ``target_score`` (top-1 accuracy reached), ``min_loss``
(mean training loss since the last validation at or below it) and ``patience`` (that many
validations without improving the monitored value). ``max_iters`` and ``epochs`` are checked by the
trainer's loop.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MONITORS = ("valid_loss", "top1", "macro_f1")


@dataclass
class StopRules:
    monitor: str = "valid_loss"
    patience: int = 0            # 0 = no early stopping
    target_score: float | None = None
    min_loss: float | None = None
    # state
    best: float = -math.inf      # higher is better (valid_loss is negated)
    best_iteration: int = -1
    bad: int = 0

    def score(self, entry: dict) -> float | None:
        v = entry.get(self.monitor)
        if v is None:
            return None
        return -float(v) if self.monitor == "valid_loss" else float(v)

    def update(self, entry: dict) -> tuple[bool, str | None]:
        """Record a validation ``entry``; returns ``(improved, stop_reason or None)``."""
        improved = False
        s = self.score(entry)
        if s is not None and s == s:
            if s > self.best + 1e-12:
                self.best, self.best_iteration, self.bad = s, int(entry["iteration"]), 0
                improved = True
            else:
                self.bad += 1
        if self.target_score is not None and entry.get("top1") is not None and entry["top1"] >= self.target_score:
            return improved, f"target score reached (top1 {entry['top1']:.4f} >= {self.target_score})"
        if self.min_loss is not None and entry.get("train_loss") is not None and entry["train_loss"] <= self.min_loss:
            return improved, f"minimum loss reached (train loss {entry['train_loss']:.4g} <= {self.min_loss})"
        if self.patience and s is not None and self.bad >= self.patience:
            return improved, f"no improvement of {self.monitor} for {self.patience} validations"
        return improved, None

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, d: dict) -> None:
        self.best = float(d["best"])
        self.best_iteration = int(d["best_iteration"])
        self.bad = int(d["bad"])
