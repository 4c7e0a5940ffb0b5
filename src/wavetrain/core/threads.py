"""Single-threaded numeric defaults.

On the 2-vCPU machines wavetrain targets, two BLAS/OpenMP threads behave like one core and are
often many times slower than one thread.  Importing :mod:`wavetrain` sets the thread-count
variables to 1 unless the user already set them, before numpy/scipy/torch load their pools.
``WAVETRAIN_THREADS=N`` overrides the default.
"""
from __future__ import annotations

import os

_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
         "NUMEXPR_NUM_THREADS")


def compute_threads() -> int:
    """Number of compute threads wavetrain uses (``WAVETRAIN_THREADS``, default 1)."""
    try:
        return max(1, int(os.environ.get("WAVETRAIN_THREADS", "1")))
    except ValueError:
        return 1


def set_default_threads() -> None:
    n = str(compute_threads())
    for var in _VARS:
        os.environ.setdefault(var, n)
    # MKL (the FFT backend): no OpenMP runtime at all with one thread; with more, GNU OpenMP —
    # the runtime torch already loads — instead of a second one (Intel's libiomp5)
    os.environ.setdefault("MKL_THREADING_LAYER", "SEQUENTIAL" if n == "1" else "GNU")


def limit_torch_threads(torch) -> None:
    """Apply the thread default to an imported torch module."""
    n = compute_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set once in this process
        pass
