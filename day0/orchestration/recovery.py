"""A validation whose worker dies still ends, and its release is run again.

Three parts, each Prefect's own mechanism where one exists:

* heartbeats: every flow run of a deployment emits ``prefect.flow-run.heartbeat`` every
  ``heartbeat_s`` (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, set for the runs of ``day0 serve``);
* the zombie automation (Prefect's documented recipe, created once per server by ``day0 serve``
  and ``day0 stack up``): a run that sent no heartbeat and reached no final state within
  ``zombie_after_s`` of its last one is set Crashed, with the reason;
* the worker watch: a flow-run process whose worker (its parent: ``day0 serve`` or a process
  worker) died stops itself with SIGTERM instead of running on unsupervised; its stages stop
  with it (they die with their owner), its report keeps what finished, and the run ends Crashed.

A Crashed run has no verdict: the release receiver submits its release again
(day0.receiver.journal, submit.crash_attempts). Settings: day0/data/recovery.yaml.
"""

from __future__ import annotations

import os
import signal
import threading
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from day0.yamlio import load_model, read_mapping

SETTINGS = Path(__file__).resolve().parents[1] / "data" / "recovery.yaml"
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"


class RecoverySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    heartbeat_s: int = Field(ge=30, description=(
        "Seconds between a flow run's heartbeat events (Prefect's minimum is 30)."))
    zombie_after_s: int = Field(gt=0, description=(
        "A run with no heartbeat and no final state for this long is set Crashed."))
    parent_poll_s: float = Field(gt=0, le=10, description=(
        "How often a served flow-run process checks that its worker still lives."))
    automation_name: str = Field(min_length=1, description="Name of the zombie automation.")
    client_outage_s: float = Field(gt=0, le=3600, description=(
        "How long a client waiting on a run waits through a Prefect outage before exit 3."))


@lru_cache(maxsize=1)
def settings() -> RecoverySettings:
    loaded = load_model(RecoverySettings, read_mapping(SETTINGS), str(SETTINGS))
    if loaded.zombie_after_s <= loaded.heartbeat_s:
        from day0.errors import ConfigError

        raise ConfigError("zombie_after_s must exceed heartbeat_s", file=str(SETTINGS),
                          field="zombie_after_s", fix="give it at least two heartbeats")
    return loaded


def enable_heartbeats() -> None:
    """Heartbeats for the flow runs this process starts (they inherit the environment); a value
    the caller set is kept."""
    os.environ.setdefault(HEARTBEAT_ENV, str(settings().heartbeat_s))


def zombie_automation():
    """Prefect's automation that sets Crashed a run whose heartbeats stopped."""
    from datetime import timedelta

    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    s = settings()
    return Automation(
        name=s.automation_name,
        description="day0: a flow run that stopped sending heartbeats (its process or machine "
                    "died) is set Crashed; the release receiver then runs its release again.",
        trigger=EventTrigger(
            # any event of the run answers: a heartbeat, or a state change, whose event is
            # named after the state's name (day0's are PASS, FAIL, ... not Completed, Failed)
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.*"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
            within=timedelta(seconds=s.zombie_after_s)),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED,
            message=f"no heartbeat for {s.zombie_after_s} s: the process running this flow "
                    "died (worker or machine gone); day0 runs the release again")])


def ensure_zombie_automation() -> str:
    """Create the zombie automation on the server of PREFECT_API_URL unless one of its name
    exists; returns what was done (a line for the log)."""
    from prefect.client.orchestration import get_client

    wanted = zombie_automation()
    with get_client(sync_client=True) as client:
        if client.read_automations_by_name(wanted.name):
            return f"automation {wanted.name!r} present"
        wanted.create()
    return f"automation {wanted.name!r} created"


def watch_worker(on_orphaned=None) -> threading.Thread | None:
    """In a flow-run process started by a worker: a daemon thread that sends this process
    SIGTERM once its parent (the worker) is gone, after calling on_orphaned(parent pid). None
    where the parent is init (nothing to watch)."""
    parent = os.getppid()
    if parent <= 1:
        return None
    poll = settings().parent_poll_s
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(poll):
            if os.getppid() != parent:  # re-parented: the worker died
                if on_orphaned is not None:
                    on_orphaned(parent)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, name="day0-worker-watch", daemon=True)
    thread.start()
    return thread


__all__ = ["settings", "enable_heartbeats", "zombie_automation", "ensure_zombie_automation",
           "watch_worker", "HEARTBEAT_ENV"]
