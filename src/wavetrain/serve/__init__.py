"""``wavetrain serve``: a trained model behind HTTP (``POST /v1/classify``, ``GET /v1/model``,
``GET /healthz`` and a web page at ``/``). Needs the ``serve`` extra (starlette, uvicorn,
python-multipart)."""
from __future__ import annotations

from wavetrain.serve.app import ServeConfig, create_app
from wavetrain.serve.inference import ClassifyOptions, ModelService

__all__ = ["ClassifyOptions", "ModelService", "ServeConfig", "create_app"]
