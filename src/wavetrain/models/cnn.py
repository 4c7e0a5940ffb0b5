"""``cnn``: the Java framework's small convolutional network on 64-band log-mel grams.

Architecture (input ``(batch, 1, frames, bands)``, normalised per band)::

    conv 5x5, 24 + ReLU -> max-pool 2x2
    conv 5x5, 48 + ReLU -> max-pool 2x2
    conv 5x5, 48 + ReLU -> adaptive max-pool to at most 8x8
    dense 64 + ReLU -> dropout -> dense 64 + ReLU -> dense K -> softmax

The adaptive pool makes the dense part independent of the input size. Windows are cropped or
padded to a fixed ``frames`` (see :mod:`wavetrain.models._torch_common`). torch is imported only
when a model is built.
"""
from __future__ import annotations

from typing import ClassVar

from wavetrain.core.params import Param
from wavetrain.models._torch_common import NEURAL_PARAMS, NeuralClassifier, import_torch, input_norm_param


def build_cnn(n_features: int, n_frames: int, n_classes: int, *, dropout: float = 0.3):
    """The network as a ``torch.nn.Module``: ``(batch, 1, n_frames, n_features)`` -> logits ``(batch, n_classes)``."""
    torch = import_torch()
    nn = torch.nn
    t, f = n_frames, n_features
    for _ in range(2):
        t, f = max(1, t // 2), max(1, f // 2)
    pt, pf = min(8, t), min(8, f)
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
    summary: ClassVar[str] = "CNN conv5x5(24)-pool-conv5x5(48)-pool-conv5x5(48)-dense64-dense64 on log-mel (torch)"
    default_features: ClassVar[str] = "logmel(bands=64)"
    hyperparams: ClassVar[tuple[Param, ...]] = NEURAL_PARAMS + (
        Param("dropout", 0.3, "dropout rate after the first dense layer", float, low=0.0, high=0.95),
        input_norm_param("level"),
    )

    def build_net(self, n_features: int, n_frames: int, n_classes: int):
        return build_cnn(n_features, n_frames, n_classes, dropout=self.params["dropout"])
