"""An exported graph (``.onnx``, from ``wavetrain export``) loaded as a model that scores samples
through onnxruntime: ``classify -m model.onnx`` and ``serve -m model.onnx`` check the deployed
artefact with the commands that check the ``.wt`` file.

It answers as the model it was exported from: the same labels, score kind, windows, unknown rule
and detector threshold, read from the graph's metadata (:mod:`wavetrain.models.onnx_export`). Its
windows are clips of samples (:attr:`~wavetrain.models.base.Classifier.scores_samples`), cut as a
live stream's; the graph computes their features.

A graph file is a program, and one from elsewhere may be hostile. :func:`load_onnx` validates it
as :func:`~wavetrain.models.modelfile.load_model` validates a ``.wt`` file, before and after
onnxruntime opens it, and every run of it is bounded:

- the file is a regular file (never a pipe or a device) of at most :data:`MAX_GRAPH_BYTES`, read
  once; its ``ModelProto`` (read with the ``onnx`` package) holds no tensor whose data lives in
  another file (an exported graph never does: such a tensor could read any local file into the
  scores), whatever onnxruntime would allow;
- the graph's contract: one input ``audio``, float32 ``(n,)``; the outputs ``scores`` (float32),
  ``best`` (int64) and the details its metadata lists (float32), no others; the metadata's every
  field of the type and range the exporter writes, its text without control characters, its label
  values those a model may have (:func:`~wavetrain.models.base.label_values_problem`: never
  ``unknown`` for a classifier, ``anomaly`` for a detector), a detector's threshold finite;
- a probe: the graph scores a clip of silence and one of quiet noise, each a window of the model
  (a second for a model of whole recordings), into outputs of the contract's shapes, ``best``
  among the label values, every score finite;
- every run of the graph (session creation, probe, each clip) has a deadline
  (:data:`RUN_TIMEOUT_S`, or ``$WAVETRAIN_GRAPH_TIMEOUT`` seconds, plus :data:`RUN_S_PER_AUDIO_S`
  per second of audio in the clip): past it the run is stopped
  (onnxruntime's terminate flag) and raises :class:`GraphRunError`, the session usable again and
  the caller's thread free; a Ctrl-C stops it the same way;
- every run allocates from one arena of at most :func:`graph_memory_bytes` (half the machine's
  memory, or ``$WAVETRAIN_GRAPH_MEMORY``), shared by all the graphs of the process; a run that
  asks for more fails in one line; constant folding, which computes constant nodes outside the
  arena as the session is created, is on only for a graph whose constant nodes have static shapes
  that add up to at most a quarter of the bound (:data:`MAX_FOLDED_BYTES` at most): an exported
  graph's do, and it runs several times faster folded;
- a run's outputs are checked as the probe's: NaN or infinite scores are never an answer.
"""
from __future__ import annotations

import json
import math
import os
import queue
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from wavetrain.core.errors import AudioError, ModelFileError, ParameterError, UserError
from wavetrain.core.inputs import check_input_file
from wavetrain.features.graph import min_samples as feature_min_samples
from wavetrain.features.spec import parse_spec
from wavetrain.models.anomaly import ANOMALY
from wavetrain.models.base import (
    MAX_CLIP_MS,
    UNKNOWN,
    Classifier,
    control_characters,
    is_unknown,
    label_values_problem,
    plain_text,
)
from wavetrain.models.gmm import z_rule

__all__ = ["GRAPH_MEMORY_ENV", "GRAPH_TIMEOUT_ENV", "RUN_TIMEOUT_S", "GraphRunError", "OnnxModel",
           "graph_memory_bytes", "graph_timeout_s", "load_onnx"]

#: Metadata properties an exported graph must carry.
_REQUIRED = ("labels", "rate", "clip_ms", "clip_shift_ms", "pad", "frames", "min_samples", "score_kind",
             "features", "family")
