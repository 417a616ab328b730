"""up, down, status and upload of the hand-run stack (day0.stack.core says what runs)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from day0.errors import InputError, StackError
from day0.stack import components as comp, procs
from day0.stack.core import (BUCKET, DEPLOYMENT_NAME, ORDER, SECRETS, Layout, Out, Proc,
                             StackState, base_env, choose_ports, default_dir, ensure_secrets,
                             ports_from_env, read_env_file, write_client_env)

START_TIMEOUT_S = {"prefect": 240, "receiver": 90, "seaweedfs": 90, "serve": 240}
# seconds from SIGTERM to SIGKILL; weed lingers ~15 s after SIGTERM (its data is synced on write)
GRACE_S = {"seaweedfs": 5.0}


def _alive(p: Proc) -> bool:
    return procs.alive(p.pid, p.ticks)


def _dir_flag(layout: Layout) -> str:
    return "" if layout.root == default_dir() else f" --state-dir {layout.root}"


def day0_command() -> str:
    """How to call this day0 from the caller's shell: the venv's script (relative to the current
    folder when inside it), since the venv may not be active."""
    import sys

    script = Path(sys.executable).parent / "day0"
    if not script.is_file():
        return "day0"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def up(state_dir: str | Path | None = None, *, ports: dict[str, int | None] | None = None,
       target: str = "cpu-bf16", timeout_s: float | None = None, out: Out = print) -> StackState:
    """Start the stack (or report it running); StackError names the component that failed."""
    layout = Layout(state_dir)
    layout.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    old = layout.load()
    if old is not None and old.procs:
        running = [p.name for p in old.procs if _alive(p)]
        if len(running) == len(ORDER):
            out(f"day0 stack is already up ({layout.root})")
            summary(layout, old, out)
            return old
        if running:
            raise StackError(f"the stack is partly running ({', '.join(running)} alive)",
                             file=str(layout.root),
                             fix=f"{day0_command()} stack down{_dir_flag(layout)}")
    secrets = ensure_secrets(layout.secrets, out)
    wanted = {**ports_from_env(), **{k: v for k, v in (ports or {}).items() if v}}
    state = StackState(ports=choose_ports(wanted, old.ports if old else None),
                       target=target, deployment=f"validate/{DEPLOYMENT_NAME}")
    env = base_env(state, secrets, layout)
    write_client_env(layout, state, secrets)
    starters = {
        "prefect": lambda t: comp.start_prefect(state, env, layout, t),
        "receiver": lambda t: comp.start_receiver(state, env, secrets, layout, t),
        "seaweedfs": lambda t: comp.start_seaweedfs(state, env, secrets, layout, t),
        "serve": lambda t: comp.start_serve(state, env, layout, t),
    }
    try:
        for name in ORDER:
            _start(name, starters[name], timeout_s or START_TIMEOUT_S[name], layout, state, out)
    except BaseException:  # a failed component or Ctrl-C: nothing started is left running
        _stop_all(layout, state, _never_fails(out), check=False)
        raise
    summary(layout, state, out)
    return state


def _never_fails(out: Out) -> Out:
    """out that cannot interrupt a clean-up (a closed stdout raises BrokenPipeError)."""
    def say(line: str) -> None:
        try:
            out(line)
        except (OSError, ValueError):
            pass
    return say


def _start(name: str, starter, limit: float, layout: Layout, state: StackState, out: Out) -> None:
    out(f"starting {name} ...")
    started = time.monotonic()
    proc, wait = starter(limit)
    state.procs.append(proc)
    layout.save(state)  # a killed `up` leaves what `down` needs
    try:
        wait()
    except StackError as exc:
        out(f"{name} failed: {exc}\n--- last lines of {proc.log}:\n"
            f"{procs.log_tail(Path(proc.log))}\n---")
        raise
    out(f"  {name} ready in {time.monotonic() - started:.1f} s (pid {proc.pid})")


def summary(layout: Layout, state: StackState, out: Out = print) -> None:
    flag, day0 = _dir_flag(layout), day0_command()
    lines = [
        f"day0 stack is up; state, logs and data under {layout.root}",
        f"  Prefect UI   {state.prefect_url}   (API {state.api_url})",
        f"  S3 endpoint  {state.s3_url}   bucket {BUCKET}, keys in {layout.client_env}",
        f"  receiver     {state.receiver_url}   (SeaweedFS filer events -> /v1/events/seaweedfs)",
        f"  worker       `day0 serve`: deployment {state.deployment}, target {state.target}",
        f"  secrets      {layout.secrets} (0600): {', '.join(SECRETS)}",
        f"  logs         {layout.logs}/",
        "Upload a checkpoint; its last file starts one validation (--wait prints the verdict):",
        f"  {day0} stack upload{flag} CHECKPOINT_DIR MODEL_NAME --wait",
        f"  e.g. {day0} stack upload{flag} tests/fixtures/models/tiny-llama acme/tiny-llama --wait",
        f"Other clients (aws s3 cp, day0 validate --deployment): set -a; . {layout.client_env}; set +a",
        f"Stop everything: {day0} stack down{flag}",
    ]
    out("\n".join(lines))


def _stop_all(layout: Layout, state: StackState, out: Out, *, check: bool = True) -> None:
    """Stop every process of state in reverse order; StackError (when check) if a process or
    a port outlives it."""
    stuck = []
    for p in reversed(state.procs):
        began = time.monotonic()
        if not procs.stop(p.pid, p.ticks, grace_s=GRACE_S.get(p.name, 15.0)):
            stuck.append(f"{p.name} (pid {p.pid})")
        else:
            out(f"stopped {p.name} (pid {p.pid}) in {time.monotonic() - began:.1f} s")
    ports = [q for p in state.procs for q in p.ports]
    deadline = time.monotonic() + 15
    while [q for q in ports if procs.port_open(q)] and time.monotonic() < deadline:
        time.sleep(0.2)
    still = [q for q in ports if procs.port_open(q)]
    for q in ports:  # weed leaves its unix sockets in /tmp
        for sock in Path("/tmp").glob(f"seaweedfs-*-{q}.sock"):
            sock.unlink(missing_ok=True)
    state.procs = [p for p in state.procs if _alive(p)]
    layout.save(state)
    if check and (stuck or still):
        raise StackError(f"still running: {', '.join(stuck) or 'none'}; ports still open: "
                         f"{still or 'none'}", file=str(layout.root),
                         fix="stop them by pid, then run `day0 stack down` again")


def down(state_dir: str | Path | None = None, *, out: Out = print) -> None:
    layout = Layout(state_dir)
    state = layout.load()
    if state is None or not state.procs:
        out(f"day0 stack: nothing running ({layout.root})")
        return
    _stop_all(layout, state, out)
    out("day0 stack is down (data, secrets and run history kept under "
        f"{layout.root}; remove the folder to start afresh)")


def status(state_dir: str | Path | None = None, *, out: Out = print) -> bool:
    """Print each component (pid, ports, alive); True when all are up."""
    layout = Layout(state_dir)
    state = layout.load()
    if state is None or not state.procs:
        out(f"day0 stack: not running ({layout.root})")
        return False
    out(f"{'component':<10} {'pid':>8}  {'alive':<5}  {'ports':<40} log")
    for p in state.procs:
        ports = ",".join(str(q) for q in p.ports) or "-"
        out(f"{p.name:<10} {p.pid:>8}  {'yes' if _alive(p) else 'NO':<5}  {ports:<40} {p.log}")
    missing = [n for n in ORDER if n not in {p.name for p in state.procs}]
    if missing:
        out(f"not started: {', '.join(missing)}")
    ok = not missing and all(_alive(p) for p in state.procs)
    if ok:
        out(f"Prefect UI {state.prefect_url}   S3 {state.s3_url}   receiver {state.receiver_url}")
    return ok


def upload(folder: str | Path, name: str, state_dir: str | Path | None = None, *,
           wait: bool = False, timeout_s: float = 900, out: Out = print) -> int:
    """Upload the files of folder to s3://models/<name>/ (the receiver starts one validation
    once it is complete); with wait, follow that run to its end. Returns an exit code:
    0 uploaded (and with wait: the run Completed), 1 the run did not complete."""
    from day0.receiver.safety import check_name
    from day0.store.s3 import put_object

    layout = Layout(state_dir)
    state = layout.load()
    if state is None or not all(_alive(p) for p in state.procs) or len(state.procs) < len(ORDER):
        raise StackError("the stack is not up", file=str(layout.root),
                         fix=f"{day0_command()} stack up{_dir_flag(layout)}")
    try:
        name = check_name(name.strip("/"), "model name")
    except ValueError as exc:
        raise InputError(str(exc), field="MODEL_NAME") from None
    files = sorted(p for p in Path(folder).iterdir() if p.is_file()) if Path(folder).is_dir() else []
    if not files:
        raise InputError("not a folder with files", file=str(folder), fix="give a checkpoint folder")
    client = comp.s3_client(state, read_env_file(layout.secrets))
    source = f"s3://{BUCKET}/{name}"
    since = dt.datetime.now(dt.timezone.utc)
    # shards last: the checkpoint becomes complete with the last object
    for path in sorted(files, key=lambda p: (p.suffix == ".safetensors", p.name)):
        put_object(f"{source}/{path.name}", path, client=client)
    out(f"uploaded {len(files)} files to {source}/")
    if not wait:
        out(f"the receiver starts its validation; runs: {state.prefect_url}/runs")
        return 0
    return _follow(state, client, source, name, since, timeout_s, out)


def _follow(state: StackState, client, source: str, name: str, since: dt.datetime,
            timeout_s: float, out: Out) -> int:
    import json

    from day0.store import identity
    from day0.orchestration.runs import wait_for_run
    from day0.store.s3 import NoSuchObject, read_object

    def found(run) -> None:
        out(f"flow run {run.name}: {state.prefect_url}/runs/flow-run/{run.id}")

    run = wait_for_run(state.deployment, source, since, api=state.api_url, timeout_s=timeout_s,
                       csrf=False, on_found=found)  # the stack's server runs without CSRF
    if run is None:
        out(f"no finished run of {source} within {timeout_s:g} s; see {state.prefect_url}/runs")
        return 1
    out(f"flow run {run.name} ended {run.state_name}" + (f": {run.message}" if run.message else ""))
    target, revision = run.parameters.get("target") or state.target, run.parameters.get("revision")
    # the stack's runs publish next to their source (day0.stack.core.base_env drops DAY0_RESULTS_URI)
    base = f"s3://{BUCKET}/{identity.RESULTS_FOLDER}"
    folder = identity.results_location(base, source, target, revision, name) if revision else None
    try:
        if folder is None:
            raise KeyError("revision")
        latest = json.loads(read_object(folder + identity.LATEST, client=client))
        out(f"report: {latest['uri']}report.json")
    except (NoSuchObject, ValueError, KeyError):
        out(f"no report under {folder} (see the run's logs)")
    return 0 if run.state_type == "COMPLETED" else 1


__all__ = ["up", "down", "status", "upload", "summary"]
