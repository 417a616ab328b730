"""`day0 server start|stop|status`: one Prefect server kept for the day0 commands that follow.

Without PREFECT_API_URL, `day0 validate` runs on Prefect's temporary server: started and stopped
by every command (database migrations, uvicorn; 5-15 s on a 2-core machine). A kept server pays
that once. `day0 server start` runs `prefect server start` (API and UI) with its PREFECT_HOME
under ``${XDG_STATE_HOME:-~/.local/state}/day0/server``, and every later `day0 validate` without
PREFECT_API_URL attaches to it while it answers (its runs stay in its UI). A watcher process
stops it after ``--idle-minutes`` in which no day0 command attached and no flow run was pending
or running, or at `day0 server stop`; a watcher that dies takes the server with it.

PREFECT_API_URL, when set, always wins: day0 never replaces a server the user chose.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from day0.execution import lifecycle
from day0.atomic import write_atomic
from day0.errors import ConfigError, StackError
from day0.orchestration import prefect_db
from day0.store.paths import server_home
from day0.stack import procs
from day0.stack.core import _get

STATE_FILE = "server.json"
LAST_USED_FILE = "last_used"
DEFAULT_IDLE_MINUTES = 30.0
DEFAULT_PORT = 4200
START_TIMEOUT_S = 180.0
CHECK_EVERY_S = 5.0
BUSY_STATES = ["PENDING", "RUNNING", "CANCELLING"]


def home(root: str | Path | None = None) -> Path:
    return Path(root).expanduser().resolve() if root else server_home()


def healthy(api_url: str) -> bool:
    return _get(api_url + "/health")[0] == 200


def busy_runs(api_url: str) -> int | None:
    """Flow runs pending or running on the server; None when it does not answer."""
    code, body = _get(api_url + "/flow_runs/count", json_body={
        "flow_runs": {"state": {"type": {"any_": BUSY_STATES}}}})
    try:
        return int(json.loads(body)) if code == 200 else None
    except ValueError:
        return None


def read_state(root: Path) -> dict | None:
    """The kept server's state while its watcher is alive, else None."""
    try:
        state = json.loads((root / STATE_FILE).read_text())
        watcher = state["watcher"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if procs.alive(watcher["pid"], watcher.get("ticks")) else None


def attach(root: str | Path | None = None) -> str | None:
    """API URL of the kept server if it runs and answers (marking it used), else None."""
    root = home(root)
    state = read_state(root)
    if state is None or not healthy(state["api_url"]):
        return None
    (root / LAST_USED_FILE).touch()
    return state["api_url"]


def start(root: str | Path | None = None, *, port: int | None = None,
          idle_minutes: float = DEFAULT_IDLE_MINUTES, timeout_s: float = START_TIMEOUT_S,
          out=print) -> str:
    """Start the kept server (or find it running); its API URL once it answers."""
    root = home(root)
    if (url := attach(root)) is not None:
        out(f"day0 server: already running at {url.removesuffix('/api')} (UI and API)")
        keep_stage_host(root)
        return url
    if port is not None and not procs.port_free(port):
        raise ConfigError(f"port {port} is taken", field="--port",
                         fix="give a free port, or leave --port out for 4200 or a free one")
    port = procs.pick_port([port or DEFAULT_PORT], set())
    root.mkdir(parents=True, exist_ok=True)
    (root / STATE_FILE).unlink(missing_ok=True)
    log = root / "watcher.log"
    watcher = procs.spawn([sys.executable, "-m", "day0.orchestration.server", "--root", str(root),
                           "--port", str(port), "--idle-minutes", f"{idle_minutes:g}"],
                          env={**os.environ}, cwd=root, log=log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if watcher.poll() is not None:
            raise StackError(f"the Prefect server exited during start-up ({watcher.returncode})",
                             field="day0 server", fix=f"see {root / 'prefect.log'} and {log}")
        if (url := attach(root)) is not None:
            out(f"day0 server: Prefect UI and API at {url.removesuffix('/api')}; day0 commands "
                f"without PREFECT_API_URL use it; it stops after {idle_minutes:g} idle minutes "
                "or at `day0 server stop`")
            keep_stage_host(root)
            return url
        time.sleep(0.25)
    procs.stop(watcher.pid, procs.start_ticks(watcher.pid))
    raise StackError(f"the Prefect server did not answer within {timeout_s:g} s",
                     field="day0 server", fix=f"see {root / 'prefect.log'}; a busy machine may "
                                               "need --timeout")


def keep_stage_host(root: Path) -> None:
    """Beside the server, a kept warm stage host for this environment (day0.execution.stagehost), started
    in the background: the next validations fork their stages from it. It leaves with the
    server's watcher, or after the server's idle time without a stage."""
    from day0.execution import stagehost

    state = read_state(root)
    if state is None or not stagehost.enabled() or root != home():
        return  # validations find kept hosts under home() only
    keep_hosts_beside(state)
    stagehost.host_for(dict(os.environ))


def keep_hosts_beside(state: dict) -> None:
    """Stage hosts this process starts from now on are kept, anchored to the server's watcher
    (state: read_state's) and idle as long as the server may be."""
    from day0.execution import stagehost

    watcher = state["watcher"]
    stagehost.keep_beside(watcher["pid"], watcher.get("ticks"), float(state["idle_minutes"]) * 60)


def stop(root: str | Path | None = None, out=print) -> bool:
    """Stop the kept server; False when none was running."""
    root = home(root)
    state = read_state(root)
    if state is None:
        out("day0 server: none running")
        return False
    watcher = state["watcher"]
    procs.stop(watcher["pid"], watcher.get("ticks"))
    (root / STATE_FILE).unlink(missing_ok=True)
    out(f"day0 server: stopped ({state['api_url'].removesuffix('/api')})")
    return True


def status(root: str | Path | None = None, out=print) -> bool:
    root = home(root)
    state = read_state(root)
    if state is None or not healthy(state["api_url"]):
        out("day0 server: not running" if state is None else
            f"day0 server: watcher {state['watcher']['pid']} alive, API not answering")
        return False
    idle = time.time() - _last_used(root)
    out(f"day0 server: {state['api_url'].removesuffix('/api')}, watcher pid "
        f"{state['watcher']['pid']}, {busy_runs(state['api_url']) or 0} runs busy, idle "
        f"{idle / 60:.1f} of {state['idle_minutes']:g} minutes")
    return True


def _last_used(root: Path) -> float:
    try:
        return (root / LAST_USED_FILE).stat().st_mtime
    except OSError:
        return 0.0


def watch(root: Path, port: int, idle_minutes: float) -> int:
    """The watcher: runs the Prefect server as its child until idle, stopped, or the child dies."""
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": api_url,
           "PREFECT_SERVER_UI_API_URL": api_url, "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port)}
    env.pop("PREFECT_API_URL", None)
    prefect_db.seed(root / "prefect", env)
    with open(root / "prefect.log", "ab") as log:  # in the watcher's session; dies with it
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                                   "127.0.0.1", "--port", str(port)], env=env, cwd=root,
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  preexec_fn=lifecycle.die_with_parent)
    ticks = procs.start_ticks(server.pid)
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    state = {"api_url": api_url, "port": port, "idle_minutes": idle_minutes,
             "watcher": {"pid": os.getpid(), "ticks": procs.start_ticks(os.getpid())},
             "server": {"pid": server.pid, "ticks": ticks}}
    write_atomic(root / STATE_FILE, json.dumps(state))  # `start` polls it: never half-written
    answered = False
    try:
        while not stopping["now"] and server.poll() is None:
            if not answered:  # the idle clock starts once it answers (migrations take a while)
                answered = healthy(api_url)
                (root / LAST_USED_FILE).touch()
                if answered:
                    prefect_db.keep(root / "prefect", env)
            elif busy_runs(api_url):
                (root / LAST_USED_FILE).touch()
            elif time.time() - _last_used(root) > idle_minutes * 60:
                break
            time.sleep(CHECK_EVERY_S if answered else 0.5)
    finally:
        procs.stop(server.pid, ticks)
        try:
            if json.loads((root / STATE_FILE).read_text())["watcher"]["pid"] == os.getpid():
                (root / STATE_FILE).unlink()
        except (OSError, ValueError, KeyError):
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the kept Prefect server's watcher")
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle-minutes", type=float, default=DEFAULT_IDLE_MINUTES)
    args = parser.parse_args(argv)
    return watch(Path(args.root), args.port, args.idle_minutes)


if __name__ == "__main__":
    sys.exit(main())
