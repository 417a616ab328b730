"""The sandbox's contract: what a program may use (Limits), how it ended (Outcome), the request
the runner reads and the lines it prints back (runner.py), shared by both backends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from day0.errors import StageError

RUNNER = Path(__file__).with_name("runner.py")


class Limits(BaseModel):
    """What one program may use."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(10.0, gt=0, le=600, description="Wall-clock seconds per program; "
                             "then its process group is killed (status timeout).")
    memory_mib: int = Field(512, ge=64, le=65536, description="Address space per program (MiB).")
    file_kib: int = Field(1024, ge=1, description="Largest file a program may write (KiB).")
    processes: int = Field(16, ge=1, le=4096, description="Processes per program (its own user's "
                           "in the process backend; the container's pids limit in Docker).")
    scratch_mib: int = Field(64, ge=1, le=4096, description="Size of the tmpfs holding the "
                             "scratch folders.")


class Outcome(BaseModel):
    """How one program ended."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="Position of the program in the batch.")
    status: Literal["passed", "failed", "timeout", "killed"] = Field(description=(
        "passed: exit 0; failed: a non-zero exit (an assertion, an exception); timeout: the wall "
        "limit; killed: a signal (memory or CPU limit)."))
    returncode: int | None = Field(description="Exit code (negative: the signal).")
    stderr: str = Field("", description="The last 600 characters of its standard error.")
    seconds: float = Field(0.0, description="Wall-clock seconds it ran.")

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class SandboxError(StageError):
    """The sandbox itself failed (not a program): the batch has no outcome."""


def request(programs: list[str], limits: Limits, python: str | None, isolate: bool,
            separate_user: bool, scratch_root: str | None = None) -> str:
    """The runner's stdin (runner.py says what each field does)."""
    return json.dumps({"programs": programs, "limits": limits.model_dump(), "python": python,
                       "isolate": isolate, "separate_user": separate_user,
                       "scratch_root": scratch_root})


def parse(stdout: str, count: int, where: str) -> list[Outcome]:
    """The runner's JSON lines: exactly one outcome per program, in order."""
    outcomes = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                outcomes.append(Outcome.model_validate_json(line))
            except ValueError as exc:
                raise SandboxError(f"{where}: unreadable runner line {line[:120]!r}: {exc}") \
                    from None
    if [o.index for o in outcomes] != list(range(count)):
        raise SandboxError(f"{where}: {len(outcomes)} outcomes for {count} programs")
    return outcomes
