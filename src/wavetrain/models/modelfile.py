"""Model files: one ``.wt`` file with the spec (the family and, for a model trained with a preset
such as ``gmm-speech``, the preset's name), label values, weights, history and versions.

The file is a zip of ``.npy`` arrays (numpy's ``.npz``) plus a JSON document stored as bytes.
It is read with ``allow_pickle=False``: opening a model never runs code. Writes are atomic.

Reading a file is one validation, :func:`load_model`, shared by every command that opens one
(``info``, ``classify``, ``evaluate -m``, ``serve``, ``plot history``): the container, the
metadata's fields and versions, the parameters (checked with the family's parameter table, as
``--set`` is at training), the features against ``feature_dim``, every array's type, size and
values (finite, not absurdly large; the family checks shapes against the label values and each
other), and a probe: the loaded model must give finite scores for the stored label values on
test windows. A file that fails any of these is one :class:`~wavetrain.core.errors.ModelFileError`.
"""
from __future__ import annotations

import copy
import json
import os
import platform
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

import wavetrain
from wavetrain.core.errors import ModelFileError, UserError
from wavetrain.core.inputs import check_input_file
from wavetrain.core.outputs import write_atomic
from wavetrain.models.anomaly import ANOMALY
from wavetrain.models.base import UNKNOWN, Classifier, control_characters, label_values_problem, plain_text
from wavetrain.models.onnx_model import load_onnx
from wavetrain.models.registry import family

__all__ = ["FORMAT", "FORMAT_VERSION", "describe_model", "load_model", "read_model_file", "save_model"]

FORMAT = "wavetrain-model"
FORMAT_VERSION = 1
_META = "__meta__"
_WEIGHT = "w/"

#: Longest name of a preset (the built-in spec a model was trained with) a file may record.
MAX_NAME = 100
#: Largest magnitude a stored number may have: its square still fits a float32 (3.4e38), and no
#: trained weight, mean, variance of features or count of frames comes near it (a variance of
#: linear spectral power stays below 1e16; neural weights, log features and their moments below 1e4).
MAX_ABS = 1e18
#: Upper limits of the metadata's sizes (far above any real model; they bound what a probe or a
#: request allocates).
MAX_FEATURE_DIM = 100_000
MAX_RATE = 10_000_000
MAX_CHANNELS = 4096
#: Largest window of features a model's ``clip_ms`` may ask for (float32 bytes).
MAX_WINDOW_BYTES = 1 << 30
#: Most a zip member may unpack to per byte it takes in the file (model files are written
#: uncompressed; compressed float weights shrink far less).
MAX_UNPACK_RATIO = 100
#: Most all the members together may unpack to per byte they take in the file (plus
#: :data:`UNPACK_ALLOWANCE`): a file of many small members of zeros is refused before one is read.
MAX_TOTAL_UNPACK_RATIO = 10
UNPACK_ALLOWANCE = 1 << 20
#: Bytes a ``.npy`` member's header may take (numpy writes 64 to a few hundred).
MAX_NPY_HEADER = 10_000
#: Frames of the probe windows every loaded model must score finitely.
PROBE_FRAMES = 32
#: Errors a family's state loading or a probe may raise on a damaged file (not a bug of the file's
#: reader: the file's numbers do not fit the model they claim to be).
_DAMAGE = (UserError, KeyError, ValueError, TypeError, IndexError, AttributeError, RuntimeError,
           OverflowError, ZeroDivisionError, FloatingPointError)
#: The first bytes of a zip (a model file); of things sometimes saved as ``.wt`` by mistake.
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_OTHER_MAGIC = ((b"\x80", "a Python pickle, which wavetrain never loads"),
                (b"\x93NUMPY", "a single numpy array (.npy)"),
                (b"RIFF", "a WAV recording"), (b"{", "a JSON document"))
#: Array dtype kinds a model's state may hold, and which kinds a stored array may have for each.
_KINDS = {"f": "f", "i": "iu", "u": "iu", "b": "b"}


