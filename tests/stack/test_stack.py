"""`day0 stack` / `make stack` (issue 11, acceptance 2): the "The stack by hand, without Docker"
commands of docs/stack.md, run as written (ports and state folder chosen here, through
DAY0_STACK_*), bring up Prefect, the receiver, SeaweedFS and `day0 serve`. A checkpoint uploaded
with boto3 starts exactly one validation, only after its last shard, that PASSes; its report is
in the bucket and its run and artifacts in the Prefect API; the page's upload command follows
its own run to the verdict; `down` leaves no process and no port open. The other tests drive
day0.stack's pieces without starting the real servers."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from day0.errors import ConfigError, StackError
from day0.stack import control, core, procs
from tests.conftest import MODELS, ROOT
from tests.receiver.support import wait_until
from tests.s3server import free_ports

PAGE = ROOT / "docs" / "stack.md"
SECTION = "## The stack by hand, without Docker"
MODEL = "acme/tiny-llama"  # the page's upload
BOTO3_MODEL = "acme/tiny-llama-boto3"
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def page_commands() -> list[str]:
    """The command lines of the first bash block of docs/stack.md's stack section."""
    text = PAGE.read_text()
    assert SECTION in text, f"docs/stack.md lacks the section {SECTION!r}"
    block = re.search(r"```bash\n(.*?)```", text[text.index(SECTION):], re.S)
    assert block, "no bash block in the stack section"
    lines = [ln.strip() for ln in block.group(1).splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def stack_env(state: Path) -> dict[str, str]:
    """The caller's environment plus every port and the state folder, chosen free here."""
    ports = dict(zip(("PREFECT", "RECEIVER", "S3", "MASTER", "VOLUME", "FILER"), free_ports(6)))
    env = {**os.environ, "DAY0_STACK_DIR": str(state)}
    env.update({f"DAY0_STACK_{name}_PORT": str(port) for name, port in ports.items()})
    return env


def run(line: str, env: dict, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s)


def api(state: core.StackState, method: str, path: str, body: dict | None = None):
    resp = httpx.request(method, state.api_url + path, json=body, timeout=30)
    resp.raise_for_status()
    return resp.json()


def runs_of(state: core.StackState, model: str) -> list[dict]:
    """Flow runs of the stack's deployment whose source is s3://models/<model>."""
    dep = api(state, "GET", f"/deployments/name/{state.deployment}")
    found = api(state, "POST", "/flow_runs/filter",
                {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}}})
    return [r for r in found if r["parameters"].get("source") == f"s3://models/{model}"]


