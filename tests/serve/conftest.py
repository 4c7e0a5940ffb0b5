"""Fixtures of the server tests: models of the demo data (gmm: mean_loglik, knn: probability,
normal-dist: a detector), an in-process ASGI caller (no network, no httpx), and a real uvicorn server
on 127.0.0.1 and an ephemeral port in a thread."""
from __future__ import annotations

import asyncio
import csv
import http.client
import io
import json
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")

from wavetrain.cli.main import main  # noqa: E402
from wavetrain.serve import ModelService, ServeConfig, create_app  # noqa: E402


def _train(demo_csv, path: Path, *args: str) -> Path:
    assert main(["train", "--data", str(demo_csv), *args, "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="session")
def gmm_file(demo_csv, tmp_path_factory):
    return _train(demo_csv, tmp_path_factory.mktemp("serve") / "gmm.wt", "--label", "state", "--model", "gmm",
                  "--set", "components=3")


@pytest.fixture(scope="session")
def knn_file(demo_csv, tmp_path_factory):
    return _train(demo_csv, tmp_path_factory.mktemp("serve") / "knn.wt", "--label", "state", "--model", "knn")


@pytest.fixture(scope="session")
def detector_file(demo_csv, tmp_path_factory):
    return _train(demo_csv, tmp_path_factory.mktemp("serve") / "nd.wt", "--label", "state", "--normal", "healthy",
                  "--model", "normal-dist")


@pytest.fixture(scope="session")
def demo_files(demo_csv) -> dict[str, Path]:
    """``{state: first recording of that state}``."""
    out: dict[str, Path] = {}
    with open(demo_csv, newline="") as f:
        for row in csv.reader(f):
            labels = dict(p.split("=", 1) for p in row[1].split(";") if "=" in p)
            out.setdefault(labels["state"], Path(demo_csv).parent / row[0])
    return out


@pytest.fixture(scope="session")
def long_wav(demo_files, tmp_path_factory) -> Path:
    """Ten seconds: the demo recordings of every state one after another."""
    parts = [sf.read(str(p), dtype="float32")[0] for p in demo_files.values()]
    x = np.concatenate(parts * (10 // len(parts) + 1))[: 10 * 16000]
    path = tmp_path_factory.mktemp("serve") / "long.wav"
    sf.write(str(path), x, 16000, subtype="PCM_16")
    return path


# ---- in process --------------------------------------------------------------------------------
class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, chunks_read: int = 0):
        self.status, self.headers, self.body, self.chunks_read = status, headers, body, chunks_read

    def json(self):
        return json.loads(self.body)


def asgi(app, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
         chunk: int | None = None) -> Reply:
    """One request to an ASGI app in this process (``chunk``: the body in pieces of that size,
    without Content-Length, as a streamed upload arrives)."""
    return asyncio.run(asgi_async(app, method, path, body, headers, chunk))


async def asgi_async(app, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                     chunk: int | None = None) -> Reply:
    path, _, query = path.partition("?")
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    pieces = pieces or [b""]
    hdrs = dict(headers or {})
    if not chunk:
        hdrs.setdefault("content-length", str(len(body)))
    read = [0]
    sent: list[dict] = []
    answered = asyncio.Event()

    async def receive():
        if read[0] < len(pieces):
            i = read[0]
            read[0] += 1
            return {"type": "http.request", "body": pieces[i], "more_body": i < len(pieces) - 1}
        await answered.wait()              # as a server does: the client stays until answered
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(k.lower().encode(), str(v).encode()) for k, v in hdrs.items()],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Reply(start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, out, read[0])


def multipart(data: bytes, filename: str = "x.wav", field: str = "file",
              ctype: str = "audio/wav") -> tuple[bytes, str]:
    """A multipart/form-data body with one file part; returns ``(body, content type)``."""
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
            f"Content-Type: {ctype}\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def wav_bytes(x: np.ndarray, rate: int = 16000, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.fixture(scope="session")
def gmm_service(gmm_file):
    return ModelService.from_file(gmm_file)


@pytest.fixture(scope="session")
def gmm_app(gmm_service):
    return create_app(gmm_service, ServeConfig(max_bytes=4 << 20))


# ---- a real server -----------------------------------------------------------------------------
class LiveServer:
    """uvicorn serving ``app`` on 127.0.0.1 and a free port, in a daemon thread."""

    def __init__(self, app):
        from wavetrain.serve.protocol import bind_socket, uvicorn_server

        self.sock = bind_socket("127.0.0.1", 0)
        self.server = uvicorn_server(app, app.state.server.config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        return http_request(self.port, method, path, body, headers)


def http_request(port: int, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None, timeout: float = 30) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()
