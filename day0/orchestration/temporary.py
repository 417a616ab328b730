"""The temporary Prefect server of one `day0 validate` that finds no server to attach to.

Prefect would start the same server itself (its SubprocessASGIServer: uvicorn on Prefect's app
factory, UI off) in the command's process group. `timeout 60 day0 validate ...`, a CI runner or
Ctrl-C then signal the server with the command, and the run that should write its report, end
its flow run Crashed and exit spends minutes retrying a dead API. Here it runs in a session of
its own, so only day0 stops it (at the command's end, SIGTERM included), and dies with the
command should that be killed outright (SIGKILL: the kernel's parent-death signal).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from day0.errors import StackError

START_TIMEOUT_S = 180.0  # migrations of a fresh database take a while on a busy 2-core machine
STOP_GRACE_S = 5.0


def _command(port: int) -> list[str]:
    import prefect

    return [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "error", "--lifespan", "on"]


def _environment() -> dict[str, str]:
    from prefect.settings import get_current_settings

    return {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            **get_current_settings().to_environment_variables(exclude_unset=True)}


def _drain_prefect_services(timeout_s: float = 10.0) -> None:
    """Send what Prefect's background services still hold (run logs, events) while the server
    answers: after it stops they would retry a dead API for minutes at interpreter exit."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        try:
            service.drain_all(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - the server stops either way
            pass


@contextlib.contextmanager
def temporary_server(log=print):
    """A Prefect server for this command; yields its API URL, stops it on the way out."""
    from day0.execution.lifecycle import die_with_parent
    from day0.stack import procs
    from day0.stack.core import _get

    port = procs.pick_port([], set())
    api_url = f"http://127.0.0.1:{port}/api"
    log(f"day0: temporary Prefect server on http://127.0.0.1:{port} (`day0 server start` keeps "
        "one for later commands)")
    server = subprocess.Popen(_command(port), env=_environment(), stdin=subprocess.DEVNULL,
                              start_new_session=True, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _get(api_url + "/health")[0] != 200:
            if server.poll() is not None:
                raise StackError(f"the temporary Prefect server exited during start-up "
                                 f"({server.returncode})", field="prefect server",
                                 fix="run `day0 server start`, or set PREFECT_API_URL")
            if time.monotonic() > deadline:
                raise StackError(f"the temporary Prefect server did not answer within "
                                 f"{START_TIMEOUT_S:g} s", field="prefect server",
                                 fix="run `day0 server start`, or set PREFECT_API_URL")
            time.sleep(0.1)
        yield api_url
    finally:
        _drain_prefect_services()
        server.terminate()
        try:
            server.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


__all__ = ["temporary_server"]
