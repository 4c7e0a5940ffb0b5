"""Helpers shared by the store tests (imported by name; tests/store is on sys.path)."""
from __future__ import annotations

import numpy as np

SPEC = "0123456789abcdef"
SPEC2 = "fedcba9876543210"


def rec_id(i: int) -> str:
    """A 40-hex-digit (SHA-1 sized) recording id for an integer."""
    return f"{i:040x}"


def gram(i: int, shape=(100, 64)) -> np.ndarray:
    """A deterministic float32 gram for key ``i``."""
    return np.random.default_rng(i).standard_normal(shape).astype(np.float32)
