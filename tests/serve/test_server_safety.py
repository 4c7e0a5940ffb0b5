"""A real uvicorn server on 127.0.0.1 under abuse, with raw sockets: idle connections, request heads
sent a byte at a time, uploads that send their headers and no body; malformed requests; and
``wavetrain serve``'s start-up errors. Timeouts are short so that every wait here is bounded."""
from __future__ import annotations

import json
import socket
import time

import pytest

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
    """60 idle connections and 12 uploads stuck after their headers, against 64 connections:
    /healthz and a classify request are still answered at once, and the stuck uploads get a JSON
    408, or a 503 where one was closed to make room for a newer connection (a small body being
    read makes room as an idle connection does)."""
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
                assert res["status"] == status and headers["content-type"] == "application/json"
                want = {408: "stopped arriving", 503: "make room"}
                assert status in want and want[status] in res["error"], res
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
    """Four large uploads (over 512 KiB: each holds an upload slot) stuck after their headers fill
    the four connections: a new one is answered 503."""
    app = create_app(gmm_service, ServeConfig(max_connections=4, header_timeout_s=5, read_timeout_s=5))
    with LiveServer(app) as srv:
        stalled = [_stalled_upload(srv.port, 1_000_000) for _ in range(4)]
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
        for raw, want in ((b"NOT HTTP AT ALL\r\n\r\n", 400), (long_head, 431)):
            s = _connect(srv.port)
            try:
                s.sendall(raw)
                status, headers, res = _json_reply(_read_all(s))
            finally:
                s.close()
            assert status == want and res["status"] == want and headers["content-type"] == "application/json"
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


def _head(size: int) -> bytes:
    """A whole GET /healthz request head of ``size`` bytes (padded with one header)."""
    start, end = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


def test_request_heads_over_16_kib_are_refused_even_when_whole(gmm_service):
    """A head that arrives in one piece is bounded as one arriving a byte at a time: 16 KiB is
    answered, more is a JSON 431 and the connection closed — a pipelined one too."""
    app = create_app(gmm_service, ServeConfig(**FAST))
    with LiveServer(app) as srv:
        for size, want in ((16 * 1024, 200), (16 * 1024 + 1, 431), (20 * 1024, 431), (64 * 1024, 431)):
            s = _connect(srv.port)
            try:
                s.sendall(_head(size))
                raw = _read_all(s, 5) if want == 431 else s.recv(65536)
            finally:
                s.close()
            assert raw.startswith(f"HTTP/1.1 {want} ".encode()), (size, raw[:100])
            if want == 431:
                status, headers, res = _json_reply(raw)
                assert res == {"error": "request head larger than 16384 bytes", "status": 431}
                assert headers["connection"] == "close"
        # a small request, then an oversized one in the same packet (pipelined)
        s = _connect(srv.port)
        try:
            s.sendall(_head(200) + _head(40 * 1024))
            raw = _read_all(s, 5)
        finally:
            s.close()
        assert raw.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 431 " in raw


