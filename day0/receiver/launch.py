"""Run the receiver for tests, benchmarks and scripted stacks: in a thread or as a process.

``ReceiverProcess`` runs ``python -m day0.cli hooks serve`` (so it can be killed with SIGKILL
and restarted on the same journal); ``ReceiverThread`` runs uvicorn in this process (fast to
start; used where no kill is needed). Both wait until GET /healthz answers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, token: str | None, timeout_s: float, alive=lambda: True) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("receiver exited during start-up")
        try:
            if httpx.get(f"{url}/healthz", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"receiver at {url} not healthy within {timeout_s:g} s")


def write_config(path: str | Path, settings: dict) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return path


class ReceiverProcess:
    """`day0 hooks serve --config FILE` as a child process (its own session, killable)."""

    def __init__(self, config: str | Path, port: int | None = None, env: dict | None = None,
                 log: str | Path | None = None, admin_token: str | None = None):
        self.config, self.port = Path(config), port or free_port()
        self.env = {**os.environ, **(env or {})}
        self.log = Path(log) if log else self.config.with_suffix(".log")
        self.admin_token = admin_token
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90.0) -> "ReceiverProcess":
        cmd = [sys.executable, "-m", "day0.cli", "hooks", "serve", "--config", str(self.config),
               "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_healthy(self.url, self.admin_token, timeout_s, alive=lambda: self.proc.poll() is None)
        except RuntimeError as exc:
            self.kill()
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from None
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs (what a crash or OOM kill looks like)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ReceiverThread:
    """uvicorn serving create_app(settings) in a daemon thread of this process."""

    def __init__(self, settings, client_factory=None):
        import uvicorn

        from day0.receiver.app import create_app
        from day0.receiver.server import uvicorn_config

        if not settings.port:
            settings = settings.model_copy(update={"port": free_port()})
        self.settings = settings
        # the same limits and protocol as `day0 hooks serve`
        config = uvicorn_config(create_app(settings, client_factory), settings,
                                log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="receiver-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    def start(self, timeout_s: float = 30.0) -> "ReceiverThread":
        self.thread.start()
        token = self.settings.secrets.admin_token
        wait_healthy(self.url, token.get_secret_value() if token else None, timeout_s,
                     alive=self.thread.is_alive)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
