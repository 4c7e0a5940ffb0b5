"""Vocal tract length normalisation at scoring (``vtln=true``) for the families that score a
window by its log-likelihood under each value's model (``gmm``, ``hmm``).

A speaker's vocal tract length scales the frequencies of its formants; a model trained on other
speakers reads a new one better when the mel filter bank is warped to meet it. The model learns
from the unwarped features (``warp=1``). A fitted model reads its feature spec at every warp of
``vtln_warps`` side by side (:func:`~wavetrain.features.spec.warped_specs`: one decode, one frame
grid, warp 1 first), and scores each window at the warp under which its best value scores
highest: the maximum-likelihood warp, searched per window (a whole recording with ``clip_ms=0``,
as Kaldi's VTLN picks one per utterance). The chosen warp is reported per window (``warp``).

The search runs wherever the model scores (local streams, Spark tasks, a server, an exported
graph) because it is part of the model's features and scoring, not of an engine.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.core.graph import FLOAT, Graph
from wavetrain.core.params import Param
from wavetrain.features.spec import FeatureSpec, parse_spec, warped_specs

__all__ = ["VTLN_PARAMS", "WarpSearch", "parse_warps"]

#: The parameters of a family that searches warps at scoring.
VTLN_PARAMS: tuple[Param, ...] = (
    Param("vtln", False, "vocal tract length normalisation: score each window at the mel filter bank warp (of "
          "vtln_warps) under which it scores best; needs mel-family features", bool),
    Param("vtln_warps", "0.88:1.12:0.04", "the warps searched with vtln=true: LOW:HIGH:STEP, or a list such as "
          "0.9,1,1.1 (1 is always searched: the model learns from unwarped features)", str),
)


def parse_warps(text: str) -> tuple[float, ...]:
    """The warps of ``vtln_warps``: 1 first, then the others in increasing order (each in
    [0.5, 2]); ``LOW:HIGH:STEP`` or a comma-separated list. Raises :class:`ParameterError`."""
    def bad(why: str) -> ParameterError:
        return ParameterError(f"vtln_warps={text!r}: {why}; expected LOW:HIGH:STEP (e.g. 0.88:1.12:0.04) or "
                              "a list (e.g. 0.9,1,1.1)", param="vtln_warps")
    try:
        if ":" in text:
            lo, hi, step = (float(v) for v in text.split(":"))
            if step <= 0 or hi < lo:
                raise bad("HIGH must be at least LOW and STEP above 0")
            n = int(np.floor((hi - lo) / step + 1e-9)) + 1
            if n > 64:
                raise bad(f"{n} warps; at most 64")
            values = [lo + i * step for i in range(n)]
        else:
            values = [float(v) for v in text.split(",")]
    except ValueError:
        raise bad("not numbers") from None
    values = sorted({round(v, 6) for v in values} | {1.0})
    if values[0] < 0.5 or values[-1] > 2.0:
        raise bad("every warp must lie in [0.5, 2]")
    return (1.0, *(v for v in values if v != 1.0))


class WarpSearch:
    """Mixin of a :class:`~wavetrain.models.base.Classifier` whose ``_loglik(grams)`` gives the mean
    frame log-likelihood of windows under each value's model ``(n, labels)`` (higher: better) and
    whose ``graph_loglik`` writes it in ONNX: adds ``vtln`` (:data:`VTLN_PARAMS` in its table),
    the warped features of a fitted model, and the search."""

    params: dict[str, Any]
    labels_: list[str] | None
    feature_dim_: int | None

    def _check_vtln(self) -> None:
        """Refuse, when the model is built, warps it cannot search."""
        if self.params.get("vtln", False):
            warped_specs(self.params["features"], self.warps)      # raises for features without a mel bank

    @property
    def warps(self) -> tuple[float, ...]:
        """The warps searched at scoring: ``(1.0,)`` without ``vtln``."""
        return parse_warps(self.params["vtln_warps"]) if self.params.get("vtln", False) else (1.0,)

    @property
    def feature_spec(self) -> FeatureSpec:
        """The features: those of ``features`` while it learns; for a fitted model with ``vtln``,
        those at every warp side by side (warp 1 first)."""
        if not self.params.get("vtln", False) or self.labels_ is None:
            return parse_spec(self.params["features"])
        return warped_specs(self.params["features"], self.warps)

    def member_refusal(self) -> str | None:
        """A model with ``vtln`` reads more features once fitted (every warp) than it learns from."""
        if self.params.get("vtln", False):
            return "with vtln=true a fitted model reads its features at every warp; use it on its own"
        return None

    @property
    def frame_dim(self) -> int:
        """Features per frame of one warp (what the value models read)."""
        return int(self.feature_dim_ or 0) // len(self.warps)

    # -- fitting: learn unwarped, then read every warp -------------------------------------------
    def _read_warps(self) -> None:
        """Once the family learned from unwarped features: the features it reads from then on
        (every warp side by side). The last step of the family's ``_learn``."""
        self.feature_dim_ = int(self.feature_dim_ or 0) * len(self.warps)

    # -- scoring ---------------------------------------------------------------------------------
    def _loglik(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def warped_loglik(self, grams: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Mean frame log-likelihoods ``(n, labels)`` of each window at its best warp, and that
        warp ``(n,)``: the warp whose best value scores highest (the first of equals: warp 1)."""
        warps, d = self.warps, self.frame_dim
        table = np.stack([self._loglik([g[:, b * d:(b + 1) * d] for g in grams]) for b in range(len(warps))])
        chosen = table.max(axis=2).argmax(axis=0)                            # (windows,): first of equals
        return table[chosen, np.arange(len(grams))], np.asarray(warps)[chosen]

    def graph_loglik(self, g: Graph, gram: str) -> str:
        raise NotImplementedError

    def graph_warped(self, g: Graph, gram: str) -> tuple[str, str]:
        """Nodes of :meth:`warped_loglik` for one window: the scores float64 ``(labels,)`` and the
        warp float32 ``(1,)``."""
        warps = self.warps
        if len(warps) == 1:
            return self.graph_loglik(g, gram), g.const(np.ones(1, np.float32))
        d = self.frame_dim
        rows = [g.op("Unsqueeze", self.graph_loglik(g, g.op("Slice", gram, g.i64(b * d), g.i64((b + 1) * d), g.i64(1))),
                     g.i64(0)) for b in range(len(warps))]
        table = g.op("Concat", *rows, axis=0)                                 # (warps, labels)
        pick = g.op("ArgMax", g.reduce("ReduceMax", table, [1], keepdims=False), axis=0, keepdims=1)
        scores = g.op("Squeeze", g.op("Gather", table, pick, axis=0), g.i64(0))
        return scores, g.op("Gather", g.const(np.asarray(warps, np.float32)), pick)


def warp_detail(model: WarpSearch, warps: np.ndarray) -> dict[str, np.ndarray]:
    """The ``warp`` detail of predictions: the warp of each window with ``vtln``, else none."""
    return {"warp": warps} if model.params.get("vtln", False) else {}


def graph_warp_detail(model: WarpSearch, g: Graph, warp: str) -> dict[str, str]:
    """The ``warp`` output of an exported graph with ``vtln``, else none."""
    return {"warp": g.cast(warp, FLOAT)} if model.params.get("vtln", False) else {}
