"""``cnn``: the Java framework's small convolutional network on 64-band log-mel grams.

Architecture (input ``(batch, 1, frames, bands)``, each window normalised by its own level, then
per band; ``T`` = ``time_bins``)::

    conv 5x5, 24 + ReLU -> max-pool 2x2
    conv 5x5, 48 + ReLU -> max-pool 2x2
    conv 5x5, 48 + ReLU -> adaptive max-pool to at most T x 8 (time x frequency)
    dense 64 + ReLU -> dropout -> dense 64 + ReLU -> dense K -> softmax

The adaptive pool makes the dense part independent of the input size. With ``time_bins=1`` (the
default) it takes the maximum of each pattern over the whole window: what the convolutions found
counts wherever in time it lies (the last convolution sees about 29 frames, 0.6 s of the default
20 ms frames), so a word said earlier, later or more slowly looks the same; the dense part then has
24,640 weights instead of the Java framework's 196,672 (``time_bins=8``: a dense input per eighth
of the window, which learns where in the training windows a sound lay). Windows are cropped or
padded to a fixed ``frames`` (see :mod:`wavetrain.models._torch_common`). torch is imported only
when a model is built.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from wavetrain.core.params import Param
from wavetrain.models._torch_common import NEURAL_PARAMS, NeuralClassifier, import_torch, input_norm_param


def build_cnn(n_features: int, n_frames: int, n_classes: int, *, dropout: float = 0.3, time_bins: int = 8):
    """The network as a ``torch.nn.Module``: ``(batch, 1, n_frames, n_features)`` -> logits ``(batch, n_classes)``;
    the last convolution's output max-pooled to at most ``time_bins`` x 8."""
    torch = import_torch()
    nn = torch.nn
    t, f = n_frames, n_features
    for _ in range(2):
        t, f = max(1, t // 2), max(1, f // 2)
    pt, pf = min(time_bins, t), min(8, f)
    pool = lambda: nn.MaxPool2d(2, ceil_mode=True)  # noqa: E731 - ceil keeps 1-frame inputs alive
    return nn.Sequential(
        nn.Conv2d(1, 24, 5, padding=2), nn.ReLU(), pool(),
        nn.Conv2d(24, 48, 5, padding=2), nn.ReLU(), pool(),
        nn.Conv2d(48, 48, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool2d((pt, pf)),
        nn.Flatten(),
        nn.Linear(48 * pt * pf, 64), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, n_classes),
    )


#: Index of the first dense layer in :func:`build_cnn`'s ``Sequential`` (its weights tell the time bins).
DENSE_LAYER = 10


class CNNClassifier(NeuralClassifier):
    """Small CNN (conv 24-48-48, dense 64-64) trained with the wavetrain trainer.

    Parameters: see ``wavetrain models`` (``param_table()``); every training setting (epochs, lr,
    schedule, stopping rules, ...) is a parameter, so ``--set epochs=5`` works.

    Examples
    --------
    >>> from wavetrain.models import build
    >>> m = build("cnn", {"epochs": 5, "lr": 0.002})
    """

    name: ClassVar[str] = "cnn"
    summary: ClassVar[str] = ("CNN conv5x5(24)-pool-conv5x5(48)-pool-conv5x5(48)-max over time-dense64-dense64 on "
                              "log-mel (torch)")
    default_features: ClassVar[str] = "logmel(bands=64)"
    hyperparams: ClassVar[tuple[Param, ...]] = NEURAL_PARAMS + (
        Param("dropout", 0.3, "dropout rate after the first dense layer", float, low=0.0, high=0.95),
        input_norm_param("level"),
        Param("time_bins", 1, "time bins the last convolution's output is max-pooled to before the dense layers: "
              "1 = the maximum over the whole window (a sound counts wherever in time it lies), 8 = the Java "
              "framework's network", int, low=1, high=64),
    )

    def __init__(self, **params: Any):
        super().__init__(**params)
        #: Whether time_bins was set (else a state loaded says it: files written before the
        #: parameter existed hold the 8-bin network).
        self._time_bins_given = "time_bins" in params

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """The family's state; without ``time_bins`` set, the time bins are those of the weights
        (a model file written before the parameter existed holds the Java framework's 8)."""
        dense = state.get(f"net.{DENSE_LAYER}.weight")
        if not self._time_bins_given and dense is not None and np.ndim(dense) == 2 and self.feature_dim_:
            f = int(self.feature_dim_)
            for _ in range(2):
                f = max(1, f // 2)
            per_bin = 48 * min(8, f)
            if np.shape(dense)[1] % per_bin == 0 and np.shape(dense)[1] >= per_bin:
                self.params["time_bins"] = int(np.shape(dense)[1] // per_bin)
        super().load_state_dict(state)

    def build_net(self, n_features: int, n_frames: int, n_classes: int):
        return build_cnn(n_features, n_frames, n_classes, dropout=self.params["dropout"],
                         time_bins=self.params["time_bins"])
