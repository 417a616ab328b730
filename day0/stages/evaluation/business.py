"""A user's business regression set (JSONL) turned into lm-eval tasks at run time.

One object per line::

    {"id": "refund-1", "prompt": "...", "answer": "...", "match": "contains"}
    {"prompt": "...", "choices": ["A", "B", "C"], "answer": "B", "match": "choice"}

``match``: exact (the stripped generation equals the answer), contains (the answer occurs in
the generation, case-insensitive), regex (a search of the answer in the generation, with the
`regex` module's time limit: a pattern that backtracks catastrophically is a config error naming
its row, at load when a probe shows it, else when it first runs out of time), choice
(loglikelihood multiple choice: the answer is one of the choices). Choice rows become one
multiple-choice task, the others one generative task; both are the category "business".
Every bad line is reported at once, by line number.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from day0.errors import ConfigError, InputError, Problem

MAX_ROWS = 100_000
MAX_FIELD_CHARS = 200_000
MAX_REGEX_CHARS = 500
# a generation is at most max_gen_toks tokens: a sound pattern searches it in microseconds
MATCH_TIMEOUT_S = 1.0
PROBE_TIMEOUT_S = 0.05


def _probes(pattern: str) -> list[str]:
    """Texts on which a catastrophically backtracking pattern runs out of time: runs of one
    character (common ones and the pattern's own letters), with and without a tail that fails
    the match."""
    chars = dict.fromkeys("a0 x\n" + "".join(c for c in pattern if c.isalnum())[:12])
    return [c * 40 + tail for c in chars for tail in ("", "!")]


def backtracks(pattern: str) -> bool:
    """Whether the pattern runs out of time on a probe (catastrophic backtracking)."""
    compiled = regex.compile(pattern)
    for probe in _probes(pattern):
        try:
            compiled.search(probe, timeout=PROBE_TIMEOUT_S)
        except TimeoutError:
            return True
    return False


class BusinessRow(BaseModel):
    """One item of a business regression set."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, max_length=200, description="Stable id (default: line-N).")
    prompt: str = Field(min_length=1, max_length=MAX_FIELD_CHARS, description="The model's input.")
    answer: str = Field(min_length=1, max_length=MAX_FIELD_CHARS, description="Expected answer.")
    match: Literal["exact", "contains", "regex", "choice"] = Field(description="How to judge.")
    choices: list[str] | None = Field(None, min_length=2, max_length=26, description=(
        "match: choice only: the options, one of them the answer."))

    @model_validator(mode="after")
    def _consistent(self) -> "BusinessRow":
        if self.match == "choice":
            if not self.choices:
                raise ValueError("match 'choice' needs 'choices' (2 to 26 options)")
            if len(set(self.choices)) != len(self.choices):
                raise ValueError("choices must be distinct")
            if self.answer not in self.choices:
                raise ValueError("answer must be one of the choices")
        elif self.choices is not None:
            raise ValueError(f"'choices' is only for match 'choice', not '{self.match}'")
        if self.match == "regex":
            if len(self.answer) > MAX_REGEX_CHARS:
                raise ValueError(f"regex longer than {MAX_REGEX_CHARS} characters")
            try:
                regex.compile(self.answer)
            except regex.error as exc:
                raise ValueError(f"answer is not a valid regex: {exc}") from None
            if backtracks(self.answer):
                raise ValueError("answer is a regex that backtracks catastrophically (it ran "
                                 f"out of {PROBE_TIMEOUT_S:g} s on a 41-character probe): "
                                 "remove the nested repetition, e.g. (x+)+")
        return self


def read_rows(path: str | Path) -> list[dict]:
    """The rows as task documents; InputError naming every bad line (up to 20)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError("business set not found", file=str(path), field="business_file",
                         fix="give an existing JSONL file")
    problems: list[Problem] = []
    docs: list[dict] = []
    seen: set[str] = set()
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number > MAX_ROWS:
                problems.append(Problem(f"more than {MAX_ROWS} rows", file=str(path),
                                        field=f"line {number}", fix="split the set"))
                break
            if not raw.strip():
                continue
            doc, why = _parse(raw, number, seen)
            if why:
                problems.append(Problem(why, file=str(path), field=f"line {number}",
                                        fix=FIX))
            else:
                docs.append(doc)
            if len(problems) >= 20:
                break
    if not problems and not docs:
        problems.append(Problem("no rows", file=str(path), field="business_file",
                                fix="write one JSON object per line"))
    if problems:
        raise InputError.from_problems(problems)
    return docs


FIX = ('one JSON object per line: {"prompt": ..., "answer": ..., "match": '
       '"exact|contains|regex|choice", "choices": [...] for choice}')


def _parse(raw: bytes, number: int, seen: set[str]) -> tuple[dict, str | None]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {}, "not UTF-8"
    except json.JSONDecodeError as exc:
        return {}, f"not JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(data, dict):
        return {}, f"a JSON {type(data).__name__}, not an object"
    try:
        row = BusinessRow.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        return {}, f"{where}: {msg}" if where else msg
    row_id = row.id or f"line-{number}"
    if row_id in seen:
        return {}, f"duplicate id '{row_id}'"
    seen.add(row_id)
    doc = {"id": row_id, "line": number, "prompt": row.prompt, "answer": row.answer,
           "match": row.match}
    if row.choices:
        doc |= {"choices": row.choices, "answer_index": row.choices.index(row.answer)}
    return doc, None


def matches(match: str, generated: str, answer: str) -> bool:
    """Whether a generation is right under the row's matcher."""
    if match == "exact":
        return generated.strip() == answer.strip()
    if match == "contains":
        return answer.casefold() in generated.casefold()
    if match == "regex":
        return regex.search(answer, generated, timeout=MATCH_TIMEOUT_S) is not None
    raise ValueError(f"matcher '{match}' is not generative")


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval's per-item hook of the generative business task; a regex that runs out of time
    is the business set's config error, naming its row."""
    try:
        return {"acc": float(matches(doc["match"], results[0], doc["answer"]))}
    except TimeoutError:
        raise ConfigError(f"row {doc.get('id')}: its answer regex ran out of "
                          f"{MATCH_TIMEOUT_S:g} s on a {len(results[0])}-character generation "
                          "(catastrophic backtracking)", field=f"line {doc.get('line')}.answer",
                          fix="remove the nested repetition, e.g. (x+)+") from None


def write_tasks(path: str | Path, folder: Path, max_gen_toks: int) -> dict[str, int]:
    """Task YAML + JSONL for the set in folder: {task name: items}."""
    import yaml

    docs = read_rows(path)
    stem = re.sub(r"[^a-z0-9_]", "_", Path(path).stem.lower()) or "set"
    written: dict[str, int] = {}
    choice = [d for d in docs if d["match"] == "choice"]
    generative = [d for d in docs if d["match"] != "choice"]
    common = {"dataset_path": "json", "test_split": "test",
              "metadata": {"version": 1.0, "category": "business", "source": str(path)}}
    if choice:
        name = f"business_{stem}_choice"
        _jsonl(folder / f"{name}.jsonl", choice)
        spec = {"task": name, **common,
                "dataset_kwargs": {"data_files": {"test": str(folder / f"{name}.jsonl")}},
                "output_type": "multiple_choice", "doc_to_text": "{{prompt}}",
                "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer_index}}",
                "metric_list": [{"metric": "acc", "aggregation": "mean",
                                 "higher_is_better": True}]}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        written[name] = len(choice)
    if generative:
        name = f"business_{stem}_generate"
        _jsonl(folder / f"{name}.jsonl", generative)
        (folder / "day0_business.py").write_text(
            "from day0.stages.evaluation.business import process_results  # noqa: F401\n")
        spec = {"task": name, **common,
                "dataset_kwargs": {"data_files": {"test": str(folder / f"{name}.jsonl")}},
                "output_type": "generate_until", "doc_to_text": "{{prompt}}",
                "doc_to_target": "{{answer}}",
                "generation_kwargs": {"until": ["\n\n"], "max_gen_toks": max_gen_toks,
                                      "do_sample": False, "temperature": 0.0},
                "process_results": "__FUNCTION__",
                "metric_list": [{"metric": "acc", "aggregation": "mean",
                                 "higher_is_better": True}]}
        text = yaml.safe_dump(spec, sort_keys=False).replace(
            "'__FUNCTION__'", "!function day0_business.process_results").replace(
            "__FUNCTION__", "!function day0_business.process_results")
        (folder / f"{name}.yaml").write_text(text)
        written[name] = len(generative)
    return written


def _jsonl(path: Path, docs: list[dict]) -> None:
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