#: Seconds one run of a graph (one clip, the probe, the session's creation) may take by default,
#: plus :data:`RUN_S_PER_AUDIO_S` per second of audio in the clip (an exported graph scores a second
#: of audio in a few milliseconds on one thread: a long recording of a model of whole recordings
#: gets its time).
RUN_TIMEOUT_S = 30.0
RUN_S_PER_AUDIO_S = 0.1
#: Environment variables that change the bounds: seconds per run, and bytes (``512M``, ``4G``)
#: of the arena every graph of the process allocates from.
GRAPH_TIMEOUT_ENV = "WAVETRAIN_GRAPH_TIMEOUT"
GRAPH_MEMORY_ENV = "WAVETRAIN_GRAPH_MEMORY"
#: Seconds a run that was told to stop (its deadline, a Ctrl-C) is given to stop.
STOP_GRACE_S = 2.0
#: Largest graph file (protobuf's own limit).
MAX_GRAPH_BYTES = 2 << 30
#: Most the constant nodes of a graph may fold into when its session is created (bytes; at most a
#: quarter of the memory bound too).
MAX_FOLDED_BYTES = 1 << 30
#: Longest clip the probe scores (samples), and the largest ``rate`` a graph may declare.
MAX_PROBE_SAMPLES = 1 << 22
MAX_RATE = 10_000_000
#: What ``score_kind`` may be, and the ``pad`` rules.
SCORE_KINDS = ("probability", "mean_loglik", "anomaly")
PADS = ("none", "zero", "duplicate")
#: A detail output's name (``z``, ``nearest``, ``agreement``, ``warp``...).
_DETAIL = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
#: The unknown rules a graph's metadata may hold, and their number fields.
_RULE_NUMBERS = {"top_below": ("value",), "best_below": (), "above": ("value",), "outside": ("low", "high")}

_T = TypeVar("_T")


class GraphRunError(ModelFileError):
    """A run of an exported graph that ran past its deadline, asked for more memory than the bound,
    failed, or gave outputs outside the graph's contract (NaN or infinite scores, ``best`` out of
    range, other shapes): the graph is not a working export of a wavetrain model."""


def graph_timeout_s() -> float:
    """Seconds one run of a graph may take: ``$WAVETRAIN_GRAPH_TIMEOUT``, else :data:`RUN_TIMEOUT_S`."""
    text = os.environ.get(GRAPH_TIMEOUT_ENV, "").strip()
    if not text:
        return RUN_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ParameterError(f"{GRAPH_TIMEOUT_ENV}={text!r}: expected seconds, a positive number")
    return value


def graph_memory_bytes() -> int:
    """Bytes the arena of the process's graph runs may hold: ``$WAVETRAIN_GRAPH_MEMORY`` (bytes,
    or with a suffix K, M, G, T), else half the machine's memory."""
    text = os.environ.get(GRAPH_MEMORY_ENV, "").strip()
    if not text:
        import psutil

        return int(psutil.virtual_memory().total // 2)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?", text.lower())
    value = float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " ") if m else 0.0
    if not value >= 1 << 20:
        raise ParameterError(f"{GRAPH_MEMORY_ENV}={text!r}: expected a size of at least 1M, e.g. 512M or 4G")
    return int(value)


_ARENA_LOCK = threading.Lock()
_ARENA: dict[str, int] = {}


def _arena(ort) -> int:
    """The bound of the one arena every graph session of the process allocates from (created by
    the first; ``session.use_env_allocators``)."""
    with _ARENA_LOCK:
        if "bytes" not in _ARENA:
            limit = graph_memory_bytes()
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            # (kSameAsRequested: the arena grows by what a run asks for, never by doubling past it)
            ort.create_and_register_allocator(info, ort.OrtArenaCfg({"max_mem": limit, "arena_extend_strategy": 1}))
            _ARENA["bytes"] = limit
        return _ARENA["bytes"]


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if "Status Message:" in text:            # onnxruntime: "... Status Message: <the reason>"
        text = text.split("Status Message:", 1)[1].strip()
    return (text or type(e).__name__)[:200]


def _out_of_memory(e: BaseException) -> bool:
    text = str(e)
    return any(w in text for w in ("Failed to allocate memory", "Available memory of", "bad_alloc",
                                   "bad allocation"))


