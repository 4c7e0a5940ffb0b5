"""The HTTP app of ``wavetrain serve`` (Starlette; uvicorn runs it, with the connection bounds of
:mod:`wavetrain.serve.protocol`).

Routes: ``POST /v1/classify`` (multipart upload, an audio body, or raw PCM), ``GET /v1/model``,
``GET /healthz`` and the web page at ``/``.

Bounds of a classify request:

- its body is read up to ``max_bytes`` and refused (413) the moment it exceeds them — at once when
  its Content-Length says so; a pause of ``read_timeout_s`` between its chunks, or an upload slower
  than ``min_upload_rate`` bytes/s (after ``read_timeout_s``), is answered 408 and the connection
  closed; the bodies being read or waiting hold at most ``(workers + queue) * max_bytes`` bytes
  together (beyond that: 503);
- a slot is taken once the whole body has arrived: at most ``workers + queue`` requests wait for
  or run in the ``workers`` threads; the next ones get 503 with Retry-After;
- clips and shifts shorter than the model's feature frame shift are a 400; more than
  ``max_windows`` windows, more than ``max_window_frames`` frames in them all, or an answer over
  ``max_answer_bytes`` is a 422 saying the limits, before any feature is computed;
- the windows are scored in chunks, and a client that disconnects stops the work at the next one.

Errors are JSON ``{"error": message, "status": code}``; an unexpected exception is logged and
answered 500, and the server goes on. A request whose Host header is not one of ``allowed_hosts``
(any port) is answered 421 (DNS rebinding). Every answer has ``X-Content-Type-Options: nosniff``
and ``X-Frame-Options: DENY``; the page has a Content-Security-Policy.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from wavetrain.core.errors import AudioError, ParameterError, UserError
from wavetrain.serve.decode import (
    AUDIO_TYPES,
    PCM_TYPE,
    Decoded,
    RequestError,
    decode_audio,
    decode_pcm,
    multipart_file,
)
from wavetrain.serve.inference import Cancelled, ClassifyOptions, ModelService
from wavetrain.serve.page import PAGE, PAGE_CSP

__all__ = ["ServeConfig", "create_app"]

log = logging.getLogger(__name__)


#: Host names a server on a loopback address always answers to (any port).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class ServeConfig:
    """Limits of a server.

    Attributes
    ----------
    max_bytes : int
        Largest request body; it also bounds the decoded audio to ``max_samples`` values
        (``max_bytes`` of them, at least 1 Mi: a flac or ogg body decodes to more than its size),
        before and after resampling to the model's rate.
    workers : int
        Threads that decode and classify (one request each at a time).
    queue : int
        Classify requests admitted beyond those being worked on; more get 503.
    retry_after_s : int
        The Retry-After of a 503.
    max_windows : int
        Most windows one request may cut (clip settings times duration).
    max_window_frames : int
        Most feature frames in all the windows of one request (the scoring work).
    max_answer_bytes : int
        Largest answer (its size is estimated from windows and ``top_k`` before the work).
    max_parts : int
        Most parts of a multipart upload.
    read_timeout_s : float
        Longest pause between two chunks of a body (408 after it).
    min_upload_rate : int
        Bytes per second a body must average once ``read_timeout_s`` has passed.
    header_timeout_s : float
        Time a connection has to send a whole request head (closed after it).
    keep_alive_s : float
        Time an idle kept-alive connection is kept.
    max_connections : int
        Open connections; a new one closes the oldest without a request in progress.
    allowed_hosts : tuple of str or None
        Host header names answered (any port); None: any.
    """

    max_bytes: int = 50 << 20
    workers: int = 1
    queue: int = 8
    retry_after_s: int = 1
    max_windows: int = 10_000
    max_window_frames: int = 4_000_000
    max_answer_bytes: int = 16 << 20
    max_parts: int = 16
    read_timeout_s: float = 10.0
    min_upload_rate: int = 16 << 10
    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 100
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS

    def __post_init__(self):
        if self.max_bytes < 1 or self.workers < 1 or self.queue < 0:
            raise ParameterError(f"serve: max_bytes >= 1, workers >= 1 and queue >= 0 expected, got "
                                 f"{self.max_bytes}, {self.workers}, {self.queue}")
        small = {k: getattr(self, k) for k in ("max_windows", "max_window_frames", "max_answer_bytes", "max_parts",
                                                "min_upload_rate", "max_connections") if getattr(self, k) < 1}
        small.update({k: getattr(self, k) for k in ("read_timeout_s", "header_timeout_s", "keep_alive_s")
                      if not getattr(self, k) > 0})
        if small:
            raise ParameterError("serve: " + ", ".join(f"{k}={v}" for k, v in small.items()) + ": expected > 0")

    @property
    def max_samples(self) -> int:
        return max(self.max_bytes, 1 << 20)

    @property
    def slots(self) -> int:
        """Classify requests admitted at a time (running or waiting)."""
        return self.workers + self.queue

    @property
    def body_budget(self) -> int:
        """Bytes of bodies held at a time (being read or waiting)."""
        return self.slots * self.max_bytes


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(obj, allow_nan=False, separators=(",", ":")), status_code=status,
                    headers=headers, media_type="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json({"error": message, "status": status}, status, headers)


class _Disconnected(Exception):
    """The client went away while its request was read or worked on."""


class _Server:
    """State shared by the requests: the model, the worker pool, the admission count and the
    bytes of bodies held."""

    def __init__(self, service: ModelService, config: ServeConfig):
        self.service = service
        self.config = config
        self.pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="wavetrain-serve")
        self.admitted = 0           # classify requests between the end of their body and their answer
        self.buffered = 0           # bytes of bodies being read or held
        self.reading = 0            # classify requests reading their body
        self.served = 0
        self.refused = 0
        self.disconnected = 0

    # -- routes ---------------------------------------------------------------------------------
    async def page(self, request: Request) -> Response:
        return HTMLResponse(PAGE, headers={"Content-Security-Policy": PAGE_CSP})

    async def healthz(self, request: Request) -> Response:
        c = self.config
        return _json({"status": "ok", "model": self.service.model_id, "admitted": self.admitted,
                      "reading": self.reading, "buffered_bytes": self.buffered, "served": self.served,
                      "refused_busy": self.refused, "disconnected": self.disconnected, "workers": c.workers,
                      "queue": c.queue, "max_bytes": c.max_bytes, "max_windows": c.max_windows})

    async def model(self, request: Request) -> Response:
        return _json(self.service.describe())

    async def classify(self, request: Request) -> Response:
        t0 = time.perf_counter()
        held = [0]
        body_read = False
        admitted = False
        detached = False

        def release() -> None:
            self.buffered -= held[0]
            if admitted:
                self.admitted -= 1

        def detach(work: asyncio.Future) -> None:
            # a client gone while its work runs or waits in the pool: the work keeps its body and
            # its slot until it ends, so that leaving clients cannot queue unbounded bodies
            nonlocal detached
            detached = True
            work.add_done_callback(_retrieve)
            work.add_done_callback(lambda _: release())

        try:
            kind, ctype = self._content_kind(request)
            options = ClassifyOptions.from_query(request.query_params)
            self.service.check_options(options)
            self._check_length(request)
            self.reading += 1
            try:
                body = await self._read_body(request, held)
                body_read = True
            finally:
                self.reading -= 1
            if self.admitted >= self.config.slots:
                raise self._busy(f"{self.admitted} requests are being classified or waiting")
            self.admitted += 1
            admitted = True
            query = dict(request.query_params)
            out = await self._run(request, body, kind, ctype, query, options, detach)
            del body
            out["timings"]["total_ms"] = round(1000 * (time.perf_counter() - t0), 3)
            self.served += 1
            return _json(out)
        except _Disconnected as e:
            self.disconnected += 1
            log.info("classify: the client went away %s; its request was dropped", e)
            return _error(499, "client disconnected")
        except RequestError as e:
            # refused before its body was read: the connection is closed rather than drained
            close = {} if body_read else {"Connection": "close"}
            return _error(e.status, e.message, {**e.headers, **close})
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
            if not detached:
                release()

    # -- helpers --------------------------------------------------------------------------------
    def _busy(self, why: str) -> RequestError:
        self.refused += 1
        return RequestError(503, f"busy: {why}; retry shortly", {"Retry-After": str(self.config.retry_after_s)})

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

    async def _read_body(self, request: Request, held: list[int]) -> bytes:
        """The body, chunk by chunk, counting its bytes in ``held`` (and the server's
        ``buffered``) as they arrive."""
        c = self.config
        chunks: list[bytes] = []
        start = time.monotonic()
        while True:
            allowed = c.read_timeout_s + held[0] / c.min_upload_rate - (time.monotonic() - start)
            try:
                message = await asyncio.wait_for(request.receive(), min(c.read_timeout_s, max(allowed, 0.001)))
            except TimeoutError:
                raise RequestError(408, f"the body stopped arriving or came too slowly ({held[0]} bytes in "
                                        f"{time.monotonic() - start:.1f} s; a pause of at most "
                                        f"{c.read_timeout_s:g} s and {c.min_upload_rate} bytes/s on average are "
                                        "accepted)", {"Connection": "close"}) from None
            if message["type"] == "http.disconnect":
                raise _Disconnected(f"after {held[0]} bytes of its body")
            chunk = message.get("body", b"")
            if held[0] + len(chunk) > c.max_bytes:
                raise RequestError(413, f"body larger than {c.max_bytes} bytes: at most {c.max_bytes} are accepted",
                                   {"Connection": "close"})
            if self.buffered + len(chunk) > c.body_budget:
                raise self._busy(f"{self.buffered} bytes of uploads are held")
            if chunk:
                chunks.append(chunk)
                held[0] += len(chunk)
                self.buffered += len(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _run(self, request: Request, body: bytes, kind: str, ctype: str, query: dict,
                   options: ClassifyOptions, detach: Callable[[asyncio.Future], None]) -> dict[str, Any]:
        """``_work`` in the pool; a client that disconnects meanwhile stops it at its next chunk
        (``detach(work)`` is called then: the work goes on until that chunk)."""
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        work = asyncio.ensure_future(loop.run_in_executor(self.pool, self._work, body, kind, ctype, query, options,
                                                          time.perf_counter(), cancel))
        gone = asyncio.ensure_future(request.receive())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done() and gone.result()["type"] == "http.disconnect":
                cancel.set()
                detach(work)                           # its Cancelled is expected, not an error
                raise _Disconnected("while its request was classified")
            return await work
        finally:
            gone.cancel()
            # an exception raised by the work refers to this frame through its traceback, and
            # this frame to the future holding it: drop the future so that the request's audio
            # is freed at once rather than at the next full garbage collection
            del work, gone

    def _work(self, body: bytes, kind: str, ctype: str, query: dict, options: ClassifyOptions,
              t_read: float, cancel: threading.Event) -> dict[str, Any]:
        """In a worker thread: decode, classify, answer (nothing when ``cancel`` was set)."""
        t0 = time.perf_counter()
        if cancel.is_set():
            raise _Disconnected("while its request waited")
        c = self.config

        def check(decoded: Decoded) -> None:
            self.service.check_cost(decoded, options, max_samples=c.max_samples, max_windows=c.max_windows,
                                    max_window_frames=c.max_window_frames, max_answer_bytes=c.max_answer_bytes)

        if kind == "pcm":
            decoded = decode_pcm(body, sample_rate=query.get("sample_rate"), channels=query.get("channels"),
                                 fmt=query.get("format"), max_samples=c.max_samples)
            check(decoded)
        else:
            data = multipart_file(body, ctype, max_parts=c.max_parts) if kind == "multipart" else body
            decoded = decode_audio(data, max_samples=c.max_samples, check=check)   # checked from its header
        t1 = time.perf_counter()
        try:
            preds, features_s, inference_s = self.service.classify(decoded, options, cancel=cancel)
        except Cancelled:
            raise _Disconnected("while its request was classified") from None
        if not preds:
            raise RequestError(422, f"the audio ({1000 * decoded.duration_s:.0f} ms) is shorter than one window of "
                                    "this model and the model drops short windows (pad=none)")
        out = self.service.answer(preds, decoded, options)
        out["timings"] = {"queue_ms": round(1000 * (t0 - t_read), 3), "decode_ms": round(1000 * (t1 - t0), 3),
                          "features_ms": round(1000 * features_s, 3), "inference_ms": round(1000 * inference_s, 3)}
        return out


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class _Guard:
    """ASGI middleware: a foreign Host header is answered 421; every answer gets
    ``X-Content-Type-Options: nosniff`` and ``X-Frame-Options: DENY``."""

    def __init__(self, app, allowed_hosts: tuple[str, ...] | None):
        self.app = app
        self.allowed = None if allowed_hosts is None else {_bare_host(h) for h in allowed_hosts}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-content-type-options", b"nosniff"),
                                                  (b"x-frame-options", b"DENY")]}
            await send(message)

        host = dict(scope.get("headers") or []).get(b"host")
        if self.allowed is not None and host is not None:
            name = _bare_host(host.decode("latin-1"))
            if name not in self.allowed:
                shown = host.decode("latin-1")[:100]
                reply = _error(421, f"Host {shown!r} is not served here (this server answers to "
                                    f"{', '.join(sorted(self.allowed))}; start it with --allow-host NAME to add one)")
                await reply(scope, receive, send_with_headers)
                return
        await self.app(scope, receive, send_with_headers)


def _bare_host(text: str) -> str:
    """``Host`` header (or an address) without its port, brackets and final dot, lower case;
    anything after ``]`` but a port is kept, so that it matches no allowed name."""
    text = text.strip().lower()
    if text.startswith("["):
        name, close, rest = text[1:].partition("]")
        if close and (not rest or (rest[0] == ":" and rest[1:].isdigit())):
            return name
        return text
    if text.count(":") == 1:
        name, _, port = text.partition(":")
        if port.isdigit():
            text = name
    return text.rstrip(".")


async def _http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    return _error(status, str(getattr(exc, "detail", "")) or "error")


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    return _error(500, "internal server error (logged by the server)")


def create_app(service: ModelService, config: ServeConfig | None = None) -> Starlette:
    """The ASGI app serving ``service``'s model under ``config``'s limits."""
    config = config or ServeConfig()
    server = _Server(service, config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        server.pool.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=[
        Route("/", server.page, methods=["GET"]),
        Route("/healthz", server.healthz, methods=["GET"]),
        Route("/v1/model", server.model, methods=["GET"]),
        Route("/v1/classify", server.classify, methods=["POST"]),
    ], middleware=[Middleware(_Guard, allowed_hosts=config.allowed_hosts)],
        exception_handlers={HTTPException: _http_error, Exception: _server_error}, lifespan=lifespan)
    app.state.server = server
    return app
