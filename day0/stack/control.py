"""up, restart, down, status and upload of the hand-run stack (day0.stack.core says what runs)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from day0.errors import InputError, StackError
from day0.stack import components as comp, procs
from day0.stack.core import (ALIASES, BUCKET, DEPLOYMENT_NAME, ORDER, PART_PORTS, SECRETS,
                             Layout, Out, Proc, StackState, base_env, choose_ports, default_dir,
                             ensure_secrets, marker, port_taken, ports_from_env, read_env_file,
                             twins, wait_until, write_client_env)

DEFAULT_TARGET = "cpu-bf16"
START_TIMEOUT_S = {"prefect": 240, "receiver": 90, "seaweedfs": 90, "serve": 240}
# a runner polls every 10 s (+30 % jitter) and gives up after 3 refused polls in a row
RECONNECT_S = 45.0
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
       target: str | None = None, timeout_s: float | None = None,
       out: Out = print) -> StackState:
    """Start what of the stack does not run, in order, keeping what runs (its pid and ports);
    StackError names the part that failed."""
    layout = Layout(state_dir)
    layout.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    old = layout.load()
    kept = [p for p in (old.procs if old else []) if _alive(p)]
    if {p.name for p in kept} == set(ORDER):
        out(f"day0 stack is already up ({layout.root})")
        summary(layout, old, out)
        return old
    for name in ORDER:  # an orphan of a dead part may hold its port
        if name not in {p.name for p in kept}:
            _stop_part(layout, _proc(old, name), name, out)
    secrets = ensure_secrets(layout.secrets, out)
    wanted = {**ports_from_env(), **{k: v for k, v in (ports or {}).items() if v}}
    if kept:
        state = _partial(layout, old, kept, wanted, target)
        out(f"keeping {', '.join(f'{p.name} (pid {p.pid})' for p in kept)}")
    else:
        state = StackState(ports=choose_ports(wanted, old.ports if old else None),
                           target=target or DEFAULT_TARGET,
                           deployment=f"validate/{DEPLOYMENT_NAME}")
    env = base_env(state, secrets, layout)
    write_client_env(layout, state, secrets)
    started: list[str] = []
    try:
        for name in ORDER:
            if _proc(state, name) is None:
                started.append(name)
                _start(name, layout, state, env, secrets, timeout_s, out)
                if name == "prefect" and _proc(state, "serve"):
                    _serve_follows(layout, state, out)  # else started again below
    except BaseException:  # a failed part or Ctrl-C: nothing this up started is left running
        _stop_all(layout, state, _never_fails(out), check=False, names=started)
        raise
    summary(layout, state, out)
    return state


def _proc(state: StackState | None, name: str) -> Proc | None:
    return next((p for p in state.procs if p.name == name), None) if state else None


def _partial(layout: Layout, old: StackState, kept: list[Proc], wanted: dict[str, int],
             target: str | None) -> StackState:
    """The state of a stack some parts of which run: theirs (ports, target), nothing else, since
    each part was told the others' ports."""
    fix = f"{day0_command()} stack down{_dir_flag(layout)}, then up with it"
    for name, port in wanted.items():
        if old.ports.get(name) != port:
            raise StackError(f"the stack runs with {name} port {old.ports.get(name)}, not {port}",
                             field=f"{name} port", fix=fix)
    if target and target != old.target:
        raise StackError(f"the stack runs target {old.target}, not {target}", field="--target",
                         fix=fix)
    return StackState(ports=old.ports, target=old.target, deployment=old.deployment,
                      procs=list(kept))


