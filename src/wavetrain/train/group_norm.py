"""Batch normalisation over a device group's whole batch.

A BatchNorm layer normalises with the mean and variance of the batch it sees. In a device group
each replica sees its own rows only, so its statistics (and the gradients through them) would not
be the whole batch's: the group's gradient would not be the one-device gradient. Here every
replica's BatchNorm layers exchange sums with the others' (their replicas run in threads of one
process) so that each layer normalises with the statistics of the whole batch:

* forward: each replica's count, per-channel sum and sum of squares (of ``x`` less the running
  mean, which every replica holds alike; accumulated in float64 and brought to the host) are
  added over the replicas in replica order; every replica normalises with the same mean and
  (biased) variance and updates its running statistics the way ``torch.nn.BatchNorm`` does (the
  unbiased variance of the whole batch);
* backward: the per-channel sums of ``dy`` and ``dy·x̂`` are added the same way, and
  ``dx = γ/σ · (dy − Σdy/N − x̂·Σ(dy·x̂)/N)`` over the whole batch's ``N``; the weight and bias
  gradients are each replica's own parts (the group adds them).

The layers exchange in the same order on every replica (the same network, forward then backward),
through one :class:`Exchange` per step: two waits per layer and step, a cost that grows with the
number of layers (on two CPU replicas of the 2-vCPU test machine, rescnn's 20 layers made a step
about twice as long as with per-replica statistics, dcase's 3 about 10% longer). Outside a group
step (validation, a single replica, a pass after training) a layer is the plain BatchNorm.
:func:`attach` turns a network's BatchNorm layers into group layers (their class changes, their
parameters and buffers stay: the state dict is the same) and :func:`detach` turns them back.

torch is imported only inside functions of this module.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Exchange", "attach", "detach", "norm_layers", "set_exchange"]

#: Seconds a replica waits for the others at an exchange before the step fails (a replica that
#: died without aborting; never reached in a working group).
EXCHANGE_TIMEOUT_S = 600.0


class Exchange:
    """Element-wise sums of float64 vectors over ``parties`` threads, added in slot order (every
    thread gets the same bits). Each call is one round; all parties make the same calls in the
    same order."""

    def __init__(self, parties: int):
        self._parts: list[np.ndarray | None] = [None] * parties
        self._total = np.zeros(0)
        self._barrier = threading.Barrier(parties, action=self._add)

    def _add(self) -> None:
        parts = [p for p in self._parts if p is not None]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        self._total = total

    def all_sum(self, slot: int, part: np.ndarray) -> np.ndarray:
        """The sum of every party's ``part`` (this thread's is ``slot``)."""
        self._parts[slot] = np.asarray(part, dtype=np.float64)
        self._barrier.wait(EXCHANGE_TIMEOUT_S)   # the last party to arrive adds the parts, then all go on
        # (the next round's sum is made only once every party has come back for it: after this read)
        return self._total

    def abort(self) -> None:
        """Release every waiting party with ``threading.BrokenBarrierError`` (a replica failed)."""
        self._barrier.abort()


def norm_layers(net) -> list[Any]:
    """The BatchNorm layers of ``net`` (any dimension), in module order."""
    import torch

    return [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


_GROUP_CLASSES: dict[type, type] = {}


def _group_class(cls: type) -> type:
    """A subclass of the BatchNorm class ``cls`` whose forward is :func:`_group_forward`."""
    if cls not in _GROUP_CLASSES:
        _GROUP_CLASSES[cls] = type(f"Group{cls.__name__}", (cls,), {"forward": _group_forward,
                                                                     "_plain_class": cls})
    return _GROUP_CLASSES[cls]


def attach(net) -> list[Any]:
    """Turn ``net``'s BatchNorm layers into group layers (in place); returns them. With no
    exchange set (``layer.exchange = None``) they compute what they computed before."""
    layers = norm_layers(net)
    for m in layers:
        if not hasattr(m, "_plain_class"):
            m.__class__ = _group_class(type(m))
        m.exchange, m.slot = None, 0
    return layers


def detach(net) -> None:
    """Turn ``net``'s group layers back into plain BatchNorm layers (in place)."""
    for m in norm_layers(net):
        if hasattr(m, "_plain_class"):
            m.__class__ = m._plain_class
            for name in ("exchange", "slot"):
                m.__dict__.pop(name, None)