def save_model(model: Classifier, path: str | os.PathLike, *, extra: dict[str, Any] | None = None) -> Path:
    """Write a fitted classifier to ``path`` atomically (never replacing anything but a regular
    file). Raises :class:`~wavetrain.core.outputs.OutputError` when it cannot be written."""
    model.check_is_fitted()
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "model": model.name, "params": model.get_params(),
        **({"preset": model.preset_} if model.preset_ else {}),
        "labels": list(model.fitted_labels), "label_name": model.label_name_,
        "feature_dim": model.feature_dim_, "feature_rate": model.feature_rate_, "channels": model.channels_,
        "history": model.history_,
        "versions": {"wavetrain": wavetrain.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    meta.update(extra or {})
    arrays = {_META: np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    for k, v in model.state_dict().items():
        arrays[_WEIGHT + k] = np.asarray(v)
    # (numpy's stub types savez's keyword arrays as its allow_pickle flag)
    return write_atomic(path, lambda f: np.savez(f, **arrays), what="model file")  # type: ignore[arg-type]


def _damaged(path: Path, what: str) -> ModelFileError:
    return ModelFileError(f"{path}: damaged model file ({what}); train the model again")


def _is_int(v: Any, low: int = 1, high: int | None = None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)


def _check_meta(path: Path, meta: Any) -> dict[str, Any]:
    """The fields every reader relies on, with their types; one line naming the first bad one."""
    def bad(what: str) -> ModelFileError:
        return _damaged(path, what)

    if not isinstance(meta, dict):
        raise bad("its metadata is not a JSON object")
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a wavetrain model file (its metadata names no wavetrain format)")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise bad(f"format_version is {version!r}, expected a positive integer")
    if version > FORMAT_VERSION:
        raise ModelFileError(f"{path}: written by a newer wavetrain (format {version}); upgrade wavetrain "
                             "to read it")
    if not isinstance(meta.get("model"), str):
        raise bad("no model name")
    preset = meta.get("preset")
    if preset is not None and not (isinstance(preset, str) and plain_text(preset) and 0 < len(preset) <= MAX_NAME):
        raise bad("preset is not a model name")
    if not isinstance(meta.get("params"), dict):
        raise bad("params is not an object")
    # (the answer that is no label value, unknown or anomaly, is checked once the family is known)
    problem = label_values_problem(meta.get("labels"))
    if problem:
        raise bad(problem)
    if meta.get("label_name") is not None and not plain_text(meta["label_name"]):
        raise bad("label_name is not a line of text")
    if not _is_int(meta.get("feature_dim"), 1, MAX_FEATURE_DIM):
        raise bad(f"feature_dim is {meta.get('feature_dim')!r}, expected an integer in [1, {MAX_FEATURE_DIM}]")
    for key, high in (("feature_rate", MAX_RATE), ("channels", MAX_CHANNELS)):
        if meta.get(key) is not None and not _is_int(meta[key], 1, high):
            raise bad(f"{key} is {meta[key]!r}, expected an integer in [1, {high}]")
    for key in ("versions", "training"):
        value = meta.get(key, {})
        if not (isinstance(value, dict) and all(v is None or isinstance(v, (int, float, str))
                                                 for v in value.values())):
            raise bad(f"{key} is not an object of names and values")
    if meta.get("created") is not None and not isinstance(meta["created"], str):
        raise bad("created is not a date")
    history = meta.get("history", [])
    if not (isinstance(history, list) and all(isinstance(h, dict) for h in history)):
        raise bad("history is not a list of objects")
    for h in history:
        for k, v in h.items():
            per_device = isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)  # a device group's
            if not (v is None or isinstance(v, (int, float, str)) or per_device):
                raise bad(f"history value {k}={v!r} is not a number")
    # (commands print these: no terminal escape reaches the output; a parameter's text, such as an
    # ensemble's members, may span lines)
    for key, value in meta.items():
        allowed = {ord(c): None for c in ("\t\n\r" if key == "params" else "")}
        try:
            control = any(control_characters(t.translate(allowed)) for t in _texts({key: value}))
        except RecursionError:
            raise bad(f"its metadata {key[:40]!r} nests too deep") from None
        if control:
            raise bad(f"its metadata {key[:40]!r} holds control characters (terminal escapes, line breaks)")
    return meta


def _texts(value: Any):
    """Every string of a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)


def _not_a_model(path: Path) -> ModelFileError | None:
    """Why ``path`` is not a zip at all (a pickle, an array, a recording...), or None."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(_ZIP_MAGIC):
        return None
    what = next((w for magic, w in _OTHER_MAGIC if head.startswith(magic)),
                "empty" if not head else "not a zip of arrays")
    return ModelFileError(f"{path}: not a readable wavetrain model file ({what}); give a model written by "
                          "`wavetrain train`")


def _check_members(path: Path) -> None:
    """Every member of the zip is a ``.npy`` array of plain numbers (no Python objects) that holds
    exactly what its header declares (no more, no less), no member unpacks to far more than it
    takes in the file, and all of them together unpack to at most :data:`MAX_TOTAL_UNPACK_RATIO`
    times what they take (plus :data:`UNPACK_ALLOWANCE`): a forged header, a zip bomb or a file of
    many members of zeros is refused before anything is allocated."""
    from numpy.lib import format as npy

    with zipfile.ZipFile(path) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        packed, unpacked = sum(i.compress_size for i in infos), sum(i.file_size for i in infos)
        if unpacked > MAX_TOTAL_UNPACK_RATIO * packed + UNPACK_ALLOWANCE:
            raise _damaged(path, f"its {len(infos)} members would unpack to {unpacked:,} bytes from {packed:,}")
        for info in infos:
            if info.file_size > MAX_UNPACK_RATIO * info.compress_size + UNPACK_ALLOWANCE:
                raise _damaged(path, f"{info.filename} would unpack to {info.file_size:,} bytes from "
                                     f"{info.compress_size:,}")
            if not info.filename.endswith(".npy"):
                raise _damaged(path, f"{info.filename} is not an array")
            with zf.open(info) as f:
                version = npy.read_magic(f)
                read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, _, dtype = read(f, max_header_size=MAX_NPY_HEADER)
                header = f.tell()
            if dtype.hasobject:
                raise ModelFileError(f"{path}: not a readable wavetrain model (it holds Python objects, which "
                                     "wavetrain never loads)")
            needs = header + int(np.prod(shape, dtype=object)) * dtype.itemsize
            if needs > info.file_size:
                raise _damaged(path, f"{info.filename} promises an array of shape {shape} that it does not hold")
            if needs < info.file_size:
                raise _damaged(path, f"{info.filename} holds {info.file_size - needs:,} bytes beyond its array of "
                                     f"shape {shape}")


def _reason(e: Exception) -> str:
    """One line on why numpy or zipfile could not read the file. numpy's own words are not
    passed on when they suggest loading pickled data: a model file never needs that."""
    text = str(e).lower()
    if "pickle" in text or "object arrays" in text:
        return "it holds Python objects, which wavetrain never loads"
    return f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"


def _read(path: Path) -> tuple[Any, dict[str, np.ndarray]]:
    """The metadata (parsed JSON) and the weight arrays of a zip of ``.npy`` arrays."""
    try:
        bad = _not_a_model(path)
        if bad is not None:
            raise bad
        _check_members(path)
        with np.load(path, allow_pickle=False) as z:
            if _META not in z.files:
                raise ModelFileError(f"{path}: not a wavetrain model file (no metadata); give a model written "
                                     "by `wavetrain train`")
            raw = z[_META]
            if not (isinstance(raw, np.ndarray) and raw.dtype == np.uint8 and raw.ndim == 1):
                raise _damaged(path, "its metadata is not a JSON document")
            meta = json.loads(raw.tobytes().decode())
            weights: dict[str, np.ndarray] = {}
            for k in z.files:
                if k.startswith(_WEIGHT):
                    v = z[k]
                    if not isinstance(v, np.ndarray):
                        raise _damaged(path, f"weights {k[len(_WEIGHT):]!r} are not an array")
                    weights[k[len(_WEIGHT):]] = v
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, UnicodeDecodeError,
            RecursionError, NotImplementedError, TypeError) as e:
        raise ModelFileError(f"{path}: not a readable wavetrain model ({_reason(e)})") from None
    return meta, weights