class _Workers:
    """Daemon threads that run graph calls, started as more run at once and kept (a new thread per
    run would cost onnxruntime's per-thread set-up each time); a run that never stops keeps its
    thread, never the caller's, and never holds up the process's exit."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1            # (that waiting thread takes this job, or another's)
        if start:
            threading.Thread(target=self._serve, name="wavetrain-graph-run", daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


_WORKERS = _Workers()


class _Runner:
    """Runs one call of onnxruntime in a worker thread under a deadline: the caller waits for it
    (a Ctrl-C included) and gets its thread back at the deadline, the run told to stop."""

    def __init__(self, path: str, timeout_s: float, memory_bytes: int):
        self.path, self.timeout_s, self.memory_bytes = path, float(timeout_s), int(memory_bytes)
        #: Set when a run did not stop after it was told to (one kernel running on): the graph is
        #: not run again in this process.
        self.stuck = False

    def __call__(self, what: str, call: Callable[[Any], _T], options: Any = None, extra_s: float = 0.0) -> _T:
        if self.stuck:
            raise GraphRunError(f"{self.path}: an earlier run of the graph did not stop when told to; it is not "
                                "run again (restart to use it)")
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = call(options)
            except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
                box["error"] = e
            finally:
                done.set()

        _WORKERS.submit(work)
        try:
            finished = done.wait(self.timeout_s + extra_s)
        except BaseException:                   # Ctrl-C while waiting: stop the run, then go
            self._stop(options, done)
            raise
        if not finished:
            self._stop(options, done)
            raise GraphRunError(f"{self.path}: {what} took more than {self.timeout_s + extra_s:g} s and was stopped "
                                f"(a graph that never ends, or far more work than a wavetrain model's; "
                                f"${GRAPH_TIMEOUT_ENV} sets the bound)")
        if "error" in box:
            e = box["error"]
            if not isinstance(e, Exception):
                raise e
            if _out_of_memory(e):
                raise GraphRunError(f"{self.path}: {what} asked for more memory than the "
                                    f"{self.memory_bytes / 2**30:.3g} GiB graphs may use (${GRAPH_MEMORY_ENV} sets "
                                    "the bound)") from None
            raise GraphRunError(f"{self.path}: {what} failed ({_first_line(e)})") from None
        return box["value"]

    def _stop(self, options: Any, done: threading.Event) -> None:
        if options is not None:
            options.terminate = True
        try:
            if not done.wait(STOP_GRACE_S):
                self.stuck = True
        except BaseException:   # a second Ctrl-C: leave the run to the process's end
            self.stuck = True
            raise


class OnnxModel(Classifier):
    """A model exported to ONNX, scored by onnxruntime on one thread (see the module notes).

    Attributes
    ----------
    meta_ : dict
        The graph's metadata properties (strings), as exported.
    threshold_ : float
        A detector's threshold (NaN for a classifier).
    run_timeout_s : float
        Seconds one run of the graph (one clip) may take, plus :data:`RUN_S_PER_AUDIO_S` per second
        of audio in the clip.
    """

    scores_samples: ClassVar[bool] = True

    def __init__(self, path: str | os.PathLike, session: Any, meta: dict[str, str], *,
                 timeout_s: float = RUN_TIMEOUT_S, memory_bytes: int = 0):
        fields = _contract(str(path), meta)
        self.score_kind = fields["score_kind"]  # type: ignore[misc]  # (per instance: the exported model's)
        self.params = {"features": meta["features"], "clip_ms": fields["clip_ms"],
                       "clip_shift_ms": fields["clip_shift_ms"], "pad": fields["pad"], "augment": ""}
        self.min_samples_ = fields["min_samples"]
        self.details_ = fields["outputs"]
        self.unknown_ = fields["unknown"]
        self.threshold_ = fields["threshold"]
        self.feature_dim_ = fields["feature_dim"]
        self.name = f"{meta['family']} (onnx)"  # type: ignore[misc]
        self.preset_ = fields["preset"]
        self.detector = self.score_kind == "anomaly"  # type: ignore[misc]
        self.labels_ = fields["labels"]
        self.label_name_ = meta.get("label_name") or "label"
        self.feature_rate_, self.channels_ = fields["rate"], None
        self.history_, self.train_info_ = [], {}
        self.meta_ = dict(meta)
        self.path = str(path)
        self.session = session
        self._runner = _Runner(self.path, timeout_s, memory_bytes)

    def __reduce__(self) -> tuple[Any, tuple[str, float]]:
        """Pickled as its file and run deadline (a Spark task receives it so): unpickling opens
        and checks the graph again, in the process that scores with it."""
        return _reopen, (self.path, self.run_timeout_s)

    def __copy__(self) -> OnnxModel:
        """A shallow copy (the same session; what :func:`copy.copy` gave before pickling was
        defined: a request's windows are set on a copy)."""
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        return out

    @property
    def run_timeout_s(self) -> float:
        return self._runner.timeout_s

    @run_timeout_s.setter
    def run_timeout_s(self, value: float) -> None:
        self._runner.timeout_s = float(value)

    # -- scoring ----------------------------------------------------------------------------------
    def check_clip(self, clip_ms: int) -> None:
        """Refuse windows other than the model's own for a model trained on clips: the graph
        completes a short clip to the model's window, not to another."""
        own = int(self.meta_["clip_ms"]) if self.meta_ else 0
        if own and clip_ms != own:
            raise ParameterError(f"{self.path}: the graph scores windows of the model's {own} ms (clips are completed "
                                 f"to it); {clip_ms} ms windows need the .wt model", param="clip_ms")

    def run_clip(self, x: np.ndarray, what: str = "a run of the graph") -> tuple[np.ndarray, int, dict[str, Any]]:
        """The graph's outputs for one clip (float32 samples at the model's rate), run under the
        deadline and checked against the contract: ``(scores, best, details)``.

        Raises
        ------
        GraphRunError
            The run ran past its deadline, asked for more than the memory bound, failed, or gave
            outputs of other types or shapes, ``best`` out of range or a NaN or infinite score (or
            an infinite detail).
        """
        import onnxruntime as ort

        outputs = ["scores", "best", *self.details_]
        options = ort.RunOptions()
        options.log_severity_level = 4
        extra = RUN_S_PER_AUDIO_S * x.shape[0] / float(self.feature_rate_ or 1)
        res = self._runner(what, lambda o: self.session.run(outputs, {"audio": x}, o), options, extra)
        return self._checked(res, what)

    def _checked(self, res: Sequence[Any], what: str) -> tuple[np.ndarray, int, dict[str, Any]]:
        width = 1 if self.detector else len(self.fitted_labels)

        def bad(why: str) -> GraphRunError:
            return GraphRunError(f"{self.path}: {what} gave {why}; the graph is not a working export of a wavetrain "
                                 "model")

        scores, best = res[0], res[1]
        if not (isinstance(scores, np.ndarray) and scores.dtype == np.float32 and scores.shape == (width,)):
            raise bad(f"scores of shape {getattr(scores, 'shape', None)}, expected float32 ({width},)")
        if not (isinstance(best, np.ndarray) and best.dtype == np.int64 and best.shape == (1,)):
            raise bad(f"best of shape {getattr(best, 'shape', None)}, expected int64 (1,)")
        if not 0 <= int(best[0]) < width:
            raise bad(f"best {int(best[0])}, outside the {width} label value(s)")
        if not np.isfinite(scores).all():
            raise bad("a NaN or infinite score")
        details = {}
        for k, v in zip(self.details_, res[2:]):
            if not (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == (1,)):
                raise bad(f"{k} of shape {getattr(v, 'shape', None)}, expected float32 (1,)")
            if np.isinf(v).any():       # (NaN: undefined, e.g. a gmm's z for a value of one training window)
                raise bad(f"an infinite {k}")
            details[k] = v[0]
        return scores, int(best[0]), details

    def score_clips(self, clips: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """What :meth:`predict_scores` gives for windows of features, for clips of samples at the
        model's rate: values, scores ``(n, labels)`` and details ``{name: (n,)}``; each clip is
        one run of the graph (:meth:`run_clip`)."""
        names: list[str] = []
        rows: list[np.ndarray] = []
        details: dict[str, list[float]] = {k: [] for k in self.details_}
        for x in clips:
            x = np.ascontiguousarray(x, dtype=np.float32)
            if x.ndim != 1:
                raise AudioError(f"a clip of shape {x.shape}: the graph scores mono samples, (n,)")
            if x.shape[0] < self.min_samples_:
                raise AudioError(f"a clip of {x.shape[0]} samples is shorter than one feature sub-window of "
                                 f"{self.min_samples_} samples at {self.feature_rate_} Hz")
            scores, best, values = self.run_clip(x)
            for k, v in values.items():
                details[k].append(float(v))
            rows.append(np.asarray(scores, np.float64))
            names.append(self._answer(scores, best, values))
        if self.detector:
            details["threshold"] = [self.threshold_] * len(rows)
        width = 1 if self.detector else len(self.fitted_labels)
        return (names, np.array(rows).reshape(len(rows), width),
                {k: np.asarray(v, dtype=np.float64) for k, v in details.items()})

    def _answer(self, scores: np.ndarray, best: int, details: dict[str, np.float32]) -> str:
        """The value answered from the graph's float32 outputs, each rule compared in float32 (a
        score equal to a threshold in float64 stays equal to it after rounding)."""
        f32 = np.float32
        if self.detector:
            return ANOMALY if scores[0] > f32(self.threshold_) else self.fitted_labels[0]
        if self.unknown_ and is_unknown(self.unknown_, scores, best, details, dtype=f32):
            return UNKNOWN
        return self.fitted_labels[best]

    def probe(self) -> None:
        """Score a clip of silence and one of quiet noise, each one window of the model (one second
        for a model of whole recordings): outputs of the contract, or :class:`GraphRunError` (the
        load refuses the graph)."""
        window = int((self.meta_ or {}).get("window_samples") or 0) or int(self.feature_rate_ or 0)
        n = min(max(window, self.min_samples_), MAX_PROBE_SAMPLES)
        noise = (0.01 * np.random.default_rng(0).standard_normal(n)).astype(np.float32)
        for what, x in (("silence", np.zeros(n, np.float32)), ("quiet noise", noise)):
            self.run_clip(x, f"the probe (a clip of {n} samples of {what})")

    def unknown_rule(self) -> dict[str, Any] | None:
        """The rule the exported model was trained with (the graph's ``unknown`` metadata), or None."""
        return self.unknown_

    def live_unknown_rule(self, level: float | None = None) -> dict[str, Any] | None:
        """As the exported family's: by its top probability (probabilities), or by its ``z``
        output (a Gaussian mixture's), else none."""
        if self.score_kind == "mean_loglik" and "z" in self.details_:
            return z_rule(self.name, level)
        return super().live_unknown_rule(level)

    def predict_scores(self, grams):
        raise ParameterError(f"{self.path}: an exported graph computes its own features from samples; give it "
                             "audio (classify, serve), not feature windows")

    @property
    def title(self) -> str:
        """``gmm-speech (gmm, onnx)`` for a graph exported from a preset's model, else ``gmm (onnx)``."""
        return f"{self.preset_} ({self.name.removesuffix(' (onnx)')}, onnx)" if self.preset_ else self.name

    def __repr__(self) -> str:
        return f"OnnxModel({self.path!r}, family={self.meta_['family'] if self.meta_ else '?'})"


# -- the contract ---------------------------------------------------------------------------------
def _not_ours(path: str, why: str) -> ModelFileError:
    return ModelFileError(f"{path}: not a graph exported by wavetrain export ({why}); export the .wt model again")


def _int(path: str, meta: dict[str, str], key: str, low: int, high: int, default: int | None = None) -> int:
    text = meta.get(key)
    if text is None and default is not None:
        return default
    try:
        value = int(str(text))
    except ValueError:
        raise _not_ours(path, f"{key} is {str(text)[:40]!r}, expected an integer") from None
    if not low <= value <= high:
        raise _not_ours(path, f"{key} is {value}, expected {low} to {high}")
    return value


def _json(path: str, meta: dict[str, str], key: str) -> Any:
    try:
        return json.loads(meta[key])
    except (ValueError, RecursionError):
        raise _not_ours(path, f"{key} is not JSON") from None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_rule(path: str, rule: Any, labels: list[str], details: list[str]) -> dict[str, Any]:
    """An unknown rule of a kind :func:`~wavetrain.models.base.is_unknown` evaluates, its numbers
    finite, its output one of the graph's details and its floors one per label value."""
    if not (isinstance(rule, dict) and rule.get("rule") in _RULE_NUMBERS):
        raise _not_ours(path, f"unknown is not a rule of {', '.join(_RULE_NUMBERS)}")
    kind = rule["rule"]
    if not all(_number(rule.get(k)) for k in _RULE_NUMBERS[kind]):
        raise _not_ours(path, f"the {kind} rule needs finite numbers {', '.join(_RULE_NUMBERS[kind])}")
    if kind == "best_below":
        floors = rule.get("floors")
        if not (isinstance(floors, list) and len(floors) == len(labels) and all(_number(v) for v in floors)):
            raise _not_ours(path, f"the best_below rule needs {len(labels)} finite floors, one per label value")
    if kind in ("above", "outside") and rule.get("output") not in details:
        raise _not_ours(path, f"the {kind} rule compares {str(rule.get('output'))[:40]!r}, which is none of the "
                              "graph's outputs")
    return rule


def _contract(path: str, meta: dict[str, str]) -> dict[str, Any]:
    """The metadata's fields, each of the type and range :func:`~wavetrain.models.onnx_export.model_graph`
    writes (one :class:`ModelFileError` naming the first that is not)."""
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise ModelFileError(f"{path}: an ONNX graph without wavetrain's metadata ({', '.join(missing)} missing); "
                             "classify and serve run graphs made by wavetrain export")
    for key, value in meta.items():
        if control_characters(key) or control_characters(value):
            raise _not_ours(path, f"its metadata {key[:40]!r} holds control characters (terminal escapes, line breaks)")
    if not plain_text(meta["family"]) or len(meta["family"]) > 100:
        raise _not_ours(path, "family is not a name")
    preset = meta.get("preset")
    if preset is not None and (not plain_text(preset) or len(preset) > 100):
        raise _not_ours(path, "preset is not a name")
    if meta.get("label_name") is not None and not plain_text(meta["label_name"]):
        raise _not_ours(path, "label_name is not a line of text")
    kind = meta["score_kind"]
    if kind not in SCORE_KINDS:
        raise _not_ours(path, f"score_kind is {kind[:40]!r}, expected one of {', '.join(SCORE_KINDS)}")
    detector = kind == "anomaly"
    labels = _json(path, meta, "labels")
    problem = label_values_problem(labels, reserved=ANOMALY if detector else UNKNOWN)
    if problem:
        raise _not_ours(path, problem)
    if detector and len(labels) != 1:
        raise _not_ours(path, f"a detector knows one value, the normal one; it lists {len(labels)}")
    if not detector and len(labels) < 2:
        raise _not_ours(path, "a classifier knows two label values or more")
    out: dict[str, Any] = {"labels": list(labels), "score_kind": kind}
    out["rate"] = _int(path, meta, "rate", 1, MAX_RATE)
    out["clip_ms"] = _int(path, meta, "clip_ms", 0, MAX_CLIP_MS)
    out["clip_shift_ms"] = _int(path, meta, "clip_shift_ms", 0, MAX_CLIP_MS)
    out["min_samples"] = _int(path, meta, "min_samples", 1, MAX_PROBE_SAMPLES)
    _int(path, meta, "frames", 0, MAX_CLIP_MS)
    for key in ("window_samples", "hop_samples"):
        _int(path, meta, key, 0, 1 << 62, default=0)
    if meta["pad"] not in PADS:
        raise _not_ours(path, f"pad is {meta['pad'][:40]!r}, expected one of {', '.join(PADS)}")
    out["pad"] = meta["pad"]
    try:
        spec = parse_spec(meta["features"])
        out["feature_dim"] = spec.feature_dim(out["rate"])
        shortest = feature_min_samples(spec, out["rate"])
    except (UserError, ValueError, TypeError, OverflowError) as e:
        raise _not_ours(path, f"its features cannot be used: {_first_line(e)[:120]}") from None
    if shortest != out["min_samples"]:
        raise _not_ours(path, f"min_samples is {out['min_samples']}, but its features need {shortest}")
    details = _json(path, meta, "outputs") if "outputs" in meta else []
    if not (isinstance(details, list) and all(isinstance(d, str) and _DETAIL.match(d) for d in details)
            and len(set(details)) == len(details) and not {"scores", "best", "threshold"} & set(details)):
        raise _not_ours(path, "outputs is not a list of detail names")
    out["outputs"] = list(details)
    out["unknown"] = _check_rule(path, _json(path, meta, "unknown"), labels, details) if meta.get("unknown") else None
    if detector:
        try:
            out["threshold"] = float(meta.get("threshold", "nan"))
        except ValueError:
            out["threshold"] = math.nan
        if not math.isfinite(out["threshold"]):
            raise _not_ours(path, "a detector's threshold is missing or not a finite number")
    else:
        out["threshold"] = math.nan
    out["preset"] = preset
    return out


def _external_tensor(proto: Any) -> str | None:
    """The name of the first tensor anywhere in the model (initializers, sparse ones, constants and
    other node attributes, subgraphs, functions) whose data lives in another file, or None."""
    from onnx import TensorProto

    stack = [proto]
    while stack:
        msg = stack.pop()
        if isinstance(msg, TensorProto):
            if msg.data_location == TensorProto.EXTERNAL or len(msg.external_data):
                return msg.name or "(a tensor without a name)"
            continue
        for field, value in msg.ListFields():
            if field.type != field.TYPE_MESSAGE:
                continue
            if field.is_repeated:
                stack.extend(value)
            else:
                stack.append(value)
    return None


def _folded_bytes(proto: Any) -> int | None:
    """Bytes of the tensors onnxruntime's constant folding would compute as the session is created
    (every output of a node whose inputs are all constant, or of a ``Shape`` or ``Size`` of a tensor
    of static shape, sub-graphs included), from the shapes ONNX's shape inference gives them; None
    when one of them has no static shape, or inference fails."""
    from onnx import AttributeProto, helper, shape_inference

    try:
        inferred = shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # noqa: BLE001 (onnx raises its own errors for a graph it cannot infer)
        return None
    total = 0

    def static(t: Any) -> tuple[int, ...] | None:
        shape = t.tensor_type.shape if t is not None and t.HasField("tensor_type") else None
        if shape is None or not t.tensor_type.HasField("shape") or not all(d.HasField("dim_value") for d in shape.dim):
            return None
        return tuple(d.dim_value for d in shape.dim)

    def walk(graph: Any, outer: set[str], outer_types: dict[str, Any]) -> bool:
        nonlocal total
        const = set(outer) | {i.name for i in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
        types = dict(outer_types)
        types.update({v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)})
        for node in graph.node:
            subgraphs = [g for a in node.attribute for g in
                         ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs))]
            if not all(walk(g, const, types) for g in subgraphs):
                return False
            inputs = [i for i in node.input if i]
            if node.op_type == "Constant":
                const.update(node.output)
                continue
            first = types.get(inputs[0]) if inputs else None
            shape_of_static = node.op_type in ("Shape", "Size") and static(first) is not None
            if subgraphs or not (shape_of_static or (inputs and all(i in const for i in inputs))):
                continue
            for out in (o for o in node.output if o):
                t = types.get(out)
                dims = static(t)
                if t is None or dims is None:
                    return False
                try:
                    size = np.dtype(helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type)).itemsize
                except (KeyError, TypeError, ValueError):
                    size = 8
                total += int(np.prod(dims, dtype=object)) * size
                const.add(out)
        return True

    try:
        return total if walk(inferred.graph, set(), {}) else None
    except RecursionError:
        return None


