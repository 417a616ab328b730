#!/usr/bin/env python
"""`make demo`: validate the bundled fixtures against ONE Prefect server and print each verdict.

    python scripts/demo.py [--target cpu-bf16] [--out out/demo] [--no-cache] [MODEL ...]

Starts one ``prefect server start`` (its PREFECT_HOME under day0's cache dir, a free port,
analytics off, no UI), runs ``day0 validate`` for every fixture in this process against it, and
stops it (a separate ``day0 validate`` each would start and stop a temporary server per model:
most of a warm re-run). With PREFECT_API_URL already set, that server is used and none started.
Exit status: the first non-zero ``day0 validate`` status, else 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from day0.orchestration import prefect_db

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ["tiny-llama", "tiny-qwen3moe", "tiny-deepseekv3"]
STARTUP_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_dir() -> Path:
    return Path(os.environ.get("DAY0_CACHE_DIR") or Path.home() / ".cache" / "day0")


class Server:
    """One `prefect server start` for the demo; kept DB under PREFECT_HOME, so a re-run skips
    the migrations."""

    def __init__(self, home: Path):
        self.home, self.port = home, free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        return {"PREFECT_HOME": str(self.home), "PREFECT_API_URL": self.api_url,
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false"}

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        prefect_db.seed(self.home)  # Prefect's migrations, once per machine
        log = open(self.home / "server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
             "--port", str(self.port), "--no-ui", "--analytics-off"],
            env={**os.environ, **self.env()}, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as r:
                    if r.status == 200:
                        prefect_db.keep(self.home)
                        return
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        tail = (self.home / "server.log").read_text(errors="replace").splitlines()[-15:]
        raise SystemExit("demo: the Prefect server did not start within "
                         f"{STARTUP_S:g} s:\n  " + "\n  ".join(tail))

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # uvicorn and its services: the whole group
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _drain_prefect() -> None:
    """Send the queued run logs and events while the server still answers (at exit they would
    retry against a stopped server for a minute)."""
    try:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for worker in (APILogWorker, EventsWorker):
            worker.drain_all(timeout=10)
    except Exception as exc:  # the verdicts are printed already; only logs may be lost
        print(f"demo: could not flush Prefect's logs/events: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=FIXTURES, help="fixture names (default: all)")
    parser.add_argument("--target", default="cpu-bf16")
    parser.add_argument("--out", default="out/demo", help="report folder, one sub-folder per model")
    parser.add_argument("--text", default=str(ROOT / "tests/fixtures/text/heldout.txt"))
    parser.add_argument("--no-cache", action="store_true", help="recompute every stage")
    args = parser.parse_args(argv)

    started = time.monotonic()
    from day0.execution import stagehost

    stagehost.prewarm()  # the stage host's imports overlap the server's start
    server = None
    if not os.environ.get("PREFECT_API_URL"):
        server = Server(cache_dir() / "demo-prefect")
        print(f"=== one Prefect server for the demo: {server.api_url} "
              f"(PREFECT_HOME {server.home})", flush=True)
        server.start()
        os.environ.update(server.env())  # before prefect is imported in this process
        print(f"    up in {time.monotonic() - started:.1f} s", flush=True)
    from day0 import cli  # imports prefect lazily, after the environment is set

    verdicts, status = [], 0
    try:
        for model in args.models:
            source = ROOT / "tests" / "fixtures" / "models" / model
            cmd = ["validate", str(source), "--target", args.target, "--text", args.text,
                   "--out", str(Path(args.out) / model)] + (["--no-cache"] if args.no_cache else [])
            print(f"=== day0 {' '.join(cmd)}", flush=True)
            t0 = time.monotonic()
            code = cli.main(cmd)
            verdicts.append((model, code, time.monotonic() - t0))
            status = status or code
    finally:
        if server is not None:
            _drain_prefect()
            server.stop()
    names = {0: "PASS", 1: "FAIL", 2: "bad input", 3: "ERROR", 4: "internal error", 5: "BROKEN"}
    print(f"=== demo: {len(verdicts)} models on {args.target} in "
          f"{time.monotonic() - started:.1f} s")
    for model, code, seconds in verdicts:
        print(f"    {model:<18} {names.get(code, f'exit {code}'):<8} {seconds:6.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
