"""Which lm-eval tasks run and where their files are: day0's bundled tasks (YAML + JSONL in
day0/stages/evaluation/data/tasks; the long-context one built for the model's context), standard
tasks on fetched real data (benchmarks.py), a business set, a user's include_path, lm-eval's own
registry. Everything is written into one run folder
that lm-eval's TaskManager reads (include_path), with absolute data paths."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from day0.errors import ConfigError
from day0.stages.evaluation import benchmarks, business, codeexec
from day0.stages.evaluation.config import BUNDLED, Config

TASKS_DIR = Path(__file__).parent / "data" / "tasks"
LONG_CONTEXT = "day0_long_context"


@dataclass(frozen=True)
class Task:
    """A task of this run: its lm-eval name, the category it is gated under, and the digest of
    what defines it (YAML and data; lm-eval registry tasks: name and lm-eval version)."""

    name: str
    category: str
    origin: str  # bundled | standard | business | include_path | lm-eval
    digest: str
    items: int | None  # known before the run (None: lm-eval registry tasks)


def category_of(name: str) -> str:
    standard = benchmarks.standard_tasks().get(name)
    return standard.category if standard and standard.category else name.removeprefix("day0_")


def known_categories() -> set[str]:
    """The categories day0's own tasks are gated under (bundled, standard, business)."""
    names = [*BUNDLED, *benchmarks.standard_tasks()]
    return {category_of(n) for n in names} | {"business"}


def standard_items(name: str, config: Config) -> int:
    """Items a standard task evaluates (its test split, else validation) under config.limit,
    which lm-eval applies per task: per subject task of a group, counted as fetched (before the
    fetch: an upper bound)."""
    bench = benchmarks.standard_tasks()[name]
    split = benchmarks.evaluated_split(name)
    total = next(d.rows for f, d in bench.files.items() if f.endswith(f"{split}.jsonl"))
    if not bench.subjects:
        return min(total, config.limit or total)
    rows = benchmarks.counted_rows(name, benchmarks.data_dir(config.benchmarks_dir))
    if rows is None:
        return min(total, len(bench.subjects) * (config.limit or total))
    per_task = [rows[splits[split]] for splits in benchmarks.lm_eval_tasks(name).values()]
    return sum(min(n, config.limit or n) for n in per_task)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def planned(config: Config) -> dict[str, int | None]:
    """Items per category known before the run (for the gates' power check), without a
    tokenizer or lm-eval: None where only the run knows (lm-eval registry tasks)."""
    sizes: dict[str, int | None] = {}

    def add(category: str, n: int | None, limited: bool = False) -> None:
        if config.limit and n is not None and not limited:  # lm-eval's limit is per task
            n = min(n, config.limit)
        before = sizes.get(category, 0)
        sizes[category] = None if n is None or before is None else before + n

    for name in config.tasks:
        if name == LONG_CONTEXT:
            add(category_of(name), config.long_context_items)
        elif name in BUNDLED:
            add(category_of(name), _lines(TASKS_DIR / f"{name}.jsonl"))
        elif name in benchmarks.standard_tasks():
            add(category_of(name), standard_items(name, config), limited=True)
        else:
            add(category_of(name), None)
    if config.business_file:
        rows = business.read_rows(config.business_file)
        choice = sum(1 for d in rows if d["match"] == "choice")
        for n in (choice, len(rows) - choice):  # its two tasks are one category
            if n:
                add("business", n)
    known = list(sizes.values())
    sizes["all"] = None if None in known else sum(known)
    return sizes


def prepare(config: Config, folder: Path, *, tokenizer, long_context_tokens: int,
            lm_eval_version: str) -> list[Task]:
    """Write this run's task files into folder; the tasks in config order."""
    from day0.stages.evaluation.long_context import build_items

    tasks: list[Task] = []
    for name in config.tasks:
        if name in BUNDLED:
            spec = yaml.safe_load((TASKS_DIR / f"{name}.yaml").read_text())
            data = folder / f"{name}.jsonl"
            if name == LONG_CONTEXT:
                rows = build_items(tokenizer, long_context_tokens, config.long_context_items,
                                   seed=config.seed)
                data.write_text("".join(json.dumps(r) + "\n" for r in rows))
            else:
                data.write_bytes((TASKS_DIR / f"{name}.jsonl").read_bytes())
            spec["dataset_kwargs"] = {"data_files": {"test": str(data)}}
            text = yaml.safe_dump(spec, sort_keys=False)
            (folder / f"{name}.yaml").write_text(text)
            tasks.append(Task(name, category_of(name), "bundled",
                              _digest(text.replace(str(folder), "").encode(), data.read_bytes()),
                              _lines(data)))
        elif name in benchmarks.standard_tasks():
            data_dir = benchmarks.data_dir(config.benchmarks_dir)
            marker = benchmarks.fetched(name, data_dir)  # checked against their sha256
            split = benchmarks.evaluated_split(name)
            scorer = benchmarks.standard_tasks()[name].scorer
            scoring = [] if scorer == "lm_eval" else [f"{scorer}:{codeexec.VERSION}".encode()]
            subtasks = benchmarks.lm_eval_tasks(name)
            for task, text in benchmarks.task_yamls(name, data_dir).items():
                (folder / f"{task}.yaml").write_text(text)
                splits = subtasks[task]
                tasks.append(Task(task, category_of(name), "standard", _digest(
                    task.encode(), lm_eval_version.encode(), *scoring,
                    *(f"{f}:{marker['files'][f]}".encode() for f in sorted(splits.values()))),
                    min(marker["rows"][splits[split]], config.limit or 10**9)))
        elif config.include_path and _declared_in(name, Path(config.include_path)):
            files = sorted(Path(config.include_path).rglob("*"))
            tasks.append(Task(name, name, "include_path", _digest(
                *(f.read_bytes() for f in files if f.is_file())), None))
        else:
            tasks.append(Task(name, name, "lm-eval", _digest(name.encode(),
                                                             lm_eval_version.encode()), None))
    if config.business_file:
        raw = Path(config.business_file).expanduser().read_bytes()
        for name, n in business.write_tasks(config.business_file, folder,
                                             config.max_gen_toks).items():
            tasks.append(Task(name, "business", "business", _digest(raw, name.encode()), n))
    return tasks


def _declared_in(name: str, folder: Path) -> bool:
    if not folder.is_dir():
        raise ConfigError("include_path is not a folder", file=str(folder),
                          field="include_path", fix="give a folder of lm-eval task YAMLs")
    for path in folder.rglob("*.yaml"):
        try:
            if f"task: {name}" in path.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False
