"""The stage registry: every stage is a package, found by name, planned from what it requires.

A stage is a module (usually a package ``day0/stages/<name>/``) exposing:

==================  ==========================================================================
``Config``          pydantic, ``extra="forbid"``: the stage's own settings (stage_configs[name])
``Result``          pydantic, a :class:`day0.contract.StageResult`: its evidence, as JSON
``run``             ``run(config, inputs) -> Result``: the pure core, no Prefect inside
``REQUIRES``        stages whose results it reads (``inputs.upstream[name]``; part of its cache
                    key); default ``()``
``AFTER``           stages it only runs after (they must succeed and find the checkpoint sound;
                    not read, not in its cache key); default ``()``
``TARGET_KINDS``    target kinds it supports (``Target.kind``); default ``("torch",)``
``USES_ENDPOINT``   True when it talks to the engine of an engine target
                    (``inputs.endpoint``: attached or launched by the flow around the run's
                    waves); such a stage is never cached (a served engine has no digest);
                    default False
``METRICS``         YAML declaring the metrics ``Result.metrics()`` may produce; default
                    ``metrics.yaml`` in the stage's folder
``BUDGET``          YAML of its resource budget factors (day0.budget.StageFactors; the formula
                    in ``day0/data/budgets.yaml``); default ``budget.yaml`` in its folder
``facts``           optional ``facts(result: dict) -> dict``: model facts (architecture, params,
                    moe, dimensions) for the report, the gates' ``applies_to`` and budgets
``evidence``        optional ``evidence(result: dict) -> dict``: what report.json keeps under
                    ``evidence[name]``; default the whole result
``markdown``        optional ``markdown(result: dict, gates: list) -> str``: its report.md
                    section; default a table of its metrics
``tables``          optional ``tables(result: dict) -> dict[key, (description, rows)]``: extra
                    tables shown as Prefect artifacts (the key gets ``-<model>-<target>``)
``plots``           optional ``plots(result: dict) -> dict[name, bytes]``: PNG figures, kept as
                    ``plots/<stage>-<name>.png`` next to report.json (``--out`` and the
                    published run) and shown inline in the Prefect UI; draw with
                    :mod:`day0.plots` (matplotlib, Agg, imported only when drawing); a plot
                    that raises is logged and left out
``files``           optional ``files(result: dict) -> dict[path, bytes]``: files kept next to
                    report.json (``--out`` and the published run), e.g. per-item outputs
                    as JSONL; given the whole result (not the evidence)
``EXCLUSIVE``       True when it measures time: it runs in a wave of its own after every
                    other stage (nothing else loads the machine or the engine meanwhile),
                    and is never cached (it measures the machine as it is now); default False
``check_gates``     optional ``check_gates(config: dict, gates: list[Gate]) -> list[Problem]``:
                    before any stage runs, what is wrong with the gates on its metrics given
                    its config (a paired gate its items cannot power): exit 2
``findings``        optional ``findings(result: dict) -> list[str]``: one-line findings (e.g.
                    the first divergent layer) for the report's headline and the CLI
==================  ==========================================================================

The report hooks get the stage's evidence as report.json keeps it (NaN/inf may be strings).

Stages are found, in this order: the built-ins below, the ``day0.stages`` entry-point group
(``name = "pkg.module"`` or ``"pkg.module:attr"``; how a vendor package adds a stage without
touching day0), and :func:`register` at run time. A locator is imported lazily, only when the
stage is used, so listing stages or checking a gates file never imports torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from types import ModuleType
from typing import Callable

from day0.errors import ConfigError, InputError, did_you_mean

ENTRY_POINT_GROUP = "day0.stages"
BUILTIN = {"analysis": "day0.stages.analysis", "scan": "day0.stages.scan",
           "alignment": "day0.stages.alignment", "smoke": "day0.stages.smoke",
           "api_alignment": "day0.stages.api_alignment", "serving": "day0.stages.serving",
           "evaluation": "day0.stages.evaluation", "performance": "day0.stages.performance",
           "soak": "day0.stages.soak"}
_registered: dict[str, str] = {}


@dataclass(frozen=True)
class Stage:
    """One registered stage: its name, where it lives, and its declared hooks."""

    name: str
    locator: str  # "pkg.module" or "pkg.module:attr"

    @cached_property
    def module(self) -> ModuleType:
        module_name, _, attr = self.locator.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise InputError(f"stage '{self.name}' names module '{module_name}', which is "
                                 "not installed", field="stage",
                                 fix="install the package that provides it, or fix its entry "
                                     f"point in group '{ENTRY_POINT_GROUP}'") from None
            raise
        target = getattr(module, attr) if attr else module
        # a lazy package (contract.lazy_core) declares its core's names: checking them by
        # hasattr would import the core (torch) into the flow's process for nothing
        lazy = getattr(getattr(target, "__getattr__", None), "provides", ())
        missing = [a for a in ("Config", "Result", "run")
                   if a not in lazy and not hasattr(target, a)]
        if missing:
            raise InputError(f"stage '{self.name}' ({self.locator}) lacks {', '.join(missing)}",
                             field="stage", fix="a stage exposes Config, Result and "
                                                "run(config, inputs) (see day0.stages)")
        return target

    def hook(self, name: str, default=None):
        return getattr(self.module, name, default)

    @property
    def requires(self) -> tuple[str, ...]:
        return tuple(self.hook("REQUIRES", ()))

    @property
    def after(self) -> tuple[str, ...]:
        return tuple(self.hook("AFTER", ()))

    @property
    def target_kinds(self) -> tuple[str, ...]:
        return tuple(self.hook("TARGET_KINDS", ("torch",)))

    @property
    def uses_endpoint(self) -> bool:
        return bool(self.hook("USES_ENDPOINT", False))

    @property
    def exclusive(self) -> bool:
        return bool(self.hook("EXCLUSIVE", False))

    @property
    def builtin(self) -> bool:
        return BUILTIN.get(self.name) == self.locator

    @property
    def folder(self) -> Path:
        """Where the stage's own files are: its package's folder (a module's: the folder it
        is in)."""
        if self.builtin:
            return Path(__file__).parent / self.name  # known without importing the stage
        return Path(self.module.__file__).parent

    @property
    def metrics_file(self) -> Path:
        return Path(self._declared("METRICS") or self.folder / "metrics.yaml")

    @property
    def budget_file(self) -> Path:
        return Path(self._declared("BUDGET") or self.folder / "budget.yaml")

    def _declared(self, name: str):
        if self.builtin:
            return None  # the built-ins keep theirs in their folder under the default names
        return self.hook(name)

    @property
    def summary(self) -> str:
        """What it proves: its docstring's first sentence (a stage's docstring says it)."""
        paragraph = " ".join((self.module.__doc__ or "").strip().split("\n\n")[0].split())
        for end in (". ", "? "):
            if end in paragraph:
                paragraph = paragraph[:paragraph.index(end) + 1]
        return paragraph

    def describe(self) -> dict:
        """What `day0 stages` lists: what it proves, needs and runs on, and how it runs."""
        return {"name": self.name, "proves": self.summary, "runs_on": list(self.target_kinds),
                "requires": list(self.requires), "after": list(self.after),
                "uses_endpoint": self.uses_endpoint, "exclusive": self.exclusive,
                "locator": self.locator}

    def facts(self, result: dict) -> dict:
        fn: Callable | None = self.hook("facts")
        return dict(fn(result)) if fn else {}

    def evidence(self, result: dict) -> dict:
        fn: Callable | None = self.hook("evidence")
        return dict(fn(result)) if fn else dict(result)


def register(name: str, locator: str) -> None:
    """Add (or replace) a stage at run time; child processes get the locator with the spec."""
    if not name.isidentifier():
        raise ConfigError(f"stage name '{name}' is not an identifier", field="stage",
                          fix="use letters, digits and underscores")
    _registered[name] = locator


def unregister(name: str) -> None:
    _registered.pop(name, None)


def _entry_points() -> dict[str, str]:
    return dict(_entry_points_on(tuple(sys.path)))


@lru_cache(maxsize=8)
def _entry_points_on(path: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Scanning every installed distribution costs ~10 ms and a flow asks ~60 times; a new
    sys.path entry (a plug-in's site folder) is a new scan."""
    return tuple((ep.name, ep.value)
                 for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def locators() -> dict[str, str]:
    """name -> locator of every stage: built-ins, then entry points, then register()."""
    return {**BUILTIN, **_entry_points(), **_registered}


def names() -> list[str]:
    return list(locators())


def get(name: str, locator: str | None = None) -> Stage:
    """The stage called name (a given locator wins: what the parent resolved for a child)."""
    found = locator or locators().get(name)
    if found is None:
        known = names()
        raise InputError(f"unknown stage '{name}'", field="stage",
                         fix=did_you_mean(name, known).strip() or f"use one of {', '.join(known)}")
    return Stage(name, found)


def not_on(target_kind: str) -> list[str]:
    """The registered stages that never run on this kind of target (their gates do not apply)."""
    return [name for name in names() if target_kind not in get(name).target_kinds]


def plan(selected: list[str] | None, target_kind: str) -> list[list[str]]:
    """Waves of stage names: each wave runs after the previous one, its stages in parallel.

    selected: the stages asked for (None: every stage supporting the target kind), plus what
    they require or run after. A stage that does not support the target kind, an unknown
    stage or a cycle is a ConfigError naming it."""
    stages = {n: get(n) for n in names()}
    wanted = [n for n, s in stages.items() if target_kind in s.target_kinds] if selected is None \
        else list(selected)
    order: list[str] = []
    problems: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            problems.append("stages depend on each other in a cycle: " + " -> ".join(path + (name,)))
            return
        stage = stages.get(name) or get(name)
        if target_kind not in stage.target_kinds:
            problems.append(f"stage '{name}' does not support '{target_kind}' targets "
                            f"(it supports {', '.join(stage.target_kinds)})")
            return
        for dep in (*stage.requires, *stage.after):
            visit(dep, path + (name,))
        order.append(name)

    for name in wanted:
        visit(name, ())
    if problems:
        raise ConfigError(problems[0], field="stages", fix="choose stages whose needs can be met")
    waves: list[list[str]] = []
    level: dict[str, int] = {}
    for name in order:  # dependencies come first in order
        stage = stages.get(name) or get(name)
        level[name] = 1 + max((level[d] for d in (*stage.requires, *stage.after)), default=-1)
        while len(waves) <= level[name]:
            waves.append([])
        waves[level[name]].append(name)
    # a stage that measures time runs alone, after the rest (nothing else loads the machine)
    alone = [n for n in order if (stages.get(n) or get(n)).exclusive]
    waves = [[n for n in wave if n not in alone] for wave in waves]
    return [wave for wave in waves if wave] + [[n] for n in alone]


__all__ = ["Stage", "ENTRY_POINT_GROUP", "BUILTIN", "register", "unregister", "locators",
           "names", "get", "not_on", "plan"]