@pytest.mark.integration
@pytest.mark.slow
def test_docs_stack_section_end_to_end(tmp_path):
    commands = page_commands()
    kinds = [next((k for k in ("make stack", "stack status", "stack upload", "stack down")
                   if k in c), c) for c in commands]
    assert kinds == ["make stack", "stack status", "stack upload", "stack down"], commands
    assert (ROOT / ".venv" / "bin" / "day0").exists(), "the page's commands use .venv/bin/day0"
    layout = core.Layout(tmp_path / "state")
    env = stack_env(layout.root)
    env.pop("DAY0_RESULTS_URI", None)
    pids: set[int] = set()
    try:
        # make stack: the four processes, each healthy, and what to do next
        up = run(commands[0], env, 900)
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        state = layout.load()
        assert [p.name for p in state.procs] == ["prefect", "receiver", "seaweedfs", "serve"]
        secrets = core.read_env_file(layout.secrets)
        assert set(secrets) == set(core.SECRETS)
        assert stat.S_IMODE(layout.secrets.stat().st_mode) == 0o600
        assert state.prefect_url in up.stdout and str(layout.secrets) in up.stdout
        assert "stack upload" in up.stdout and state.s3_url in up.stdout
        for value in secrets.values():  # names and the file, never a value
            assert value not in up.stdout + up.stderr
        # the UI served on the chosen port calls the API on that port
        ui = httpx.get(state.prefect_url + "/ui-settings", timeout=10).json()
        assert ui["api_url"] == state.api_url
        assert httpx.get(state.prefect_url + "/", timeout=10).status_code == 200
        pids = {q for p in state.procs for q in procs.tree(p.pid)}

        st = run(commands[1], env, 120)
        assert st.returncode == 0 and st.stdout.count(" yes ") == 4, st.stdout + st.stderr

        # boto3 upload, the last shard only once the receiver has seen the rest: no run before
        # it, exactly one after it, and that one PASSes
        from day0.store.s3 import s3_client

        client = s3_client(endpoint=state.s3_url, access_key=secrets["DAY0_S3_ACCESS_KEY"],
                           secret_key=secrets["DAY0_S3_SECRET_KEY"], region=core.REGION)
        files = sorted(p for p in (MODELS / "tiny-llama").iterdir() if p.is_file())
        shards = [p for p in files if p.suffix == ".safetensors"]
        for path in [p for p in files if p not in shards] + shards[:-1]:
            client.upload_file(str(path), "models", f"{BOTO3_MODEL}/{path.name}")
        receiver_log = layout.logs / "receiver.log"
        waiting = f"s3://models/{BOTO3_MODEL} not complete yet: waiting for 1 shard"
        assert wait_until(lambda: waiting in receiver_log.read_text(), 60), receiver_log.read_text()
        assert runs_of(state, BOTO3_MODEL) == []
        client.upload_file(str(shards[-1]), "models", f"{BOTO3_MODEL}/{shards[-1].name}")
        started = time.monotonic()
        assert wait_until(lambda: [r for r in runs_of(state, BOTO3_MODEL)
                                 if r["state"]["type"] in FINAL], 900, 1.0), runs_of(state, BOTO3_MODEL)
        print(f"last shard to verdict: {time.monotonic() - started:.1f} s")
        time.sleep(3)  # late or repeated filer events start nothing more
        (flow_run,) = runs_of(state, BOTO3_MODEL)
        assert flow_run["state"]["type"] == "COMPLETED", flow_run["state"]
        revision = flow_run["parameters"]["revision"]

        # the report in the bucket: runs/<id>/report.json and latest.json naming it
        folder = f"day0-results/{BOTO3_MODEL}/{revision}/{state.target}/"
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="models", Prefix=folder)["Contents"]]
        reports = [k for k in keys if k.startswith(folder + "runs/") and k.endswith("/report.json")]
        assert len(reports) == 1, keys
        report = json.loads(client.get_object(Bucket="models", Key=reports[0])["Body"].read())
        assert report["verdict"] == "PASS"
        latest = json.loads(client.get_object(Bucket="models", Key=folder + "latest.json")["Body"].read())
        assert reports[0].startswith(latest["uri"].removeprefix("s3://models/"))
        # ... and in the API the UI reads: the run and its artifacts, which carry the verdict
        artifacts = api(state, "POST", "/artifacts/filter",
                        {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}}})
        assert any("PASS" in json.dumps(a.get("data")) for a in artifacts), artifacts

        # the page's upload command: one more run, for its own name, followed to its verdict
        upload = run(commands[2], env, 1200)
        assert upload.returncode == 0, upload.stdout[-4000:] + upload.stderr[-4000:]
        (page_run,) = runs_of(state, MODEL)
        assert page_run["state"]["type"] == "COMPLETED", page_run["state"]
        assert f"/runs/flow-run/{page_run['id']}" in upload.stdout
        assert "report: s3://models/day0-results/" + MODEL in upload.stdout, upload.stdout

        # the receiver said what it did with each event, never a secret, no Prefect 4xx noise
        log = receiver_log.read_text()
        assert "ignored POST /v1/events/seaweedfs" in log and "directory entry" in log, log[-3000:]
        assert "csrf-token" not in log and "HTTP Request" not in log, log[-3000:]
        for value in secrets.values():
            assert value not in log

        pids |= {q for p in state.procs for q in procs.tree(p.pid)}  # flow-run children too
        down = run(commands[3], env, 300)
        assert down.returncode == 0, down.stdout + down.stderr
        left = [p for p in pids if procs.stat(p) and procs.stat(p)[0] not in "ZX"]
        assert not left, f"processes left after down: {left}"
        open_ports = [q for p in state.procs for q in p.ports if procs.port_open(q)]
        assert not open_ports, open_ports
    finally:
        subprocess.run([sys.executable, "-m", "day0.cli", "stack", "down"], env=env,
                       capture_output=True, timeout=300)


# ------------------------------------------------------------------ pieces, no real servers

def test_secrets_generated_once_private_and_reused(tmp_path):
    path = tmp_path / "secrets.env"
    said: list[str] = []
    first = core.ensure_secrets(path, said.append)
    assert set(first) == set(core.SECRETS) and len(set(first.values())) == len(first)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert core.ensure_secrets(path, said.append) == first  # reused, not regenerated
    os.chmod(path, 0o644)
    assert core.ensure_secrets(path, said.append) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not any(v in line for v in first.values() for line in said)


def test_ports_given_kept_default_or_free(tmp_path):
    """A given port must be free; without one a stack keeps its previous port, and one that
    something else took is an error naming it and the fix, never a silent move."""
    import socket

    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {taken}"):
            core.choose_ports({"prefect": taken}, None)
        previous = {"prefect": taken, "receiver": free_ports(1)[0]}
        with pytest.raises(StackError, match=f"port {taken} \\(prefect\\) is taken") as err:
            core.choose_ports({}, previous)
        assert err.value.field == "prefect" and "DAY0_STACK_PREFECT_PORT" in err.value.fix
        given = free_ports(1)[0]
        chosen = core.choose_ports({"prefect": given}, previous)  # a given port moves it
    assert chosen["prefect"] == given and chosen["receiver"] == previous["receiver"]
    assert len(set(chosen.values())) == len(chosen)


def test_a_port_in_time_wait_stays_free_for_the_next_up():
    """The port of a server that closed its connections first holds them in TIME_WAIT for a
    minute; servers bind it all the same (SO_REUSEADDR), so the stack keeps it (was: the next
    up after a down moved every such port, Prefect 4200 -> 38512)."""
    import socket

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, _ = server.accept()
    conn.close()  # the server's side closes first: it is the one left in TIME_WAIT
    assert client.recv(1) == b""
    client.close()
    server.close()
    tcp = Path("/proc/net/tcp").read_text().splitlines()[1:]
    assert any(f":{port:04X} " in line.split()[1] + " " and line.split()[3] == "06"
               for line in tcp), f"no TIME_WAIT on port {port}"
    assert procs.port_free(port)