def read_model_file(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return ``(meta, weights)`` without building the model. No pickle is ever loaded.

    The container, the metadata's fields and every weight array's type and values (finite, at
    most :data:`MAX_ABS` in magnitude) are checked: a damaged or hand-edited file is one
    :class:`ModelFileError`. This is the first half of :func:`load_model`, which every command
    uses; only it checks the weights against the model they describe."""
    path = Path(path)
    check_input_file(path, "model file", ModelFileError)
    meta, weights = _read(path)
    meta = _check_meta(path, meta)
    for k, v in weights.items():
        if v.dtype.kind not in "fiub":
            raise _damaged(path, f"weights {k!r} of type {v.dtype}")
        if v.dtype.kind == "f" and v.size:
            if not np.isfinite(v).all():
                raise _damaged(path, f"weights {k!r} hold NaN or infinite values")
            if float(np.abs(v).max()) > MAX_ABS:
                raise _damaged(path, f"weights {k!r} hold values as large as {float(np.abs(v).max()):.3g}")
    return meta, weights


def _build(path: Path, meta: dict[str, Any]) -> Classifier:
    """The unfitted model the metadata describes: its parameters checked with the family's table
    (as ``--set`` is at training) and its features parsed."""
    try:
        cls = family(meta["model"])
        model = cls(**meta["params"])
        model.feature_spec  # noqa: B018 (parses the features; raises SpecError)
    except ModuleNotFoundError as e:
        raise ModelFileError(f"{path}: a {meta['model']} model needs {e.name}, which is not installed") from None
    except UserError as e:
        raise ModelFileError(f"{path}: cannot be used ({e})") from None
    labels = list(meta["labels"])
    if model.detector and len(labels) != 1:
        raise _damaged(path, f"a {model.name} detector knows one value, the normal one; it lists {len(labels)}")
    problem = label_values_problem(labels, reserved=ANOMALY if model.detector else UNKNOWN)
    if problem:
        raise _damaged(path, problem)
    if not model.detector and len(labels) < model.min_labels:
        raise _damaged(path, f"a {model.name} classifier needs at least {model.min_labels} label values; "
                             f"it lists {len(labels)}")
    model.labels_ = labels
    model.label_name_ = meta.get("label_name")
    model.preset_ = meta.get("preset")
    model.feature_dim_ = meta["feature_dim"]
    model.feature_rate_ = meta.get("feature_rate")
    model.channels_ = meta.get("channels")
    model.history_ = meta.get("history", [])
    return model


def _check_geometry(path: Path, model: Classifier) -> None:
    """Where the training rate is known: the features give ``feature_dim`` values per frame, and
    a window of ``clip_ms`` is of a size that can be held."""
    rate = model.feature_rate_
    if not rate:
        return
    spec, dim = model.feature_spec, int(model.feature_dim_ or 0)
    try:
        want = spec.feature_dim(rate, channels=model.channels_ or 1)
        shift = spec.frame_shift_s(rate)
    except UserError as e:
        raise ModelFileError(f"{path}: cannot be used ({e})") from None
    if want != dim:
        raise _damaged(path, f"its features {spec} give {want} values per frame at {rate} Hz, but it "
                             f"records feature_dim {dim}")
    clip = model.params.get("clip_ms") or 0
    if clip and shift > 0:
        size = (clip / 1000.0 / shift) * dim * 4
        if size > MAX_WINDOW_BYTES:
            raise _damaged(path, f"clip_ms={clip} makes each window {size / 2**20:,.0f} MB of features, more "
                                 f"than {MAX_WINDOW_BYTES >> 20} MB")


def _check_state_types(path: Path, model: Classifier, weights: dict[str, np.ndarray]) -> None:
    """Every stored array is one the loaded model keeps, with its kind of number (and, beyond
    single values, its shape): floats where the family stores floats, integers where it counts."""
    state = model.state_dict()
    extra = sorted(k for k in weights if k not in state)
    if extra:
        raise _damaged(path, f"weights {extra[0]!r}{f' and {len(extra) - 1} more' if len(extra) > 1 else ''} "
                             f"are no part of a {model.name} model")
    for k, v in weights.items():
        have = np.asarray(state[k])
        if v.dtype.kind not in _KINDS.get(have.dtype.kind, have.dtype.kind):
            kind = "floating-point numbers" if have.dtype.kind == "f" else f"{have.dtype.kind!r} numbers"
            raise _damaged(path, f"weights {k!r} are of type {v.dtype}, expected {kind}")
        if have.size > 1 and v.shape != have.shape:
            raise _damaged(path, f"weights {k!r} have shape {v.shape}, expected {have.shape}")


def _probe(path: Path, model: Classifier) -> None:
    """Score test windows (zeros, noise, constants of either sign): every score must be finite, no
    detail infinite, and there must be one column per stored label value (one for a detector)."""
    d = int(model.feature_dim_ or 1)
    noise = np.random.default_rng(0).standard_normal((PROBE_FRAMES, d)).astype(np.float32)
    grams = [np.zeros_like(noise), noise, 10 * noise, np.full_like(noise, 10), np.full_like(noise, -10)]
    # a model that learns while it scores (normal-dist adapt) is probed on a copy
    target = copy.deepcopy(model) if model.params.get("adapt") else model
    try:
        with np.errstate(all="ignore"):
            names, scores, details = target.predict_scores(grams)
    except _DAMAGE as e:
        why = f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
        raise _damaged(path, f"it cannot score a window: {why}") from None
    width = 1 if model.detector else len(model.fitted_labels)
    scores = np.asarray(scores)
    if scores.shape != (len(grams), width) or len(names) != len(grams):
        raise _damaged(path, f"it gives scores of shape {scores.shape} for {width} label values")
    # (a detail may be NaN where it is undefined: a gmm's z for a value whose training windows all
    # scored alike)
    finite = np.isfinite(scores).all() and not any(
        np.isinf(np.asarray(v, np.float64)).any() for v in details.values()
        if np.asarray(v).dtype.kind in "fiub")
    if not finite:
        raise _damaged(path, "its weights give NaN or infinite scores")


def _load(path: str | os.PathLike) -> tuple[Classifier, dict[str, Any], dict[str, np.ndarray]]:
    meta, weights = read_model_file(path)
    p = Path(path)
    model = _build(p, meta)
    _check_geometry(p, model)
    try:
        model.load_state_dict(weights)
    except _DAMAGE as e:
        what = f"weight {e} missing" if isinstance(e, KeyError) else ' '.join(str(e).split())[:200]
        raise ModelFileError(f"{path}: the weights do not fit the model it describes ({what}); train the "
                             "model again") from None
    _check_state_types(p, model, weights)
    _probe(p, model)
    model.meta_ = meta
    return model, meta, weights


def load_model(path: str | os.PathLike) -> Classifier:
    """Load a classifier from a model file, validated as a whole (see the module's notes).

    Raises
    ------
    ModelFileError
        Not a model file, damaged, from a newer wavetrain, of an unknown family, parameters
        outside the family's limits, or weights that do not fit the parameters and label values
        it records or that give non-finite scores. For an ``.onnx`` file: not a graph exported
        by ``wavetrain export``, or onnxruntime missing.

    An ``.onnx`` file (from ``wavetrain export``) loads as an
    :class:`~wavetrain.models.onnx_model.OnnxModel` that scores samples through onnxruntime.
    """
    if str(path).lower().endswith(".onnx"):
        return load_onnx(path)
    return _load(path)[0]


def describe_model(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(meta, weights)`` of a model file that :func:`load_model` accepts (what ``info`` and
    ``plot history`` show); the same :class:`ModelFileError` otherwise."""
    _, meta, weights = _load(path)
    return meta, weights
