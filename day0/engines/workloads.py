"""Workloads as data (``day0/data/workloads.yaml`` or a stage's
``workloads_file``) and the timed traces they give the load generator.

A workload draws every request's prompt and output length from its distributions with the
stage's seed (the same trace on every run, so a run compares with its baseline request by
request), and sends them at each of its arrival levels: closed-loop concurrency (that many in
flight) or an open-loop Poisson rate. Multi-turn workloads (``turns`` > 1) are conversations: a
shared system/tools prefix, then each turn's prompt is the previous turn's prompt, its answer
and a new user message, so the history grows and a prefix cache can reuse it; turn t of every
conversation is sent ``t * think_time_s`` after the run starts.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from day0.engines.loadgen import CHUNK, LoadRun, TraceEntry
from day0.errors import ConfigError, did_you_mean
from day0.yamlio import load_model, read_mapping

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "workloads.yaml"


class Lengths(BaseModel):
    """Token counts of a request part. ``of_context``: value/min/max/median are fractions of
    the engine's context (max_model_len) instead of tokens."""

    model_config = ConfigDict(extra="forbid")

    dist: Literal["fixed", "uniform", "lognormal"] = Field("fixed", description=(
        "fixed: value; uniform: min..max; lognormal: median and sigma, clipped to min..max."))
    value: float | None = Field(None, gt=0, description="fixed: the count.")
    min: float | None = Field(None, gt=0, description="Smallest count (uniform, lognormal).")
    max: float | None = Field(None, gt=0, description="Largest count (uniform, lognormal).")
    median: float | None = Field(None, gt=0, description="lognormal: the median.")
    sigma: float | None = Field(None, gt=0, description="lognormal: sigma of log(count).")
    of_context: bool = Field(False, description=(
        "Counts are fractions of the context: of max_model_len for outputs, of max_model_len "
        "less the request's output tokens for prompts (so the request fits)."))

    @model_validator(mode="after")
    def _complete(self) -> "Lengths":
        need = {"fixed": ("value",), "uniform": ("min", "max"),
                "lognormal": ("median", "sigma", "min", "max")}[self.dist]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"dist {self.dist} needs {', '.join(missing)}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}")
        if self.of_context and any(v is not None and v > 1 for v in
                                   (self.value, self.min, self.max, self.median)):
            raise ValueError("of_context counts are fractions of the context (at most 1)")
        return self

    def smallest(self, context: int) -> int:
        """The least count a draw can give."""
        scale = max(1, context) if self.of_context else 1
        return max(1, int(round((self.value if self.dist == "fixed" else self.min) * scale)))

    def draw(self, rng: random.Random, context: int) -> int:
        scale = max(1, context) if self.of_context else 1
        if self.dist == "fixed":
            value = self.value
        elif self.dist == "uniform":
            value = rng.uniform(self.min, self.max)
        else:
            value = min(max(self.median * math.exp(rng.gauss(0, self.sigma)), self.min), self.max)
        return max(1, int(round(value * scale)))


class Arrival(BaseModel):
    """How requests arrive: one run per level."""

    model_config = ConfigDict(extra="forbid")

    concurrency: list[int] | None = Field(None, description=(
        "Closed loop: requests kept in flight, one run per level (e.g. [1, 4])."))
    rate: list[float] | None = Field(None, description=(
        "Open loop: Poisson arrivals per second, one run per level."))

    @model_validator(mode="after")
    def _one(self) -> "Arrival":
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        levels = self.concurrency or self.rate
        if not levels or any(v <= 0 for v in levels):
            raise ValueError("levels must be a non-empty list of positive numbers")
        return self


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str = Field("", description="What traffic this stands for.")
    input_tokens: Lengths = Field(description=(
        "Prompt tokens; multi-turn: each turn's new user message."))
    output_tokens: Lengths = Field(description="Generated tokens per request (EOS ignored).")
    requests: int = Field(ge=1, le=100_000, description=(
        "Requests per run (multi-turn: conversations x turns, rounded down)."))
    arrival: Arrival = Field(description="Concurrency or rate levels, one run each.")
    max_duration_s: float = Field(300.0, gt=0, description=(
        "Time bound of each run: the client is stopped past it and the run reported as such."))
    shared_prefix_tokens: int = Field(0, ge=0, description=(
        "Tokens every request starts with (a system prompt and tool definitions), in whole "
        "16-token blocks; at most a quarter of the engine's context (capped, with a note)."))
    turns: int = Field(1, ge=1, le=64, description="Turns per conversation (1: single requests).")
    think_time_s: float = Field(0.0, ge=0, description=(
        "Multi-turn: seconds between a conversation's turns (turn t is sent at t x this)."))
    slo_ms: dict[Literal["ttft", "tpot", "e2el"], float] = Field(default_factory=dict, description=(
        "Goodput SLOs in ms: a request is good when it meets every one (vLLM's --goodput); "
        "the workload's goodput metric is the share of good requests."))


class WorkloadFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workloads: dict[str, Workload] = Field(description="Workloads by name.")


def load(path: str | Path | None) -> WorkloadFile:
    """The workloads file, every problem in it at once (exit 2)."""
    file = Path(path) if path else BUNDLED
    return load_model(WorkloadFile, read_mapping(file), str(file))


def pick(file: WorkloadFile, names: list[str], field: str) -> list[str]:
    """names, each checked to be a workload of file (ConfigError with did-you-mean)."""
    for name in names:
        if name not in file.workloads:
            raise ConfigError(f"unknown workload {name!r}", field=field,
                              fix=did_you_mean(name, list(file.workloads)).strip()
                              or f"use one of {', '.join(file.workloads)}")
    return names


def level_name(arrival: Arrival, level: float) -> str:
    return f"c{int(level)}" if arrival.concurrency else f"r{level:g}"


def runs_for(name: str, workload: Workload, *, context: int, seed: int,
             notes: list[str] | None = None) -> list[LoadRun]:
    """One LoadRun per arrival level, all with the same trace; what had to be adapted to the
    engine's context is appended to notes."""
    trace = trace_for(name, workload, context=context, seed=seed, notes=notes)
    levels = workload.arrival.concurrency or workload.arrival.rate
    return [LoadRun(id=f"{name}-{level_name(workload.arrival, level)}", trace=trace,
                    concurrency=int(level) if workload.arrival.concurrency else None,
                    rate=None if workload.arrival.concurrency else float(level),
                    self_timed=workload.turns > 1 and workload.think_time_s > 0,
                    goodput=dict(workload.slo_ms),
                    max_duration_s=workload.max_duration_s)
            for level in levels]


def trace_for(name: str, workload: Workload, *, context: int, seed: int,
              notes: list[str] | None = None) -> list[TraceEntry]:
    rng = random.Random(f"{seed}:{name}")
    prefix_blocks = min(workload.shared_prefix_tokens, context // 4) // CHUNK
    if prefix_blocks * CHUNK < workload.shared_prefix_tokens and notes is not None:
        notes.append(f"{name}: shared prefix of {prefix_blocks * CHUNK} tokens instead of "
                     f"{workload.shared_prefix_tokens} (whole 16-token blocks, at most a "
                     "quarter of "
                     f"the engine's context of {context})")
    next_id = [1_000_000 * (1 + sum(map(ord, name)) % 1000)]  # ids of this workload only

    def fresh(n: int) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    prefix = fresh(prefix_blocks)
    entries: list[tuple[int, int, TraceEntry]] = []
    conversations = max(1, workload.requests // workload.turns)
    short_turns: set[int] = set()
    clipped = 0
    for conversation in range(conversations):
        history = prefix_blocks * CHUNK  # tokens so far
        blocks = list(prefix)
        for turn in range(workload.turns):
            out = workload.output_tokens.draw(rng, context)
            new_in = workload.input_tokens.draw(rng, context - history - out)
            room = context - history - out
            if turn == 0 and new_in > room >= workload.input_tokens.smallest(room):
                clipped += 1  # the distribution's tail past this engine's context is cut
                new_in = room
            length = history + new_in
            if length + out > context:
                if turn == 0:
                    raise ConfigError(
                        f"workload {name}: a request of {length} prompt + {out} output tokens "
                        f"does not fit the engine's context of {context}",
                        field=f"workloads.{name}.input_tokens",
                        fix="lower input_tokens/output_tokens/shared_prefix_tokens or give "
                            "the engine a longer max_model_len")
                short_turns.add(turn)
                break  # the conversation has filled the context: it ends here
            need = -(-length // CHUNK)
            blocks += fresh(need - len(blocks))
            entries.append((turn, conversation, TraceEntry(
                timestamp=turn * workload.think_time_s, input_length=length, output_length=out,
                hash_ids=blocks[:need])))
            history = length + out
    if clipped and notes is not None:
        notes.append(f"{name}: {clipped} prompts shortened to fit the engine's context of "
                     f"{context} (the length distribution's tail is longer)")
    if short_turns and notes is not None:
        notes.append(f"{name}: some conversations end after {min(short_turns)} of "
                     f"{workload.turns} turns (their history fills the context of {context})")
    # turn-major: a conversation's later turns are sent after its earlier ones
    return [entry for _, _, entry in sorted(entries, key=lambda t: t[:2])]
