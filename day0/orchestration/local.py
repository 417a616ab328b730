"""The ``validate`` flow for the CLI: in this process, on a served deployment, or served here.

Each function takes a :class:`day0.request.ValidateRequest` (the flow's parameters, checked
before Prefect starts) and returns report.json as a dict.
"""

from __future__ import annotations

import sys
from typing import Callable

from day0.errors import StageError
from day0.request import ValidateRequest

FLOW = "validate"


def validate(request: ValidateRequest) -> dict:
    """Run the flow in this process (against PREFECT_API_URL, else a temporary local server).

    A SIGTERM during the run: the flow writes the report of what was measured and ends as
    Prefect ends a terminated run, which then re-sends the signal to the handler set here; it
    exits with 143 through normal interpreter shutdown, so the temporary server is stopped
    (the default action would leave it running)."""
    import signal
    import threading

    from flows.results import report_of
    from flows.validate import validate as flow

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main else None
    try:
        # a FAIL/ERROR/BROKEN run ends Failed: its report is the state's data (result() would
        # raise)
        return report_of(flow(**request.as_parameters(), return_state=True))
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


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
    flow_run = follow.start(deployment_name(deployment), request.as_parameters())
    say(f"flow run {flow_run.name}: {follow.run_url(flow_run.id)}")
    flow_run = follow.follow(flow_run.id, say)
    if not is_verdict(flow_run.state):
        raise StageError(f"flow run {flow_run.name} ({flow_run.id}) ended "
                         f"{flow_run.state.name if flow_run.state else 'without a state'}",
                         field="--deployment", fix="open the run in the Prefect UI for its logs")
    return read_report(flow_run)  # plain JSON: never State.result(), which may unpickle


def serve(name: str, *, limit: int | None = None, target: str | None = None) -> None:
    """Register deployment validate/<name> on PREFECT_API_URL and run its flow runs here."""
    from prefect.deployments.runner import EntrypointType

    from flows.validate import validate as flow

    # module entrypoint: runs resolve `flows.validate` from the installed package, whatever the cwd
    flow.serve(name=name, limit=limit, tags=["day0"], entrypoint_type=EntrypointType.MODULE_PATH,
               parameters={"target": target} if target else None,
               description="day0 validation: the registered stages, gates, report.")


__all__ = ["validate", "validate_on", "serve", "deployment_name"]
