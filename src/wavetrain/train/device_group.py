"""A device group: one training step split across several devices, unequal ones included.

Each step the global batch of ``B`` windows (the same whatever the devices, so results do not
depend on the hardware) is split into ``n_k`` rows per device; every device's replica runs
forward and backward on its rows with the loss summed and divided by ``B``, so the gradients
added over the replicas are exactly the single-device gradient of the whole batch; the first
replica's optimiser steps and the others copy its weights.

How the batch is split is a :class:`Balancer`'s choice, from each device's own compute time for
its rows (measured in its thread, not the step time):

* :class:`ThroughputBalancer` (default) — shares in proportion to each device's measured
  throughput (rows per second, an exponential moving average), rounded to whole rows, each at
  least a minimum share: it reaches the optimum in a step or two and does not oscillate;
* :class:`GradientBalancer` — the speech-DNN trainer's finite-difference rule
  ``x ← x − γ·(T_i − T_{i−1})/(x_i − x_{i−1})`` on the first device's fraction ``x`` (two devices),
  kept to compare, with guards where it divides 0 by 0 (a probe step when the split did not move);
* :class:`FixedBalancer` — fixed fractions.

A device may be simulated (a CPU replica that sleeps a fixed time per row after its compute) so
that unequal devices can be tested without a GPU.

torch is imported only inside functions of this module.
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from wavetrain.errors import ParameterError
from wavetrain.train.steps import evaluate, make_optimizer

__all__ = ["Balancer", "DeviceGroup", "FixedBalancer", "GradientBalancer", "ThroughputBalancer", "make_balancer",
           "parse_sync", "split_rows"]

#: Smallest fraction of the batch any device gets (a device measured at zero rows is never measured again).
MIN_SHARE = 0.05


def split_rows(batch: int, fractions: Sequence[float], min_rows: int = 1) -> list[int]:
    """Whole rows per device summing to ``batch``, as close to ``fractions`` (normalised) as the
    largest-remainder rounding gets, each at least ``min_rows`` (when the batch allows it)."""
    f = np.maximum(np.asarray(fractions, dtype=np.float64), 0.0)
    f = f / f.sum() if f.sum() > 0 else np.full(len(f), 1.0 / len(f))
    floor = min(min_rows, batch // len(f))
    rest = batch - floor * len(f)
    ideal = f * rest
    rows = np.floor(ideal).astype(int)
    for k in np.argsort(-(ideal - rows), kind="stable")[: rest - int(rows.sum())]:
        rows[k] += 1
    return [int(r) + floor for r in rows]


class Balancer(Protocol):
    """Chooses each step's split from the devices' measured compute times."""

    def fractions(self) -> list[float]:
        """The fraction of the next batch each device gets."""
        ...

    def observe(self, rows: Sequence[int], seconds: Sequence[float]) -> None:
        """Each device's rows and compute seconds of the step just run."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (a resumed run starts from the shares it had)."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        ...


class FixedBalancer:
    def __init__(self, fractions: Sequence[float]):
        total = float(sum(fractions))
        if len(fractions) < 1 or total <= 0 or min(fractions) < 0:
            raise ParameterError(f"--balance fixed: expected positive fractions, got {list(fractions)}")
        self._f = [float(v) / total for v in fractions]

    def fractions(self) -> list[float]:
        return list(self._f)

    def observe(self, rows: Sequence[int], seconds: Sequence[float]) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        pass


