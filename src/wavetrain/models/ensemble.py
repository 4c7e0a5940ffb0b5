"""The ``ensemble`` family: several classifiers, each with its own parameters and feature spec,
trained on the same windows and combined.

Members are model specs: ``--set members=gmm,gmm-speech`` (family or preset names), or in a TOML
model spec a list of member tables, each with its own parameters::

    model = "ensemble"
    combine = "weighted"
    clip_ms = 1000
    [[members]]
    model = "gmm"
    components = 16
    features = "mfcc(coeffs=20)"
    [[members]]
    model = "cnn"
    epochs = 5
    features = "logmel(bands=64)"

A recording is decoded once for all members: the ensemble's feature spec is the combined spec of
the members' (``A + B``, see :class:`~wavetrain.features.CombinedSpec`; members with the same spec
share its columns), so the pipeline, the store, prediction and serving see one spec. Each member
sees its columns of every window (windowing, ``clip_ms`` etc., is the ensemble's). The
``features`` parameter is derived from the members, not set.

``combine``: ``mean`` (mean of the members' probabilities), ``vote`` (majority vote of the
members' predicted values; ties go to the value of highest mean probability) or ``weighted``
(vote weighted by ``weights``, else by each member's accuracy on ``valid_fraction`` of the
recordings held out from the members' training). Members whose scores are not probabilities (gmm's
mean log-likelihoods) contribute their ``predict_proba`` (a softmax over values).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.graph import DOUBLE, FLOAT, Graph
from wavetrain.core.params import Param
from wavetrain.features import CombinedSpec, FeatureSpec, combine_specs, parse_spec
from wavetrain.features.combined import part_rows
from wavetrain.features.graph import member_rows
from wavetrain.models.base import COMMON_PARAMS, UNKNOWN, Classifier, FitOptions
from wavetrain.models.passes import Executor, ScoreList
from wavetrain.models.registry import family, resolve_spec

__all__ = ["Columns", "EnsembleClassifier", "MemberAccuracy", "PartRows"]

log = logging.getLogger(__name__)

_COMMON = {p.name for p in COMMON_PARAMS}
#: Warnings given already (once a process).
_WARNED: set[str] = set()
#: Rates tried, in order, to find the parts' column widths when the rate is not known.
_RATES = (16000, 8000, 22050, 24000, 32000, 44100, 48000, 11025)


#: For a gram's row count, the rows that are a member's own frames (None: all of them).
Rows = Callable[[int], "np.ndarray | None"]
#: part_rows of the few window lengths a data set has, computed once each.
_part_rows = functools.lru_cache(maxsize=1024)(part_rows)


@dataclasses.dataclass(frozen=True)
class PartRows:
    """For a window's row count, the rows that are part ``part``'s own frames (:data:`Rows`; a
    value, not a closure, so that it pickles to the Spark executors)."""

    spec: CombinedSpec
    part: int
    rate: int

    def __call__(self, frames: int) -> np.ndarray | None:
        return _part_rows(self.spec, self.part, frames, self.rate)


@dataclasses.dataclass(frozen=True)
class Columns:
    """A member's view of a window: columns ``[start, stop)`` of the combined features and, with
    ``rows``, only the rows that are the member's own frames (a member on a coarser frame grid
    than the first member's sees each of its frames once, not repeated)."""

    start: int
    stop: int
    rows: Rows | None = None

    def __call__(self, g: np.ndarray) -> np.ndarray:
        return _cut(g, self.start, self.stop, self.rows)


def _cut(g: np.ndarray, start: int, stop: int, rows: Rows | None) -> np.ndarray:
    """Columns ``[start, stop)`` of one window's gram, and with ``rows`` only those rows."""
    r = rows(g.shape[0]) if rows is not None else None
    return np.ascontiguousarray(g[:, start:stop] if r is None else g[r, start:stop])


def _member_error(i: int, name: str, msg: str) -> ParameterError:
    return ParameterError(f"ensemble.members[{i}] ({name}): {msg}", param="members")


def _entries(value: str) -> list[Any]:
    text = value.strip()
    if text.startswith("["):
        try:
            out = json.loads(text)
        except json.JSONDecodeError as e:
            raise ParameterError(f"ensemble.members: invalid JSON list ({e})", param="members") from None
        if not isinstance(out, list):
            raise ParameterError("ensemble.members: expected a list of member tables", param="members")
        return out
    return [t.strip() for t in text.split(",")]


