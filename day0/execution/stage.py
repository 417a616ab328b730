"""Run one stage isolated in a subprocess: spec JSON in, result JSON out, exit status.

``python -m day0.execution.stage SPEC.json RESULT.json`` is the contract inside any process or image that
has Python, torch and day0. The parent (``run_stage``) enforces the target's timeout and memory
limit, streams the child's log lines, and turns a crash, timeout or OOM kill into a failed
``StageOutcome`` with its reason instead of taking the caller (the Prefect flow) down with it.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from day0.execution import lifecycle, progress, stagehost
from day0.atomic import write_atomic
from day0.execution.budget import StageBudget, for_spec
from day0.execution.contract import StageInputs
from day0 import stages
from day0.errors import ConfigError, Day0Error, TargetFault
from day0.execution.memory import group_rss_bytes, rss_bytes, stage_peak_rss_bytes

# "target": the stage ran but the target itself failed (TargetFault: its forward raised): a
# finding, FAIL. "error" (StageError or a bug), "crash", "timeout", "oom", "image" (missing, or
# lacking a dependency): the stage could not finish: ERROR. "input"/"config": bad input, exit 2.
# interrupted: the run got SIGTERM/SIGINT before the stage finished (the flow marks it so)
FailureKind = Literal["input", "config", "target", "error", "crash", "timeout", "oom", "image",
                      "interrupted"]


class StageSpec(BaseModel):
    """Everything a stage process needs; written to SPEC.json."""

    model_config = ConfigDict(extra="forbid")

    stage: str = Field(description="Stage name (day0.stages).")
    locator: str | None = Field(None, description=(
        "Where the stage lives ('pkg.module' or 'pkg.module:attr'), as the parent resolved it: "
        "a stage registered at run time is found in the child too."))
    config: dict = Field(default_factory=dict, description="The stage's own Config, as JSON.")
    inputs: StageInputs = Field(description="Source, target, reference, required results.")
    facts: dict = Field(default_factory=dict, description=(
        "Model facts from earlier stages (params, dimensions) for the stage's memory and time "
        "budget (day0.execution.budget); never read by the stage, never part of its cache key."))


class StageOutcome(BaseModel):
    """What the runner reports for one stage, success or not."""

    # NaN/Inf are evidence: keep them as "NaN"/"Infinity" in JSON instead of null
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    stage: str
    ok: bool
    result: dict | None = Field(None, description="The stage Result as JSON when ok.")
    metrics: dict[str, float | None] = Field(default_factory=dict)
    failure: FailureKind | None = None
    error: str | None = Field(None, description="One-line reason when not ok.")
    exit_code: int | None = None
    seconds: float = 0.0
    cached: bool = False
    log_tail: list[str] = Field(default_factory=list)
    ran_in: str = Field("", description=(
        "Where it ran: 'process', 'docker:IMAGE:CONTAINER', 'deployment:NAME:FLOW_RUN_ID'."))
    budget: StageBudget | None = Field(None, description=(
        "The memory and time the stage was allowed and where they came from (day0.execution.budget)."))
    peak_rss_gib: float | None = Field(None, description=(
        "The stage process's own peak resident memory (VmHWM since it started, or was forked), "
        "GiB; None where unknown (a crash, a container)."))
    cache_key: str | None = Field(None, description=(
        "The stage's cache key (day0.execution.cache): what a stage that requires this one is keyed by."))


def stage_module(spec: StageSpec):
    """The stage's core (Config, Result, run): by the spec's locator, else by name."""
    return stages.get(spec.stage, spec.locator).load()


def execute(spec: StageSpec) -> StageOutcome:
    """Run a stage in this process (the child side of the contract)."""
    from day0.yamlio import load_model

    started = time.monotonic()
    try:
        module = stage_module(spec)
        config = load_model(module.Config, spec.config, f"{spec.stage} stage config")
        result = module.run(config, spec.inputs)
        return StageOutcome(stage=spec.stage, ok=True, result=result.model_dump(mode="json"),
                            metrics=result.metrics(), seconds=time.monotonic() - started)
    except Day0Error as exc:
        return StageOutcome(stage=spec.stage, ok=False, failure=failure_kind(exc), error=str(exc),
                            exit_code=exc.exit_code, seconds=time.monotonic() - started)
    except (ImportError, importlib.metadata.PackageNotFoundError) as exc:
        # the environment (image, venv) lacks a dependency: not a finding about the target
        traceback.print_exc()
        return StageOutcome(stage=spec.stage, ok=False, failure="image",
                            error=f"the stage's environment lacks a dependency: {exc}",
                            seconds=time.monotonic() - started)
    except MemoryError:
        return StageOutcome(stage=spec.stage, ok=False, failure="oom",
                            error="ran out of memory (MemoryError)", seconds=time.monotonic() - started)
    except Exception as exc:  # the stage's own bug or the target's failure: keep the traceback
        traceback.print_exc()
        return StageOutcome(stage=spec.stage, ok=False, failure="error",
                            error=f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
                            seconds=time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    lifecycle.guard_stage()  # before any work: never outlive the run_stage that started us
    if len(argv) != 2:
        print("usage: python -m day0.execution.stage SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec = StageSpec.model_validate_json(Path(argv[0]).read_text())
    lifecycle.name_process(f"day0:{spec.stage}")  # `ps -o pid,comm` names each stage process
    progress.start(spec.stage)  # the stage's progress lines go to stdout, to the runner
    try:
        outcome = execute(spec)
    finally:
        progress.stop()
    outcome.peak_rss_gib = round(stage_peak_rss_bytes() / 2**30, 4)
    write_atomic(argv[1], outcome.model_dump_json())  # a half-written result is never read
    return 0 if outcome.ok else (outcome.exit_code or 1)


_RUNNING: set[int] = set()  # process groups of the stage children running now


def interrupt_running(signum: int = signal.SIGTERM, already: frozenset[int] = frozenset()
                      ) -> frozenset[int]:
    """Send signum to every running stage child's process group not in already (a stage that
    handles it, the soak, stops early and reports what it measured, so none gets it twice);
    the groups signalled, already included."""
    sent = set(already)
    for group in list(_RUNNING):
        if group in sent:
            continue
        try:
            os.killpg(group, signum)
            sent.add(group)
        except ProcessLookupError:
            _RUNNING.discard(group)
    return frozenset(sent)


class TracebackFilter:
    """Which lines of a stage's output go to the run's log: all but the frames of a Python
    traceback, which stay in the outcome's log_tail (stages/<stage>.json) where a developer
    reads them; the log shows the exception's own line. DAY0_DEBUG=1 shows every line."""

    HEAD = "Traceback (most recent call last):"
    CHAINED = ("During handling of the above exception", "The above exception was the direct")

    def __init__(self):
        self.inside = self.ended = False
        self.everything = bool(os.environ.get("DAY0_DEBUG"))

    def __call__(self, line: str) -> bool:
        if self.everything:
            return True
        if line.startswith(self.HEAD) or line.startswith(self.CHAINED):
            self.inside = True
            return False
        if self.inside and line[:1].isspace():
            return False
        if not line.strip():  # between chained tracebacks (after one's exception line)
            return not self.ended
        self.ended = self.inside  # the exception's line ends the traceback: shown
        self.inside = False
        return True