def set_exchange(layers: Sequence[Any], exchange: Exchange | None, slot: int) -> None:
    """Group layers of one replica: exchange through ``exchange`` as party ``slot`` (None: plain)."""
    for m in layers:
        m.exchange, m.slot = exchange, slot


def _group_forward(self, x):
    """The forward of a group layer: the plain one, unless training inside a group step."""
    if self.exchange is None or not (self.training or not self.track_running_stats):
        return self._plain_class.forward(self, x)
    self._check_input_dim(x)
    # sums about a shift every replica shares (the running mean: the replicas update it alike),
    # so that the variance from them does not lose float32 digits to a large mean
    shift = self.running_mean if self.track_running_stats else None
    mean, var, n = _statistics(x, shift, self.exchange, self.slot)
    if self.training and self.track_running_stats:
        self.num_batches_tracked.add_(1)
        m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        with _no_grad():
            self.running_mean.mul_(1 - m).add_(torch_tensor(mean, x), alpha=m)
            self.running_var.mul_(1 - m).add_(torch_tensor(var * (n / max(n - 1, 1)), x), alpha=m)
    return _GroupNormFunction.apply(x, self.weight, self.bias, torch_tensor(mean, x),
                                    torch_tensor(1.0 / np.sqrt(var + self.eps), x), n, self.exchange, self.slot)


def _no_grad():
    import torch

    return torch.no_grad()


def torch_tensor(a: np.ndarray, like) -> Any:
    """``a`` as a tensor of ``like``'s dtype on its device."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).to(device=like.device, dtype=like.dtype)


def _dims(x) -> list[int]:
    return [0, *range(2, x.dim())]


def _shape(x) -> list[int]:
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def _sums(*tensors) -> np.ndarray:
    """Per-channel sums of each tensor, accumulated in float64, one host vector."""
    import torch

    return np.concatenate([t.sum(_dims(t), dtype=torch.float64).cpu().numpy() for t in tensors])


def _statistics(x, shift, exchange: Exchange, slot: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean and biased variance (float64, on the host) of the whole batch per channel, and the
    batch's count per channel."""
    import torch

    c = x.shape[1]
    with torch.no_grad():
        xs = x.detach() if shift is None else x.detach() - shift.view(_shape(x))
        part = np.concatenate([[x.numel() // max(c, 1)], _sums(xs, xs * xs)])
    total = exchange.all_sum(slot, part)
    n = float(total[0])
    d = total[1:c + 1] / n
    var = np.maximum(total[c + 1:] / n - d * d, 0.0)
    base = 0.0 if shift is None else shift.detach().double().cpu().numpy()
    return base + d, var, n


def _make_function():
    import torch

    class GroupNormFunction(torch.autograd.Function):
        """BatchNorm with the whole batch's statistics; the backward adds the whole batch's sums."""

        @staticmethod
        def forward(ctx, x, weight, bias, mean, invstd, n, exchange, slot):
            shape = _shape(x)
            xhat = (x - mean.view(shape)) * invstd.view(shape)
            y = xhat
            if weight is not None:
                y = y * weight.view(shape)
            if bias is not None:
                y = y + bias.view(shape)
            ctx.save_for_backward(xhat, weight, invstd)
            ctx.n, ctx.exchange, ctx.slot = n, exchange, slot
            ctx.has_bias = bias is not None
            return y

        @staticmethod
        def backward(ctx, dy):
            xhat, weight, invstd = ctx.saved_tensors
            shape, c = _shape(dy), dy.shape[1]
            local = _sums(dy, dy * xhat)                      # Σdy, Σdy·x̂ of this replica's rows
            total = ctx.exchange.all_sum(ctx.slot, local)
            s1, s2 = torch_tensor(total[:c] / ctx.n, dy), torch_tensor(total[c:] / ctx.n, dy)
            scale = invstd if weight is None else invstd * weight
            dx = scale.view(shape) * (dy - s1.view(shape) - xhat * s2.view(shape))
            dw = torch_tensor(local[c:], weight) if weight is not None else None
            db = torch_tensor(local[:c], dy) if ctx.has_bias else None
            return dx, dw, db, None, None, None, None, None

    return GroupNormFunction


class _LazyFunction:
    """The autograd function, built at first use (torch is imported then)."""

    _fn: Any = None

    def apply(self, *args):
        if self._fn is None:
            type(self)._fn = _make_function()
        return self._fn.apply(*args)


_GroupNormFunction = _LazyFunction()