def build_members(value: str) -> list[Classifier]:
    """Unfitted members from ``members`` (comma-separated model names, or a JSON list of tables
    ``{"model": NAME, PARAM: VALUE, ...}``); one-line :class:`ParameterError` for a bad list."""
    entries = _entries(value)
    if len(entries) < 2:
        raise ParameterError(f"ensemble.members: an ensemble needs two or more members, got {len(entries)} "
                             f"({value.strip() or 'none'}); e.g. members=gmm,gmm-speech", param="members")
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            if not entry:
                raise ParameterError(f"ensemble.members: member {i} is empty in {value.strip()!r}; expected "
                                     "comma-separated model names such as gmm,gmm-speech", param="members")
            name, params = entry, {}
        elif isinstance(entry, dict):
            params = dict(entry)
            name = params.pop("model", None)
            if not isinstance(name, str):
                raise ParameterError(f"ensemble.members[{i}]: a member table needs model = \"NAME\" (e.g. "
                                     "\"gmm\")", param="members")
        else:
            raise ParameterError(f"ensemble.members[{i}]: expected a model name or a table, got "
                                 f"{type(entry).__name__}", param="members")
        try:
            fam, resolved = resolve_spec(name, params)
        except UserError as e:
            raise _member_error(i, name, str(e)) from None
        cls = family(fam)
        if cls is EnsembleClassifier:
            raise _member_error(i, name, "an ensemble cannot be a member; list its members instead")
        if cls.detector:
            raise _member_error(i, name, f"{fam} is an anomaly detector; members must be classifiers")
        shared = sorted(_COMMON & set(params))
        if shared:
            raise _member_error(i, name, f"{shared[0]} is the ensemble's (windowing is shared by all "
                                         "members); set it on the ensemble")
        try:
            member = cls(**resolved)
        except UserError as e:
            raise _member_error(i, name, str(e)) from None
        refusal = member.member_refusal()
        if refusal:
            raise _member_error(i, name, refusal)
        out.append(member)
    return out


def _member_table(m: Classifier) -> dict[str, Any]:
    return {"model": m.name, **{k: v for k, v in m.get_params().items() if k not in _COMMON}}




