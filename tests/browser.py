"""Headless Chromium driven over the DevTools protocol (CDP), for tests of the Prefect UI.

Chromium is started with ``--remote-debugging-port=0`` (it writes the port it chose to
DevToolsActivePort in its profile); each page is a new target whose websocket we talk to:
evaluate JavaScript (wait until the single-page app rendered what we expect, read <img> state),
save a screenshot and the DOM. ``make browser`` installs Debian's chromium.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.procs import stop_group

BINARIES = ("chromium", "chromium-browser")


def find_chromium() -> str | None:
    for name in (os.environ.get("DAY0_CHROMIUM"), *BINARIES):
        if name and (found := shutil.which(name)):
            return found
    return None


class Page:
    """One browser tab: JavaScript, waits, screenshots, DOM dumps."""

    def __init__(self, ws, width: int, height: int):
        self.ws, self._id = ws, 0
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:  # events arrive in between; only our answer counts
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str = ""):
        """Poll a JavaScript expression until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText.slice(0, 1500) : ''")
                raise AssertionError(f"page never showed {what or expression!r} within "
                                     f"{timeout:g} s; it shows:\n{text}")
            time.sleep(0.5)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path) -> Path:
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def dump_dom(self, path: Path) -> str:
        html = self.evaluate("document.documentElement.outerHTML") or ""
        path.write_text(html)
        return html


class Chromium:
    """A headless Chromium process; ``with Chromium(profile) as b: with b.page(url) as p: ...``."""

    def __init__(self, profile: Path, binary: str | None = None, width: int = 1400,
                 height: int = 900):
        self.binary = binary or find_chromium()
        if not self.binary:
            raise FileNotFoundError("no chromium: run `make browser`")
        self.profile, self.width, self.height = profile, width, height
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    def __enter__(self) -> "Chromium":
        self.profile.mkdir(parents=True, exist_ok=True)
        log = open(self.profile / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-quic", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", f"--window-size={self.width},{self.height}",
             "about:blank"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.is_file() and active.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not start: "
                                   + (self.profile / "chromium.log").read_text()[-2000:])
            time.sleep(0.1)
        self.port = int(active.read_text().split()[0])
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace_s=10)

    def page(self, url: str, height: int | None = None) -> "_PageContext":
        """A new tab at url; height: a taller viewport (the UI scrolls inside its own panes,
        so a full-page capture shows no more than the viewport)."""
        return _PageContext(self, url, height or self.height)


class _PageContext:
    def __init__(self, browser: Chromium, url: str, height: int):
        self.browser, self.url, self.height = browser, url, height

    def __enter__(self) -> Page:
        from websockets.sync.client import connect

        base = f"http://127.0.0.1:{self.browser.port}"
        request = urllib.request.Request(f"{base}/json/new?{urllib.parse.quote(self.url, safe=':/?=&%')}",
                                         method="PUT")
        with urllib.request.urlopen(request, timeout=30) as answer:
            self.target = json.load(answer)
        self.ws = connect(self.target["webSocketDebuggerUrl"], max_size=2 ** 28,
                          open_timeout=30)
        return Page(self.ws, self.browser.width, self.height)

    def __exit__(self, *exc) -> None:
        self.ws.close()
        base = f"http://127.0.0.1:{self.browser.port}"
        try:
            urllib.request.urlopen(f"{base}/json/close/{self.target['id']}", timeout=10).close()
        except OSError:
            pass


IMAGES_JS = """(() => [...document.images].map(i => ({
    src: (i.getAttribute('src') || '').slice(0, 30), length: (i.getAttribute('src') || '').length,
    complete: i.complete, naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight})))()"""

LOADED_PNG_JS = """(() => [...document.images].some(i =>
    (i.getAttribute('src') || '').startsWith('data:image/png;base64,')
    && i.complete && i.naturalWidth > 0))()"""


__all__ = ["Chromium", "Page", "find_chromium", "IMAGES_JS", "LOADED_PNG_JS"]
