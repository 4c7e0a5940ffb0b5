"""The HTTP/1.1 connection handling of ``wavetrain serve``: uvicorn's h11 protocol with the bounds
a server on a network needs, and the socket it listens on.

uvicorn alone lets a connection that never sends a request (or sends its headers a byte at a
time) stay open for ever, and its ``limit_concurrency`` then answers every request, ``/healthz``
included, with a plain-text 503. Here:

- a connection must send a whole request head within ``header_timeout_s`` of connecting (or of
  its first byte after a kept-alive answer), else it is closed;
- a request head (request line and headers, up to the blank line) is at most
  :data:`MAX_HEAD_BYTES`: a larger one is answered 431 and the connection closed, whether it
  arrives in pieces or in one (h11's own limit only counts a head still incomplete);
- at most ``max_connections`` connections are open: a new one closes the oldest connection that
  has no request in progress (idle or still sending its head), else the oldest whose request the
  app marked :data:`EVICTABLE` (a small body being read: answered 503 as it is closed); when every
  one is busy with a request the new one is answered a JSON 503 with Retry-After and closed;
- uvicorn's own answers to malformed requests are JSON (``{"error", "status"}``) too.

The body of a request is read by the app (:mod:`wavetrain.serve.app`), which bounds its size and
the pauses between its chunks.

On SIGINT or SIGTERM (:func:`uvicorn_server`) the server stops listening, the app answers the
requests being worked on (503) and stops their work, requests still reading their body have
``shutdown_timeout_s`` to finish, and the process exits even if a worker thread is stuck in a
call that never returns (the threads are daemons: :mod:`wavetrain.serve.workers`).
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import re
import socket
from typing import Any

from wavetrain.core.errors import UserError

__all__ = ["EVICTABLE", "MAX_HEAD_BYTES", "bind_socket", "protocol_class", "uvicorn_config", "uvicorn_server"]

log = logging.getLogger(__name__)

#: Largest request head accepted (request line, headers and the blank line after them).
MAX_HEAD_BYTES = 16 * 1024
#: A key the app sets true in a request's scope while its connection may be closed to make room
#: for a new one (the scope is the dict the protocol handed to the app).
EVICTABLE = "wavetrain.evictable"
#: The end of a request head, as h11 finds it.
_HEAD_END = re.compile(b"\n\r?\n")


def _raw_json(status: int, reason: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": message, "status": status}, separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"x-content-type-options: nosniff\r\n{extra}connection: close\r\n\r\n")
    return head.encode("latin-1") + body


def protocol_class(*, max_connections: int, header_timeout_s: float, retry_after_s: int) -> type:
    """An h11 protocol class for uvicorn (``Config(http=...)``) enforcing the bounds above; each
    call makes a class with its own count of connections."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    open_: dict[Any, None] = {}           # connections in the order they were opened

    class BoundedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            open_[self] = None
            self._arm_header_timer()
            if len(open_) > max_connections:
                self._make_room()

        def connection_lost(self, exc: Exception | None) -> None:
            open_.pop(self, None)
            self._cancel_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._busy():
                self._cancel_header_timer()            # a whole request head has arrived
            elif self._header_timer is None and not self.transport.is_closing():
                self._arm_header_timer()               # the next request's head has begun

        def on_response_complete(self) -> None:
            self._cancel_header_timer()                # uvicorn's keep-alive timer runs now
            super().on_response_complete()

        def handle_events(self) -> None:
            # a request head is parsed by h11 when it is waiting for one (IDLE): bound its size
            # first, complete or not; called on new data and after an answer (pipelined heads)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                data = self.conn.trailing_data[0]
                end = _HEAD_END.search(data, 0, MAX_HEAD_BYTES + 2)
                if (end.end() if end else len(data)) > MAX_HEAD_BYTES:
                    self._cancel_header_timer()
                    self.transport.write(_raw_json(431, "Request Header Fields Too Large",
                                                   f"request head larger than {MAX_HEAD_BYTES} bytes"))
                    self.transport.close()
                    return
            super().handle_events()

        def send_400_response(self, msg: str) -> None:
            self.transport.write(_raw_json(400, "Bad Request", f"malformed HTTP request ({msg.rstrip('.')})"))
            self.transport.close()

        # -- helpers ----------------------------------------------------------------------------
        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self._busy() and not self.transport.is_closing():
                self.transport.close()

        def _evictable(self) -> bool:
            return not self._busy() or bool(self.scope and self.scope.get(EVICTABLE))

        def _make_room(self) -> None:
            # the oldest without a request first, then the oldest whose request may be closed
            for other in [c for c in open_ if not c._busy()] + [c for c in open_ if c._busy() and c._evictable()]:
                if len(open_) <= max_connections:
                    return
                if other is not self:
                    open_.pop(other, None)
                    if other._busy() and not other.transport.is_closing():
                        other.transport.write(_raw_json(503, "Service Unavailable", "busy: the connection was "
                                                        "closed to make room for others while its body was "
                                                        "still arriving; retry shortly",
                                                        f"retry-after: {retry_after_s}\r\n"))
                    other.transport.close()
            if len(open_) > max_connections:
                open_.pop(self, None)
                self._cancel_header_timer()
                log.warning("%d connections are busy with requests: a new one is answered 503", max_connections)
                self.transport.write(_raw_json(503, "Service Unavailable",
                                               f"busy: {max_connections} connections are in use; retry shortly",
                                               f"retry-after: {retry_after_s}\r\n"))
                self.transport.close()

    return BoundedH11Protocol


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (not yet listening); a bad host, a port out of range
    or in use is a :class:`UserError`."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: expected 0 to 65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"--host {host!r}: not an address of this machine ({e})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        what = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror or e})"
        raise UserError(f"--host {host} --port {port}: the address {what}") from None
    sock.set_inheritable(True)
    return sock


def uvicorn_config(app, config, *, log_level: str = "warning", access_log: bool = False):
    """The ``uvicorn.Config`` of a server of ``app`` under ``config``'s limits (a
    :class:`~wavetrain.serve.app.ServeConfig`); host and port come from the socket given to
    ``uvicorn.Server.run(sockets=[...])``."""
    import uvicorn

    http = protocol_class(max_connections=config.max_connections, header_timeout_s=config.header_timeout_s,
                          retry_after_s=config.retry_after_s)
    return uvicorn.Config(app, http=http, ws="none", lifespan="on", log_level=log_level, access_log=access_log,
                          timeout_keep_alive=config.keep_alive_s, limit_concurrency=None,
                          h11_max_incomplete_event_size=MAX_HEAD_BYTES, server_header=False,
                          timeout_graceful_shutdown=config.shutdown_timeout_s)


def uvicorn_server(app, config, **kw):
    """A ``uvicorn.Server`` of :func:`uvicorn_config` (``kw`` its log settings) that, when it
    starts to stop (SIGINT, SIGTERM), first tells the app (``app.state.server.stop()``, where
    there is one): requests being worked on are answered at once rather than after the grace
    time, and no worker thread keeps the server from stopping."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            stop = getattr(getattr(app.state, "server", None), "stop", None)
            if stop is not None:
                stop()
            await super().shutdown(sockets=sockets)

    return StoppingServer(uvicorn_config(app, config, **kw))
