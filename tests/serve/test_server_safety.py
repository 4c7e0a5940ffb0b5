"""A real uvicorn server on 127.0.0.1 under abuse, with raw sockets: idle connections, request heads
sent a byte at a time, uploads that send their headers and no body; malformed requests; and
``wavetrain serve``'s start-up errors. Timeouts are short so that every wait here is bounded."""
from __future__ import annotations

import json
import socket
import time

from tests.serve.conftest import LiveServer, http_request, multipart
from wavetrain.serve import ServeConfig, create_app

FAST = {"header_timeout_s": 1.0, "read_timeout_s": 1.0, "keep_alive_s": 1.0}


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def _read_all(s: socket.socket, limit: float = 10) -> bytes:
    """Everything the server sends until it closes the connection (bounded by ``limit`` s)."""
    s.settimeout(limit)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def _stalled_upload(port: int, length: int = 30_000) -> socket.socket:
    s = _connect(port)
    s.sendall(f"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: audio/wav\r\n"
              f"Content-Length: {length}\r\n\r\n".encode())
    return s


def _json_reply(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_idle_connections_and_stalled_uploads_do_not_lock_others_out(gmm_service, demo_files):
    """60 idle connections and 12 uploads stuck after their headers: /healthz and a classify
    request are still answered at once, and the stuck uploads get a JSON 408 and are closed."""
    app = create_app(gmm_service, ServeConfig(max_connections=64, workers=1, queue=8, **FAST))
    body, ctype = multipart(demo_files["bearing"].read_bytes())
    with LiveServer(app) as srv:
        stalled = [_stalled_upload(srv.port) for _ in range(12)]
        for _ in range(200):                            # until the server reads their heads (bounded)
            if http_request(srv.port, "GET", "/healthz", timeout=5).json()["reading"] == 12:
                break
            time.sleep(0.01)
        idle = [_connect(srv.port) for _ in range(60)]
        try:
            r = http_request(srv.port, "GET", "/healthz", timeout=5)
            assert r.status == 200 and r.json()["admitted"] == 0
            r = http_request(srv.port, "POST", "/v1/classify", body, {"Content-Type": ctype}, timeout=5)
            assert r.status == 200 and r.json()["label"] == "bearing"
            for s in stalled:
                status, headers, res = _json_reply(_read_all(s))
                assert status == 408 and res["status"] == 408 and "stopped arriving" in res["error"]
                assert headers["content-type"] == "application/json"
            assert sum(_read_all(s, 5) == b"" for s in idle) == 60    # closed: evicted or timed out
            health = http_request(srv.port, "GET", "/healthz", timeout=5).json()
            assert health["admitted"] == 0 and health["buffered_bytes"] == 0 and health["served"] == 1
        finally:
            for s in stalled + idle:
                s.close()


def test_slow_request_heads_are_closed(gmm_service):
    app = create_app(gmm_service, ServeConfig(**FAST))
    with LiveServer(app) as srv:
        s = _connect(srv.port)
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            s.settimeout(0.3)
            end = time.monotonic() + 10
            closed = False
            while not closed and time.monotonic() < end:    # a header line now and then: still closed
                try:
                    s.sendall(b"X-A: b\r\n")
                    closed = s.recv(100) == b""
                except TimeoutError:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
            assert closed
        finally:
            s.close()
        # a kept-alive connection that then sends half a request head is closed as well
        s = _connect(srv.port)
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            first = s.recv(65536)
            while not first.endswith(b"}"):         # the whole answer (a JSON object)
                first += s.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert _read_all(s) == b""
        finally:
            s.close()


def test_connections_all_busy_get_a_json_503(gmm_service):
    app = create_app(gmm_service, ServeConfig(max_connections=4, header_timeout_s=5, read_timeout_s=5))
    with LiveServer(app) as srv:
        stalled = [_stalled_upload(srv.port) for _ in range(4)]
        try:
            time.sleep(0.2)                          # the four heads are read (a bound, not a measure)
            status, headers, res = _json_reply(_read_all(_connect(srv.port)))
            assert status == 503 and headers["retry-after"] == "1" and "connections" in res["error"]
        finally:
            for s in stalled:
                s.close()


def test_malformed_requests_get_json(gmm_service):
    app = create_app(gmm_service, ServeConfig(**FAST))
    with LiveServer(app) as srv:
        long_head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 20_000      # growing past 16 KiB
        for raw in (b"NOT HTTP AT ALL\r\n\r\n", long_head):
            s = _connect(srv.port)
            try:
                s.sendall(raw)
                status, headers, res = _json_reply(_read_all(s))
            finally:
                s.close()
            assert status == 400 and res["status"] == 400 and headers["content-type"] == "application/json"
        r = http_request(srv.port, "GET", "/healthz", headers={"Host": "evil.example"})
        assert r.status == 421 and r.json()["status"] == 421
        # refused before its body is read: the connection is closed, not drained of a declared gigabyte
        r = http_request(srv.port, "POST", "/v1/classify", None, {"Content-Type": "audio/wav",
                                                                  "Content-Length": str(10 ** 9)})
        assert r.status == 413 and r.headers["connection"] == "close"


def test_cli_start_up_errors_are_one_line(gmm_file, capsys):
    from wavetrain.cli.main import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, words in ((["--port", str(port)], "in use"), (["--host", "no-such-host.invalid", "--port", "0"],
                                                                 "--host"), (["--host", "203.0.113.7", "--port", "0"],
                                                                             "cannot be bound")):
            assert main(["serve", "-m", str(gmm_file), *args]) == 2
            err = capsys.readouterr().err
            assert words in err and "serving" not in err and "Traceback" not in err, err
            assert len(err.strip().splitlines()) == 1, err
    assert main(["serve", "-m", str(gmm_file), "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert "0 to 65535" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_an_adapting_detector(demo_csv, tmp_path, capsys):
    from tests.serve.conftest import _train
    from wavetrain.cli.main import main

    path = _train(demo_csv, tmp_path / "nd.wt", "--label", "state", "--normal", "healthy", "--model",
                  "normal-dist", "--set", "adapt=5")
    capsys.readouterr()
    assert main(["serve", "-m", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "adapt=5" in err and "serving" not in err and len(err.strip().splitlines()) == 1