def _check_graph(path: str, proto: Any, details: list[str]) -> None:
    """The graph's inputs and outputs are the contract's (types and ranks)."""
    from onnx import TensorProto

    g = proto.graph
    constants = {i.name for i in g.initializer} | {s.values.name for s in g.sparse_initializer}
    inputs = [i for i in g.input if i.name not in constants]
    if [i.name for i in inputs] != ["audio"]:
        names = ", ".join(repr(i.name[:40]) for i in inputs) or "none"
        raise _not_ours(path, f"its inputs are {names}; an exported graph takes one, 'audio'")
    t = inputs[0].type
    dims = t.tensor_type.shape.dim if t.HasField("tensor_type") and t.tensor_type.HasField("shape") else None
    if (not t.HasField("tensor_type") or t.tensor_type.elem_type != TensorProto.FLOAT or dims is None
            or len(dims) != 1 or dims[0].HasField("dim_value")):
        raise _not_ours(path, "its input audio is not float32 samples of any length, (n,)")
    want = {"scores": TensorProto.FLOAT, "best": TensorProto.INT64, **{d: TensorProto.FLOAT for d in details}}
    have = {o.name: o.type for o in g.output}
    if set(have) != set(want) or len(g.output) != len(want):
        names = ", ".join(repr(o.name[:40]) for o in g.output) or "none"
        raise _not_ours(path, f"its outputs are {names}; expected {', '.join(want)}")
    for name, elem in want.items():
        if not (have[name].HasField("tensor_type") and have[name].tensor_type.elem_type == elem):
            raise _not_ours(path, f"its output {name} is not {'int64' if elem == TensorProto.INT64 else 'float32'}")


