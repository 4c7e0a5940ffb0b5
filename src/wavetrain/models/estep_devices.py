"""The GMM's E-step on a device: the kernel of the mixture passes on numpy or torch.

:func:`estep_on` gives the E-step of one :class:`~wavetrain.models.device_pool.Device`:

* ``cpu`` — the numpy E-step (:func:`~wavetrain.models.mixture.responsibilities`), its own
  buffers;
* ``cuda`` / ``cuda:N`` — the same E-step in torch float64 on that GPU (frames copied from pinned
  host memory without blocking);
* ``cpu-torch`` — the torch E-step on torch's CPU device: how the GPU code is tested without a
  GPU.

The mixture passes (:mod:`wavetrain.models.mixture_fit`) hand blocks of frames to it; the local
executor spreads them over its devices (:class:`~wavetrain.models.device_pool.DevicePool`) and
adds each block's statistics (:class:`~wavetrain.models.mixture.Stats`) in the blocks' order, so
the sum is the one a single device accumulates: with ``cpu`` devices only it is the same to the
last bit, and with torch devices it differs by rounding only (about 1e-15 relative).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from wavetrain.models.device_pool import Device, DevicePool
from wavetrain.models.mixture import _EXP_FLOOR, Stats, Workspace, responsibilities

__all__ = ["EStep", "EStepPool", "Terms", "add_into", "estep_on"]

#: ``gauss_terms`` of one mixture: W (k, 2d) and const (k,).
Terms = tuple[np.ndarray, np.ndarray]
#: A block of frames: ``[x, x²]`` (n, 2d), or the pair ``(x, x²)``.
Block = Any


def _rows(xx: Block) -> int:
    return int(xx[0].shape[0] if isinstance(xx, tuple) else xx.shape[0])


def add_into(total: Stats, st: Stats) -> None:
    """``total += st`` in place (the same additions, in the same order, as ``Stats.add``'s)."""
    total.n += st.n
    total.s += st.s
    total.ll += st.ll
    total.frames += st.frames


class _NumpyEStep:
    """The numpy E-step with its own buffers."""

    def __init__(self, k: int, d: int):
        self.k, self.d = k, d
        self.ws = Workspace(k, d)

    def prepare(self, terms: dict[int, Terms]) -> dict[int, Any]:
        return dict(terms)

    def frames(self, parts: list[np.ndarray]) -> Block:
        return self.ws.frames(parts)

    def squared(self, x: np.ndarray) -> Block:
        """``(x, x²)`` of a float64 block of frames (x² in this E-step's buffer)."""
        return x, np.multiply(x, x, out=self.ws.squares(x.shape[0]))

    def stats(self, terms: Any, xx: Block) -> Stats:
        ll, resp = responsibilities(xx, *terms, **self.ws.out(_rows(xx)))
        st = Stats(self.k, self.d)
        st.add(xx, resp, ll)
        return st

    def loglik(self, terms: Any, xx: Block) -> np.ndarray:
        return responsibilities(xx, *terms, **self.ws.out(_rows(xx)))[0]


class _TorchEStep:
    """The same E-step in torch float64 on one torch device (a GPU, or the CPU for tests)."""

    def __init__(self, device: Device, k: int, d: int):
        self.torch, self.device, self.k, self.d = device.torch, device.device, k, d

    def _put(self, a: np.ndarray) -> Any:
        """A host array on the device as float64: pinned and copied without blocking to a GPU
        (the kernels that use it are queued behind the copy on the same stream)."""
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        if self.device.type == "cuda":
            t = t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.torch.float64)

    def prepare(self, terms: dict[int, Terms]) -> dict[int, Any]:
        return {c: (self._put(w), self._put(const)) for c, (w, const) in terms.items()}

    def frames(self, parts: list[np.ndarray]) -> Block:
        x = self._put(np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0])
        return x, x * x

    def squared(self, x: np.ndarray) -> Block:
        """``(x, x²)`` of a block of frames, on the device."""
        t = self._put(x)
        return t, t * t

    def _put_block(self, xx: Block) -> Block:
        if isinstance(xx, tuple):
            return tuple(v if isinstance(v, self.torch.Tensor) else self._put(v) for v in xx)
        return xx if isinstance(xx, self.torch.Tensor) else self._put(xx)

    def _resp(self, terms: Any, xx: Block) -> tuple[Any, Any]:
        """As :func:`~wavetrain.models.mixture.responsibilities`: ll (n,), resp (k, n)."""
        w, const = terms
        if isinstance(xx, tuple):
            x, x2 = xx
            d = x.shape[1]
            a = w[:, :d] @ x.T
            a += w[:, d:] @ x2.T
        else:
            a = w @ xx.T
        a += const[:, None]
        m = a.max(dim=0).values
        a -= m
        a.clamp_(min=_EXP_FLOOR)
        a.exp_()
        total = a.sum(dim=0)
        a /= total
        return m + self.torch.log(total), a

    def stats(self, terms: Any, xx: Block) -> Stats:
        xx = self._put_block(xx)
        ll, resp = self._resp(terms, xx)
        if isinstance(xx, tuple):
            s = self.torch.cat([resp @ xx[0], resp @ xx[1]], dim=1)
        else:
            s = resp @ xx
        st = Stats(self.k, self.d)
        # .cpu() is a blocking copy (it waits for the kernels above): the host reads the sums at once
        st.n = resp.sum(dim=1).cpu().numpy()
        st.s = s.cpu().numpy()
        st.ll = float(ll.sum())
        st.frames = _rows(xx)
        return st

    def loglik(self, terms: Any, xx: Block) -> np.ndarray:
        return self._resp(terms, self._put_block(xx))[0].cpu().numpy()


