"""The web page in a real browser: headless chromium (Debian's package) driven over the DevTools
protocol with a small websocket client (no selenium, no playwright). It loads ``/``, gives the file
input a wav (``DOM.setFileInputFiles``), and waits for the predictions to render: the spectrogram
hidden until then, drawn with labelled time and frequency axes, and a GMM's log-likelihoods as bars
relative to the best."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from tests.serve.conftest import LiveServer
from wavetrain.serve import ServeConfig, create_app

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and os.access(p, os.X_OK)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                                          ".ci/run installs it when running as root)")


class DevTools:
    """Just enough of a websocket client (RFC 6455, text frames) to send DevTools commands."""

    def __init__(self, ws_url: str, timeout: float = 30):
        u = urlparse(ws_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "DevTools closed the connection during the handshake"
            head += chunk
        assert b" 101 " in head.split(b"\r\n", 1)[0], head
        self.buf = head.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def close(self) -> None:
        self.sock.close()

    def _send(self, text: str) -> None:
        data = text.encode()
        n = len(data)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
                                if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "DevTools closed the connection"
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _message(self) -> dict:
        parts = []
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)               # the server does not mask
            if b0 & 0x0F in (0x8, 0x9, 0xA):       # close, ping, pong: nothing DevTools sends here
                continue
            parts.append(payload)
            if b0 & 0x80:
                return json.loads(b"".join(parts))

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = self._message()
            if msg.get("id") == self.next_id:
                assert "error" not in msg, (method, msg["error"])
                return msg.get("result", {})

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        status = self.evaluate("document.getElementById('status').textContent")
        raise AssertionError(f"timed out waiting for {expression}; page status: {status!r}")

    def upload(self, path) -> None:
        """Give the page's file input ``path`` and wait until the page has its answer (state done)."""
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", nodeId=root, selector="#file")["nodeId"]
        self.call("DOM.setFileInputFiles", nodeId=node, files=[str(path)])
        state = self.wait_for("['done', 'error'].includes(document.body.dataset.state) && "
                              "document.body.dataset.state")
        assert state == "done", self.evaluate("document.getElementById('status').textContent")