def restart(part: str, state_dir: str | Path | None = None, *, timeout_s: float | None = None,
            out: Out = print) -> StackState:
    """Stop one part's whole tree and start it again on the same ports, once healthy."""
    name = ALIASES.get(part, part)
    if name not in ORDER:
        raise StackError(f"no part {part!r} in the stack", field="PART",
                         fix=f"one of {', '.join(ORDER)} (store = seaweedfs)")
    layout = Layout(state_dir)
    state = layout.load()
    if state is None:
        raise StackError("the stack was never started here", file=str(layout.root),
                         fix=f"{day0_command()} stack up{_dir_flag(layout)}")
    secrets = ensure_secrets(layout.secrets, out)
    _, left = _stop_part(layout, _proc(state, name), name, out)
    state.procs = [p for p in state.procs if p.name != name]
    layout.save(state)
    if left:
        raise StackError(f"{name}: pids {_pids(left)} outlived SIGKILL", field=name,
                         fix=f"stop them by hand, then `day0 stack restart {part}` again")
    env, names = base_env(state, secrets, layout), [name]
    try:
        _start(name, layout, state, env, secrets, timeout_s, out)
        if name == "prefect" and _proc(state, "serve") and not _serve_follows(layout, state, out):
            names.append("serve")
            _start("serve", layout, state, env, secrets, timeout_s, out)
    except BaseException:  # what this restart started does not outlive its failure
        _stop_all(layout, state, _never_fails(out), check=False, names=names)
        raise
    return state


def _serve_follows(layout: Layout, state: StackState, out: Out) -> bool:
    """After Prefect (re)started under a running `day0 serve`: True once its runner polls the
    new server (it retries a refused poll); a runner that gave up (3 refused polls in a row)
    is stopped and dropped from state, to be started again: False."""
    serve, since = _proc(state, "serve"), dt.datetime.now(dt.timezone.utc)
    try:
        wait_until(comp.polled_since(state, since), serve, RECONNECT_S, "a poll of the new Prefect")
        out(f"  serve (pid {serve.pid}) polls the new Prefect")
        return True
    except StackError as exc:
        out(f"serve did not follow Prefect's restart ({exc}); restarting it")
    _stop_part(layout, serve, "serve", out)
    state.procs.remove(serve)
    layout.save(state)
    return False


def _never_fails(out: Out) -> Out:
    """out that cannot interrupt a clean-up (a closed stdout raises BrokenPipeError)."""
    def say(line: str) -> None:
        try:
            out(line)
        except (OSError, ValueError):
            pass
    return say


def _start(name: str, layout: Layout, state: StackState, env: dict, secrets: dict,
           timeout_s: float | None, out: Out) -> None:
    """Start part name on state's ports once they are free; wait until it is healthy."""
    limit = timeout_s or START_TIMEOUT_S[name]
    _require_free(state, name)
    out(f"starting {name} ...")
    started = time.monotonic()
    proc, wait = {
        "prefect": lambda: comp.start_prefect(state, env, layout, limit),
        "receiver": lambda: comp.start_receiver(state, env, secrets, layout, limit),
        "seaweedfs": lambda: comp.start_seaweedfs(state, env, secrets, layout, limit),
        "serve": lambda: comp.start_serve(state, env, layout, limit),
    }[name]()
    state.procs.append(proc)
    state.procs.sort(key=lambda p: ORDER.index(p.name))
    layout.save(state)  # a killed `up` leaves what `down` needs
    try:
        wait()
    except StackError as exc:
        out(f"{name} failed: {exc}\n--- last lines of {proc.log}:\n"
            f"{procs.log_tail(Path(proc.log))}\n---")
        raise
    out(f"  {name} ready in {time.monotonic() - started:.1f} s (pid {proc.pid})")


def _require_free(state: StackState, name: str, wait_s: float = 10.0) -> None:
    """The ports of part name (gRPC twins too) are free, within wait_s (a stopped server's
    socket closes as it exits); else the StackError that names the port and the fix."""
    ports = {q: (p, state.ports[p]) for p in PART_PORTS[name] for q in twins(p, state.ports[p])}
    deadline = time.monotonic() + wait_s
    while busy := [q for q in ports if not procs.port_free(q)]:
        if time.monotonic() > deadline:
            raise port_taken(*ports[busy[0]], busy[0])
        time.sleep(0.2)


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


def _pids(pids: set[int]) -> str:
    return ", ".join(map(str, sorted(pids)))


