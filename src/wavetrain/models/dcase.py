"""``dcase``: a DCASE-baseline-style network on 128-band log-mel grams.

Architecture (input ``(batch, 1, frames, bands)``, normalised per band)::

    conv 1x7 (along frequency), 64 + batch-norm + ReLU -> max-pool 1x4 over frequency
    conv 1xF' (all remaining bands), 128 + batch-norm + ReLU      -> (batch, 128, frames, 1)
    conv 7x1 (along time), 256 + batch-norm + ReLU
    global max-pool over time -> dense 128 + ReLU -> dropout -> dense K -> softmax

The global pooling accepts any length; training batches are cropped/padded to ``frames``
(see :mod:`wavetrain.models._torch_common`).
"""
from __future__ import annotations

from typing import ClassVar

from wavetrain.core.params import Param
from wavetrain.models._torch_common import NEURAL_PARAMS, NeuralClassifier, import_torch


def build_dcase(n_features: int, n_frames: int, n_classes: int, *, dropout: float = 0.5):
    """The network: ``(batch, 1, n_frames, n_features)`` -> logits ``(batch, n_classes)``."""
    torch = import_torch()
    nn = torch.nn
    pool_f = 4 if n_features >= 8 else 1
    f2 = max(1, n_features // pool_f)

    class GlobalMax(nn.Module):  # type: ignore[name-defined]  # (nn is imported at run time)
        def forward(self, x):  # (batch, C, T, 1) -> (batch, C)
            return x.amax(dim=(2, 3))

    return nn.Sequential(
        nn.Conv2d(1, 64, (1, 7), padding=(0, 3), bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d((1, pool_f)),
        nn.Conv2d(64, 128, (1, f2), bias=False), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 256, (7, 1), padding=(3, 0), bias=False), nn.BatchNorm2d(256), nn.ReLU(),
        GlobalMax(),
        nn.Linear(256, 128), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(128, n_classes),
    )


class DCASEClassifier(NeuralClassifier):
    """DCASE-baseline-style CNN with batch-norm and global max-pooling.

    Examples
    --------
    >>> from wavetrain.models import build
    >>> m = build("dcase", {"epochs": 5})
    """

    name: ClassVar[str] = "dcase"
    summary: ClassVar[str] = ("DCASE-style CNN conv1x7(64)-BN-pool-conv(128)-BN-conv7x1(256)-BN-globalmax-"
                              "dense128 on 128-band log-mel (torch)")
    default_features: ClassVar[str] = "logmel(bands=128)"
    activation_floats_per_cell = 260  # 64 full-resolution channels (conv, BN, ReLU) and their gradients
    hyperparams: ClassVar[tuple[Param, ...]] = NEURAL_PARAMS + (
        Param("dropout", 0.5, "dropout rate before the output layer", float, low=0.0, high=0.95),
    )

    def build_net(self, n_features: int, n_frames: int, n_classes: int):
        return build_dcase(n_features, n_frames, n_classes, dropout=self.params["dropout"])