def _start_chromium(profile: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--no-default-browser-check", "--disable-dev-shm-usage", "--remote-debugging-port=0",
                             "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode(errors="replace")
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        m = re.search(r"DevTools listening on (ws://\S+)", line)
        if m:
            return proc, m[1]
    proc.kill()
    proc.wait()
    pytest.fail("chromium did not start its DevTools endpoint:\n" + "".join(seen[-20:]))


def _page_ws(browser_ws: str) -> str:
    """A new tab's DevTools websocket address (``/json/new`` of the browser's HTTP endpoint)."""
    import urllib.request

    u = urlparse(browser_ws)
    req = urllib.request.Request(f"http://{u.hostname}:{u.port}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["webSocketDebuggerUrl"]


@contextlib.contextmanager
def open_page(app) -> Iterator[DevTools]:
    """``app``'s page in a tab of headless chromium: the app served on 127.0.0.1, the tab's Page and
    Runtime domains enabled and the page asked for; chromium is stopped on the way out."""
    with LiveServer(app) as srv, tempfile.TemporaryDirectory(prefix="wt-chromium-") as profile:
        proc, browser_ws = _start_chromium(profile)
        try:
            # the stderr pipe is not read from now on: keep chromium from blocking on a full one
            assert proc.stderr is not None
            proc.stderr.close()
            tab = DevTools(_page_ws(browser_ws))
            try:
                tab.call("Page.enable")
                tab.call("Runtime.enable")
                tab.call("Page.navigate", url=f"http://127.0.0.1:{srv.port}/")
                yield tab
            finally:
                tab.close()
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


#: The page's spectrogram canvas: its size and the plot inside the margins (MARGIN in page.py).
CANVAS_W, CANVAS_H, LEFT, TOP, BOTTOM = 900, 300, 58, 8, 40

#: JavaScript: the dark pixels (text, ticks) of the canvas in a rectangle (x, y, w, h).
DARK_PIXELS = ("((x, y, w, h) => { const d = document.getElementById('spec').getContext('2d')"
               ".getImageData(x, y, w, h).data; let n = 0; for (let i = 0; i < d.length; i += 4) "
               "if (d[i] + d[i + 1] + d[i + 2] < 300) n++; return n; })")


def test_page_uploads_a_file_and_shows_the_predictions(gmm_service, demo_files):
    app = create_app(gmm_service, ServeConfig(max_bytes=4 << 20))
    with open_page(app) as tab:
        tab.wait_for("document.readyState === 'complete' && !!document.getElementById('file')")
        tab.wait_for("document.getElementById('model').textContent.includes('gmm.wt')")
        # no empty canvas before an upload: the spectrogram is hidden and takes no room
        assert tab.evaluate("document.getElementById('specbox').hidden && "
                            "document.getElementById('spec').getBoundingClientRect().height === 0")
        tab.upload(demo_files["loose"])
        first = tab.evaluate("document.querySelector('#predictions li .name').textContent")
        assert first == "loose"
        rows = tab.evaluate("document.querySelectorAll('#segments tr').length")
        assert rows == 2                          # the header and one window
        assert "loose" in tab.evaluate("document.getElementById('segments').textContent")
        # the spectrogram is drawn in the page (not all black) once the audio is decoded
        tab.wait_for("(() => { const c = document.getElementById('spec'); const d = c.getContext('2d')"
                     ".getImageData(0, 0, c.width, c.height).data; let s = 0; for (let i = 0; i < d.length; "
                     "i += 4000) s += d[i]; return s > 0; })()", timeout=20)
        # shown once drawn, with time and frequency axes: ticks labelled in the margins
        tab.wait_for("!document.getElementById('specbox').hidden", timeout=20)
        assert tab.evaluate("document.getElementById('spec').getBoundingClientRect().height") > 100
        ds = tab.evaluate("Object.assign({}, document.getElementById('spec').dataset)")
        assert ds["xlabel"] == "time (s)" and ds["ylabel"] == "frequency (kHz)"
        assert ds["xticks"].split()[:10] == [f"{i / 10:.1f}" for i in range(10)]   # a 1 s recording
        assert ds["yticks"].split() == ["0", "2", "4", "6", "8"]            # the file's 16 kHz: to 8 kHz
        plot_bottom = CANVAS_H - BOTTOM
        below = tab.evaluate(f"{DARK_PIXELS}({LEFT}, {plot_bottom + 6}, {CANVAS_W - LEFT}, {BOTTOM - 6})")
        left = tab.evaluate(f"{DARK_PIXELS}(0, {TOP}, {LEFT - 2}, {plot_bottom - TOP})")
        corner = tab.evaluate(f"{DARK_PIXELS}(0, {plot_bottom + 12}, {LEFT - 12}, {BOTTOM - 12})")
        assert below > 100 and left > 100, (below, left)     # tick labels and axis titles
        assert corner == 0                                    # the margins are not black
        caption = tab.evaluate("document.getElementById('speccaption').textContent")
        assert "s, 0" in caption and "kHz" in caption
        # a GMM's mean log-likelihoods: the best a full bar, the others labelled with the difference
        listed = "[...document.querySelectorAll('#predictions li {}')].map(e => e.{})"
        values = tab.evaluate(listed.format(".value", "textContent"))
        widths = tab.evaluate(listed.format(".bar", "style.width"))
        assert values[0] == "0 (best)" and all(v.startswith("\u2212") for v in values[1:]), values
        assert widths[0] == "300px" and len(widths) == len(values) == 3, widths
        assert "difference from the best" in tab.evaluate("document.getElementById('scorenote').textContent")
