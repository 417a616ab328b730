"""`day0 stack up|down|status`: the release-to-verdict stack on this machine, without Docker.

Four processes, each in its own session with its log under ``<state>/logs/``, started in this
order and each waited for until healthy:

1. Prefect server (``PREFECT_HOME=<state>/prefect``, analytics off, the UI told which API to
   call: a bare ``prefect server start --port X`` serves a UI that calls port 4200);
2. the release receiver (``day0 hooks serve``), with the secrets of ``<state>/secrets.env``;
3. SeaweedFS (master, volume, filer, S3 gateway; data under ``<state>/seaweedfs``), whose filer
   posts every event to the receiver; the ``models`` bucket is created once it answers;
4. ``day0 serve`` (deployment ``validate/day0``).

The receiver starts before SeaweedFS on purpose: the filer sends an event once (with a few
retries) and drops it when nobody listens, so the receiver is listening before the first event
can exist. ``down`` stops them in reverse order (process group, session and descendants;
SIGTERM, then SIGKILL) and checks that every port refuses connections.

Every process the stack starts carries ``DAY0_STACK_ID=<state folder>`` and
``DAY0_STACK_PART=<name>`` in its environment, and children inherit them: ``down``, ``restart``
and ``up`` find a part's orphans by them (a flow run outlives a killed ``day0 serve``, a stage
may make a session of its own), besides the leader's session, which outlives the leader.

Ports belong to the state folder: the first ``up`` takes the given ones, else the defaults when
free, else free ones, and every later ``up`` or ``restart`` keeps them; one that something else
took is a StackError naming it, never a silent move (the URLs in client.env, the UI's address
and the filer's webhook would all change).

Secrets are generated once, written to ``<state>/secrets.env`` (0600) and reused by every
later ``up``; only their names and the file's path are ever printed.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import secrets as _secrets
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from day0.errors import ConfigError, StackError
from day0.store.paths import state_home
from day0.stack import procs

Out = Callable[[str], None]
BUCKET = "models"
DEPLOYMENT_NAME = "day0"
REGION = "us-east-1"
# name -> what it guards (docs/releases.md, "Receiver secrets", lists the same)
SECRETS = {
    "DAY0_RELEASE_SECRET": "HMAC key of signed release webhooks (POST /v1/webhooks/release)",
    "DAY0_HF_WEBHOOK_SECRET": "secret the Hugging Face Hub sends with its webhooks",
    "DAY0_SEAWEEDFS_TOKEN": "bearer token of the SeaweedFS filer's events (/v1/events/seaweedfs)",
    "DAY0_S3_EVENTS_TOKEN": "token of S3/MinIO/SNS/EventBridge events (/v1/events/s3)",
    "DAY0_ADMIN_TOKEN": "bearer token of GET /healthz with journal statistics",
    "DAY0_S3_ACCESS_KEY": "the object store's access key (SeaweedFS identity 'day0')",
    "DAY0_S3_SECRET_KEY": "the object store's secret key",
}
RECEIVER_SECRETS = {"release_hmac": "DAY0_RELEASE_SECRET", "hf_webhook": "DAY0_HF_WEBHOOK_SECRET",
                    "seaweedfs_token": "DAY0_SEAWEEDFS_TOKEN", "s3_token": "DAY0_S3_EVENTS_TOKEN",
                    "admin_token": "DAY0_ADMIN_TOKEN"}
# port name -> conventional default (taken when free); SeaweedFS ports need port + 10000 too
DEFAULT_PORTS = {"prefect": 4200, "receiver": 8787, "s3": 8333, "master": 9333, "volume": 8080,
                 "filer": 8888}
WEED_PORTS = ("s3", "master", "volume", "filer")
ORDER = ("prefect", "receiver", "seaweedfs", "serve")
PART_PORTS = {"prefect": ("prefect",), "receiver": ("receiver",), "seaweedfs": WEED_PORTS,
              "serve": ()}
ALIASES = {"store": "seaweedfs"}  # the issue's and the docs' word for the object store
MARK, MARK_PART = "DAY0_STACK_ID", "DAY0_STACK_PART"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Proc(_Strict):
    name: str
    pid: int
    ticks: int | None = Field(None, description="start time in clock ticks (/proc/<pid>/stat)")
    ports: list[int] = Field(default_factory=list, description="every port it listens on")
    log: str


class StackState(_Strict):
    ports: dict[str, int]
    target: str
    deployment: str
    procs: list[Proc] = Field(default_factory=list)

    @property
    def prefect_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prefect']}"

    @property
    def api_url(self) -> str:
        return self.prefect_url + "/api"

    @property
    def s3_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def receiver_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['receiver']}"


def default_dir() -> Path:
    return state_home() / "stack"


def ports_from_env() -> dict[str, int]:
    """DAY0_STACK_<NAME>_PORT for each port name (e.g. DAY0_STACK_PREFECT_PORT=4310)."""
    found = {}
    for name in DEFAULT_PORTS:
        var = f"DAY0_STACK_{name.upper()}_PORT"
        raw = os.environ.get(var)
        if raw:
            if not raw.isdigit() or not 0 < int(raw) < 65536:
                raise ConfigError(f"{var}={raw!r} is not a port", field=var, fix="give 1-65535")
            found[name] = int(raw)
    return found


class Layout:
    """Where everything of one stack lives under its state folder."""

    def __init__(self, root: str | Path | None):
        root = root or os.environ.get("DAY0_STACK_DIR")
        self.root = Path(root).expanduser().resolve() if root else default_dir()

    state = property(lambda self: self.root / "stack.json")
    secrets = property(lambda self: self.root / "secrets.env")
    client_env = property(lambda self: self.root / "client.env")
    logs = property(lambda self: self.root / "logs")
    prefect_home = property(lambda self: self.root / "prefect")
    weed_data = property(lambda self: self.root / "seaweedfs" / "data")
    weed_conf = property(lambda self: self.root / "seaweedfs" / "conf")
    receiver_dir = property(lambda self: self.root / "receiver")

    def load(self) -> StackState | None:
        try:
            return StackState.model_validate_json(self.state.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ConfigError(f"unreadable stack state: {exc}".splitlines()[0], file=str(self.state),
                              fix="stop what runs by hand and remove the file") from None

    def save(self, state: StackState) -> None:
        _write_private(self.state, state.model_dump_json(indent=2))


def _write_private(path: Path, text: str) -> None:
    """Write text to path readable by the owner only (created 0600, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            out[name.strip()] = value.strip()
    return out


def ensure_secrets(path: Path, out: Out) -> dict[str, str]:
    """The stack's secrets: read from path, missing ones generated and added (file 0600)."""
    have = read_env_file(path) if path.exists() else {}
    if path.exists() and path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
        out(f"note: {path} was readable by others; now 0600")
    missing = [name for name in SECRETS if not have.get(name)]
    if missing:
        have.update({name: _secrets.token_hex(24) for name in missing})
        lines = ["# day0 stack secrets: generated once, reused by every `day0 stack up`.",
                 "# Keep private (0600). What each guards: docs/releases.md, 'Receiver secrets'."]
        lines += [f"{name}={have[name]}" for name in SECRETS]
        _write_private(path, "\n".join(lines) + "\n")
        out(f"secrets: generated {', '.join(missing)} in {path}")
    return {name: have[name] for name in SECRETS}


def twins(name: str, port: int) -> tuple[int, ...]:
    """port and, for a SeaweedFS one, its gRPC twin (port + 10000)."""
    return (port, port + procs.GRPC_OFFSET) if name in WEED_PORTS else (port,)


def port_taken(name: str, port: int, busy: int | None = None) -> StackError:
    """The error of a kept port (or busy, its gRPC twin) that something else holds: what to
    stop, or how to move it."""
    part = next(p for p, names in PART_PORTS.items() if name in names)
    busy = busy or port
    kind = f"{name} gRPC" if busy != port else name
    move = f"`day0 stack down`, then DAY0_STACK_{name.upper()}_PORT=<port> `day0 stack up`"
    return StackError(f"port {busy} ({kind}) is taken by another process", field=part,
                      fix=f"stop what holds it (ss -ltnp 'sport = :{busy}'), or move it: {move}")


def choose_ports(given: dict[str, int | None], previous: dict[str, int] | None) -> dict[str, int]:
    """Given ports must be free (ConfigError); others are the previous up's (StackError when
    something else took one: no silent move), else the default when free, else a free one."""
    chosen: dict[str, int] = {}
    taken: set[int] = set()
    for name, default in DEFAULT_PORTS.items():
        want, kept = given.get(name), (previous or {}).get(name)
        port = want or kept
        if port:
            busy = [q for q in twins(name, port) if q in taken or not procs.port_free(q)]
            if busy:
                if not want:
                    raise port_taken(name, port, busy[0])
                grpc = name in WEED_PORTS
                twin = f" and {want + procs.GRPC_OFFSET} (its gRPC port)" if grpc else ""
                raise ConfigError(f"port {want}{twin} is not free", field=f"{name} port",
                                  fix="pick another port, or leave it out (the last up's is kept)")
        else:
            port = procs.pick_port([default], taken, grpc=name in WEED_PORTS)
        chosen[name] = port
        taken |= set(twins(name, port))
    return chosen


def marker(layout: "Layout", part: str | None = None) -> dict[str, str]:
    """The environment variables that mark the stack's processes (of one part, when given)."""
    return {MARK: str(layout.root), **({MARK_PART: part} if part else {})}


def base_env(state: StackState, secrets: dict[str, str], layout: Layout) -> dict[str, str]:
    """The environment of every process: the caller's, minus Prefect settings and results
    locations that would point elsewhere, plus the stack's Prefect and S3 settings."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("PREFECT_") and not k.startswith("PREFECT_LOGGING_"))
           and k not in ("DAY0_RESULTS_URI",) and not k.startswith("DAY0_S3_")}
    env.update({
        "PREFECT_HOME": str(layout.prefect_home), "PREFECT_API_URL": state.api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # the server runs without CSRF protection (Prefect's default); saying so to the clients
        # spares each of them the probe that the server answers 422
        "PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "false",
        "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "false",
        "DAY0_S3_ENDPOINT": state.s3_url, "DAY0_S3_REGION": REGION, "DAY0_S3_ADDRESSING": "path",
        "DAY0_S3_ACCESS_KEY": secrets["DAY0_S3_ACCESS_KEY"],
        "DAY0_S3_SECRET_KEY": secrets["DAY0_S3_SECRET_KEY"],
        "PYTHONUNBUFFERED": "1",
        **marker(layout),  # inherited by every descendant: how down finds orphans
    })
    return env


def write_client_env(layout: Layout, state: StackState, secrets: dict[str, str]) -> None:
    """<state>/client.env: what other clients (aws, day0 validate, prefect) need (0600)."""
    keys = (secrets["DAY0_S3_ACCESS_KEY"], secrets["DAY0_S3_SECRET_KEY"])
    lines = [f"PREFECT_API_URL={state.api_url}", "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED=false",
             f"DAY0_S3_ENDPOINT={state.s3_url}",
             f"DAY0_S3_REGION={REGION}", "DAY0_S3_ADDRESSING=path",
             f"DAY0_S3_ACCESS_KEY={keys[0]}", f"DAY0_S3_SECRET_KEY={keys[1]}",
             f"AWS_ENDPOINT_URL={state.s3_url}", f"AWS_DEFAULT_REGION={REGION}",
             f"AWS_ACCESS_KEY_ID={keys[0]}", f"AWS_SECRET_ACCESS_KEY={keys[1]}"]
    _write_private(layout.client_env, "\n".join(lines) + "\n")


# ---------------------------------------------------------------------------- health checks

def _get(url: str, headers: dict | None = None, timeout: float = 2.0,
         json_body: dict | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET, or of a POST of json_body; status 0 when nothing answers."""
    data = json.dumps(json_body).encode() if json_body is not None else None
    headers = {**(headers or {}), **({"Content-Type": "application/json"} if data else {})}
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    # a reply that is not HTTP is nothing answering either: polling a port in the ephemeral range
    # before its server listens can connect the socket to itself (TCP simultaneous open), and
    # reading back the request line raises BadStatusLine (seen: `day0 server start`, exit 4)
    except (OSError, ValueError, http.client.HTTPException):
        return 0, b""


def wait_until(check: Callable[[], bool], proc: Proc, timeout_s: float, what: str) -> None:
    """Poll check until it holds; StackError when proc exits or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not procs.alive(proc.pid, proc.ticks):
            raise StackError(f"{proc.name} exited during start-up", field=proc.name,
                             fix=f"see {proc.log}")
        try:
            if check():
                return
        except Exception:  # not ready yet (connection refused, partial start)
            pass
        time.sleep(0.5)
    raise StackError(f"{proc.name}: {what} not within {timeout_s:g} s", field=proc.name,
                     fix=f"see {proc.log}; a busy machine may need --timeout")
