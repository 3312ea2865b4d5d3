"""Debian's headless `chromium`, driven over the DevTools protocol (CDP) for the dashboard
tests: open a page, evaluate JS in it, wait for a condition, save a screenshot.

Nothing is downloaded: the browser is the system's `chromium` (`.ci/run` and `setup.sh`
install it where they can); `websocket-client` (a dev dependency) carries CDP. The browser
runs in its own session and is stopped by its PID's process group at `close`.
"""

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

BROWSERS = ("chromium", "chromium-browser")
START_TIMEOUT_S = 30


def find_chromium() -> str | None:
    """The system's chromium, or None (the test is skipped, saying how to install it)."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """One headless chromium with one page, driven through CDP."""

    def __init__(self, tmp: Path, width: int = 1400, height: int = 900) -> None:
        import websocket

        exe = find_chromium()
        assert exe is not None
        self.log_path = tmp / "chromium.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (open while the browser runs)
        self.proc = subprocess.Popen(
            [
                exe,
                "--headless=new",
                "--no-sandbox",  # root in CI containers
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={tmp / 'chromium-profile'}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            start_new_session=True,  # its zygote and renderers share our PID's group
        )
        try:
            port = self._devtools_port()
            pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
            self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True)
        except BaseException:
            self.close()
            raise
        self._ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _devtools_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited: {self.log_path.read_text()[-2000:]}")
            for line in self.log_path.read_text().splitlines():
                if line.startswith("DevTools listening on ws://"):
                    return int(line.split("ws://")[1].split("/")[0].rsplit(":", 1)[1])
            time.sleep(0.1)
        raise RuntimeError(f"chromium did not start: {self.log_path.read_text()[-2000:]}")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One CDP command; its result (events in between are skipped)."""
        i = next(self._ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def eval(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr: str, timeout_s: float, what: str) -> float:
        """Seconds until `expr` is truthy in the page (AssertionError after `timeout_s`)."""
        t0 = time.monotonic()
        while True:
            try:
                if self.eval(expr):
                    return time.monotonic() - t0
            except RuntimeError:
                pass  # the page is still loading
            if time.monotonic() - t0 > timeout_s:
                raise AssertionError(f"the page did not show {what} within {timeout_s} s")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):  # renderers left behind in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()
