"""``rescnn``: a small residual network of depthwise-separable convolutions on log-mel grams.

Architecture (input ``(batch, 1, frames, bands)``, normalised per band; ``w`` = ``width``)::

    stem: conv 3x3, w, stride 2 + batch-norm + ReLU
    block(w -> w,   stride 2)
    block(w -> 2w,  stride 2)
    block(2w -> 4w, stride 2)
    block(4w -> 4w, stride 1)
    average pool to at most 4 x 4 (time x frequency) -> dropout -> dense K -> softmax

    block(cin -> cout, stride s):
        depthwise 3x3 (stride s) + BN + ReLU -> pointwise 1x1 to cout + BN + ReLU
        -> depthwise 3x3 + BN + ReLU -> pointwise 1x1 + BN
        (+ the input; through a strided pointwise 1x1 + BN when the shape changes) -> ReLU

With the default ``width=32`` the network has about 106 k parameters (10 classes; ``cnn`` has
290 k on 64 bands), and only the stem works at a quarter of the input resolution, the blocks at
1/16 and less, so a training step takes about a third of ``cnn``'s on one CPU core. The global
pooling accepts any length; training batches are cropped/padded to ``frames`` (see
:mod:`wavetrain.models._torch_common`).

Test-time crops
---------------
With ``tta_crops=N`` (N > 1), a window longer than the network's input (``frames``) is scored at
N evenly spaced crops, first to last frame, and the N softmax outputs are averaged; ``tta_crops=1``
scores the centre crop only, as the other neural families do. Windows no longer than ``frames``
are scored once (every crop would be the same padded window).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from wavetrain.core.graph import DOUBLE, INT64, Graph
from wavetrain.core.params import Param
from wavetrain.models._torch_common import NEURAL_PARAMS, NeuralClassifier, import_torch
from wavetrain.models.base import FitOptions
from wavetrain.stream.batches import WindowStream

#: Channel multipliers of the stem and of the four blocks, and the blocks' strides.
STEM = 1
STEM_STRIDE = 2
BLOCKS: tuple[tuple[int, int, int], ...] = ((1, 1, 2), (1, 2, 2), (2, 4, 2), (4, 4, 1))


def freq_bins(n: int) -> int:
    """Bins kept along an axis of ``n`` input cells after the blocks (1/16 of them), averaged down
    to at most 4, so that the classifier knows where in time and frequency a pattern lies."""
    for _ in range(sum(s == 2 for *_, s in BLOCKS) + 1):
        n = (n + 1) // 2
    return max(1, min(4, n))


def rescnn_parameters(n_classes: int, width: int = 32, n_features: int = 64, n_frames: int = 64) -> int:
    """Trainable parameters of :func:`build_rescnn` (independent of the input size)."""
    w = width
    n = 9 * STEM * w + 2 * STEM * w                                     # stem conv (no bias) + BN
    for a, b, s in BLOCKS:
        cin, cout = a * w, b * w
        n += 9 * cin + 2 * cin + cin * cout + 2 * cout                  # dw + BN, pw + BN
        n += 9 * cout + 2 * cout + cout * cout + 2 * cout               # dw + BN, pw + BN
        if s != 1 or cin != cout:
            n += cin * cout + 2 * cout                                  # shortcut pw + BN
    return n + BLOCKS[-1][1] * w * freq_bins(n_frames) * freq_bins(n_features) * n_classes + n_classes   # classifier


def build_rescnn(n_features: int, n_frames: int, n_classes: int, *, width: int = 32, dropout: float = 0.2):
    """The network: ``(batch, 1, n_frames, n_features)`` -> logits ``(batch, n_classes)``."""
    torch = import_torch()
    nn = torch.nn

    def bn_relu(c):
        return [nn.BatchNorm2d(c), nn.ReLU()]

    class Block(nn.Module):  # type: ignore[name-defined]  # (nn is imported at run time)
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False), *bn_relu(cin),
                nn.Conv2d(cin, cout, 1, bias=False), *bn_relu(cout),
                nn.Conv2d(cout, cout, 3, padding=1, groups=cout, bias=False), *bn_relu(cout),
                nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout),
            )
            self.short = (nn.Identity() if stride == 1 and cin == cout else
                          nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)))
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.body(x) + self.short(x))

    w = width
    tb, fb = freq_bins(n_frames), freq_bins(n_features)
    layers = [nn.Conv2d(1, STEM * w, 3, stride=STEM_STRIDE, padding=1, bias=False), *bn_relu(STEM * w)]
    layers += [Block(a * w, b * w, s) for a, b, s in BLOCKS]
    layers += [nn.AdaptiveAvgPool2d((tb, fb)), nn.Flatten(), nn.Dropout(dropout),
               nn.Linear(BLOCKS[-1][1] * w * tb * fb, n_classes)]
    return nn.Sequential(*layers)


def crop_starts(length: int, frames: int, crops: int) -> list[int]:
    """First frames of ``crops`` evenly spaced crops of ``frames`` frames from a window of
    ``length`` frames: one crop at the centre when ``crops`` is 1 or the window fits whole."""
    if length <= frames:
        return [0]
    if crops == 1:
        return [(length - frames) // 2]
    return sorted({int(s) for s in np.rint(np.linspace(0, length - frames, crops))})


class ResCNNClassifier(NeuralClassifier):
    """Small residual depthwise-separable CNN (~106 k parameters at width 32, 64 bands), optional test-time crops.

    Examples
    --------
    >>> from wavetrain.models import build
    >>> m = build("rescnn", {"epochs": 20, "width": 24, "tta_crops": 3})
    """

    name: ClassVar[str] = "rescnn"
    summary: ClassVar[str] = ("experimental: residual depthwise-separable CNN stem3x3(w)-4 blocks(w,2w,4w,4w)-"
                              "avgpool 4x4 on log-mel, ~106k parameters (torch); overfits training speakers")
    default_features: ClassVar[str] = "logmel(bands=64)"
    #: Kept for the backward pass, per input cell: every layer's output (the stem's at a quarter of
    #: the resolution, the blocks' at 1/16 and less: ~80 floats at width 32, counted with forward
    #: hooks in tests/models/test_rescnn.py) and its gradient (~160), with a margin.
    activation_floats_per_cell = 200
    hyperparams: ClassVar[tuple[Param, ...]] = NEURAL_PARAMS + (
        Param("width", 32, "channels of the stem; the blocks have 1, 2, 4 and 4 times as many", int, low=4, high=256),
        Param("dropout", 0.2, "dropout rate before the output layer", float, low=0.0, high=0.95),
        Param("tta_crops", 1, "windows longer than frames: average the softmax of this many evenly spaced crops "
              "(1 = the centre crop only)", int, low=1, high=64),
    )

    def build_net(self, n_features: int, n_frames: int, n_classes: int):
        return build_rescnn(n_features, n_frames, n_classes, width=self.params["width"],
                            dropout=self.params["dropout"])

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """The neural estimate with this network's weights (and their Adam state) instead of the
        shared 0.6 M-parameter allowance, and activations scaled with ``width``."""
        base = super().memory_estimate(feature_dim, n_labels, batch_frames, total_frames, window_frames)
        p = self.params
        frames = p["frames"] or min(max(window_frames, 1), 512)
        scale = max(1.0, p["width"] / 32)   # activations grow with the width; the declared value covers 32
        extra_acts = int(p["batch_size"] * frames * feature_dim * 4 * self.activation_floats_per_cell * (scale - 1))
        weights = 16 * rescnn_parameters(max(n_labels, 1), p["width"], feature_dim, frames)
        return base - 16 * 600_000 + weights + extra_acts

    # -- batch-norm statistics --------------------------------------------------------------------
    def fit_rank(self, stream: WindowStream, valid: WindowStream | None, options: FitOptions) -> None:
        """The neural fit, then the batch-norm statistics measured afresh over the training stream
        (see :meth:`recalibrate_batchnorm`), then ``unknown_fpr``'s threshold with them."""
        if valid is None and self.params["valid_fraction"] > 0:
            stream, valid = self._split(stream, options.group_by)
        self._defer_unknown = True
        try:
            super().fit_rank(stream, valid, options)
        finally:
            self._defer_unknown = False
        self.recalibrate_batchnorm(stream)
        self._calibrate_unknown(valid if valid is not None else stream)

    def _calibrate_unknown(self, stream: WindowStream) -> None:
        if not getattr(self, "_defer_unknown", False):
            super()._calibrate_unknown(stream)

    def recalibrate_batchnorm(self, stream: WindowStream) -> None:
        """Replace every batch-norm layer's running mean and variance by their average over one
        pass of ``stream``'s labelled windows through the final weights (in training mode, without
        gradients). The running averages kept during training trail the weights: in this deep
        stack of normalised layers the activations' variance falls while the network trains, and
        a model predicting with the trailing statistics scored 0.32 on its own training speakers
        (spoken-words-noisy) and 0.5 on a two-value toy problem it had learnt, 0.99 and 1.0 after
        this pass."""
        torch = import_torch()
        net = self.net_
        norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        if not norms:
            return
        momenta = [m.momentum for m in norms]
        before = copy.deepcopy(net.state_dict())
        for m in norms:
            m.reset_running_stats()
            m.momentum = None                       # cumulative average over the pass
        seen = 0
        try:
            net.train()
            with torch.no_grad():
                for b in stream.batches(shuffle=False, seed=0):
                    grams = [g for g, y in zip(b.grams, b.y) if y >= 0]
                    if len(grams) > 1:              # (batch-norm needs two windows in a batch)
                        net(torch.from_numpy(self.prepare(grams)))
                        seen += len(grams)
        finally:
            for m, mom in zip(norms, momenta):
                m.momentum = mom
            net.eval()
        if seen == 0:                               # nothing to measure on: keep the running averages
            net.load_state_dict(before)

    def graph_crops(self, g: Graph, gram: str) -> str:
        """The crops of :meth:`predict_proba` as a batch ``(crops, 1, frames, features)``: the
        distinct ``rint(linspace(0, T - frames, tta_crops))`` (one at the centre with one crop)."""
        k = self.params["tta_crops"]
        if k == 1:
            return super().graph_crops(g, gram)
        x = self.graph_normalised(g, gram)
        t = g.dim(x, 0)
        room = g.op("Max", g.op("Sub", t, g.i64(self.frames_)), g.i64(0))
        # (T <= frames: one crop at 0, padded; linspace of an empty range is all zeros)
        spots = g.op("Mul", g.const(np.arange(k, dtype=np.float64)),
                     g.op("Div", g.cast(room, DOUBLE), g.const(np.float64(k - 1))))
        starts = g.op("Unique", g.cast(g.op("Round", spots), INT64), sorted=1)
        idx = g.op("Add", g.op("Unsqueeze", starts, g.i64(1)), g.const(np.arange(self.frames_, dtype=np.int64)[None]))
        missing = g.op("Max", g.op("Sub", g.i64(self.frames_), t), g.i64(0))
        x = g.op("Pad", x, g.op("Concat", g.i64(0, 0), missing, g.i64(0), axis=0))
        return g.op("Unsqueeze", g.op("Gather", x, idx, axis=0), g.i64(1))

    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Confidences ``(n_windows, n_labels)``; with ``tta_crops`` > 1 the mean over crops."""
        k = self.params["tta_crops"]
        if k == 1 or len(grams) == 0:
            return super().predict_proba(grams)
        self._check_grams(grams)
        crops, owner = [], []
        for i, g in enumerate(grams):
            g = np.asarray(g)
            for s in crop_starts(g.shape[0], self.frames_, k):
                crops.append(g[s:s + self.frames_])
                owner.append(i)
        p = super().predict_proba(crops)
        idx = np.asarray(owner)
        out = np.zeros((len(grams), p.shape[1]))
        np.add.at(out, idx, p)
        return out / np.bincount(idx, minlength=len(grams))[:, None]
