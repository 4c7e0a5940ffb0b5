"""Model files: one ``.wt`` file with the spec, label values, weights, history and versions.

The file is a zip of ``.npy`` arrays (numpy's ``.npz``) plus a JSON document stored as bytes.
It is read with ``allow_pickle=False``: opening a model never runs code. Writes are atomic.
"""
from __future__ import annotations

import json
import os
import platform
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

import wavetrain
from wavetrain.errors import ModelFileError, UserError
from wavetrain.models.base import Classifier
from wavetrain.models.registry import family
from wavetrain.outputs import write_atomic

FORMAT = "wavetrain-model"
FORMAT_VERSION = 1
_META = "__meta__"
_WEIGHT = "w/"


def save_model(model: Classifier, path: str | os.PathLike, *, extra: dict[str, Any] | None = None) -> Path:
    """Write a fitted classifier to ``path`` atomically (never replacing anything but a regular
    file). Raises :class:`~wavetrain.outputs.OutputError` when it cannot be written."""
    model.check_is_fitted()
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "model": model.name, "params": model.get_params(),
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


def _is_int(v: Any, low: int = 1) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _check_meta(path: Path, meta: Any) -> dict[str, Any]:
    """The fields every reader relies on, with their types; one line naming the first bad one."""
    def bad(what: str) -> ModelFileError:
        return ModelFileError(f"{path}: damaged model file ({what}); train the model again")

    if not isinstance(meta, dict):
        raise bad("its metadata is not a JSON object")
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a wavetrain model file")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise bad(f"format_version is {version!r}, expected a positive integer")
    if version > FORMAT_VERSION:
        raise ModelFileError(f"{path}: written by a newer wavetrain (format {version}); upgrade wavetrain "
                             "to read it")
    if not isinstance(meta.get("model"), str):
        raise bad("no model name")
    if not isinstance(meta.get("params"), dict):
        raise bad("params is not an object")
    labels = meta.get("labels")
    if not (isinstance(labels, list) and labels and all(isinstance(v, str) for v in labels)):
        raise bad("labels is not a list of label values")
    if len(set(labels)) != len(labels):
        raise bad("labels repeats a value")
    if meta.get("label_name") is not None and not isinstance(meta["label_name"], str):
        raise bad("label_name is not a string")
    if not _is_int(meta.get("feature_dim")):
        raise bad(f"feature_dim is {meta.get('feature_dim')!r}, expected a positive integer")
    for key in ("feature_rate", "channels"):
        if meta.get(key) is not None and not _is_int(meta[key]):
            raise bad(f"{key} is {meta[key]!r}, expected a positive integer")
    history = meta.get("history", [])
    if not (isinstance(history, list) and all(isinstance(h, dict) for h in history)):
        raise bad("history is not a list of objects")
    for h in history:
        for k, v in h.items():
            per_device = isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)  # a device group's
            if not (v is None or isinstance(v, (int, float, str)) or per_device):
                raise bad(f"history value {k}={v!r} is not a number")
    return meta


def read_model_file(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return ``(meta, weights)`` without building the model. No pickle is ever loaded.

    The metadata's fields are checked (types, label values) and every weight array must hold
    finite numbers: a damaged or hand-edited file is one :class:`ModelFileError`."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: model file not found" if not path.exists()
                             else f"{path}: not a model file (a folder or a device)")
    try:
        with np.load(path, allow_pickle=False) as z:
            if _META not in z.files:
                raise ModelFileError(f"{path}: not a wavetrain model (no metadata); train one with `wavetrain train`")
            meta = json.loads(z[_META].tobytes().decode())
            weights = {k[len(_WEIGHT):]: z[k] for k in z.files if k.startswith(_WEIGHT)}
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, UnicodeDecodeError,
            RecursionError) as e:
        raise ModelFileError(f"{path}: not a readable wavetrain model ({type(e).__name__}: {str(e)[:120]})") from None
    meta = _check_meta(path, meta)
    for k, v in weights.items():
        if v.dtype.kind not in "fiub":
            raise ModelFileError(f"{path}: damaged model file (weights {k!r} of type {v.dtype}); train the "
                                 "model again")
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            raise ModelFileError(f"{path}: damaged model file (weights {k!r} hold NaN or infinite values); "
                                 "train the model again")
    return meta, weights


def load_model(path: str | os.PathLike) -> Classifier:
    """Load a classifier from a model file.

    Raises
    ------
    ModelFileError
        Not a model file, damaged, from a newer wavetrain, of an unknown family, or weights that
        do not fit the parameters and label values it records.
    """
    meta, weights = read_model_file(path)
    try:
        cls = family(meta["model"])
        model = cls(**meta["params"])
    except ModuleNotFoundError as e:
        raise ModelFileError(f"{path}: a {meta['model']} model needs {e.name}, which is not installed") from None
    except UserError as e:
        raise ModelFileError(f"{path}: cannot be used ({e})") from None
    model.labels_ = list(meta["labels"])
    model.label_name_ = meta.get("label_name")
    model.feature_dim_ = meta["feature_dim"]
    model.feature_rate_ = meta.get("feature_rate")
    model.channels_ = meta.get("channels")
    model.history_ = meta.get("history", [])
    try:
        model.load_state_dict(weights)
    except (UserError, KeyError, ValueError, TypeError, IndexError) as e:
        what = f"weight {e} missing" if isinstance(e, KeyError) else str(e)
        raise ModelFileError(f"{path}: the weights do not fit the model it describes ({what}); train the "
                             "model again") from None
    model.meta_ = meta
    return model