def _stop_part(layout: Layout, proc: Proc | None, name: str,
               out: Out) -> tuple[set[int], set[int]]:
    """Stop what of part name runs: proc's tree and session, and whatever carries the part's
    marker (its orphans); say what was stopped, only that. Returns (pids found, pids left)."""
    began = time.monotonic()
    pid, ticks = (proc.pid, proc.ticks) if proc else (None, None)
    found, left = procs.stop_all(pid, ticks, marker=marker(layout, name),
                                 grace_s=GRACE_S.get(name, 15.0))
    others = found - {pid}
    extra = f"{len(others)} leftover process(es) of it (pids {_pids(others)})"
    if left:
        out(f"{name}: pids {_pids(left)} still run after SIGKILL")
    elif proc is not None and proc.pid in found:
        out(f"stopped {name} (pid {pid}) in {time.monotonic() - began:.1f} s")
    elif proc is not None:
        out(f"{name} (pid {pid}) was not running" + (f"; stopped {extra}" if others else ""))
    elif others:
        out(f"stopped {name}: {extra}")
    if found and name == "seaweedfs":  # weed leaves its unix sockets in /tmp
        for q in (proc.ports if proc else []):
            for sock in Path("/tmp").glob(f"seaweedfs-*-{q}.sock"):
                sock.unlink(missing_ok=True)
    return found, left


def _stop_all(layout: Layout, state: StackState, out: Out, *, check: bool = True,
              names: list[str] | None = None) -> bool:
    """Stop the parts names (default: all, and whatever else carries the stack's marker) in
    reverse order; StackError (when check) if a process or a port of theirs outlives it.
    True when something was running."""
    every = names is None
    stuck, ports, ran = [], [], False
    for name in reversed(ORDER):
        if every or name in names:
            p = _proc(state, name)
            found, left = _stop_part(layout, p, name, out)
            stuck += [f"{name} (pids {_pids(left)})"] if left else []
            ran |= bool(found)
            ports += p.ports if p and found else []  # a dead part's port may be someone else's
    if every:  # what carries the stack's marker but no part's (started by an older day0)
        found, left = procs.stop_all(None, None, marker=marker(layout), grace_s=5.0)
        if found:
            out(f"stopped {len(found)} leftover process(es) of the stack (pids {_pids(found)})")
        stuck += [f"pids {_pids(left)}"] if left else []
        ran |= bool(found)
    deadline = time.monotonic() + 15
    while [q for q in ports if procs.port_open(q)] and time.monotonic() < deadline:
        time.sleep(0.2)
    still = [q for q in ports if procs.port_open(q)]
    state.procs = [p for p in state.procs if _alive(p)]
    if layout.state.exists():
        layout.save(state)
    if check and (stuck or still):
        raise StackError(f"still running: {', '.join(stuck) or 'none'}; ports still open: "
                         f"{still or 'none'}", file=str(layout.root),
                         fix="stop them by pid, then run `day0 stack down` again")
    return ran


def down(state_dir: str | Path | None = None, *, out: Out = print) -> None:
    """Stop every process the stack started, orphans of a dead part included."""
    layout = Layout(state_dir)
    state = layout.load() or StackState(ports={}, target=DEFAULT_TARGET,
                                        deployment=f"validate/{DEPLOYMENT_NAME}")
    if not _stop_all(layout, state, out):
        out(f"day0 stack: nothing running ({layout.root})")
        return
    out("day0 stack is down (data, secrets and run history kept under "
        f"{layout.root}; remove the folder to start afresh)")


def status(state_dir: str | Path | None = None, *, out: Out = print) -> bool:
    """Print each part (pid, ports, alive) and leftovers of dead ones; True when all are up."""
    layout = Layout(state_dir)
    state = layout.load()
    listed = state.procs if state else []
    if not listed:
        out(f"day0 stack: not running ({layout.root})")
    else:
        out(f"{'component':<10} {'pid':>8}  {'alive':<5}  {'ports':<40} log")
    for p in listed:
        ports = ",".join(str(q) for q in p.ports) or "-"
        out(f"{p.name:<10} {p.pid:>8}  {'yes' if _alive(p) else 'NO':<5}  {ports:<40} {p.log}")
    for name in ORDER:
        p = _proc(state, name)
        if p is None or not _alive(p):
            pids = set(procs.members(p.pid if p else None, p.ticks if p else None,
                                     marker(layout, name)))
            if pids:
                out(f"leftovers of {name}: pids {_pids(pids)} "
                    f"(`{day0_command()} stack down{_dir_flag(layout)}` stops them)")
    if not listed:
        return False
    missing = [n for n in ORDER if _proc(state, n) is None]
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
                       csrf=False, on_found=found, say=out)  # the stack's server runs without CSRF
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


__all__ = ["up", "down", "restart", "status", "upload", "summary"]