#: The E-step of one device: ``prepare(terms by label)`` (the mixtures' terms on the device, once
#: a pass), ``frames(parts)`` (windows' frames as one block), ``stats(terms, block)`` and
#: ``loglik(terms, block)``.
EStep = _NumpyEStep | _TorchEStep


def estep_on(device: Device, k: int, d: int) -> EStep:
    """The E-step of mixtures of ``k`` components over ``d`` features on ``device``."""
    return _NumpyEStep(k, d) if device.torch is None else _TorchEStep(device, k, d)


def add_stats_in_order(pool: DevicePool, terms: dict[int, Terms], pieces: Iterable[Any],
                       work: Callable[[EStep, dict[int, Any], Any], Any], reduce: Callable[[Any], None],
                       k: int, d: int) -> None:
    """``reduce(work(estep, terms on its device, piece))`` for every piece, spread over ``pool``'s
    devices, in the pieces' order."""
    def setup(device: Device) -> tuple[EStep, dict[int, Any]]:
        estep = estep_on(device, k, d)
        return estep, estep.prepare(terms)

    pool.map(pieces, lambda device, ctx, piece: work(ctx[0], ctx[1], piece), reduce, setup=setup)


class EStepPool(DevicePool):
    """A :class:`~wavetrain.models.device_pool.DevicePool` that runs the E-step of one mixture of
    ``k`` components over ``d`` features on blocks of frames (what benchmarks and tests drive
    directly; a fit goes through the mixture passes)."""

    def __init__(self, devices: Sequence[str], k: int, d: int):
        super().__init__(devices)
        self.k, self.d = k, d

    def e_step(self, terms: Terms, blocks: Iterable[Block]) -> Stats:
        """Statistics of frame blocks under one mixture (as :func:`~wavetrain.models.mixture.e_step`)."""
        total = Stats(self.k, self.d)
        add_stats_in_order(self, {0: terms}, blocks, lambda e, t, xx: e.stats(t[0], xx),
                           lambda st: add_into(total, st), self.k, self.d)
        return total

    def loglik(self, terms: Terms, blocks: Iterable[Block]) -> list[np.ndarray]:
        """Frame log-likelihoods of each block under one mixture, in the blocks' order."""
        out: list[np.ndarray] = []
        add_stats_in_order(self, {0: terms}, blocks, lambda e, t, xx: e.loglik(t[0], xx), out.append, self.k, self.d)
        return out