def run_stage(spec: StageSpec, *, timeout_s: float | None = None,
              memory_limit_gib: float | None = None, log: Callable[[str], None] | None = None,
              env: dict | None = None, budget: StageBudget | None = None) -> StageOutcome:
    """Run spec in a child process and always return an outcome (never raise for the stage).

    Limits: budget when given, else timeout_s / memory_limit_gib when given, else the target's,
    else derived from the model's size (day0.execution.budget). Memory counts the stage's process group.
    Every line of the child goes to log, progress lines included (day0.execution.progress); a child
    silent for 10 s gets a heartbeat line there (elapsed time, memory)."""
    if budget is None:
        try:
            budget = for_spec(spec, timeout_s=timeout_s, memory_limit_gib=memory_limit_gib)
        except Day0Error as exc:  # an unknown stage, one without budget factors: its outcome
            return _failed(spec, failure_kind(exc), str(exc), exc.exit_code, 0.0, [])
    log = log or (lambda line: None)
    tail: list[str] = []
    started = time.monotonic()
    scratch = lifecycle.make_scratch(spec.stage)  # owner-named: a later start sweeps it if we die
    try:
        spec_file, result_file = scratch / "spec.json", scratch / "result.json"
        spec_file.write_text(spec.model_dump_json())
        (scratch / "tmp").mkdir()
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}),
                     # the stage's temp files live and go with its scratch folder, even killed
                     "TMPDIR": str(scratch / "tmp"),
                     lifecycle.OWNER_ENV: lifecycle.owner_token(),
                     lifecycle.SCRATCH_ENV: str(scratch),
                     lifecycle.MEMORY_ENV: f"{budget.memory_gib:.6g}"}  # a stage may fit its work to it
        proc = _start_child([str(spec_file), str(result_file)], child_env, log)

        _RUNNING.add(proc.pid)
        beat = progress.Heartbeat(spec.stage, log, rss=lambda: group_rss_bytes(proc.pid))

        shown = TracebackFilter()

        def pump():
            for line in proc.stdout:
                line = line.rstrip()
                beat.seen(line)
                if not line.startswith(progress.PREFIX):  # the tail explains failures
                    tail.append(line)
                    del tail[:-40]
                if shown(line):
                    log(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            killed_for = _supervise(proc, budget, started, beat)
            proc.wait()
        finally:
            _RUNNING.discard(proc.pid)
        lifecycle.kill_group(proc.pid)  # children the stage left behind go with it
        reader.join(timeout=5)
        seconds = time.monotonic() - started
        if getattr(proc, "host_died", False) and not killed_for:
            return _failed(spec, "crash", f"the warm stage host (pid {proc.host_pid}) died while "
                           f"stage '{spec.stage}' ran; the stage was killed with it",
                           proc.returncode, seconds, tail, budget)
        if killed_for:
            # what the stage was doing: the work that consumed the budget, when it said so
            doing = (f" (it was at {beat.last_progress.describe()})" if beat.last_progress
                     else "")
            return _failed(spec, "timeout" if killed_for == "time" else "oom",
                           budget.exceeded(spec.stage, killed_for) + doing, proc.returncode,
                           seconds, tail, budget)
        if result_file.is_file():
            outcome = StageOutcome.model_validate_json(result_file.read_text())
            return outcome.model_copy(update={"seconds": seconds, "log_tail": tail[-20:],
                                              "ran_in": "process", "budget": budget})
        return _failed(spec, *_describe_exit(spec.stage, proc.returncode), proc.returncode,
                       seconds, tail, budget)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _start_child(argv: list[str], env: dict, log: Callable[[str], None]):
    """The stage child: forked from the warm host (day0.execution.stagehost) when it can be, else a cold
    `python -m day0.execution.stage` (DAY0_STAGE_HOST=0, or a host that cannot start)."""
    if stagehost.enabled():
        try:
            host = stagehost.host_for(env)
            child = host.spawn("day0.execution.stage:main", argv, env, os.getcwd())
            if isinstance(host, stagehost.KeptHost):  # its code is the code of its start
                log(f"forked from the kept stage host (pid {host.pid}, {host.record.parent})")
            return child
        except stagehost.HostUnavailable as exc:
            log(f"{exc}; starting the stage cold")
    return subprocess.Popen([sys.executable, "-m", "day0.execution.stage", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)


def _supervise(proc: subprocess.Popen, budget: StageBudget, started: float,
               beat: progress.Heartbeat | None = None) -> str | None:
    """Wait for proc; kill its group when it goes over budget: 'time', 'memory' or None.
    beat: ticked every poll (a line when the stage has been silent for its period)."""
    limit = budget.memory_gib * 2**30
    polls = 0
    while proc.poll() is None:
        if time.monotonic() - started > budget.timeout_s:
            lifecycle.kill_group(proc.pid)
            return "time"
        # the whole group every second (a /proc scan), the leader in between (one file read)
        group = polls % 10 == 0
        rss = group_rss_bytes(proc.pid) if group else rss_bytes(proc.pid)
        if rss > limit:
            lifecycle.kill_group(proc.pid)
            return "memory"
        if beat is not None:
            beat.tick(rss if group else None)
        polls += 1
        time.sleep(0.1)
    return None


def _describe_exit(stage: str, code: int) -> tuple[str, str]:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        if -code == signal.SIGKILL:
            return "crash", (f"stage '{stage}' was killed by SIGKILL without a result "
                             "(the kernel's OOM killer sends SIGKILL: check memory)")
        return "crash", f"stage '{stage}' was killed by {name} without a result"
    return "crash", f"stage '{stage}' crashed (exit code {code}) without a result"


def failure_kind(exc: Day0Error) -> FailureKind:
    """What a day0 error raised by or for a stage makes of it (FailureKind)."""
    return ("config" if isinstance(exc, ConfigError) else
            "target" if isinstance(exc, TargetFault) else
            "error" if exc.exit_code == 3 else "input")


def _failed(spec, kind, message, code, seconds, tail, budget=None) -> StageOutcome:
    return StageOutcome(stage=spec.stage, ok=False, failure=kind, error=message, exit_code=code,
                        seconds=seconds, log_tail=tail[-20:], ran_in="process", budget=budget)


if __name__ == "__main__":
    sys.exit(main())
