"""Model families by name, and model specs (built-in name or TOML file plus parameter overrides)."""
from __future__ import annotations

import importlib
import os
import tomllib
from pathlib import Path
from typing import Any

from wavetrain.core.errors import SpecError
from wavetrain.core.inputs import check_input_file

#: name -> "module:Class"; modules are imported only when the family is used (torch is heavy).
_FAMILIES: dict[str, str] = {
    "gmm": "wavetrain.models.gmm:GMMClassifier",
    "hmm": "wavetrain.models.hmm:HMMClassifier",
    "cnn": "wavetrain.models.cnn:CNNClassifier",
    "dcase": "wavetrain.models.dcase:DCASEClassifier",
    "rescnn": "wavetrain.models.rescnn:ResCNNClassifier",
    "normal-dist": "wavetrain.models.normal_dist:NormalDistDetector",
    "anomaly-gmm": "wavetrain.models.anomaly_gmm:AnomalyGMM",
    "knn": "wavetrain.models.knn:KNNClassifier",
    "linear": "wavetrain.models.linear:LinearClassifier",
    "knn-anomaly": "wavetrain.models.knn_anomaly:KNNAnomaly",
    "autoencoder": "wavetrain.models.autoencoder:AutoencoderDetector",
    "ensemble": "wavetrain.models.ensemble:EnsembleClassifier",
}


#: The model spec commands use when ``--model`` is not given.
DEFAULT_MODEL = "gmm"
#: The model for voices, where ``DEFAULT_MODEL`` is for machines (the demo's spoken words).
SPEECH_MODEL = "gmm-speech"

#: Built-in specs: a family with tuned parameters (listed by `wavetrain models`).
PRESETS: dict[str, tuple[str, dict[str, Any], str]] = {
    "gmm-speech": ("gmm", {
        "components": 32,
        "features": "mfcc(bands=40, coeffs=13, window_ms=25, shift_pct=40) | delta(order=2) | normalize(axis=time)",
    }, "gmm for speech: per-recording mean/variance normalisation (robust to channel and noise), "
       "32 components"),
    "hmm-speech": ("hmm", {
        "states": 8, "mixtures": 6,
        "features": "mfcc(bands=40, coeffs=13, window_ms=25, shift_pct=40) | delta(order=2) | normalize(axis=time)",
    }, "hmm for isolated words: per-recording mean/variance normalisation, as gmm-speech; 8 states of 6 "
       "Gaussians"),
    "linear-speech": ("linear", {
        "c": 0.1,
        "features": "speech_embedding | pool",
    }, "linear on a pretrained speech network's embeddings (speech_embedding, from the speech extra), their mean "
       "and max over each recording (clips padded to 1.5 s): for voices the model has not heard"),
    "cnn-id": ("cnn", {"clip_ms": 500, "clip_shift_ms": 250, "epochs": 10},
               "cnn that tells units (sections, operating points) apart from 500 ms clips every 250 ms, 10 "
               "epochs: the network of knn-id"),
    "knn-id": ("knn-anomaly", {"id_labels": "section", "id_network": "cnn-id", "subwindow_frames": 1},
               "knn-anomaly on the embeddings of a cnn-id trained to tell the normal recordings' sections "
               "apart (id_labels=section; --set id_labels=unit for another label): for a fleet of similar units"),
}


def family_names() -> list[str]:
    return list(_FAMILIES)


def families_with(**tags: Any) -> list[str]:
    """Names of the families whose capability tags (:data:`wavetrain.models.base.TAGS`) have the
    given values, e.g. ``families_with(supports_device_groups=True)`` (imports each family's module,
    not torch)."""
    return [n for n in _FAMILIES if all(getattr(family(n), k) == v for k, v in tags.items())]


def preset_names() -> list[str]:
    return list(PRESETS)


def family(name: str):
    if name not in _FAMILIES:
        raise SpecError(f"unknown model {name!r}; expected one of: {', '.join([*_FAMILIES, *PRESETS])} "
                        f"or a .toml model spec")
    mod, cls = _FAMILIES[name].split(":")
    return getattr(importlib.import_module(mod), cls)


def resolve_spec(spec: str, overrides: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """Turn a model spec (family name or TOML file) plus overrides into ``(family, params)``.

    A TOML model spec has a ``model = "gmm"`` key and the parameters at top level, e.g.::

        model = "gmm"
        components = 16
        features = "mfcc(coeffs=20)"
    """
    name, params, _ = _resolve(spec, overrides)
    return name, params


def _resolve(spec: str, overrides: dict[str, Any] | None) -> tuple[str, dict[str, Any], str | None]:
    """``(family, params, preset)``: :func:`resolve_spec`'s answer and the preset the spec names
    (directly or as a TOML spec's ``model``), None when it names a family."""
    preset = None
    params: dict[str, Any] = {}
    if spec.endswith(".toml") or os.path.sep in spec:
        p = Path(spec)
        check_input_file(p, "model spec file", SpecError)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise SpecError(f"{p}: invalid TOML ({e})") from None
        except OSError as e:
            raise SpecError(f"{p}: cannot be read ({e.strerror or e})") from None
        name = data.pop("model", None)
        if not isinstance(name, str):
            raise SpecError(f"{p}: expected a top-level key model = \"{'|'.join(_FAMILIES)}\"")
        if name in PRESETS:
            preset = name
            name, base, _ = PRESETS[name]
            params.update(base)
        params.update(data)
    elif spec in PRESETS:
        preset = spec
        name, base, _ = PRESETS[spec]
        params.update(base)
    else:
        name = spec
    family(name)  # validates the name
    params.update(overrides or {})
    return name, params, preset


def build(spec: str, overrides: dict[str, Any] | None = None):
    """Build an unfitted classifier from a spec; parameters are validated now. A preset's name
    is kept on the model (``preset_``: its model file, ``info``, the server's page and warnings
    name it beside the family's, ``gmm-speech (gmm)``)."""
    name, params, preset = _resolve(spec, overrides)
    model = family(name)(**params)
    model.preset_ = preset
    return model
