"""The GMM's E-step on several devices: blocks of frames handed out one at a time.

A :class:`DevicePool` runs one thread per device; each thread takes the next block of frames as
soon as it has finished the one before, so a device twice as fast takes about twice the blocks
(unequal devices balance themselves, nothing is measured in advance). Each block's statistics
(:class:`~wavetrain.models.mixture.Stats`) are added in the blocks' order, whichever device
computed them, so the sum is the one a single device accumulates: with ``cpu`` devices only it is
the same to the last bit, and with torch devices it differs by rounding only (≈1e-15 relative).

Devices:

* ``cpu`` — the numpy E-step (:func:`~wavetrain.models.mixture.responsibilities`), its own
  buffers, one BLAS thread;
* ``cuda`` / ``cuda:N`` — the same E-step in torch float64 on that GPU (frames copied from pinned
  host memory without blocking);
* ``cpu-torch`` — the torch E-step on torch's CPU device: how the GPU code is tested without a
  GPU.

torch is imported only when a torch device is asked for.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import numpy as np

from wavetrain.core.devices import check_device, select_device
from wavetrain.core.threads import compute_threads, limit_torch_threads
from wavetrain.models.mixture import _EXP_FLOOR, Stats, Workspace, responsibilities

__all__ = ["POOL_DEVICES", "DevicePool", "Terms"]

#: Device names a pool accepts.
POOL_DEVICES = ("cpu", "cpu-torch", "cuda")

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


class _NumpyWorker:
    """The numpy E-step with its own buffers."""

    def __init__(self, name: str, k: int, d: int):
        self.name, self.k, self.d = name, k, d
        self.ws = Workspace(k, d)

    def prepare(self, terms: dict[int, Terms]) -> dict[int, Any]:
        return dict(terms)

    def frames(self, parts: list[np.ndarray]) -> Block:
        return self.ws.frames(parts)

    def stats(self, terms: Any, xx: Block) -> Stats:
        ll, resp = responsibilities(xx, *terms, **self.ws.out(_rows(xx)))
        st = Stats(self.k, self.d)
        st.add(xx, resp, ll)
        return st

    def loglik(self, terms: Any, xx: Block) -> np.ndarray:
        return responsibilities(xx, *terms, **self.ws.out(_rows(xx)))[0]


class _TorchWorker:
    """The same E-step in torch float64 on one torch device (a GPU, or the CPU for tests)."""

    def __init__(self, name: str, device: Any, k: int, d: int):
        import torch

        limit_torch_threads(torch)
        self.torch, self.name, self.device, self.k, self.d = torch, name, device, k, d

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


class DevicePool:
    """One worker per device; :meth:`map` hands items out one at a time to whichever worker is
    free and reduces the results in the items' order.

    Parameters
    ----------
    devices : sequence of str
        ``cpu``, ``cpu-torch``, ``cuda`` or ``cuda:N``; a name may repeat (``cpu,cpu``: two
        numpy workers).
    k, d : int
        Components and features of the mixtures.

    Attributes
    ----------
    blocks, seconds : list
        Per device: blocks computed and seconds spent on them, over the pool's life.
    """

    def __init__(self, devices: Sequence[str], k: int, d: int):
        self.names = [check_device(name, POOL_DEVICES) for name in devices]
        if not self.names:
            raise ValueError("DevicePool: no device")
        self.workers: list[_NumpyWorker | _TorchWorker] = []
        for name in self.names:
            if name == "cpu":
                self.workers.append(_NumpyWorker(name, k, d))
            else:
                import torch

                dev = torch.device("cpu") if name == "cpu-torch" else select_device(name)
                self.workers.append(_TorchWorker(name, dev, k, d))
        self.k, self.d = k, d
        self.blocks = [0] * len(self.workers)
        self.seconds = [0.0] * len(self.workers)
        self._pool = ThreadPoolExecutor(max_workers=len(self.workers), thread_name_prefix="wavetrain-estep") \
            if len(self.workers) > 1 else None

    def map(self, terms: dict[int, Terms], items: Iterable[Any], work: Callable[[Any, dict[int, Any], Any], Any],
            reduce: Callable[[Any], None]) -> None:
        """``reduce(work(worker, prepared terms, item))`` for every item, in the items' order; the
        items are taken one at a time (under a lock: a generator is fine) by whichever worker is
        free. The first error of any worker (or of the items) is raised once every worker stopped."""
        it = iter(enumerate(items))
        lock = threading.Lock()
        done: dict[int, Any] = {}
        state = {"next": 0, "stop": False}
        errors: list[BaseException] = []

        def loop(k: int) -> None:
            worker = self.workers[k]
            try:
                prepared = worker.prepare(terms)
                while True:
                    with lock:
                        if state["stop"]:
                            return
                        try:
                            seq, item = next(it)
                        except StopIteration:
                            return
                    t0 = time.perf_counter()
                    result = work(worker, prepared, item)
                    dt = time.perf_counter() - t0
                    with lock:
                        self.blocks[k] += 1
                        self.seconds[k] += dt
                        done[seq] = result
                        while state["next"] in done:        # in order: the sum one device makes
                            reduce(done.pop(state["next"]))
                            state["next"] += 1
            except BaseException as e:          # noqa: BLE001 (re-raised by the caller's thread)
                with lock:
                    state["stop"] = True
                    errors.append(e)

        if self._pool is None:
            loop(0)
        else:
            with _one_blas_thread():
                futures = [self._pool.submit(loop, k) for k in range(len(self.workers))]
                try:
                    for f in futures:
                        f.result()
                finally:
                    state["stop"] = True
        if errors:
            raise errors[0]

    # -- the E-steps GMMClassifier runs ----------------------------------------------------------
    def e_step(self, terms: Terms, blocks: Iterable[Block]) -> Stats:
        """Statistics of frame blocks under one mixture (as :func:`~wavetrain.models.mixture.e_step`)."""
        total = Stats(self.k, self.d)
        self.map({0: terms}, blocks, lambda w, t, xx: w.stats(t[0], xx), lambda st: add_into(total, st))
        return total

    def label_stats(self, terms: dict[int, Terms], parts_by_label: Iterable[tuple[list[np.ndarray], int]],
                    stats: Sequence[Stats]) -> None:
        """Add to ``stats[c]`` the statistics of each ``(parts, c)``: windows' frames of label c."""
        def work(w, t, item):
            parts, c = item
            return c, w.stats(t[c], w.frames(parts))

        def reduce(result):
            c, st = result
            add_into(stats[c], st)

        self.map(terms, parts_by_label, work, reduce)

    def loglik(self, terms: Terms, blocks: Iterable[Block]) -> list[np.ndarray]:
        """Frame log-likelihoods of each block under one mixture, in the blocks' order."""
        out: list[np.ndarray] = []
        self.map({0: terms}, blocks, lambda w, t, xx: w.loglik(t[0], xx), out.append)
        return out

    def report(self) -> dict[str, Any]:
        """``train_info_`` fields: the devices, and blocks and seconds per device."""
        return {"device": ",".join(self.names), "device_blocks": list(self.blocks),
                "device_seconds": [round(s, 4) for s in self.seconds]}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _one_blas_thread():
    """Every numpy worker on one BLAS thread while a pass runs (the default already, unless
    ``WAVETRAIN_THREADS`` asks for more)."""
    if compute_threads() == 1:
        return nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1)
