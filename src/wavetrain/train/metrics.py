"""Validation metrics from confidences: top-1, top-k accuracy and macro-F1 (numpy only)."""
from __future__ import annotations

import numpy as np


def topk_accuracy(proba: np.ndarray, y: np.ndarray, k: int) -> float:
    """Fraction of rows of ``proba`` [shape=(n, K)] whose true class ``y`` is among the top ``k``."""
    k = min(k, proba.shape[1])
    top = np.argpartition(-proba, k - 1, axis=1)[:, :k]
    return float((top == y[:, None]).any(axis=1).mean())


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Unweighted mean F1 over the classes present in ``y_true`` or ``y_pred``."""
    classes = np.union1d(y_true, y_pred)
    f1 = []
    for c in classes:
        tp = np.sum((y_pred == c) & (y_true == c))
        fp = np.sum((y_pred == c) & (y_true != c))
        fn = np.sum((y_pred != c) & (y_true == c))
        f1.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1)) if f1 else 0.0
