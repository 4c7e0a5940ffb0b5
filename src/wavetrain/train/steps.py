"""Step strategies: how one training step runs on the hardware.

The trainer's loop knows nothing of devices: it hands each prepared batch to a step strategy,
which runs forward, backward and the update, and gives back the loss. :class:`SingleDevice` is
one replica on one device (CPU or one GPU); a device group or a distributed-data-parallel rank
is another strategy behind the same methods, and the loop does not change.

torch is imported only inside functions of this module.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import numpy as np

from wavetrain.metrics import macro_f1, topk_accuracy

__all__ = ["SingleDevice", "StepStrategy", "evaluate", "make_optimizer", "predict_logits", "train_step"]


class StepStrategy(Protocol):
    """What the training loop needs of the hardware."""

    def set_lr(self, lr: float) -> None:
        """Learning rate of the next steps."""

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One forward, backward and update on the global batch ``x`` with labels ``y``; returns
        the mean loss of the batch (before the update)."""
        ...

    def evaluate(self, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
        """Validation loss, top-1, top-5 and macro-F1 over prepared ``(x, y)`` batches."""
        ...

    def weights(self) -> dict:
        """A CPU copy of the network's weights (the best ones are kept this way)."""
        ...

    def load_weights(self, state: dict) -> None:
        ...

    def state_dict(self) -> dict[str, Any]:
        """Network and optimiser state, for checkpoints."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...


def make_optimizer(net, optimizer: str, lr: float, momentum: float, weight_decay: float):
    import torch

    if optimizer == "sgd":
        return torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)


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


def evaluate(net, batches: Iterator[tuple[np.ndarray, np.ndarray]] | Iterable[tuple[np.ndarray, np.ndarray]],
             device) -> dict[str, float]:
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


class SingleDevice:
    """One replica on one device: the whole batch forward and backward, then an update.

    Parameters
    ----------
    net : torch.nn.Module
    device : torch.device
    optimizer, lr, momentum, weight_decay
        The optimiser (``adam`` or ``sgd``) and its settings.
    """

    def __init__(self, net, device, *, optimizer: str = "adam", lr: float = 1e-3, momentum: float = 0.9,
                 weight_decay: float = 0.0):
        self.net = net.to(device)
        self.device = device
        self.optimizer = make_optimizer(self.net, optimizer, lr, momentum, weight_decay)

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        return train_step(self.net, self.optimizer, x, y, self.device)

    def evaluate(self, batches) -> dict[str, float]:
        return evaluate(self.net, batches, self.device)

    def weights(self) -> dict:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.net.state_dict().items()}

    def load_weights(self, state: dict) -> None:
        self.net.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.weights(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
