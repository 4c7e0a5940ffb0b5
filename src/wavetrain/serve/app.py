"""The HTTP app of ``wavetrain serve`` (Starlette; uvicorn runs it).

Routes: ``POST /v1/classify`` (multipart upload, an audio body, or raw PCM), ``GET /v1/model``,
``GET /healthz`` and the web page at ``/``.

Bounds: a body is read up to ``max_bytes`` and refused (413) the moment it exceeds them — at once
when its Content-Length says so; decoding, features and inference run in a pool of ``workers``
threads; at most ``workers + queue`` classify requests are admitted at a time (reading, waiting or
running) and the next ones get 503 with Retry-After, before their body is read. Errors are JSON
``{"error": message, "status": code}``; an unexpected exception is logged and answered 500, and the
server goes on.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from wavetrain.errors import AudioError, ParameterError, UserError
from wavetrain.serve.decode import AUDIO_TYPES, PCM_TYPE, RequestError, decode_audio, decode_pcm, multipart_file
from wavetrain.serve.inference import ClassifyOptions, ModelService
from wavetrain.serve.page import PAGE

__all__ = ["ServeConfig", "create_app"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeConfig:
    """Limits of a server.

    Attributes
    ----------
    max_bytes : int
        Largest request body; it also bounds the decoded audio to ``max_samples`` values
        (``max_bytes`` of them, at least 1 Mi: a flac or ogg body decodes to more than its size).
    workers : int
        Threads that decode and classify (one request each at a time).
    queue : int
        Classify requests admitted beyond those being worked on; more get 503.
    retry_after_s : int
        The Retry-After of a 503.
    """

    max_bytes: int = 50 << 20
    workers: int = 1
    queue: int = 8
    retry_after_s: int = 1

    def __post_init__(self):
        if self.max_bytes < 1 or self.workers < 1 or self.queue < 0:
            raise ParameterError(f"serve: max_bytes >= 1, workers >= 1 and queue >= 0 expected, got "
                                 f"{self.max_bytes}, {self.workers}, {self.queue}")

    @property
    def max_samples(self) -> int:
        return max(self.max_bytes, 1 << 20)


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(obj, allow_nan=False, separators=(",", ":")), status_code=status,
                    headers=headers, media_type="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json({"error": message, "status": status}, status, headers)


class _Server:
    """State shared by the requests: the model, the worker pool and the admission count."""

    def __init__(self, service: ModelService, config: ServeConfig):
        self.service = service
        self.config = config
        self.pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="wavetrain-serve")
        self.admitted = 0           # classify requests between admission and answer
        self.served = 0
        self.refused = 0

    # -- routes ---------------------------------------------------------------------------------
    async def page(self, request: Request) -> Response:
        return HTMLResponse(PAGE)

    async def healthz(self, request: Request) -> Response:
        c = self.config
        return _json({"status": "ok", "model": self.service.model_id, "admitted": self.admitted,
                      "served": self.served, "refused_busy": self.refused, "workers": c.workers, "queue": c.queue,
                      "max_bytes": c.max_bytes})

    async def model(self, request: Request) -> Response:
        return _json(self.service.describe())

    async def classify(self, request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            kind, ctype = self._content_kind(request)
            options = ClassifyOptions.from_query(request.query_params)
            self._check_length(request)
            if self.admitted >= self.config.workers + self.config.queue:
                self.refused += 1
                raise RequestError(503, f"busy: {self.admitted} requests are being classified or waiting; retry "
                                        "shortly", {"Retry-After": str(self.config.retry_after_s)})
        except RequestError as e:
            return _error(e.status, e.message, e.headers)
        self.admitted += 1
        try:
            body = await self._read_body(request)
            query = dict(request.query_params)
            t_read = time.perf_counter()
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(self.pool, self._work, body, kind, ctype, query, options, t_read)
            del body
            out["timings"]["total_ms"] = round(1000 * (time.perf_counter() - t0), 3)
            self.served += 1
            return _json(out)
        except RequestError as e:
            return _error(e.status, e.message, e.headers)
        except AudioError as e:
            return _error(422, str(e))
        except ParameterError as e:
            return _error(400, str(e))
        except UserError as e:
            return _error(422, str(e))
        except Exception:
            log.exception("classify failed")
            return _error(500, "internal error while classifying (logged by the server)")
        finally:
            self.admitted -= 1

    # -- helpers --------------------------------------------------------------------------------
    @staticmethod
    def _content_kind(request: Request) -> tuple[str, str]:
        ctype = request.headers.get("content-type", "")
        main = ctype.split(";", 1)[0].strip().lower()
        if main == "multipart/form-data":
            return "multipart", ctype
        if main in AUDIO_TYPES:
            return "audio", ctype
        if main == PCM_TYPE:
            return "pcm", ctype
        raise RequestError(415, f"Content-Type {main or '(none)'!r} is not supported: send multipart/form-data "
                                f"(field 'file'), audio/wav, audio/flac, audio/ogg or {PCM_TYPE} with "
                                "?sample_rate=&channels=&format=s16le|f32le")

    def _check_length(self, request: Request) -> None:
        text = request.headers.get("content-length")
        if text is None:
            return
        try:
            n = int(text)
        except ValueError:
            raise RequestError(400, f"Content-Length {text!r} is not a number") from None
        if n > self.config.max_bytes:
            raise RequestError(413, f"body of {n} bytes: at most {self.config.max_bytes} are accepted")

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.max_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"body larger than {limit} bytes: at most {limit} are accepted")
            if chunk:
                chunks.append(chunk)
        return b"".join(chunks)

    def _work(self, body: bytes, kind: str, ctype: str, query: dict, options: ClassifyOptions,
              t_read: float) -> dict[str, Any]:
        """In a worker thread: decode, classify, answer."""
        t0 = time.perf_counter()
        max_samples = self.config.max_samples
        if kind == "pcm":
            decoded = decode_pcm(body, sample_rate=query.get("sample_rate"), channels=query.get("channels"),
                                 fmt=query.get("format"), max_samples=max_samples)
        else:
            data = multipart_file(body, ctype) if kind == "multipart" else body
            decoded = decode_audio(data, max_samples=max_samples)
        t1 = time.perf_counter()
        preds, features_s, inference_s = self.service.classify(decoded, options)
        if not preds:
            raise RequestError(422, f"the audio ({1000 * decoded.duration_s:.0f} ms) is shorter than one window of "
                                    "this model and the model drops short windows (pad=none)")
        out = self.service.answer(preds, decoded, options)
        out["timings"] = {"queue_ms": round(1000 * (t0 - t_read), 3), "decode_ms": round(1000 * (t1 - t0), 3),
                          "features_ms": round(1000 * features_s, 3), "inference_ms": round(1000 * inference_s, 3)}
        return out


async def _http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    return _error(status, str(getattr(exc, "detail", "")) or "error")


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    return _error(500, "internal server error (logged by the server)")


def create_app(service: ModelService, config: ServeConfig | None = None) -> Starlette:
    """The ASGI app serving ``service``'s model under ``config``'s limits."""
    server = _Server(service, config or ServeConfig())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        server.pool.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=[
        Route("/", server.page, methods=["GET"]),
        Route("/healthz", server.healthz, methods=["GET"]),
        Route("/v1/model", server.model, methods=["GET"]),
        Route("/v1/classify", server.classify, methods=["POST"]),
    ], exception_handlers={HTTPException: _http_error, Exception: _server_error}, lifespan=lifespan)
    app.state.server = server
    return app
