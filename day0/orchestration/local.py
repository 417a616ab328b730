"""The ``validate`` flow for the CLI: in this process, on a served deployment, or served here.

Each function takes a :class:`day0.request.ValidateRequest` (the flow's parameters, checked
before Prefect starts) and returns report.json as a dict.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable

from day0.errors import StageError
from day0.request import ValidateRequest

FLOW = "validate"


@contextlib.contextmanager
def kept_server_settings():
    """The Prefect server of this command: PREFECT_API_URL when set (environment or profile);
    else the kept server (`day0 server start`) when it answers; else a temporary one of this
    command in a session of its own (day0.orchestration.temporary: a signal to the command's
    process group never takes the API from a run writing its report). The URL goes into the
    environment and Prefect's process-global settings too: Prefect's own threads (events,
    logs, heartbeats) read those, and with api.url unset one of them would start a temporary
    server of its own."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from day0.orchestration import server
    from day0.orchestration.temporary import temporary_server

    if PREFECT_API_URL.value():
        yield
        return
    with contextlib.ExitStack() as stack:
        url = server.attach()
        if url is None:
            url = stack.enter_context(temporary_server(
                log=lambda line: print(line, file=sys.stderr, flush=True)))
        else:
            print(f"day0: on the kept Prefect server {url.removesuffix('/api')} (`day0 server`)",
                  file=sys.stderr, flush=True)
        os.environ["PREFECT_API_URL"] = url
        refresh_global_settings_context()
        try:
            with temporary_settings(updates={PREFECT_API_URL: url}):
                yield
        finally:
            os.environ.pop("PREFECT_API_URL", None)
            refresh_global_settings_context()


def warm_up(request: ValidateRequest) -> None:
    """Start the warm stage host now, so that its imports overlap Prefect's (the flow would
    start it seconds later). Beside the kept server (`day0 server`, no PREFECT_API_URL) the
    host is a kept one: later commands with the same environment fork from it too."""
    from day0.execution import stagehost
    from day0.orchestration import server
    from day0.execution.targets import resolve_target

    if not stagehost.enabled():
        return
    try:
        if resolve_target(request.target, request.target_file).runner != "process":
            return
    except Exception:  # noqa: BLE001 - the flow reports a bad target; a warm-up never does
        return
    if not os.environ.get("PREFECT_API_URL"):
        state = server.read_state(server.home())
        if state is not None and server.healthy(state["api_url"]):
            server.keep_hosts_beside(state)
    stagehost.prewarm()


def validate(request: ValidateRequest) -> dict:
    """Run the flow in this process (against PREFECT_API_URL, else the kept server of `day0
    server start`, else a temporary local server).

    SIGTERM or SIGINT (Ctrl-C) during the run: the flow stops the running stages, writes the
    report of what finished (the rest "interrupted") and ends Crashed as Prefect ends a
    terminated run, which then re-sends the signal to the handler set here; the command exits
    128 + the signal (143, 130) through normal interpreter shutdown, so the temporary server
    is stopped (the default action would leave it running)."""
    import signal
    import threading

    from prefect.exceptions import TerminationSignal

    from flows.results import report_of
    from flows.validate import validate as flow

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    def on_int(signum, frame):  # Ctrl-C takes the path of SIGTERM: the report is written
        raise TerminationSignal(signal=signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main else None
    previous_int = signal.signal(signal.SIGINT, on_int) if main else None
    try:
        # a FAIL/ERROR/BROKEN run ends Failed: its report is the state's data (result() would
        # raise)
        with kept_server_settings():
            return report_of(flow(**request.as_parameters(), return_state=True))
    except TerminationSignal as exc:  # before or after the flow's own handling
        raise SystemExit(128 + int(exc.signal)) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def deployment_name(deployment: str) -> str:
    """'day0' -> 'validate/day0'; a full 'flow/deployment' name is kept."""
    return deployment if "/" in deployment else f"{FLOW}/{deployment}"


def validate_on(deployment: str, request: ValidateRequest,
                say: Callable[[str], None] | None = None) -> dict:
    """Submit to a served/deployed `validate` and wait; its final state must be a verdict
    (Completed PASS, Failed FAIL/ERROR/BROKEN), not a crash or a cancellation. say (default:
    stderr, so --json stays clean) gets the run's UI address at once, then its progress."""
    from day0.orchestration import follow
    from flows.results import is_verdict, read_report

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    flow_run = follow.start(deployment_name(deployment), request.as_parameters(), say=say)
    say(f"flow run {flow_run.name}: {follow.run_url(flow_run.id)}")
    flow_run = follow.follow(flow_run.id, say)
    if not is_verdict(flow_run.state):
        raise StageError(f"flow run {flow_run.name} ({flow_run.id}) ended "
                         f"{flow_run.state.name if flow_run.state else 'without a state'}",
                         field="--deployment", fix="open the run in the Prefect UI for its logs")
    return read_report(flow_run)  # plain JSON: never State.result(), which may unpickle


def serve(name: str, *, limit: int | None = None, target: str | None = None) -> None:
    """Register deployment validate/<name> on PREFECT_API_URL and run its flow runs here, each
    with heartbeats (day0.orchestration.recovery: a run whose process dies ends Crashed)."""
    from prefect.deployments.runner import EntrypointType

    from day0.orchestration import recovery
    from flows.validate import validate as flow

    # runs that die with this worker (or their machine) end Crashed and run again
    recovery.enable_heartbeats()
    # a release waits at most this long for the worker to see its run (Prefect's default: 10 s)
    os.environ.setdefault("PREFECT_RUNNER_POLL_FREQUENCY", "3")
    try:
        print(f"day0 serve: {recovery.ensure_zombie_automation()}", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - serving matters more; the stack creates it too
        print(f"day0 serve: warning: could not create the zombie automation: "
              f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr, flush=True)
    # module entrypoint: runs resolve `flows.validate` from the installed package, whatever the cwd
    flow.serve(name=name, limit=limit, tags=["day0"], entrypoint_type=EntrypointType.MODULE_PATH,
               parameters={"target": target} if target else None,
               description="day0 validation: the registered stages, gates, report.")


__all__ = ["validate", "validate_on", "serve", "deployment_name"]
