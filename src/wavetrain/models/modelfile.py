"""Model files: one ``.wt`` file with the spec, label values, weights, history and versions.

The file is a zip of ``.npy`` arrays (numpy's ``.npz``) plus a JSON document stored as bytes.
It is read with ``allow_pickle=False``: opening a model never runs code. Writes are atomic.
"""
from __future__ import annotations

import io
import json
import os
import platform
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from wavetrain.errors import ModelFileError

FORMAT = "wavetrain-model"
FORMAT_VERSION = 1
_META = "__meta__"
_WEIGHT = "w/"


def save_model(model, path: str | os.PathLike, *, extra: dict[str, Any] | None = None) -> Path:
    """Write a fitted classifier to ``path`` atomically."""
    import wavetrain

    model.check_is_fitted()
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "model": model.name, "params": model.get_params(),
        "labels": list(model.labels_), "label_name": model.label_name_,
        "feature_dim": model.feature_dim_, "history": model.history_,
        "versions": {"wavetrain": wavetrain.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    meta.update(extra or {})
    arrays = {_META: np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    for k, v in model.state_dict().items():
        arrays[_WEIGHT + k] = np.asarray(v)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def read_model_file(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Return ``(meta, weights)`` without building the model. No pickle is ever loaded."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: model file not found")
    try:
        with np.load(path, allow_pickle=False) as z:
            if _META not in z.files:
                raise ModelFileError(f"{path}: not a wavetrain model (no metadata); train one with `wavetrain train`")
            meta = json.loads(z[_META].tobytes().decode())
            weights = {k[len(_WEIGHT):]: z[k] for k in z.files if k.startswith(_WEIGHT)}
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, json.JSONDecodeError, KeyError) as e:
        raise ModelFileError(f"{path}: not a readable wavetrain model ({type(e).__name__}: {str(e)[:120]})") from None
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a wavetrain model file")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise ModelFileError(f"{path}: written by a newer wavetrain (format {meta['format_version']}); "
                             f"upgrade wavetrain to read it")
    return meta, weights


def load_model(path: str | os.PathLike):
    """Load a classifier from a model file."""
    from wavetrain.models.registry import family

    meta, weights = read_model_file(path)
    cls = family(meta["model"])
    model = cls(**meta["params"])
    model.labels_ = list(meta["labels"])
    model.label_name_ = meta.get("label_name")
    model.feature_dim_ = meta.get("feature_dim")
    model.history_ = meta.get("history", [])
    model.load_state_dict(weights)
    model.meta_ = meta
    return model
