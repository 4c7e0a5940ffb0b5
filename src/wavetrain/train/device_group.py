"""A device group: one training step split across several devices, unequal ones included.

Each step the global batch of ``B`` windows (the same whatever the devices, so results do not
depend on the hardware) is split into ``n_k`` rows per device; every device's replica runs
forward and backward on its rows with the loss summed and divided by ``B``, so the gradients
added over the replicas are exactly the single-device gradient of the whole batch; the first
replica's optimiser steps and the others copy its weights.

How the batch is split is a :class:`Balancer`'s choice, from each device's own compute time for
its rows (measured in its thread, not the step time):

* :class:`ThroughputBalancer` (default) — each device's compute time modelled as
  ``a_k + b_k·n_k`` for ``n_k`` rows (a fixed per-step overhead and a time per row, fitted to its
  recent observations) and the shares chosen so that the predicted times are equal, each at least
  a minimum share (with no overhead: shares in proportion to the measured throughput); it reaches
  the optimum in a step or three and does not oscillate;
* :class:`GradientBalancer` — the speech-DNN trainer's finite-difference rule
  ``x ← x − γ·(T_i − T_{i−1})/(x_i − x_{i−1})`` on the first device's fraction ``x`` (two devices),
  kept to compare, with guards where it divides 0 by 0 (a probe step when the split did not move);
* :class:`FixedBalancer` — fixed fractions.

A device may be simulated (a CPU replica that sleeps a fixed time per row, and a fixed time per
step, after its compute) so that unequal devices can be tested without a GPU. A CUDA replica's
rows are copied from pinned host memory without blocking; every copy between replicas goes
through :func:`copy_to`, which blocks when a GPU's tensor comes back to the host (its gradients
into a CPU first replica, the weights into a CPU replica), as the host reads it at once.

A network with BatchNorm layers normalises over the whole batch: the replicas exchange their
statistics (:mod:`wavetrain.train.group_norm`), so its gradient is the one-device gradient too.

torch is imported only inside functions of this module.
"""
from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.train.group_norm import Exchange, attach, detach, norm_layers, set_exchange
from wavetrain.train.steps import class_weighted_loss, evaluate, make_optimizer

__all__ = ["Balancer", "DeviceGroup", "FixedBalancer", "GradientBalancer", "ThroughputBalancer", "copy_to",
           "make_balancer", "parse_sync", "split_rows"]

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

    def fractions(self, batch: int | None = None) -> list[float]:
        """The fraction of the next batch (of ``batch`` rows; None: the last one's size) each
        device gets."""
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

    def fractions(self, batch: int | None = None) -> list[float]:
        return list(self._f)

    def observe(self, rows: Sequence[int], seconds: Sequence[float]) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        pass


