"""Business regression sets: rows checked by line, turned into lm-eval tasks, matchers."""

from __future__ import annotations

import json

import pytest
import yaml

from day0.errors import InputError
from day0.stages.evaluation import business
from tests.conftest import ROOT

EXAMPLE = ROOT / "day0" / "stages" / "evaluation" / "data" / "business_example.jsonl"


def write(tmp_path, lines):
    path = tmp_path / "set.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


def test_the_bundled_example_is_valid_and_mixes_matchers():
    docs = business.read_rows(EXAMPLE)
    assert len(docs) == 40
    assert {d["match"] for d in docs} == {"choice", "contains", "regex", "exact"}
    choice = [d for d in docs if d["match"] == "choice"]
    assert all(d["choices"][d["answer_index"]] == d["answer"] for d in choice)


def test_every_bad_line_is_named(tmp_path):
    path = write(tmp_path, [
        {"prompt": "p", "answer": "a", "match": "exact"},
        "{not json",
        {"prompt": "p", "answer": "z", "match": "choice", "choices": ["x", "y"]},
        {"prompt": "p", "answer": "(", "match": "regex"},
        {"prompt": "p", "answer": "a", "match": "fuzzy"},
        {"prompt": "p", "answer": "a", "match": "exact", "extra": 1},
        [1, 2],
    ])
    with pytest.raises(InputError) as err:
        business.read_rows(path)
    fields = [p.field for p in err.value.problems]
    assert fields == ["line 2", "line 3", "line 4", "line 5", "line 6", "line 7"]
    text = str(err.value)
    assert "line 2" in text and "not JSON" in text and str(path) in text
    messages = " ".join(p.message for p in err.value.problems)
    assert "answer must be one of the choices" in messages
    assert "not a valid regex" in messages and "extra" in messages


def test_duplicate_ids_and_empty_files(tmp_path):
    path = write(tmp_path, [{"id": "a", "prompt": "p", "answer": "a", "match": "exact"},
                            {"id": "a", "prompt": "q", "answer": "b", "match": "exact"}])
    with pytest.raises(InputError, match="duplicate id 'a'"):
        business.read_rows(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(InputError, match="no rows"):
        business.read_rows(empty)
    with pytest.raises(InputError, match="not found"):
        business.read_rows(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("match,generated,answer,expected", [
    ("exact", "  Paris \n", "Paris", True), ("exact", "Paris, France", "Paris", False),
    ("contains", "It is PARIS.", "paris", True), ("contains", "Lyon", "paris", False),
    ("regex", "code 12345 ok", r"\b\d{5}\b", True), ("regex", "code 1234", r"\b\d{5}\b", False),
])
def test_matchers(match, generated, answer, expected):
    assert business.matches(match, generated, answer) is expected
    assert business.process_results({"match": match, "answer": answer}, [generated]) == \
        {"acc": float(expected)}


def test_tasks_written_for_lm_eval(tmp_path):
    written = business.write_tasks(EXAMPLE, tmp_path, max_gen_toks=16)
    assert written == {"business_business_example_choice": 32,
                       "business_business_example_generate": 8}
    gen = (tmp_path / "business_business_example_generate.yaml").read_text()
    assert "!function day0_business.process_results" in gen
    choice = yaml.safe_load((tmp_path / "business_business_example_choice.yaml").read_text())
    assert choice["output_type"] == "multiple_choice"
    assert choice["metadata"]["category"] == "business"
    rows = (tmp_path / "business_business_example_choice.jsonl").read_text().splitlines()
    assert len(rows) == 32