@dataclasses.dataclass
class MemberAccuracy:
    """A pass: windows each member predicts right, and windows (the last entry), summed."""

    model: Any

    def new(self) -> np.ndarray:
        return np.zeros(len(self.model.members_) + 1)

    def add(self, state: np.ndarray, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> np.ndarray:
        for i, p in enumerate(self.model._member_probas(grams)):
            state[i] += int((p.argmax(axis=1) == ys).sum())
        state[-1] += len(ys)
        return state

    def merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b


class EnsembleClassifier(Classifier):
    """Members trained on the same windows (each on its own features), combined by mean
    probability, majority vote or weighted vote."""

    name = "ensemble"
    learns_by = "members"
    #: Members learn on the executor they are given (each its own way).
    any_executor = True
    summary = ("several classifiers (members=gmm,cnn or member tables in a TOML spec), each with its own "
               "features from one decode, combined by mean probability, vote or weighted vote")
    default_features = ""
    hyperparams = (
        Param("members", "gmm,gmm-speech", "member model specs: comma-separated model names, or in a TOML "
              "model spec a list of [[members]] tables with model = NAME and that model's parameters", str),
        Param("combine", "mean", "mean = mean probability; vote = majority vote of the members' values; "
              "weighted = vote weighted by weights (else by each member's validation accuracy)", str,
              choices=("mean", "vote", "weighted")),
        Param("weights", None, "combine=weighted: comma-separated weights, one per member (none = each "
              "member's accuracy on the held-out valid_fraction)", str, optional=True),
        Param("valid_fraction", 0.2, "combine=weighted without weights: fraction of recordings held out from "
              "the members' training to measure their accuracy", float, low=0.0, low_open=True, high=0.9),
        Param("seed", 0, "random seed of the held-out split", int, low=0),
        Param("unknown_fpr", None, "answer 'unknown' for windows whose combined top probability is below all but "
              "this share of the held-out valid_fraction's windows (e.g. 0.05; none = never)", float, low=0,
              high=0.5, optional=True),
    )

    def __init__(self, **params: Any):
        params = dict(params)
        members = params.get("members")
        if isinstance(members, (list, tuple)):   # a TOML list of tables or names
            params["members"] = json.dumps(list(members))
        given = params.pop("features", None)
        super().__init__(**params)
        self.members_: list[Classifier] = build_members(self.params["members"])
        #: Windows whose combined top probability is below it are ``unknown`` (NaN: never).
        self.unknown_threshold_ = float("nan")
        # canonical: every member's resolved parameters (a preset becomes its family and values)
        self.params["members"] = json.dumps([_member_table(m) for m in self.members_], sort_keys=True)
        specs: list[FeatureSpec] = []
        self.member_parts_: list[int] = []
        for m in self.members_:
            s = m.feature_spec
            if isinstance(s, CombinedSpec):
                raise ParameterError(f"ensemble.members: {m.name}'s features are a combined spec ({s}); give "
                                     "each member one spec", param="members")
            if s not in specs:
                specs.append(s)
            self.member_parts_.append(specs.index(s))
        # the heavy modules the members import (an instance's: they depend on the members)
        imports = tuple(dict.fromkeys(x for m in self.members_ for x in m.runtime_imports))
        setattr(self, "runtime_imports", imports)  # noqa: B010  (a ClassVar elsewhere; per instance here)
        self._spec = combine_specs(specs)
        self._parts = list(self._spec.parts) if isinstance(self._spec, CombinedSpec) else [self._spec]
        #: Members on a coarser frame grid see their own frames (model files written before that
        #: was so fed them the aligned rows, and keep doing so).
        self.own_frames_ = True
        derived = str(self._spec)
        if given not in (None, "") and (not isinstance(given, str) or _parse_or_none(given) != self._spec):
            raise ParameterError(f"ensemble.features is derived from the members' feature specs ({derived}); "
                                 "set each member's features instead (a [[members]] table in a TOML model "
                                 "spec)", param="features")
        self.params["features"] = derived
        weights = self.params["weights"]
        self._given_weights: np.ndarray | None = None
        if weights is not None:
            if self.params["combine"] != "weighted":
                raise ParameterError(f"ensemble.weights is used only with combine=weighted (combine="
                                     f"{self.params['combine']})", param="weights")
            try:
                w = np.array([float(v) for v in weights.split(",")], dtype=np.float64)
            except ValueError:
                raise ParameterError(f"ensemble.weights: expected comma-separated numbers, got {weights!r}",
                                     param="weights") from None
            if len(w) != len(self.members_) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
                raise ParameterError(f"ensemble.weights: expected {len(self.members_)} non-negative numbers "
                                     f"(one per member, not all 0), got {weights!r}", param="weights")
            self._given_weights = w
        #: Combine weights per member (ones for mean and vote).
        self.weights_: np.ndarray = np.ones(len(self.members_))
        #: Columns ``[start, stop)`` of each member in the combined features.
        self.columns_: np.ndarray | None = None

    def members(self) -> list[Classifier]:
        """Its member models."""
        return list(self.members_)

    @classmethod
    def param_table(cls) -> tuple[Param, ...]:
        table = super().param_table()
        feats = Param("features", "", "derived: the members' feature specs joined by '+' (set each member's "
                      "features, not this)", str)
        return (feats,) + table[1:]

    @property
    def feature_spec(self) -> FeatureSpec:
        return self._spec

    # -- columns ---------------------------------------------------------------------------------
    def _columns(self, rate: int | None, channels: int | None, total: int) -> np.ndarray:
        """``(members, 2)`` column ranges for features of width ``total`` at ``rate``."""
        ch = channels or 1
        for r in ([rate] if rate else []) + [self._spec.rate or 0] + list(_RATES):
            if not r:
                continue
            dims = [p.feature_dim(int(r), channels=ch) for p in self._parts]
            if sum(dims) == total or rate:
                break
        if sum(dims) != total:
            raise UserError(f"ensemble: windows have {total} features, but the members' specs give "
                            f"{' + '.join(map(str, dims))} = {sum(dims)}")
        starts = np.cumsum([0, *dims])
        return np.array([[starts[k], starts[k + 1]] for k in self.member_parts_], dtype=np.int64)

    # -- fitting ---------------------------------------------------------------------------------
    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """Each member learns its own way on its columns of the executor's windows (its
        :meth:`~wavetrain.models.base.Classifier.learn`), so an ensemble runs wherever its members
        do; the combine weights and ``unknown_fpr`` come from passes over the held-out part."""
        t0 = time.perf_counter()
        self.columns_ = cols = self._columns(data.rate, data.channels, int(data.feature_dim))
        member_options = dataclasses.replace(options, checkpoint=None, resume=None)
        auto = self.params["combine"] == "weighted" and self._given_weights is None
        unknown = self.params["unknown_fpr"] is not None
        train = data
        if (auto or unknown) and valid is None:
            parts = data.split(self.params["valid_fraction"], self.params["seed"], options.group_by)
            if parts is None:
                raise UserError("ensemble: combine=weighted without weights= and unknown_fpr measure the members "
                                "on held-out recordings, and this data cannot hold any out")
            train, valid = parts
        self._warn_finer_members(data.rate)
        infos: list[dict] = []
        self.history_ = []
        for i, m in enumerate(self.members_):
            a, b = (int(v) for v in cols[i])
            t1 = time.perf_counter()
            view = Columns(a, b, self._member_rows(i, data.rate))
            m.learn(train.view(view, b - a), None if valid is None else valid.view(view, b - a), member_options)
            m.label_name_ = self.label_name_
            infos.append({"model": m.name, "fit_seconds": round(time.perf_counter() - t1, 3),
                          **{k: v for k, v in m.train_info_.items() if isinstance(v, (int, float, str))}})
            self.history_.extend(dict(h, member=i) for h in m.history_)
        if self._given_weights is not None:
            self.weights_ = self._given_weights.copy()
        elif auto:
            assert valid is not None
            acc = self._accuracies(valid)
            self.weights_ = np.maximum(acc, 1e-3)  # a member right nowhere still breaks ties
            for info, a_ in zip(infos, acc):
                info["valid_accuracy"] = round(float(a_), 4)
        else:
            self.weights_ = np.ones(len(self.members_))
        self.train_info_ = {"members": infos, "weights": [round(float(w), 4) for w in self.weights_],
                            "fit_seconds": round(time.perf_counter() - t0, 3)}
        if unknown:
            assert valid is not None
            top = valid.run(ScoreList(self, of="top_probability")).scores()
            if top.size == 0:
                raise UserError("ensemble: no held-out windows to calibrate unknown_fpr on")
            self.unknown_threshold_ = float(np.quantile(top, self.params["unknown_fpr"]))
            self.train_info_["unknown_threshold"] = self.unknown_threshold_

    def top_probability(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """The combined top probability of each window (what ``unknown_fpr`` is calibrated on)."""
        return self._combined(grams)[0].max(axis=1)

    def _shifts(self, i: int, rate: int | None) -> tuple[float, float]:
        """Frame shifts in seconds of the first member's part and of member ``i``'s."""
        rate = rate or self._spec.rate or 16000
        return self._parts[0].frame_shift_s(rate), self._parts[self.member_parts_[i]].frame_shift_s(rate)

    def _warn_finer_members(self, rate: int | None) -> None:
        """Warn (once a process) of members whose frames are finer than the first member's: the
        alignment gives them only the frames nearest to the first's."""
        for i, m in enumerate(self.members_):
            shift0, shift = self._shifts(i, rate)
            if shift >= shift0 - 1e-9:
                continue
            part0, part = self._parts[0].name, self._parts[self.member_parts_[i]].name
            msg = (f"ensemble: member {i + 1} ({m.name}, {part} every {shift * 1e3:.1f} ms) has finer frames than "
                   f"the first member ({part0} every {shift0 * 1e3:.1f} ms) and sees only the frames nearest to the "
                   "first's; list the member with the finest frames first")
            if msg not in _WARNED:
                _WARNED.add(msg)
                log.warning("%s", msg)

    def _frame_share(self, i: int) -> float:
        """The share of a window's rows that are member ``i``'s own frames (1, or the first
        member's frame shift over its coarser one)."""
        if self.member_parts_[i] == 0 or not self.own_frames_:
            return 1.0
        shift0, shift = self._shifts(i, None)
        return min(1.0, shift0 / shift)

    def _accuracies(self, valid: Executor) -> np.ndarray:
        """Each member's accuracy on the labelled windows of ``valid`` (one pass)."""
        right = valid.run(MemberAccuracy(self))
        if right[-1] == 0:
            raise UserError("ensemble: the held-out recordings have no labelled windows to weigh the members "
                            "by; give weights=W1,W2,... or more data")
        return right[:-1] / right[-1]

    # -- prediction ------------------------------------------------------------------------------
    def _member_probas(self, grams: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self.columns_ is None:
            self.check_is_fitted()
            raise UserError("ensemble: member columns unknown; fit the model or load a model file")
        out = []
        for i, (m, (a, b)) in enumerate(zip(self.members_, self.columns_)):
            rows = self._member_rows(i, self.feature_rate_)
            out.append(m.predict_proba([_cut(g, int(a), int(b), rows) for g in grams]))
        return out

    def _member_rows(self, i: int, rate: int | None) -> Rows | None:
        """Member ``i``'s rows of a window's gram (see :func:`~wavetrain.features.combined.part_rows`:
        each of its frames once when its frame grid is coarser than the first member's); None
        when they are all its own, or the rate is unknown."""
        k = self.member_parts_[i]
        rate = rate or self._spec.rate
        if k == 0 or not rate or not isinstance(self._spec, CombinedSpec) or not self.own_frames_:
            return None
        return PartRows(self._spec, k, int(rate))

    def _combined(self, grams: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """``(combined probabilities, mean probabilities, each member's)``."""
        self._check_grams(grams)
        probas = self._member_probas(grams)
        mean = np.mean(probas, axis=0)
        if self.params["combine"] == "mean":
            return mean, mean, probas
        w = self.weights_ / self.weights_.sum()
        votes = np.zeros_like(mean)
        rows = np.arange(len(mean))
        for wi, p in zip(w, probas):
            votes[rows, p.argmax(axis=1)] += wi
        return votes, mean, probas

    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """``mean``: mean of the members' probabilities; ``vote``/``weighted``: the (weighted)
        fraction of members voting for each value."""
        return self._combined(grams)[0]

    def predict_with_proba(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
        names, p, _ = self._predict(grams)
        return names, p

    def _predict(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, list[np.ndarray]]:
        p, mean, probas = self._combined(grams)
        # ties of a vote go to the value of highest mean probability
        best = np.where(p >= p.max(axis=1, keepdims=True) - 1e-12, mean, -np.inf).argmax(axis=1)
        labels = self.fitted_labels
        names = [labels[i] for i in best]
        if np.isfinite(self.unknown_threshold_):
            names = [UNKNOWN if top < self.unknown_threshold_ else v for v, top in zip(names, p.max(axis=1))]
        return names, p, [q.argmax(axis=1) == best for q in probas]

    def predict_scores(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """Values, the combined probabilities, and ``agreement``: the fraction of members whose own
        prediction is the ensemble's."""
        names, p, agree = self._predict(grams)
        return names, p, {"agreement": np.mean(agree, axis=0).astype(np.float64)}

    # -- export ----------------------------------------------------------------------------------
    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        """Nodes of :meth:`predict_scores` for one window: each member's probabilities on its
        columns (and own rows) of the combined features, combined; ``agreement`` too."""
        if self.columns_ is None:
            raise UserError("ensemble: member columns unknown; fit the model or load a model file")
        rate = int(self._spec.rate or self.feature_rate_ or 0)
        probas = []
        for i, (m, (a, b)) in enumerate(zip(self.members_, self.columns_)):
            with g.scope(f"member{i}"):
                x = g.op("Slice", gram, g.i64(int(a)), g.i64(int(b)), g.i64(1))
                if self._member_rows(i, rate) is not None:
                    rows = member_rows(g, cast(CombinedSpec, self._spec), self.member_parts_[i], g.dim(gram, 0), rate)
                    if rows is not None:
                        x = g.op("Gather", x, rows, axis=0)
                probas.append(g.op("Unsqueeze", m.graph_proba(g, x), g.i64(0)))
        stacked = g.op("Concat", *probas, axis=0)                          # (members, labels)
        mean = g.reduce("ReduceMean", stacked, [0], keepdims=False)
        picks = g.op("ArgMax", stacked, axis=1, keepdims=0)                # (members,)
        nl = len(self.fitted_labels)
        if self.params["combine"] == "mean":
            p = mean
        else:
            w = (self.weights_ / self.weights_.sum())[:, None]
            p = g.reduce("ReduceSum", g.op("Mul", g.op("Gather", g.const(np.eye(nl)), picks), g.const(w)), [0],
                         keepdims=False)
        # ties of a vote go to the value of highest mean probability
        top = g.op("GreaterOrEqual", p, g.op("Sub", g.reduce("ReduceMax", p, [0]), g.const(np.float64(1e-12))))
        best = g.op("ArgMax", g.op("Where", top, mean, g.const(np.float64(-np.inf))), axis=0, keepdims=1)
        agree = g.reduce("ReduceMean", g.cast(g.op("Equal", picks, best), DOUBLE), [0])
        return {"scores": g.cast(p, FLOAT), "best": best, "agreement": g.cast(agree, FLOAT)}

    def unknown_rule(self) -> dict[str, Any] | None:
        t = self.unknown_threshold_
        return {"rule": "top_below", "value": float(t)} if np.isfinite(t) else None

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        assert self.columns_ is not None
        out = {"columns": self.columns_, "weights": self.weights_, "own_frames": np.array([int(self.own_frames_)])}
        if np.isfinite(self.unknown_threshold_):
            out["unknown_threshold"] = np.array([self.unknown_threshold_])
        for i, m in enumerate(self.members_):
            out.update({f"m{i}.{k}": v for k, v in m.state_dict().items()})
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        n = len(self.members_)
        cols = np.asarray(state["columns"], dtype=np.int64)
        weights = np.asarray(state["weights"], dtype=np.float64)
        if cols.shape != (n, 2) or weights.shape != (n,):
            raise ParameterError(f"ensemble: columns/weights have shapes {cols.shape}/{weights.shape}, expected "
                                 f"({n}, 2)/({n},) for {n} members")
        if (cols[:, 0] < 0).any() or (cols[:, 1] <= cols[:, 0]).any() or (cols[:, 1] > (self.feature_dim_ or 0)).any():
            raise ParameterError(f"ensemble: member columns {cols.tolist()} do not fit {self.feature_dim_} features")
        if self.feature_rate_ and cols.tolist() != self._columns(self.feature_rate_, self.channels_,
                                                                  int(self.feature_dim_ or 0)).tolist():
            raise ParameterError(f"ensemble: member columns {cols.tolist()} are not the members' features' columns")
        if not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
            raise ParameterError(f"ensemble: member weights {weights.tolist()} must be non-negative, not all 0")
        for i, m in enumerate(self.members_):
            prefix = f"m{i}."
            m.labels_ = list(self.labels_ or [])
            m.label_name_ = self.label_name_
            m.feature_dim_ = int(cols[i, 1] - cols[i, 0])
            m.feature_rate_, m.channels_ = self.feature_rate_, self.channels_
            m.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        self.columns_, self.weights_ = cols, weights
        self.own_frames_ = bool(np.asarray(state.get("own_frames", [0])).reshape(-1)[0])
        self.unknown_threshold_ = float(np.asarray(state.get("unknown_threshold", [np.nan])).reshape(-1)[0])

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """Members train one after another: the largest member's training memory (plus the copy of
        its columns of a batch; a member on a coarser frame grid counts its own frames) with the
        other members' state."""
        try:
            cols = self._columns(None, None, feature_dim)
        except UserError:       # per-axis channels or an unusual rate: split the width evenly
            step = max(1, feature_dim // len(self.members_))
            cols = np.array([[i * step, (i + 1) * step] for i in range(len(self.members_))])
        dims = [int(b - a) for a, b in cols]
        train = []
        for i, (m, d) in enumerate(zip(self.members_, dims)):
            r = self._frame_share(i)     # a member on a coarser grid sees fewer frames
            train.append(m.memory_estimate(d, n_labels, int(batch_frames * r), int(total_frames * r),
                                           max(1, int(window_frames * r))) + batch_frames * d * 4)
        state = [m.memory_estimate(d, n_labels, 0, 0, 0) for m, d in zip(self.members_, dims)]
        total_state = sum(state)
        return int(max(t + total_state - s for t, s in zip(train, state)))


def _parse_or_none(text: str) -> FeatureSpec | None:
    try:
        return parse_spec(text)
    except UserError:
        return None