class _Trickle:
    """Uploads posting a ``size``-byte body at about ``rate`` bytes/s from one thread, each until
    the server answers or closes it (bounded by ``limit`` s); what each got."""

    def __init__(self, port: int, n: int, size: int = 40_000_000, rate: int = 25_000, limit: float = 20):
        import threading

        self.port, self.n, self.size, self.rate, self.limit = port, n, size, rate, limit
        self.answers: list[str | None] = [None] * n
        self.sent = [0] * n
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Trickle:
        self.socks = [_stalled_upload(self.port, self.size) for _ in range(self.n)]
        for s in self.socks:
            s.setblocking(False)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)
        for s in self.socks:
            s.close()

    def _run(self) -> None:
        piece = b"\0" * (self.rate // 10)
        end = time.monotonic() + self.limit
        while not self.stop.is_set() and time.monotonic() < end and None in self.answers:
            for i, s in enumerate(self.socks):
                if self.answers[i] is not None:
                    continue
                try:
                    data = s.recv(4096)
                    self.answers[i] = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
                except BlockingIOError:
                    try:
                        self.sent[i] += s.send(piece)
                    except BlockingIOError:
                        pass
                    except OSError:
                        self.answers[i] = "reset"
                except OSError:
                    self.answers[i] = "reset"
            self.stop.wait(0.1)

    def answered(self) -> list[str]:
        return [a for a in self.answers if a is not None]


@pytest.mark.parametrize("per_client", [2, 100])
def test_slow_large_uploads_leave_room_for_small_requests(gmm_service, demo_files, per_client):
    """12 uploads of a 40 MB body at 25 KB/s (above the rate floor) from this address, against
    12 connections: they get at most the 4 upload slots (with a per-client limit of 2: 2), the
    others are refused at once (429 per client, 503 beyond the slots) and closed, so that small
    requests are still answered; and the ones taken are dropped (408) once they fall behind the
    rate their size needs (40 MB in 5 s), long before their end."""
    app = create_app(gmm_service, ServeConfig(max_connections=12, max_uploads=4, max_uploads_per_client=per_client,
                                              max_upload_s=5, min_upload_rate=1000, **FAST))
    body, ctype = multipart(demo_files["bearing"].read_bytes())
    held = min(per_client, 4)
    with LiveServer(app) as srv, _Trickle(srv.port, 12) as slow:
        for _ in range(500):                             # the refusals (bounded wait)
            if len(slow.answered()) >= 12 - held:
                break
            time.sleep(0.01)
        refused = slow.answered()
        assert len(refused) == 12 - held
        assert set(refused) == ({"429"} if per_client == 2 else {"503"}), refused
        health = http_request(srv.port, "GET", "/healthz", timeout=5).json()
        assert health["reading"] == health["reading_large"] == held
        for _ in range(3):
            r = http_request(srv.port, "POST", "/v1/classify", body, {"Content-Type": ctype}, timeout=5)
            assert r.status == 200 and r.json()["label"] == "bearing"
        slow.thread.join(20)
        assert sorted(slow.answers) == sorted(refused + ["408"] * held), slow.answers   # type: ignore[type-var]
        assert max(slow.sent) < 200_000, slow.sent           # dropped within seconds, not after 40 MB
        health = http_request(srv.port, "GET", "/healthz", timeout=5).json()
        assert health["reading"] == 0 and health["buffered_bytes"] == 0


_STUCK_SERVER = """
import sys, threading
from wavetrain.models.modelfile import load_model

cls = type(load_model(sys.argv[1]))
score = cls.predict_scores

def stuck(self, grams):        # in the server's workers, a scoring that never returns (a graph looping for ever)
    if threading.current_thread().name.startswith("wavetrain-serve"):
        threading.Event().wait()
    return score(self, grams)

cls.predict_scores = stuck
from wavetrain.cli.main import main
sys.exit(main(["serve", "-m", sys.argv[1], "--port", "0", "--work-timeout", "600"]))
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_server_while_a_worker_is_stuck(gmm_file, demo_files, sig):
    """`wavetrain serve` whose model's scoring never returns, one request stuck in it: SIGINT
    (Ctrl-C) or SIGTERM stops the server all the same, without a traceback."""
    import os
    import re
    import signal
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _STUCK_SERVER, str(gmm_file)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            # (a suite started in the background inherits SIGINT ignored: give the child Ctrl-C)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    s = None
    try:
        line = proc.stderr.readline().decode()                 # type: ignore[union-attr]
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))   # type: ignore[union-attr]
        wav = demo_files["healthy"].read_bytes()
        for _ in range(400):                                    # until it listens (it prints first)
            try:
                http_request(port, "GET", "/healthz", timeout=5)
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
        s = _connect(port)
        s.sendall(f"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: audio/wav\r\n"
                  f"Content-Length: {len(wav)}\r\n\r\n".encode() + wav)
        for _ in range(400):                                    # until the worker is in the scoring
            if http_request(port, "GET", "/healthz", timeout=5).json()["workers_busy"] == 1:
                break
            time.sleep(0.05)
        assert http_request(port, "GET", "/healthz", timeout=5).json()["workers_busy"] == 1
        proc.send_signal(getattr(signal, sig))
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{sig} did not stop the server in 30 s")
        err = proc.stderr.read().decode()                       # type: ignore[union-attr]
        assert rc == (130 if sig == "SIGINT" else -signal.SIGTERM), (rc, err)
        assert "Traceback" not in err, err
    finally:
        if s is not None:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_slow_small_uploads_make_room_for_new_connections(gmm_service, demo_files):
    """12 uploads of a small body (30 kB, no upload slot) trickling at 1 kB/s fill the 12
    connections: each new connection closes the oldest of them (a JSON 503) rather than being
    refused, so that real requests are answered."""
    app = create_app(gmm_service, ServeConfig(max_connections=12, min_upload_rate=100, **FAST))
    body, ctype = multipart(demo_files["bearing"].read_bytes())
    with LiveServer(app) as srv, _Trickle(srv.port, 12, size=30_000, rate=1000, limit=10) as slow:
        for _ in range(500):                                    # until the server reads all of them
            if http_request(srv.port, "GET", "/healthz", timeout=5).json().get("reading") == 12:
                break                                           # (a 503 while the app has not seen them all)
            time.sleep(0.01)
        for _ in range(3):
            r = http_request(srv.port, "POST", "/v1/classify", body, {"Content-Type": ctype}, timeout=5)
            assert r.status == 200 and r.json()["label"] == "bearing"
        for _ in range(500):
            if slow.answered():
                break
            time.sleep(0.01)
        # the oldest made room (the rest then fit): answered 503, or reset as it was still sending
        assert slow.answered() in (["503"], ["reset"]), slow.answers