class ThroughputBalancer:
    """Shares in proportion to each device's throughput (rows per second of its own compute), an
    exponential moving average with weight ``alpha`` for the newest step."""

    def __init__(self, n: int, *, alpha: float = 0.5, min_share: float = MIN_SHARE):
        self.n, self.alpha, self.min_share = n, float(alpha), float(min_share)
        self.rate: list[float | None] = [None] * n

    def fractions(self) -> list[float]:
        if any(r is None for r in self.rate):
            return [1.0 / self.n] * self.n
        r = np.asarray(self.rate, dtype=np.float64)
        f = r / r.sum()
        low = f < self.min_share                     # raise the smallest shares to the floor
        if low.any():
            f[low] = self.min_share
            f[~low] *= (1.0 - self.min_share * low.sum()) / f[~low].sum()
        return [float(v) for v in f]

    def observe(self, rows: Sequence[int], seconds: Sequence[float]) -> None:
        for k, (n, s) in enumerate(zip(rows, seconds)):
            if n > 0 and s > 0:
                new = n / s
                old = self.rate[k]
                self.rate[k] = new if old is None else (1 - self.alpha) * old + self.alpha * new

    def state(self) -> dict[str, Any]:
        return {"rate": list(self.rate)}

    def restore(self, state: dict[str, Any]) -> None:
        self.rate = list(state.get("rate", self.rate))


class GradientBalancer:
    """The finite-difference rule on the first device's fraction ``x`` of two devices:
    ``x_{i+1} = x_i − γ·(T_i − T_{i−1})/(x_i − x_{i−1})`` with ``T`` the step's compute time (the
    slower device's). Guards: a step that did not move ``x`` is followed by a probe of ``probe``
    (no 0/0), and ``x`` stays within the minimum shares."""

    def __init__(self, n: int, *, gamma: float = 0.05, probe: float = 0.05, min_share: float = MIN_SHARE):
        if n != 2:
            raise ParameterError(f"--balance gradient splits between two devices, got {n}; use throughput")
        self.gamma, self.probe, self.min_share = float(gamma), float(probe), float(min_share)
        self.x = 0.5
        self._prev: tuple[float, float] | None = None      # (x, T) of the step before

    def fractions(self) -> list[float]:
        return [self.x, 1.0 - self.x]

    def observe(self, rows: Sequence[int], seconds: Sequence[float]) -> None:
        total = sum(rows)
        if total <= 0:
            return
        x, t = rows[0] / total, max(seconds)
        if self._prev is None or abs(x - self._prev[0]) < 1e-9:
            step = self.probe if x <= 0.5 else -self.probe
        else:
            slope = (t - self._prev[1]) / (x - self._prev[0])
            step = -self.gamma * slope
        self._prev = (x, t)
        self.x = float(min(1.0 - self.min_share, max(self.min_share, x + step)))

    def state(self) -> dict[str, Any]:
        return {"x": self.x, "prev": self._prev}

    def restore(self, state: dict[str, Any]) -> None:
        self.x, self._prev = float(state.get("x", self.x)), state.get("prev")


def parse_sync(spec: str) -> int:
    """``allreduce`` -> 0; ``average:H`` -> H (steps between averages, H >= 1)."""
    spec = (spec or "allreduce").strip()
    if spec == "allreduce":
        return 0
    head, _, steps = spec.partition(":")
    if head == "average" and steps.strip().isdigit() and int(steps) >= 1:
        return int(steps)
    raise ParameterError(f"--sync {spec!r}: expected allreduce or average:H (weights averaged every H steps, "
                         "H >= 1)")


def make_balancer(spec: str, n: int) -> Balancer:
    """``throughput``, ``gradient`` or ``fixed:F1,F2,...`` for ``n`` devices."""
    spec = (spec or "throughput").strip()
    if spec == "throughput":
        return ThroughputBalancer(n)
    if spec == "gradient":
        return GradientBalancer(n)
    if spec.startswith("fixed:"):
        try:
            values = [float(v) for v in spec[len("fixed:"):].split(",")]
        except ValueError:
            values = []
        if len(values) != n:
            raise ParameterError(f"--balance {spec}: expected {n} comma-separated fractions, one per device "
                                 "(e.g. fixed:0.3,0.7)")
        return FixedBalancer(values)
    raise ParameterError(f"--balance {spec!r}: expected throughput, gradient or fixed:F1,F2,...")


@dataclass
class _Replica:
    net: Any
    device: Any
    delay_per_row: float = 0.0       # simulated slowness (seconds per row, after the compute)