def test_env_keeps_no_outside_prefect_or_results_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere:4200/api")
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql://elsewhere")
    monkeypatch.setenv("DAY0_RESULTS_URI", "s3://elsewhere/results")
    state = core.StackState(ports=dict(core.DEFAULT_PORTS), target="cpu-bf16",
                            deployment="validate/day0")
    secrets = {name: "x" for name in core.SECRETS}
    env = core.base_env(state, secrets, core.Layout(tmp_path))
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:4200/api"
    assert "PREFECT_API_DATABASE_CONNECTION_URL" not in env and "DAY0_RESULTS_URI" not in env
    assert env["PREFECT_HOME"] == str(tmp_path / "prefect")
    assert not any(k in env for k in core.RECEIVER_SECRETS.values())  # only the receiver's


def _sleeper(name: str, layout: core.Layout, fail: bool = False):
    """A starter whose process is a shell: `sleep` children, or an exit with a message."""
    def start(_timeout):
        script = "echo broken on purpose >&2; exit 7" if fail else "sleep 300 & sleep 300"
        proc = procs.spawn(["bash", "-c", script], env=dict(os.environ), cwd=layout.root,
                           log=layout.logs / f"{name}.log")
        p = core.Proc(name=name, pid=proc.pid, ticks=procs.start_ticks(proc.pid),
                      log=str(layout.logs / f"{name}.log"))
        return p, lambda: core.wait_until(lambda: False if fail else True, p, 5, "ready")
    return start


def test_failed_component_stops_what_started_and_names_itself(tmp_path, monkeypatch):
    layout = core.Layout(tmp_path / "state")
    monkeypatch.setattr(control.comp, "start_prefect", lambda s, e, lay, t: _sleeper("prefect", lay)(t))
    monkeypatch.setattr(control.comp, "start_receiver",
                        lambda s, e, x, lay, t: _sleeper("receiver", lay)(t))
    monkeypatch.setattr(control.comp, "start_seaweedfs",
                        lambda s, e, x, lay, t: _sleeper("seaweedfs", lay, fail=True)(t))
    said: list[str] = []
    with pytest.raises(StackError, match="seaweedfs exited during start-up"):
        control.up(layout.root, ports={}, out=said.append)
    text = "\n".join(said)
    assert "broken on purpose" in text and "seaweedfs failed" in text, text
    state = layout.load()
    assert state.procs == []  # prefect and receiver (and their children) stopped
    assert not control.status(layout.root, out=said.append)


def test_down_stops_the_whole_tree(tmp_path):
    layout = core.Layout(tmp_path)
    layout.root.mkdir(exist_ok=True)
    proc, wait = _sleeper("serve", layout)(5)
    wait()
    time.sleep(0.3)
    members = procs.tree(proc.pid)
    assert len(members) >= 3  # bash and its two sleeps
    layout.save(core.StackState(ports={}, target="cpu-bf16", deployment="validate/day0",
                                procs=[proc]))
    control.down(layout.root, out=lambda line: None)
    assert not [p for p in members if procs.alive(p, None)]
    assert layout.load().procs == []


def test_stop_takes_the_orphans_of_a_dead_leader_and_nobody_else(tmp_path):
    """The leader SIGKILLed: its session outlives it (a flow run re-parented to PID 1 after
    `day0 serve` died) and a process carrying the marker left the session (a stage); both
    are stopped. A reused pid (other start ticks) names nothing."""
    env = {**os.environ, "DAY0_TEST_MARK": str(tmp_path)}
    leader = subprocess.Popen(["bash", "-c", "(sleep 300 &); sleep 300"], env=dict(os.environ),
                              start_new_session=True)
    stage = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        ticks = procs.start_ticks(leader.pid)

        def orphans() -> list[int]:  # bash exec'd its last sleep; the subshell's one is orphaned
            tree = procs.tree(leader.pid) - {leader.pid}
            parents = {p: (procs.stat(p) or ("", 0))[1] for p in tree}
            return [p for p, parent in parents.items() if parent != leader.pid and len(tree) == 1]

        assert wait_until(orphans, 10), procs.tree(leader.pid)
        (orphan,) = orphans()
        assert procs.stop_all(leader.pid, ticks + 1, marker={"DAY0_TEST_MARK": "other"}) == (set(), set())
        leader.kill()
        leader.wait(10)
        assert procs.alive(orphan, None)  # re-parented, still in the dead leader's session
        found, left = procs.stop_all(leader.pid, ticks, marker={"DAY0_TEST_MARK": str(tmp_path)},
                                     grace_s=5)
        assert found == {orphan, stage.pid} and left == set()
        assert stage.wait(10) == -signal.SIGTERM
        assert not procs.alive(orphan, None)
    finally:
        for p in (leader, stage):
            p.kill()
            p.wait(10)