class ThroughputBalancer:
    """Shares that equalise each device's predicted compute time ``a_k + b_k·n_k``.

    A device's time for ``n`` rows is a fixed overhead ``a_k`` (launches, synchronisation: a small
    share under-uses a GPU) plus ``b_k`` per row. ``(a_k, b_k)`` is a least-squares line through
    the device's recent ``(rows, seconds)``, each observation weighted ``(1 − alpha)^age``; it is
    refitted only when those rows spread by at least ``spread`` of their mean (two share sizes),
    the line fits them within ``fit_tol`` and ``b_k > 0``. Otherwise ``a_k`` is kept and only the
    speed of the rest, ``n / (t − a_k)`` rows per second, is averaged (weight ``alpha`` for the
    newest): at first ``a_k = 0``, which is the pure-rate rule (shares in proportion to rows per
    second). A device whose share has not yet spread that much by its second step is probed: its
    share moves by ``2·spread`` for a step (up to ``probes`` times) so that its line can be fitted. A
    time that differs by more than ``change`` from the last one at the same share is a change of
    the device (slowed, sped up): its history is dropped.

    The shares solve ``Σ_k (T − a_k)/b_k = B`` for the common time ``T``, each at least
    ``min_share`` of the batch. ``linear=False`` keeps ``a_k = 0`` (the pure-rate rule, to compare).
    """

    def __init__(self, n: int, *, alpha: float = 0.5, min_share: float = MIN_SHARE, linear: bool = True,
                 spread: float = 0.05, fit_tol: float = 0.1, change: float = 0.25, probes: int = 2):
        self.n, self.alpha, self.min_share, self.linear = n, float(alpha), float(min_share), bool(linear)
        self.spread, self.fit_tol, self.change, self.probes = float(spread), float(fit_tol), float(change), probes
        self.rate: list[float | None] = [None] * n          # rows per second of t − a
        self.overhead = [0.0] * n                            # a_k, seconds per step
        self.sums = [[0.0] * 6 for _ in range(n)]            # weighted Σw, Σwn, Σwt, Σwn², Σwnt, Σwt²
        self.last: list[tuple[int, float] | None] = [None] * n
        self.batch: int | None = None
        self.seen = [0] * n                                   # observations, fits, probes so far
        self.fitted = [0] * n
        self.probed = [0] * n
        self.probe = [0] * n                                  # the next step's probe: +1, -1 or 0

    def fractions(self, batch: int | None = None) -> list[float]:
        if any(r is None for r in self.rate):
            return [1.0 / self.n] * self.n
        big = float(batch or self.batch or 1)
        r = np.asarray(self.rate, dtype=np.float64)
        a = np.asarray(self.overhead, dtype=np.float64)
        floor = self.min_share * big
        rows = np.full(self.n, floor)
        free = np.ones(self.n, dtype=bool)
        while free.any():                          # T from the free devices; the rest hold the floor
            t = (big - floor * (~free).sum() + (a[free] * r[free]).sum()) / r[free].sum()
            rows[free] = (t - a[free]) * r[free]
            low = free & (rows < floor)
            if not low.any():
                break
            rows[low], free[low] = floor, False
        if any(self.probe):
            rows = rows * (1.0 + 2 * self.spread * np.asarray(self.probe, dtype=np.float64))
        f = rows / rows.sum()
        return [float(v) for v in f]

    def observe(self, rows: Sequence[int], seconds: Sequence[float]) -> None:
        total = int(sum(rows))
        if total > 0:
            self.batch = total
        for k, (n, s) in enumerate(zip(rows, seconds)):
            if n > 0 and s > 0:
                self._observe(k, int(n), float(s))
        self.probe = [0] * self.n
        if self.linear:
            want = [k for k in range(self.n)
                    if self.seen[k] >= 2 and not self.fitted[k] and self.probed[k] < self.probes]
            for i, k in enumerate(want):
                self.probe[k] = 1 if i % 2 == 0 else -1
                self.probed[k] += 1
            if len(want) == 1:                  # moved against the others, which all move with it
                self.probe = [-self.probe[want[0]] if j != want[0] else self.probe[j] for j in range(self.n)]

    def _observe(self, k: int, n: int, s: float) -> None:
        last, self.last[k] = self.last[k], (n, s)
        if last is not None and last[0] == n and abs(s - last[1]) > self.change * last[1]:
            self.sums[k] = [0.0] * 6                          # the device changed: its history goes
            self.rate[k] = None
        w = self.sums[k]
        for i in range(6):
            w[i] *= 1.0 - self.alpha
        for i, v in enumerate((1.0, n, s, n * n, n * s, s * s)):
            w[i] += v
        self.seen[k] += 1
        fit = self._fit(k) if self.linear else None
        if fit is not None:
            self.overhead[k], self.rate[k] = fit[0], 1.0 / fit[1]
            self.fitted[k] += 1
            return
        a = self.overhead[k] = min(self.overhead[k], 0.99 * s)  # never all of a time it beat
        new = n / (s - a)
        old = self.rate[k]
        self.rate[k] = new if old is None else (1 - self.alpha) * old + self.alpha * new

    def _fit(self, k: int) -> tuple[float, float] | None:
        """``(a, b)`` of the weighted least-squares line through device k's observations, or None
        when its rows do not spread enough, the line does not fit them or is not increasing."""
        w0, wn, wt, wnn, wnt, wtt = self.sums[k]
        mn, mt = wn / w0, wt / w0
        var = max(wnn / w0 - mn * mn, 0.0)
        if var < (self.spread * mn) ** 2:
            return None
        b = (wnt / w0 - mn * mt) / var
        if b <= 0:
            return None
        a = mt - b * mn
        if a < 0:                                   # no negative overhead: the line through 0
            a, b = 0.0, wnt / wnn
        resid = wtt / w0 - 2 * (a * mt + b * wnt / w0) + a * a + 2 * a * b * mn + b * b * wnn / w0
        if max(resid, 0.0) > (self.fit_tol * mt) ** 2 or a >= mt:
            return None
        return a, b

    def state(self) -> dict[str, Any]:
        return {"rate": list(self.rate), "overhead": list(self.overhead), "sums": [list(w) for w in self.sums],
                "last": [list(v) if v is not None else None for v in self.last], "batch": self.batch,
                "seen": list(self.seen), "fitted": list(self.fitted), "probed": list(self.probed),
                "probe": list(self.probe)}

    def restore(self, state: dict[str, Any]) -> None:
        self.rate = list(state.get("rate", self.rate))
        self.overhead = [float(v) for v in state.get("overhead", self.overhead)]
        self.sums = [[float(x) for x in w] for w in state.get("sums", self.sums)]
        self.last = [(int(v[0]), float(v[1])) if v is not None else None for v in state.get("last", self.last)]
        self.batch = state.get("batch", self.batch)
        for key in ("seen", "fitted", "probed", "probe"):
            setattr(self, key, [int(v) for v in state.get(key, getattr(self, key))])


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

    def fractions(self, batch: int | None = None) -> list[float]:
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
    delay_per_step: float = 0.0      # simulated fixed overhead (seconds per step with rows)
    class_weights: Any = None        # loss weight per class, on this device (None: 1)


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
    overheads : list of float, optional
        Seconds each device sleeps once per step in which it has rows (a simulated fixed per-step
        cost, such as a GPU's launches and synchronisation).
    sync : str
        ``allreduce`` (default): every step's gradients added, one update. ``average:H``: after
        ``H`` warm-up steps of that, every replica updates on its own rows (its own optimiser) and
        the weights are averaged, weighted by rows, every ``H`` steps and at the end — the
        speech-DNN trainer's scheme. Weights read in between (the best weights, a checkpoint) are
        that average, the replicas left as they are; a checkpoint keeps every replica's weights
        and optimiser, so a resumed run goes on as an uninterrupted one.
    optimizer, lr, momentum, weight_decay, class_weights
        As :class:`~wavetrain.train.steps.SingleDevice`.
    """

    def __init__(self, net, devices: Sequence[Any], balancer: Balancer, *, delays: Sequence[float] | None = None,
                 overheads: Sequence[float] | None = None, sync: str = "allreduce", optimizer: str = "adam",
                 lr: float = 1e-3, momentum: float = 0.9, weight_decay: float = 0.0, class_weights=None):
        import torch

        cuda = [d.index or 0 for d in devices if d.type == "cuda"]        # (cuda is cuda:0)
        if norm_layers(net) and len(devices) > 1 and len(set(cuda)) < len(cuda):
            # a GPU's backward runs on one autograd thread: two replicas there could not exchange
            raise ParameterError("--devices: a network with batch-norm layers needs each GPU once in a device group "
                                 f"(got {','.join(str(d) for d in devices)})")
        delays = list(delays or [0.0] * len(devices))
        overheads = list(overheads or [0.0] * len(devices))
        self.replicas = [_Replica(net.to(devices[0]), devices[0], delays[0], overheads[0])]
        for dev, delay, over in zip(devices[1:], delays[1:], overheads[1:]):
            self.replicas.append(_Replica(copy.deepcopy(net).to(dev), dev, delay, over))
        self.net, self.device = self.replicas[0].net, self.replicas[0].device
        # BatchNorm layers normalise with the whole batch's statistics (exchanged every step)
        self._norms = [attach(r.net) for r in self.replicas] if len(self.replicas) > 1 else []
        if not any(self._norms):
            self._norms = []
        for rep in self.replicas:                          # each device's copy of the loss weights
            rep.class_weights = (None if class_weights is None else
                                 torch.as_tensor(np.asarray(class_weights, np.float32), device=rep.device))
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
        return split_rows(batch, self.balancer.fractions(batch), min_rows=1)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward of each device's rows in its own thread, then one update (or, when
        averaging, one update per replica and every ``H`` steps an average)."""
        rows = self.split(len(y))
        bounds = np.concatenate([[0], np.cumsum(rows)])
        local = bool(self.every) and self._steps >= self.every         # past the warm-up
        self._steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        exchange = self._open_exchange(rows)
        try:
            jobs = [self._pool.submit(self._run, rep, x[a:b], y[a:b], len(y), exchange)
                    for rep, a, b in zip(self.replicas, bounds[:-1], bounds[1:])]
            failed = [e for e in (j.exception() for j in jobs) if e is not None]    # (waits for every job)
            if failed:      # the replica that failed, not one it released from the exchange
                raise next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)), failed[0])
            results = [j.result() for j in jobs]
        finally:
            for layers in self._norms:
                set_exchange(layers, None, 0)
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

    def _open_exchange(self, rows: Sequence[int]) -> Exchange | None:
        """With BatchNorm layers: the step's exchange among the replicas that have rows (slots in
        replica order), set on their layers."""
        if not self._norms:
            return None
        exchange = Exchange(sum(1 for r in rows if r > 0))
        slot = 0
        for layers, r in zip(self._norms, rows):
            set_exchange(layers, exchange if r > 0 else None, slot)
            slot += r > 0
        return exchange

    def _run(self, rep: _Replica, x: np.ndarray, y: np.ndarray, batch: int,
             exchange: Exchange | None) -> tuple[float, float]:
        """:meth:`_forward_backward`; a replica that fails releases the others waiting at the exchange."""
        try:
            return self._forward_backward(rep, x, y, batch)
        except BaseException:
            if exchange is not None:
                exchange.abort()
            raise

    @staticmethod
    def _forward_backward(rep: _Replica, x: np.ndarray, y: np.ndarray, batch: int) -> tuple[float, float]:
        """``(this replica's part of the batch's mean loss, compute seconds)``; its gradients are
        those of its rows' summed loss divided by the whole batch."""
        import torch

        t0 = time.perf_counter()
        rep.net.zero_grad(set_to_none=True)
        if len(y) == 0:
            return 0.0, 0.0
        rep.net.train()
        xt, yt = _to_replica(x, rep.device), _to_replica(y, rep.device)
        loss = class_weighted_loss(rep.net(xt), yt, rep.class_weights, batch)
        loss.backward()
        if rep.device.type == "cuda":
            torch.cuda.synchronize(rep.device)
        if rep.delay_per_row or rep.delay_per_step:
            time.sleep(rep.delay_per_step + rep.delay_per_row * len(y))
        return float(loss.detach()), time.perf_counter() - t0

    def _add_gradients(self) -> None:
        """The first replica's gradients become the sum over every replica's."""
        for rep in self.replicas[1:]:
            for p0, p in zip(self.net.parameters(), rep.net.parameters()):
                if p.grad is None:
                    continue
                g = copy_to(p.grad, self.device)        # read below: on the host when device 0 is the CPU
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
                mean = sum(float(wk) * copy_to(t, self.device) for wk, t in zip(w, tensors))
                for t in tensors:
                    t.copy_(copy_to(mean, t.device))
        self._unsynced[:] = 0

    def _copy_weights(self) -> None:
        import torch

        with torch.no_grad():
            for rep in self.replicas[1:]:
                for p0, p in zip(self.net.parameters(), rep.net.parameters()):
                    p.copy_(copy_to(p0, rep.device))    # a CPU replica reads them on the host at once
                for b0, b in zip(self.net.buffers(), rep.net.buffers()):
                    b.copy_(copy_to(b0, rep.device))

    # -- the rest of the protocol -----------------------------------------------------------------
    def evaluate(self, batches) -> dict[str, float]:
        return evaluate(self.net, batches, self.device)

    def reduce_sums(self, values: np.ndarray) -> np.ndarray:
        return values

    def weights(self) -> dict:
        """A CPU copy of the group's weights: the first replica's, or when averaging, the average
        the next sync would make (the replicas are left as they are: reading the weights, for the
        best ones or a checkpoint, does not change the run)."""
        states = [r.net.state_dict() for r in self.replicas]
        w = self._unsynced / self._unsynced.sum() if self._unsynced.any() else None
        out = {}
        with _no_grad():
            for k, v in states[0].items():
                if w is not None and v.is_floating_point():       # as _average computes it
                    v = sum(float(wk) * copy_to(s[k], self.device) for wk, s in zip(w, states))
                out[k] = v.detach().to("cpu", copy=True)
        return out

    def load_weights(self, state: dict) -> None:
        self.net.load_state_dict(state)
        self._copy_weights()
        self._unsynced[:] = 0

    def state_dict(self) -> dict[str, Any]:
        """Weights (as :meth:`weights`), the first optimiser, the balancer; when averaging, also
        every replica's own weights and optimiser and the rows each took since the last average
        (a resumed run goes on exactly as an uninterrupted one)."""
        state = {"net": self.weights(), "optimizer": self.optimizer.state_dict(), "balancer": self.balancer.state(),
                 "group_steps": self._steps}
        if self.every:
            state["replicas"] = [{k: v.detach().to("cpu", copy=True) for k, v in r.net.state_dict().items()}
                                 for r in self.replicas]
            state["replica_optimizers"] = [opt.state_dict() for opt in self._own]
            state["unsynced"] = [float(v) for v in self._unsynced]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._steps = int(state.get("group_steps", 0))
        self._copy_weights()
        self._unsynced[:] = 0
        replicas = state.get("replicas") or []
        if self.every and len(replicas) == len(self.replicas):
            for rep, own in zip(self.replicas, replicas):
                rep.net.load_state_dict(own)
            for opt, own in zip(self._own, state.get("replica_optimizers") or []):
                opt.load_state_dict(own)
            self._unsynced[:] = np.asarray(state.get("unsynced", self._unsynced), dtype=np.float64)
        self.balancer.restore(state.get("balancer") or {})

    def report(self) -> dict[str, Any]:
        """Since the last report: the devices (``cpu,cuda:0``), each one's mean share of the batch
        and mean compute seconds per step (training history fields)."""
        if not self._log:
            return {}
        rows = np.array([r for r, _ in self._log], dtype=np.float64)
        secs = np.array([s for _, s in self._log], dtype=np.float64)
        self._log.clear()
        shares = rows / np.maximum(rows.sum(axis=1, keepdims=True), 1)
        return {"devices": ",".join(str(r.device) for r in self.replicas),
                "device_shares": [round(float(v), 4) for v in shares.mean(axis=0)],
                "device_seconds": [round(float(v), 5) for v in secs.mean(axis=0)]}

    def close(self) -> None:
        """The end of training: when averaging, the replicas' last average (the first replica is
        the trained network); the device threads stop and every replica's BatchNorm layers are
        plain again."""
        self._average()
        self._pool.shutdown(wait=True)
        for rep in self.replicas:
            detach(rep.net)


