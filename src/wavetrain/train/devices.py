"""Device selection: ``cpu``, ``cuda`` (or ``cuda:N``) or ``auto`` (cuda when available)."""
from __future__ import annotations

from wavetrain.errors import ParameterError

DEVICES = ("cpu", "cuda", "auto")


def select_device(name: str | None):
    """Return a ``torch.device`` for ``name``; raises :class:`ParameterError` for an unusable one."""
    import torch

    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ParameterError(f"device: expected one of cpu, cuda, auto with a usable GPU, got {name!r} but "
                                 f"torch sees no CUDA device; use device=cpu or device=auto")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise ParameterError(f"device: {name!r} does not exist ({torch.cuda.device_count()} CUDA devices)")
        return torch.device(name)
    raise ParameterError(f"device: expected one of cpu, cuda, cuda:N, auto, got {name!r}")
