"""The HTTP app of ``wavetrain serve`` (Starlette; uvicorn runs it, with the connection bounds of
:mod:`wavetrain.serve.protocol`).

Routes: ``POST /v1/classify`` (multipart upload, an audio body, or raw PCM; its windows' answers,
or with ``events`` its events'), ``GET /v1/model``, ``GET /healthz`` and the web page at ``/``.

Bounds of a classify request, in the order it meets them:

- **its body** is read up to ``max_bytes`` and refused (413) the moment it exceeds them — at once
  when its Content-Length says so;
- **an upload slot** for a *large* body, over ``small_body`` bytes (or of undeclared length): at
  most ``max_uploads`` large bodies are read at once (beyond: 503), at most
  ``max_uploads_per_client`` of them from one client address (beyond: 429); a request refused a
  slot is answered before its body is read and its connection closed. A *small* body (an
  ordinary request: a 10 s clip is 320 kB) takes no slot: while it is read its connection may be
  closed to make room for a new one, as an idle connection is (:data:`~wavetrain.serve.protocol.
  EVICTABLE`). So slow uploads, large or small, from one address or many, hold at most
  ``max_uploads`` connections beside the ``workers + queue`` requests admitted, and keep neither
  the connections nor the work slots from ordinary requests;
- **a deadline by its size**: a pause of ``read_timeout_s`` between chunks, or, once
  ``read_timeout_s`` has passed, an average rate below ``max(min_upload_rate, size /
  max_upload_s)`` bytes/s is answered 408 and the connection closed. A body of ``size`` bytes
  therefore has ``read_timeout_s + min(size / min_upload_rate, max_upload_s)`` seconds in all,
  and an upload too slow to make it is dropped as soon as it falls behind, not at the end (100
  uploads of 40 MB at 25 KB/s each are dropped after about ``read_timeout_s``);
- the bodies being read or waiting hold at most ``(workers + queue) * max_bytes`` bytes together,
  small bodies ``max_connections * small_body`` more (beyond: 503);
- **a work slot** is taken once the whole body has arrived: at most ``workers + queue`` requests
  wait for or run in the ``workers`` threads; the next ones get 503 with Retry-After;
- clips and shifts shorter than the model's feature frame shift are a 400; more than
  ``max_windows`` windows, more than ``max_window_frames`` frames in them all, or an answer over
  ``max_answer_bytes`` is a 422 saying the limits, before any feature is computed;
- **a work deadline**: a request not answered within ``work_timeout_s`` of its body's arrival
  (waiting for a worker included) is answered 504 and its work asked to stop (the windows are
  scored in chunks and the work stops at the next one); a work that does not stop (a call that
  never returns) leaves its thread to end on its own and another thread takes its place
  (:class:`~wavetrain.serve.workers.Workers`); a client that disconnects stops its work the same
  way.

Before any route: a request whose Host header is not one of ``allowed_hosts`` (any port) is
answered 421 (DNS rebinding); one with an ``Origin`` header other than the server's own (the Host
it was sent to; a page of another site posting a form or calling fetch, or its CORS preflight) is
answered 403, and any other ``OPTIONS`` request 204 with ``Allow`` and no CORS header, so that no
browser lets another site's page read an answer.

Errors are JSON ``{"error": message, "status": code}``; a model that fails on a request (a graph
run past its own deadline) is a 500 with its one-line reason, an unexpected exception is logged
with its traceback and answered 500, and the server goes on. Every answer has ``X-Content-Type-Options: nosniff`` and
``X-Frame-Options: DENY``; the page has a Content-Security-Policy.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from wavetrain.core.errors import AudioError, ModelFileError, ParameterError, UserError
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
from wavetrain.serve.protocol import EVICTABLE
from wavetrain.serve.workers import Workers

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
        Bytes per second a body must average once ``read_timeout_s`` has passed (a large one more:
        ``max_upload_s``).
    max_upload_s : float
        Longest a body may take beyond ``read_timeout_s``: one of ``size`` bytes must average
        ``max(min_upload_rate, size / max_upload_s)`` bytes/s.
    max_uploads : int
        Large bodies (over ``small_body``) read at once: the upload slots, apart from the work
        slots; more: 503.
    small_body : int
        Bodies of at most this many bytes (by their Content-Length) are small: they take no upload
        slot, and their connection may be closed to make room while they are read.
    max_uploads_per_client : int
        Bodies over ``small_body`` read at once from one client address; more: 429.
    work_timeout_s : float
        Longest time from a body's arrival to its answer (waiting for a worker, decoding,
        classifying); past it: 504, and the work is stopped.
    shutdown_timeout_s : float
        On SIGINT or SIGTERM, the time requests in progress have to finish before they are
        cancelled and the server exits.
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
    max_upload_s: float = 120.0
    max_uploads: int = 16
    small_body: int = 512 << 10
    max_uploads_per_client: int = 4
    work_timeout_s: float = 60.0
    shutdown_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 100
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS

    def __post_init__(self):
        if self.max_bytes < 1 or self.workers < 1 or self.queue < 0:
            raise ParameterError(f"serve: max_bytes >= 1, workers >= 1 and queue >= 0 expected, got "
                                 f"{self.max_bytes}, {self.workers}, {self.queue}")
        small = {k: getattr(self, k) for k in ("max_windows", "max_window_frames", "max_answer_bytes", "max_parts",
                                                "min_upload_rate", "max_connections", "max_uploads", "small_body",
                                                "max_uploads_per_client") if getattr(self, k) < 1}
        small.update({k: getattr(self, k) for k in ("read_timeout_s", "header_timeout_s", "keep_alive_s",
                                                    "max_upload_s", "work_timeout_s", "shutdown_timeout_s")
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
        """Bytes of bodies held at a time (being read or waiting); small bodies may hold
        :attr:`small_reserve` more."""
        return self.slots * self.max_bytes

    @property
    def small_reserve(self) -> int:
        return self.max_connections * self.small_body

    def upload_rate(self, size: int) -> float:
        """Bytes/s a body of ``size`` bytes must average once ``read_timeout_s`` has passed."""
        return max(float(self.min_upload_rate), size / self.max_upload_s)


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
        self.workers = Workers(config.workers)
        self.admitted = 0           # classify requests between the end of their body and their answer
        self.buffered = 0           # bytes of bodies being read or held
        self.reading = 0            # classify requests reading their body
        self.reading_large = 0      # of them, large bodies (the upload slots taken)
        self.large_by_client: dict[str, int] = {}
        self.served = 0
        self.refused = 0
        self.disconnected = 0
        self.timed_out = 0
        self.stopping = False
        self._stop_waiters: set[asyncio.Future] = set()     # one per request being worked on

    def stop(self) -> None:
        """The server is stopping (SIGINT, SIGTERM; called in its event loop): requests being
        worked on or waiting for a worker are answered 503 at once, their work asked to stop,
        and no new work starts."""
        self.stopping = True
        for waiter in self._stop_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.workers.shutdown()

    # -- routes ---------------------------------------------------------------------------------
    async def page(self, request: Request) -> Response:
        return HTMLResponse(PAGE, headers={"Content-Security-Policy": PAGE_CSP})

    async def healthz(self, request: Request) -> Response:
        c = self.config
        w = self.workers
        return _json({"status": "ok", "model": self.service.model_id, "admitted": self.admitted,
                      "reading": self.reading, "reading_large": self.reading_large, "buffered_bytes": self.buffered,
                      "served": self.served, "refused_busy": self.refused, "disconnected": self.disconnected,
                      "timed_out": self.timed_out, "workers": c.workers, "workers_busy": w.busy,
                      "workers_stuck": w.stuck, "queue": c.queue, "max_uploads": c.max_uploads,
                      "max_bytes": c.max_bytes, "max_windows": c.max_windows})

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
            size = self._check_length(request)
            leave = self._take_upload_slot(request, size)
            try:
                body = await self._read_body(request, held, size)
                body_read = True
            finally:
                leave()
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
        except asyncio.CancelledError:
            # the server stops and its grace time is over: an answer if the client still listens
            log.info("classify: a request in progress was cancelled as the server stopped")
            return _error(503, "the server is stopping; retry shortly", {"Connection": "close"})
        except RequestError as e:
            # refused before its body was read: the connection is closed rather than drained
            close = {} if body_read else {"Connection": "close"}
            return _error(e.status, e.message, {**e.headers, **close})
        except AudioError as e:
            return _error(422, str(e))
        except ParameterError as e:
            return _error(400, str(e))
        except ModelFileError as e:
            # the model itself failed on this request (a graph run past its deadline or over its
            # memory bound): the server's fault, not the request's, and one line in the log
            log.warning("classify: the model failed: %s", e)
            return _error(500, f"the model failed on this request: {e}")
        except UserError as e:
            return _error(422, str(e))
        except Exception:
            log.exception("classify failed")
            return _error(500, "internal error while classifying (logged by the server)")
        finally:
            if not detached:
                release()

    # -- helpers --------------------------------------------------------------------------------
    def _busy(self, why: str, status: int = 503) -> RequestError:
        self.refused += 1
        return RequestError(status, f"busy: {why}; retry shortly", {"Retry-After": str(self.config.retry_after_s)})

    def _take_upload_slot(self, request: Request, size: int | None) -> Callable[[], None]:
        """For a body of ``size`` bytes (None: undeclared): an upload slot if it is large, or a
        503/429; a small one's connection is marked evictable while it is read (see the module
        notes). Returns what ends this."""
        c = self.config
        large = size is None or size > c.small_body
        client = request.client.host if request.client else ""
        if large:
            if self.large_by_client.get(client, 0) >= c.max_uploads_per_client:
                raise self._busy(f"{self.large_by_client[client]} uploads of more than {c.small_body} bytes from "
                                 f"{client or 'this client'} are being received (at most {c.max_uploads_per_client} "
                                 "at a time)", 429)
            if self.reading_large >= c.max_uploads:
                raise self._busy(f"{self.reading_large} uploads of more than {c.small_body} bytes are being received")
            self.reading_large += 1
            self.large_by_client[client] = self.large_by_client.get(client, 0) + 1
        else:
            request.scope[EVICTABLE] = True
        self.reading += 1

        def leave() -> None:
            self.reading -= 1
            if large:
                self.reading_large -= 1
                left = self.large_by_client.pop(client) - 1
                if left:
                    self.large_by_client[client] = left
            else:
                request.scope[EVICTABLE] = False
        return leave

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

    def _check_length(self, request: Request) -> int | None:
        """The body's declared size (None without Content-Length); a 413 beyond ``max_bytes``."""
        text = request.headers.get("content-length")
        if text is None:
            return None
        try:
            n = int(text)
        except ValueError:
            raise RequestError(400, f"Content-Length {text!r} is not a number") from None
        if n > self.config.max_bytes:
            raise RequestError(413, f"body of {n} bytes: at most {self.config.max_bytes} are accepted")
        return n

    async def _read_body(self, request: Request, held: list[int], size: int | None) -> bytes:
        """The body (of ``size`` bytes, None: undeclared), chunk by chunk, counting its bytes in
        ``held`` (and the server's ``buffered``) as they arrive; too slow for its size: 408."""
        c = self.config
        rate = c.upload_rate(c.max_bytes if size is None else size)
        small = size is not None and size <= c.small_body
        budget = c.body_budget + (c.small_reserve if small else 0)
        chunks: list[bytes] = []
        start = time.monotonic()
        while True:
            allowed = c.read_timeout_s + held[0] / rate - (time.monotonic() - start)
            try:
                message = await asyncio.wait_for(request.receive(), min(c.read_timeout_s, max(allowed, 0.001)))
            except TimeoutError:
                raise RequestError(408, f"the body stopped arriving or came too slowly ({held[0]} bytes in "
                                        f"{time.monotonic() - start:.1f} s; a pause of at most "
                                        f"{c.read_timeout_s:g} s and, after it, {rate:.0f} bytes/s on average "
                                        f"for a body of {'undeclared size' if size is None else f'{size} bytes'} "
                                        "are accepted)", {"Connection": "close"}) from None
            if message["type"] == "http.disconnect":
                raise _Disconnected(f"after {held[0]} bytes of its body")
            chunk = message.get("body", b"")
            if held[0] + len(chunk) > c.max_bytes:
                raise RequestError(413, f"body larger than {c.max_bytes} bytes: at most {c.max_bytes} are accepted",
                                   {"Connection": "close"})
            if self.buffered + len(chunk) > budget:
                raise self._busy(f"{self.buffered} bytes of uploads are held")
            if chunk:
                chunks.append(chunk)
                held[0] += len(chunk)
                self.buffered += len(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _run(self, request: Request, body: bytes, kind: str, ctype: str, query: dict,
                   options: ClassifyOptions, detach: Callable[[asyncio.Future], None]) -> dict[str, Any]:
        """``_work`` in a worker thread; a client that disconnects meanwhile, or the work deadline,
        stops it at its next chunk (``detach(work)`` is called then: the work goes on until that
        chunk, or its thread is retired if it never gets there)."""
        cancel = threading.Event()
        c = self.config
        deadline = time.monotonic() + c.work_timeout_s
        job = self.workers.submit(self._work, body, kind, ctype, query, options, time.perf_counter(), cancel)
        work = asyncio.wrap_future(job)
        gone = asyncio.ensure_future(request.receive())
        stopping = asyncio.get_running_loop().create_future()
        if self.stopping:
            stopping.set_result(None)
        self._stop_waiters.add(stopping)
        try:
            while not work.done():
                left = deadline - time.monotonic()
                if stopping.done():
                    cancel.set()
                    self.workers.abandon(job)
                    detach(work)
                    raise RequestError(503, "the server is stopping; retry shortly", {"Connection": "close"})
                if left <= 0:
                    cancel.set()
                    self.workers.abandon(job)
                    detach(work)
                    self.timed_out += 1
                    log.warning("classify: a request's work took longer than %g s; answered 504 and stopped",
                                c.work_timeout_s)
                    raise RequestError(504, f"the request was not answered within {c.work_timeout_s:g} s (this "
                                            "server's work timeout); its work was stopped: send less audio, fewer "
                                            "windows, or retry when the server is less busy")
                await asyncio.wait({work, gone, stopping}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if gone.done() and not work.done():
                    if gone.result()["type"] == "http.disconnect":
                        cancel.set()
                        detach(work)                   # its Cancelled is expected, not an error
                        raise _Disconnected("while its request was classified")
                    gone = asyncio.ensure_future(request.receive())
            if work.cancelled():                       # dropped from the queue as the server stops
                raise RequestError(503, "the server is stopping; retry shortly", {"Connection": "close"})
            return await work
        finally:
            gone.cancel()
            self._stop_waiters.discard(stopping)
            # an exception raised by the work refers to this frame through its traceback, and
            # this frame to the future holding it: drop the future so that the request's audio
            # is freed at once rather than at the next full garbage collection
            del work, gone, job, stopping

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
        if options.events is not None:
            try:
                events, features_s, inference_s = self.service.events(decoded, options, cancel=cancel,
                                                                      max_answer_bytes=c.max_answer_bytes)
            except Cancelled:
                raise _Disconnected("while its request was classified") from None
            out = self.service.answer_events(events, decoded, options)
        else:
            try:
                preds, features_s, inference_s = self.service.classify(decoded, options, cancel=cancel)
            except Cancelled:
                raise _Disconnected("while its request was classified") from None
            if not preds:
                raise RequestError(422, f"the audio ({1000 * decoded.duration_s:.0f} ms) is shorter than one window "
                                        "of this model and the model drops short windows (pad=none)")
            out = self.service.answer(preds, decoded, options)
        out["timings"] = {"queue_ms": round(1000 * (t0 - t_read), 3), "decode_ms": round(1000 * (t1 - t0), 3),
                          "features_ms": round(1000 * features_s, 3), "inference_ms": round(1000 * inference_s, 3)}
        return out


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class _Guard:
    """ASGI middleware: a foreign Host header is answered 421, a foreign Origin 403 and an OPTIONS
    request (a CORS preflight) 204 without CORS headers, before any route; every answer gets
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

        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host")
        if self.allowed is not None and host is not None:
            name = _bare_host(host.decode("latin-1"))
            if name not in self.allowed:
                shown = host.decode("latin-1")[:100]
                reply = _error(421, f"Host {shown!r} is not served here (this server answers to "
                                    f"{', '.join(sorted(self.allowed))}; start it with --allow-host NAME to add one)")
                await reply(scope, receive, send_with_headers)
                return
        origin = headers.get(b"origin")
        if origin is not None and not _same_origin(origin.decode("latin-1"), (host or b"").decode("latin-1"),
                                                   scope.get("scheme", "http")):
            shown = origin.decode("latin-1")[:100]
            reply = _error(403, f"cross-origin request refused: Origin {shown!r} is not this server's own; "
                                "only its own page (or a client sending no Origin) may call it",
                           {"Connection": "close"})
            await reply(scope, receive, send_with_headers)
            return
        if scope.get("method") == "OPTIONS":
            # a preflight of our own origin is never sent; this answer grants nothing (no
            # Access-Control-Allow-* header), so another site's page cannot go on
            await Response(status_code=204, headers={"Allow": "GET, POST, OPTIONS"})(scope, receive,
                                                                                      send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


#: The port an origin of each scheme has when it names none.
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _same_origin(origin: str, host: str, scheme: str) -> bool:
    """Whether ``Origin: origin`` is the origin of the server a request with ``Host: host`` was
    sent to: the same host name and port (a Host without a port has the default port of the
    origin's scheme: an ``https`` origin is a proxy's in front of this server). ``null`` (a
    sandboxed page, a file) and anything else is foreign."""
    o_scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or o_scheme not in _DEFAULT_PORTS or not rest or "/" in rest or "@" in rest:
        return False
    o_name, o_port = _split_port(rest)
    h_name, h_port = _split_port(host.strip().lower())
    if o_name is None or h_name is None or o_name.rstrip(".") != h_name.rstrip("."):
        return False
    default = _DEFAULT_PORTS[o_scheme]
    return (o_port or default) == (h_port or default)


def _split_port(text: str) -> tuple[str | None, int | None]:
    """``(name, port)`` of ``name[:port]`` or ``[v6][:port]``; ``(None, None)`` when malformed."""
    if text.startswith("["):
        name, close, rest = text[1:].partition("]")
        if not close:
            return None, None
    elif text.count(":") == 1:
        name, _, port = text.partition(":")
        rest = ":" + port
    elif ":" in text:                    # an IPv6 address without brackets
        return None, None
    else:
        name, rest = text, ""
    if not rest:
        return name or None, None
    if rest[0] != ":" or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
        return None, None
    return name or None, int(rest[1:])


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
        server.stop()

    app = Starlette(routes=[
        Route("/", server.page, methods=["GET"]),
        Route("/healthz", server.healthz, methods=["GET"]),
        Route("/v1/model", server.model, methods=["GET"]),
        Route("/v1/classify", server.classify, methods=["POST"]),
    ], middleware=[Middleware(_Guard, allowed_hosts=config.allowed_hosts)],
        exception_handlers={HTTPException: _http_error, Exception: _server_error}, lifespan=lifespan)
    app.state.server = server
    return app