def blocks_host(source: Any, target: Any) -> bool:
    """Whether a copy from device ``source`` to device ``target`` must block (see :func:`copy_to`):
    a copy to the host (``target`` the CPU) from a GPU."""
    return target.type == "cpu" and source.type != "cpu"


def copy_to(t: Any, device: Any) -> Any:
    """Tensor ``t`` on ``device``, safe to read there as soon as this returns.

    A copy to a GPU is queued without blocking: the kernels that read it run after it on that
    device's stream (from pageable host memory, the call returns once the bytes are staged, so the
    source may change at once). A copy from a GPU to the host is blocking: a non-blocking one
    would return a host tensor before the transfer has filled it, and the host code that reads
    it next (adding gradients into a CPU replica, loading a CPU replica's weights) would read
    whatever the pinned buffer held. A copy within the CPU is the tensor itself (or a cast).
    """
    if t.device == device:
        return t
    return t.to(device, non_blocking=not blocks_host(t.device, device))


def _no_grad():
    import torch

    return torch.no_grad()


def _to_replica(a: np.ndarray, device: Any) -> Any:
    """Rows for a replica: a CUDA replica's are copied from pinned (page-locked) host memory
    without blocking (queued on the device's current stream, before the forward pass that reads
    them; the caching host allocator keeps the pinned copy until the transfer is done); a CPU
    replica uses the array itself."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def ideal_speedup(rates: Sequence[float]) -> float:
    """Σr / max r: the group's best speed-up over its fastest device alone."""
    return float(sum(rates) / max(rates)) if rates and max(rates) > 0 else math.nan