def _reopen(path: str, timeout_s: float) -> OnnxModel:
    """An :class:`OnnxModel` unpickled: its graph opened and checked again."""
    return load_onnx(path, timeout_s=timeout_s)


def load_onnx(path: str | os.PathLike, *, timeout_s: float | None = None) -> OnnxModel:
    """Load an exported graph for scoring (onnxruntime, one thread), validated as the module notes
    say.

    Parameters
    ----------
    path : path-like
        The ``.onnx`` file.
    timeout_s : float, optional
        Seconds one run of the graph may take (default: :func:`graph_timeout_s`).

    Raises
    ------
    ModelFileError
        onnx or onnxruntime is missing, or the file is not a graph exported by ``wavetrain
        export``: not a regular file, unreadable, data in other files, inputs, outputs or
        metadata outside the contract, or a probe that fails (:class:`GraphRunError`: past the
        deadline, over the memory bound, outputs outside the contract).
    """
    path_s = os.fspath(path)
    size = check_input_file(path, "ONNX graph", ModelFileError).st_size
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        raise ModelFileError(f"{path_s}: an .onnx model needs onnx and onnxruntime: pip install "
                             "'wavetrain[export]'") from None
    if size > MAX_GRAPH_BYTES:
        raise _not_ours(path_s, f"{size:,} bytes, more than an ONNX graph can hold")
    timeout_s = graph_timeout_s() if timeout_s is None else float(timeout_s)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_GRAPH_BYTES + 1)
    except OSError as e:
        raise ModelFileError(f"{path_s}: cannot be read ({e.strerror or e})") from None
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # noqa: BLE001 (protobuf's DecodeError, and whatever a hostile file raises)
        raise ModelFileError(f"{path_s}: not a readable ONNX graph ({_first_line(e)})") from None
    external = _external_tensor(proto)
    if external is not None:
        raise ModelFileError(f"{path_s}: the graph's tensor {external[:60]!r} keeps its data in another file; an "
                             "exported wavetrain graph holds all its data, and wavetrain never reads a graph's "
                             "external data")
    meta = {p.key: p.value for p in proto.metadata_props}
    fields = _contract(path_s, meta)
    _check_graph(path_s, proto, fields["outputs"])
    memory = _arena(ort)
    # constant folding computes constant nodes as the session is created, outside the arena: it is
    # kept (an exported graph runs several times faster with it) only where their sizes are known
    # and within a quarter of the bound, and no node may fold into more than that
    budget = min(memory // 4, MAX_FOLDED_BYTES)
    folded = _folded_bytes(proto)
    del proto
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    opts.add_session_config_entry("session.use_env_allocators", "1")
    opts.add_session_config_entry("optimization.constant_folding_max_output_size_in_bytes", str(budget))
    off = [] if folded is not None and folded <= budget else ["ConstantFolding"]
    # (under the deadline too, though it cannot be stopped)
    session = _Runner(path_s, timeout_s, memory)("opening the graph", lambda _: ort.InferenceSession(
        data, opts, providers=["CPUExecutionProvider"], disabled_optimizers=off))
    model = OnnxModel(path_s, session, meta, timeout_s=timeout_s, memory_bytes=memory)
    model.probe()
    return model
