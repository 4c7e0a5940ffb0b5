"""Data-set feature normaliser fitted on training data (streaming) and saved with a model."""
from __future__ import annotations

import numpy as np

from wavetrain.core.errors import NotFittedError, ParameterError

__all__ = ["DatasetNormalizer"]


class DatasetNormalizer:
    """Per-feature zero mean / unit sd, fitted by streaming over training features.

    Accumulates only the count, mean and sum of squared deviations per feature (float64,
    merged batch by batch with Chan's parallel update), so memory is ``O(features)`` however
    much data is seen.

    Parameters
    ----------
    eps : float, default=1e-8
        Floor added to the standard deviation in :meth:`transform`.

    Attributes
    ----------
    count_ : int
        Frames seen.
    mean_ : np.ndarray [shape=(features,), dtype=float64]
    var_ : np.ndarray [shape=(features,), dtype=float64]
        Population variance.

    Examples
    --------
    >>> norm = DatasetNormalizer()
    >>> for feats in [np.ones((5, 3)), np.zeros((5, 3))]:
    ...     _ = norm.partial_fit(feats)
    >>> norm.mean_
    array([0.5, 0.5, 0.5])
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps
        self.count_ = 0
        self._mean: np.ndarray | None = None
        self._m2: np.ndarray | None = None

    def partial_fit(self, feats: np.ndarray) -> DatasetNormalizer:
        """Add features of shape ``(..., features)``; returns ``self``."""
        x = np.asarray(feats)
        if x.ndim < 1 or x.shape[-1] == 0:
            raise ParameterError(f"DatasetNormalizer.partial_fit: expected (..., features), "
                                 f"got shape {x.shape}")
        x = x.reshape(-1, x.shape[-1])
        if self._mean is not None and x.shape[1] != self._mean.shape[0]:
            raise ParameterError(f"DatasetNormalizer.partial_fit: expected {self._mean.shape[0]} "
                                 f"features, got {x.shape[1]}")
        n = x.shape[0]
        if n == 0:
            return self
        if not np.isfinite(x).all():
            raise ParameterError("DatasetNormalizer.partial_fit: features contain NaN or inf")
        mean_b = x.mean(axis=0, dtype=np.float64)
        m2_b = np.square(x - mean_b, dtype=np.float64).sum(axis=0)
        if self._mean is None:
            self._mean, self._m2, self.count_ = mean_b, m2_b, n
            return self
        total = self.count_ + n
        d = mean_b - self._mean
        self._mean = self._mean + d * (n / total)
        self._m2 = self._m2 + m2_b + d * d * (self.count_ * n / total)
        self.count_ = total
        return self

    def _fitted(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, m2)``; raises NotFittedError before the first fit (both are set together)."""
        if self._mean is None or self._m2 is None:
            raise NotFittedError("DatasetNormalizer is not fitted: call partial_fit on training "
                                 "features first")
        return self._mean, self._m2

    @property
    def mean_(self) -> np.ndarray:
        mean, _ = self._fitted()
        return mean

    @property
    def var_(self) -> np.ndarray:
        _, m2 = self._fitted()
        return m2 / self.count_

    @property
    def scale_(self) -> np.ndarray:
        """Standard deviation per feature plus ``eps``."""
        return np.sqrt(self.var_) + self.eps

    def transform(self, feats: np.ndarray) -> np.ndarray:
        """``(feats - mean_) / (sd + eps)`` as float32, shape ``(..., features)`` kept."""
        mean, _ = self._fitted()
        x = np.asarray(feats)
        if x.shape[-1] != mean.shape[0]:
            raise ParameterError(f"DatasetNormalizer.transform: expected {mean.shape[0]} "
                                 f"features, got {x.shape[-1]}")
        return ((x - mean.astype(np.float32)) /
                self.scale_.astype(np.float32)).astype(np.float32, copy=False)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Arrays to save with a model: ``count``, ``mean``, ``m2``, ``eps``."""
        mean, m2 = self._fitted()
        return {"count": np.array(self.count_, dtype=np.int64), "mean": mean.copy(),
                "m2": m2.copy(), "eps": np.array(self.eps, dtype=np.float64)}

    @classmethod
    def from_state_dict(cls, state: dict[str, np.ndarray]) -> DatasetNormalizer:
        """Rebuild from :meth:`state_dict` output."""
        try:
            obj = cls(eps=float(state["eps"]))
            obj.count_ = int(state["count"])
            obj._mean = np.asarray(state["mean"], dtype=np.float64)
            obj._m2 = np.asarray(state["m2"], dtype=np.float64)
        except KeyError as exc:
            raise ParameterError(f"DatasetNormalizer state is missing {exc}") from None
        return obj
