"""Size limits of the code (issue 25): no Python file over 500 lines, and no function of a stage
over 80 lines (a stage's `run` is a list of named steps). Each check names every offender with
path:line and its length, and each is shown to fail on a violating copy in tmp_path."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("day0", "flows", "tasks", "tests", "scripts", "bench", "deploy")
MAX_FILE_LINES = 500
STAGES = "day0/stages"
MAX_FUNCTION_LINES = 80


def _python_files(root: Path, folder: str) -> list[Path]:
    return sorted(p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


def long_files(root: Path, folders=FOLDERS, limit: int = MAX_FILE_LINES) -> list[str]:
    """'path:1 has N lines' for every .py file under root/folder over limit lines."""
    found = []
    for folder in folders:
        for path in _python_files(root, folder):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit:
                found.append(f"{path.relative_to(root)}:1 has {lines} lines (limit {limit})")
    return found


def long_functions(root: Path, folder: str = STAGES,
                   limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'path:line name() has N lines' for every function under root/folder over limit lines
    (end_lineno - lineno + 1: from its `def` to its last line)."""
    found = []
    for path in _python_files(root, folder):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}() has "
                                 f"{lines} lines (limit {limit})")
    return found


def test_no_python_file_is_over_500_lines():
    assert _python_files(ROOT, "day0/stages"), "the checks read nothing: ROOT is wrong"
    found = long_files(ROOT)
    assert found == [], "split these files by concern:\n" + "\n".join(found)


def test_no_function_of_a_stage_is_over_80_lines():
    found = long_functions(ROOT)
    assert found == [], "split these functions into named steps:\n" + "\n".join(found)


def _function(name: str, lines: int) -> str:
    """A function of exactly `lines` lines (its def included)."""
    return f"def {name}():\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 2)) \
        + "    return None\n"


def test_the_file_check_fails_on_a_501_line_file(tmp_path):
    (tmp_path / "day0").mkdir()
    (tmp_path / "day0" / "ok.py").write_text("x = 1\n" * 500)
    (tmp_path / "day0" / "big.py").write_text("x = 1\n" * 501)
    (tmp_path / "tests" / "deep").mkdir(parents=True)
    (tmp_path / "tests" / "deep" / "also_big.py").write_text("x = 1\n" * 600)
    assert long_files(tmp_path, folders=("day0", "tests")) == [
        "day0/big.py:1 has 501 lines (limit 500)",
        "tests/deep/also_big.py:1 has 600 lines (limit 500)"]


def test_the_function_check_fails_on_an_81_line_function(tmp_path):
    stage = tmp_path / "day0" / "stages" / "demo"
    stage.mkdir(parents=True)
    method = textwrap.indent(_function("step", 90), "    ")
    (stage / "core.py").write_text(
        '"""A stage."""\n\n\n' + _function("run", 81) + "\n\n" + _function("short", 80)
        + "\n\nclass Side:\n" + method)
    assert long_functions(tmp_path) == [
        "day0/stages/demo/core.py:4 run() has 81 lines (limit 80)",
        "day0/stages/demo/core.py:170 step() has 90 lines (limit 80)"]