class DeviceGroup:
    """A step strategy over several devices (the :class:`~wavetrain.train.steps.StepStrategy`
    protocol): one replica per device, the batch split by a :class:`Balancer`, the gradients
    weighted by rows and added.

    Parameters
    ----------
    net : torch.nn.Module
    devices : list of torch.device
        One replica each (``cpu`` twice is two CPU replicas).
    balancer : Balancer
    delays : list of float, optional
        Seconds per row each device sleeps after its compute (simulated devices, for tests and
        benchmarks).
    sync : str
        ``allreduce`` (default): every step's gradients added, one update. ``average:H``: after
        ``H`` warm-up steps of that, every replica updates on its own rows (its own optimiser) and
        the weights are averaged, weighted by rows, every ``H`` steps (and whenever the weights are
        read: the best weights, a checkpoint, the end) — the speech-DNN trainer's scheme.
    optimizer, lr, momentum, weight_decay
        As :class:`~wavetrain.train.steps.SingleDevice`.
    """

    def __init__(self, net, devices: Sequence[Any], balancer: Balancer, *, delays: Sequence[float] | None = None,
                 sync: str = "allreduce", optimizer: str = "adam", lr: float = 1e-3, momentum: float = 0.9,
                 weight_decay: float = 0.0):
        delays = list(delays or [0.0] * len(devices))
        self.replicas = [_Replica(net.to(devices[0]), devices[0], delays[0])]
        for dev, delay in zip(devices[1:], delays[1:]):
            self.replicas.append(_Replica(copy.deepcopy(net).to(dev), dev, delay))
        self.net, self.device = self.replicas[0].net, self.replicas[0].device
        self.balancer = balancer
        self.every = parse_sync(sync)                      # 0: allreduce
        self.optimizer = make_optimizer(self.net, optimizer, lr, momentum, weight_decay)
        self._own = [make_optimizer(r.net, optimizer, lr, momentum, weight_decay) for r in self.replicas[1:]] \
            if self.every else []
        self._steps, self._unsynced = 0, np.zeros(len(self.replicas))     # rows each replica took since a sync
        self._pool = ThreadPoolExecutor(max_workers=len(self.replicas), thread_name_prefix="wavetrain-device")
        self._log: list[tuple[list[int], list[float]]] = []      # per step since the last report

    # -- the step --------------------------------------------------------------------------------
    def set_lr(self, lr: float) -> None:
        for opt in [self.optimizer, *self._own]:
            for g in opt.param_groups:
                g["lr"] = lr

    def split(self, batch: int) -> list[int]:
        return split_rows(batch, self.balancer.fractions(), min_rows=1)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward of each device's rows in its own thread, then one update (or, when
        averaging, one update per replica and every ``H`` steps an average)."""
        rows = self.split(len(y))
        bounds = np.concatenate([[0], np.cumsum(rows)])
        local = bool(self.every) and self._steps >= self.every         # past the warm-up
        self._steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        jobs = [self._pool.submit(self._forward_backward, rep, x[a:b], y[a:b], len(y))
                for rep, a, b in zip(self.replicas, bounds[:-1], bounds[1:])]
        results = [j.result() for j in jobs]
        if local:
            for k, opt in enumerate([self.optimizer, *self._own]):
                if rows[k]:
                    for p in self.replicas[k].net.parameters():     # its own rows' mean gradient
                        if p.grad is not None:
                            p.grad *= len(y) / rows[k]
                    opt.step()
            self._unsynced += rows
            if self._steps % self.every == 0:
                self._average()
        else:
            self._add_gradients()
            self.optimizer.step()
            self._copy_weights()
        seconds = [s for _, s in results]
        self.balancer.observe(rows, seconds)
        self._log.append((rows, seconds))
        return float(sum(loss for loss, _ in results))

    @staticmethod
    def _forward_backward(rep: _Replica, x: np.ndarray, y: np.ndarray, batch: int) -> tuple[float, float]:
        """``(this replica's part of the batch's mean loss, compute seconds)``; its gradients are
        those of its rows' summed loss divided by the whole batch."""
        import torch
        import torch.nn.functional as F

        t0 = time.perf_counter()
        rep.net.zero_grad(set_to_none=True)
        if len(y) == 0:
            return 0.0, 0.0
        rep.net.train()
        xt = torch.from_numpy(np.ascontiguousarray(x)).to(rep.device, non_blocking=True)
        yt = torch.from_numpy(np.ascontiguousarray(y)).to(rep.device, non_blocking=True)
        loss = F.cross_entropy(rep.net(xt), yt, reduction="sum") / batch
        loss.backward()
        if rep.device.type == "cuda":
            torch.cuda.synchronize(rep.device)
        if rep.delay_per_row:
            time.sleep(rep.delay_per_row * len(y))
        return float(loss.detach()), time.perf_counter() - t0

    def _add_gradients(self) -> None:
        """The first replica's gradients become the sum over every replica's."""
        for rep in self.replicas[1:]:
            for p0, p in zip(self.net.parameters(), rep.net.parameters()):
                if p.grad is None:
                    continue
                g = p.grad.to(self.device, non_blocking=True)
                if p0.grad is None:
                    p0.grad = g.clone()
                else:
                    p0.grad += g

    def _average(self) -> None:
        """Every replica's weights (and float buffers) become their average, weighted by the rows
        each took since the last average."""
        import torch

        if not self._unsynced.any():
            return
        w = self._unsynced / self._unsynced.sum()
        with torch.no_grad():
            for tensors in zip(*[list(r.net.parameters()) + [b for b in r.net.buffers() if b.is_floating_point()]
                                 for r in self.replicas]):
                mean = sum(float(wk) * t.to(self.device) for wk, t in zip(w, tensors))
                for t in tensors:
                    t.copy_(mean.to(t.device))
        self._unsynced[:] = 0

    def _copy_weights(self) -> None:
        import torch

        with torch.no_grad():
            for rep in self.replicas[1:]:
                for p0, p in zip(self.net.parameters(), rep.net.parameters()):
                    p.copy_(p0.to(rep.device, non_blocking=True))
                for b0, b in zip(self.net.buffers(), rep.net.buffers()):
                    b.copy_(b0.to(rep.device, non_blocking=True))

    # -- the rest of the protocol -----------------------------------------------------------------
    def evaluate(self, batches) -> dict[str, float]:
        return evaluate(self.net, batches, self.device)

    def reduce_sums(self, values: np.ndarray) -> np.ndarray:
        return values

    def weights(self) -> dict:
        self._average()
        return {k: v.detach().to("cpu", copy=True) for k, v in self.net.state_dict().items()}

    def load_weights(self, state: dict) -> None:
        self.net.load_state_dict(state)
        self._copy_weights()

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.weights(), "optimizer": self.optimizer.state_dict(), "balancer": self.balancer.state(),
                "group_steps": self._steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._steps = int(state.get("group_steps", 0))
        self._copy_weights()
        self.balancer.restore(state.get("balancer") or {})

    def report(self) -> dict[str, Any]:
        """Since the last report: each device's mean share of the batch and mean compute seconds
        per step (training history fields)."""
        if not self._log:
            return {}
        rows = np.array([r for r, _ in self._log], dtype=np.float64)
        secs = np.array([s for _, s in self._log], dtype=np.float64)
        self._log.clear()
        shares = rows / np.maximum(rows.sum(axis=1, keepdims=True), 1)
        return {"device_shares": [round(float(v), 4) for v in shares.mean(axis=0)],
                "device_seconds": [round(float(v), 5) for v in secs.mean(axis=0)]}

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def ideal_speedup(rates: Sequence[float]) -> float:
    """Σr / max r: the group's best speed-up over its fastest device alone."""
    return float(sum(rates) / max(rates)) if rates and max(rates) > 0 else math.nan
