"""Devices that share the work of a pass: pieces handed out one at a time, results folded in order.

A :class:`DevicePool` runs one thread per device; each thread takes the next piece of work as
soon as it has finished the one before, so a device twice as fast takes about twice the pieces
(unequal devices balance themselves, nothing is measured in advance). The results are reduced in
the pieces' order, whichever device computed them, so the reduction is the one a single device
makes: with ``cpu`` devices only it is the same to the last bit.

The local executor (:class:`~wavetrain.models.passes.StreamExecutor`) owns a pool when a fit
asks for devices, and spreads a pass that declares a kernel
(:class:`~wavetrain.models.passes.KernelPass`) over it; the kernel computes on the
:class:`Device` it is handed.

Devices:

* ``cpu`` — numpy (one BLAS thread while the pool runs);
* ``cuda`` / ``cuda:N`` — torch on that GPU;
* ``cpu-torch`` — torch on torch's CPU device: how the GPU code is tested without a GPU.

torch is imported only when a torch device is asked for.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

from wavetrain.core.devices import check_device, select_device
from wavetrain.core.threads import compute_threads, limit_torch_threads

__all__ = ["CPU", "POOL_DEVICES", "Device", "DevicePool"]

#: Device names a pool accepts.
POOL_DEVICES = ("cpu", "cpu-torch", "cuda")


class Device:
    """One device a kernel computes on.

    Attributes
    ----------
    name : str
        As given (``cpu``, ``cpu-torch``, ``cuda:N``).
    torch : module or None
        torch for a torch device; None for ``cpu`` (numpy).
    device : torch.device or None
        The torch device.
    """

    def __init__(self, name: str):
        self.name = check_device(name, POOL_DEVICES)
        self.torch: Any = None
        self.device: Any = None
        if self.name != "cpu":
            import torch

            limit_torch_threads(torch)
            self.torch = torch
            self.device = torch.device("cpu") if self.name == "cpu-torch" else select_device(self.name)

    def __repr__(self) -> str:
        return f"Device({self.name!r})"


#: The numpy device: where a kernel computes without a pool (and what a Spark task computes on).
CPU = Device("cpu")


class DevicePool:
    """One thread per device; :meth:`map` hands items out one at a time to whichever device is
    free and reduces the results in the items' order.

    Parameters
    ----------
    devices : sequence of str
        ``cpu``, ``cpu-torch``, ``cuda`` or ``cuda:N``; a name may repeat (``cpu,cpu``: two
        numpy threads). A name that is none of these, or a GPU torch does not see, raises
        :class:`~wavetrain.core.errors.ParameterError` here, before any work.

    Attributes
    ----------
    blocks, seconds : list
        Per device: items computed and seconds spent on them, over the pool's life.
    """

    def __init__(self, devices: Sequence[str]):
        self.devices = [Device(name) for name in devices]
        if not self.devices:
            raise ValueError("DevicePool: no device")
        self.names = [d.name for d in self.devices]
        self.blocks = [0] * len(self.devices)
        self.seconds = [0.0] * len(self.devices)
        self._pool = ThreadPoolExecutor(max_workers=len(self.devices), thread_name_prefix="wavetrain-pass") \
            if len(self.devices) > 1 else None

    def map(self, items: Iterable[Any], work: Callable[[Device, Any, Any], Any], reduce: Callable[[Any], None],
            setup: Callable[[Device], Any] | None = None) -> None:
        """``reduce(work(device, context, item))`` for every item, in the items' order; ``context``
        is ``setup(device)``, made once per device in its own thread (parameters copied to a GPU).
        The items are taken one at a time (under a lock: a generator is fine) by whichever device
        is free. The first error of any device (or of the items) is raised once every device
        stopped."""
        it = iter(enumerate(items))
        lock = threading.Lock()
        done: dict[int, Any] = {}
        state = {"next": 0, "stop": False}
        errors: list[BaseException] = []

        def loop(k: int) -> None:
            device = self.devices[k]
            try:
                context = setup(device) if setup is not None else None
                while True:
                    with lock:
                        if state["stop"]:
                            return
                        try:
                            seq, item = next(it)
                        except StopIteration:
                            return
                    t0 = time.perf_counter()
                    result = work(device, context, item)
                    dt = time.perf_counter() - t0
                    with lock:
                        self.blocks[k] += 1
                        self.seconds[k] += dt
                        done[seq] = result
                        while state["next"] in done:        # in order: the reduction one device makes
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
                futures = [self._pool.submit(loop, k) for k in range(len(self.devices))]
                try:
                    for f in futures:
                        f.result()
                finally:
                    state["stop"] = True
        if errors:
            raise errors[0]

    def report(self) -> dict[str, Any]:
        """``train_info_`` fields: the devices, and items and seconds per device."""
        return {"device": ",".join(self.names), "device_blocks": list(self.blocks),
                "device_seconds": [round(s, 4) for s in self.seconds]}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _one_blas_thread():
    """Every numpy device on one BLAS thread while a pass runs (the default already, unless
    ``WAVETRAIN_THREADS`` asks for more)."""
    if compute_threads() == 1:
        return nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1)
