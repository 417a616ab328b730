"""Code benchmarks scored by running them (humaneval, mbpp; benchmarks.yaml `scorer:`).

lm-eval's prompts and generation settings make one greedy completion per problem; lm-eval's own
`code_eval` metric would load from the hub, so day0 builds each problem's check program the way
lm-eval's task does and runs it in the sandbox (day0.stages.evaluation.sandbox). An item passes
when its program exits 0 within the limits; with one completion per problem, pass@1 is the
fraction that pass (the unbiased estimator at n = 1).

* humaneval: the problem's prompt, the completion, its tests, `check(entry_point)` (OpenAI's
  human-eval harness, and lm-eval's `build_predictions` filter with its doc_to_target);
* mbpp: the completion, the problem's test_setup_code, then the three asserts lm-eval's
  doc_to_target lists. MBPP's own harness runs the set-up code, lm-eval's leaves it out (its
  canonical solutions then pass 499 of 500: task 367's asserts use objects the set-up builds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from day0.errors import ConfigError
from day0.stages.evaluation import benchmarks, sandbox

DATA = "test.jsonl"
VERSION = "1"  # of how programs are built and judged: part of a code task's digest
FIELDS = {"humaneval": ("task_id", "prompt", "canonical_solution", "test", "entry_point"),
          "mbpp": ("task_id", "code", "test_list")}


@dataclass(frozen=True)
class Problem:
    task_id: str
    prefix: str  # what precedes the completion in the program
    canonical: str  # the dataset's own solution, as a completion
    tests: str  # what follows it

    def program(self, completion: str) -> str:
        return f"{self.prefix}{completion}\n{self.tests}\n"


def _problem(scorer: str, row: dict) -> Problem:
    if scorer == "humaneval":
        return Problem(row["task_id"], row["prompt"], row["canonical_solution"],
                       f"{row['test']}\ncheck({row['entry_point']})")
    setup = row.get("test_setup_code") or ""
    return Problem(str(row["task_id"]), "", row["code"],
                   "\n".join([setup, *row["test_list"][:3]]).lstrip("\n"))


def load(scorer: str, folder: Path) -> list[Problem]:
    """The problems of a fetched code benchmark folder, in doc order."""
    path = Path(folder) / DATA
    if not path.is_file():
        raise ConfigError(f"no {scorer} data at {path}", field="evaluation.tasks",
                          fix=f"run `.venv/bin/python scripts/fetch_benchmarks.py {scorer}`")
    problems = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [f for f in FIELDS[scorer] if row.get(f) in (None, "")]
            if missing:
                raise ConfigError(f"{path} line {number} lacks {missing}",
                                  field="evaluation.tasks",
                                  fix="fetch it again (scripts/fetch_benchmarks.py)")
            problems.append(_problem(scorer, row))
    return problems


def score(problems: list[Problem], completions: list[str],
          limits: sandbox.Limits | None = None, backend: sandbox.Backend = "auto",
          ) -> tuple[float, list[sandbox.Outcome]]:
    """(pass@1, each problem's outcome) of one completion per problem."""
    if len(completions) != len(problems):
        raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
    outcomes = sandbox.run([p.program(c) for p, c in zip(problems, completions)], limits,
                           backend)
    return sum(o.passed for o in outcomes) / max(len(outcomes), 1), outcomes


def score_records(records: dict, data_dir: Path, limits: sandbox.Limits,
                  backend: sandbox.Backend) -> None:
    """Set each item of the code tasks in one side's records (sides.side_records) to whether its
    program passes; its outcome is kept in the item. Other tasks are left as they are."""
    for name, task in records.items():
        bench = benchmarks.standard_tasks().get(name)
        if bench is None or bench.scorer == "lm_eval":
            continue
        problems = load(bench.scorer, Path(data_dir) / name)
        items = task["items"]
        if any(not 0 <= it["doc_id"] < len(problems) for it in items):
            raise ConfigError(f"{name}: lm-eval evaluated a doc this data does not have",
                              field="evaluation.tasks", fix="fetch it again")
        _, outcomes = score([problems[it["doc_id"]] for it in items],
                            [str(it.get("prediction") or "") for it in items], limits, backend)
        for it, outcome in zip(items, outcomes):
            it.update(metric="pass@1", correct=float(outcome.passed), status=outcome.status)
