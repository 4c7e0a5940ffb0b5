"""One device vocabulary for every command and layer.

* ``cpu`` — numpy/scipy (features) or torch on the CPU (training);
* ``cuda`` or ``cuda:N`` — a GPU through torch (feature extraction and training);
* ``auto`` — ``cuda`` when torch sees a GPU, else ``cpu`` (training; features run on the CPU);
* ``cpu-torch`` — the torch feature path on the CPU (features only: how the GPU code is tested
  without a GPU).

torch is imported only by :func:`select_device`.
"""
from __future__ import annotations

from typing import Any

from wavetrain.core.errors import ParameterError
from wavetrain.core.extras import import_extra

__all__ = ["FEATURE_DEVICES", "TRAIN_DEVICES", "check_device", "select_device"]

#: Devices of training (``--device`` of train, evaluate and classify; the neural ``device`` parameter).
TRAIN_DEVICES = ("cpu", "cuda", "auto")
#: Devices of feature extraction (``wavetrain features --device``, ``extract(device=...)``).
FEATURE_DEVICES = ("cpu", "cpu-torch", "cuda")


def check_device(name: str, allowed: tuple[str, ...]) -> str:
    """``name`` normalised (lower case) when it is one of ``allowed`` or ``cuda:N`` (where ``cuda``
    is allowed); else :class:`ParameterError`."""
    dev = str(name).strip().lower()
    if dev in allowed or ("cuda" in allowed and dev.startswith("cuda:") and dev[5:].isdigit()):
        return dev
    raise ParameterError(f"device={name!r}: expected one of {', '.join(allowed)}"
                         + (" or cuda:N" if "cuda" in allowed else ""), param="device")


def select_device(name: str | None) -> Any:
    """A ``torch.device`` for a training device name (``None``: ``auto``); a GPU that is not
    there is a :class:`ParameterError`."""
    torch = import_extra("torch", "training on a torch device (--device, --devices)")

    dev = check_device(name or "auto", TRAIN_DEVICES)
    if dev == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ParameterError(f"device={dev!r}: torch sees no CUDA device; use device=cpu or device=auto",
                             param="device")
    idx = int(dev.split(":")[1]) if ":" in dev else 0
    if idx >= torch.cuda.device_count():
        raise ParameterError(f"device={dev!r} does not exist ({torch.cuda.device_count()} CUDA devices)",
                             param="device")
    return torch.device(dev)


def parse_devices(text: str) -> tuple[str, ...]:
    """``--devices``: ``cpu,cuda:0`` (any list; ``cpu`` twice is two CPU replicas), or ``auto``:
    every usable device (the CPU and each CUDA device). Names are checked, not opened."""
    items = [d.strip().lower() for d in str(text).split(",") if d.strip()]
    if items == ["auto"]:
        torch = import_extra("torch", "--devices auto")

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return ("cpu",) + tuple(f"cuda:{i}" for i in range(n))
    if not items:
        raise ParameterError("--devices: expected a comma-separated list such as cpu,cuda:0 (or auto)")
    return tuple(check_device(d, ("cpu", "cuda")) for d in items)
