"""The layer contracts (pyproject.toml [tool.importlinter], run first by `make test`) hold on this
tree, and each one fails on a copy of the tree with a forbidden import added: the check can fail.

grimp reads the source (imports inside functions count); the copies hold only the packages'
Python files, the config and the custom cycle contract, so each lint takes well under a second.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"
CONTRACTS = {  # id -> name, as pyproject.toml has them
    "engine-orchestration": "the engine (day0) reaches prefect, flows and tasks only through "
                            "day0.orchestration",
    "cli-dispatch": "the CLI only parses and dispatches",
    "stages-independent": "stages never import each other",
    "receiver-no-torch": "the receiver never imports torch or transformers",
    "analysis-no-torch": "header-only work never imports torch or transformers",
    "no-cycles": "no import cycles between modules of day0, flows and tasks",
    "core-layers": "the core groups are layers",
}
HEAVY = ("torch", "transformers", "lm_eval", "accelerate", "safetensors")


def lint(cwd: Path) -> tuple[int, str, dict[str, str]]:
    """(exit status, output, contract name -> KEPT/BROKEN) of lint-imports run in cwd."""
    proc = subprocess.run([str(LINT), "--no-cache", "--no-logo"], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    out = proc.stdout + proc.stderr
    states = dict((name, state) for name, state in re.findall(r"^(.+?) (KEPT|BROKEN)\b", out, re.M))
    return proc.returncode, out, states


def state_of(states: dict[str, str], contract: str) -> str | None:
    return next((s for name, s in states.items() if name.startswith(CONTRACTS[contract])), None)


def test_contracts_hold_on_this_tree():
    code, out, states = lint(ROOT)
    assert code == 0, out
    for contract in CONTRACTS:
        assert state_of(states, contract) == "KEPT", out


def test_the_stage_independence_contract_names_every_registered_stage():
    """The contract drifted before (performance and soak were missing): it names every package
    under day0.stages, which are exactly the registry's built-in stages (a new stage folder is
    covered without an edit here)."""
    import tomllib

    import grimp
    from importlinter.domain.helpers import module_expressions_to_modules
    from importlinter.domain.imports import ModuleExpression

    from day0.stages import builtin

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    independent = next(c for c in contracts if c["id"] == "stages-independent")
    graph = grimp.build_graph("day0", cache_dir=None)
    covered = module_expressions_to_modules(graph, [ModuleExpression(e)
                                                    for e in independent["modules"]])
    assert sorted(m.name for m in covered) == sorted(builtin().values())


def test_make_test_lints_before_pytest():
    makefile = (ROOT / "Makefile").read_text()
    test_rule = re.search(r"^test: (.*)$", makefile, re.M).group(1).split()
    assert test_rule[0] == "lint", "lint must be test's first prerequisite (fail fast)"
    assert re.search(r"^lint:.*\n\t\$\(VENV\)/bin/lint-imports", makefile, re.M)


def _copy_tree(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "data", "*.yaml", "*.txt")
    for package in ("day0", "flows", "tasks"):
        shutil.copytree(ROOT / package, dest / package, ignore=ignore)
    (dest / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "importlint_acyclic.py", dest / "scripts")
    shutil.copy(ROOT / "pyproject.toml", dest)
    return dest


def _add_import(module: Path, line: str) -> None:
    """Add `line` at the end of the module (a function-level import counts as much)."""
    module.write_text(module.read_text() + f"\n\ndef _violation():\n    {line}\n")


VIOLATIONS = [
    # (contract, module to edit, import added, what the report must name)
    ("engine-orchestration", "day0/verdict/gates.py", "import prefect", "day0.verdict.gates -> prefect"),
    ("engine-orchestration", "day0/cli.py", "from flows.validate import validate",
     "day0.cli -> flows.validate"),
    ("cli-dispatch", "day0/cli.py", "from day0.yamlio import read_mapping",
     "day0.cli -> day0.yamlio"),
    # (scan's, not analysis's: analysis importing any torch stage breaks analysis-no-torch too)
    ("stages-independent", "day0/stages/scan/__init__.py", "from day0.stages import smoke",
     "day0.stages.scan -> day0.stages.smoke"),
    ("receiver-no-torch", "day0/receiver/journal.py", "import torch",
     "day0.receiver.journal -> torch"),
    # transitively: day0.checkpoint.match renames tensors with transformers' own conversions
    ("receiver-no-torch", "day0/receiver/events.py", "from day0.checkpoint import match",
     "day0.receiver.events -> day0.checkpoint.match"),
    ("analysis-no-torch", "day0/stages/analysis/model.py", "import torch",
     "day0.stages.analysis.model -> torch"),
    # transitively: day0.checkpoint.sanity reads tensor data with torch
    ("analysis-no-torch", "day0/checkpoint/configview.py", "from day0.checkpoint import sanity",
     "day0.checkpoint.configview -> day0.checkpoint.sanity"),
    ("no-cycles", "day0/verdict/gates.py", "from day0.verdict import report", "day0.verdict.gates -> day0.verdict.report"),
    # the core groups are layers: an upward import breaks it, in a function too
    ("core-layers", "day0/execution/budget.py", "from day0.verdict import gates",
     "day0.execution.budget -> day0.verdict.gates"),
    ("core-layers", "day0/store/identity.py", "from day0.checkpoint import headers",
     "day0.store.identity -> day0.checkpoint.headers"),
    ("core-layers", "day0/verdict/gates.py", "from day0.rendering import tables",
     "day0.verdict.gates -> day0.rendering.tables"),
    ("core-layers", "day0/errors.py", "from day0.store import paths",
     "day0.errors -> day0.store.paths"),
]


@pytest.mark.parametrize("contract,module,line,named", VIOLATIONS,
                         ids=[f"{v[0]}:{v[1]}" for v in VIOLATIONS])
def test_a_forbidden_import_breaks_its_contract(tmp_path, contract, module, line, named):
    tree = _copy_tree(tmp_path)
    code, out, states = lint(tree)
    assert code == 0, "the copy of the tree must lint clean before the violation:\n" + out
    _add_import(tree / module, line)
    code, out, states = lint(tree)
    assert code != 0, out
    assert state_of(states, contract) == "BROKEN", out
    broken = [name for name, s in states.items() if s == "BROKEN"]
    assert len(broken) == 1, f"only {contract} should break:\n{out}"
    assert named in out, out


def test_analyze_loads_no_torch_at_run_time():
    """`day0 analyze` of a checkpoint, the CLI's own path included: what is in sys.modules when
    the process exits (a third-party import of torch would show here, not in grimp's graph)."""
    code = ("import atexit, runpy, sys\n"
            f"heavy = {HEAVY!r}\n"
            "atexit.register(lambda: sys.stderr.write('LOADED %s\\n' % sorted(\n"
            "    {m.split('.')[0] for m in sys.modules} & set(heavy))))\n"
            "sys.argv = ['day0', 'analyze', sys.argv[1], '--json']\n"
            "runpy.run_module('day0.cli', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests/fixtures/models/tiny-llama")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["params"]["total"] == 857_216
    assert "LOADED []" in proc.stderr, proc.stderr[-2000:]


def test_receiver_loads_no_torch_at_run_time():
    """What grimp cannot see (a third-party package importing torch) shows at import time."""
    modules = sorted(f"day0.receiver.{p.stem}" for p in (ROOT / "day0" / "receiver").glob("*.py")
                     if p.stem != "__init__")
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'})\n"
            "print(loaded); sys.exit(1 if loaded else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
