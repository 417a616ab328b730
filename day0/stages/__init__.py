"""The stage registry: every stage is a folder, found by name, planned from what it requires.

A stage is a subclass of :class:`day0.execution.contract.Stage` (its face, light) with a lazily imported
core (Config, Result, run); day0.execution.contract says what each member means. Stages are found, in this
order: the folders next to this file (day0's own), the ``day0.stages`` entry-point group
(``name = "pkg.module"`` or ``"pkg.module:Class"``; how a vendor package adds a stage without
touching day0), and :func:`register` at run time. A face is imported only when its stage is
asked for, a core only when it runs: listing stages or checking a gates file imports no torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pkgutil
import sys
from functools import lru_cache
from pathlib import Path

from day0.execution.contract import Option, Stage
from day0.errors import ConfigError, InputError, did_you_mean

ENTRY_POINT_GROUP = "day0.stages"
_registered: dict[str, str] = {}


@lru_cache(maxsize=1)
def builtin() -> dict[str, str]:
    """name -> locator of day0's own stages: each folder here is one (nothing else names it)."""
    return {m.name: f"{__name__}.{m.name}" for m in pkgutil.iter_modules([str(Path(__file__).parent)])
            if m.ispkg}


def _load(name: str, locator: str) -> Stage:
    module_name, _, attr = locator.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise InputError(f"stage '{name}' names module '{module_name}', which is not "
                             "installed", field="stage",
                             fix="install the package that provides it, or fix its entry point "
                                 f"in group '{ENTRY_POINT_GROUP}'") from None
        raise
    if attr:
        found = [getattr(module, attr, None)]
    else:  # the one Stage subclass the module defines
        found = [c for _, c in inspect.getmembers(module, inspect.isclass)
                 if issubclass(c, Stage) and c.__module__ == module.__name__]
    if len(found) != 1 or not (isinstance(found[0], type) and issubclass(found[0], Stage)):
        raise InputError(f"stage '{name}' ({locator}) defines {len(found) if not attr else 'no'} "
                         "day0.execution.contract.Stage subclass" + ("es" if len(found) > 1 else ""),
                         field="stage", fix="define one class Stage subclass in the stage's "
                                            "__init__.py, or name it as 'pkg.module:Class'")
    try:
        return found[0](name, locator)
    except TypeError as exc:  # an abstract member left out: core()
        raise InputError(f"stage '{name}' ({locator}): {exc}", field="stage",
                         fix="a stage defines core() returning its core module "
                             "(see day0.execution.contract)") from None


def register(name: str, locator: str) -> None:
    """Add (or replace) a stage at run time, checked now; child processes get the locator with
    the spec."""
    if not name.isidentifier():
        raise ConfigError(f"stage name '{name}' is not an identifier", field="stage",
                          fix="use letters, digits and underscores")
    _load(name, locator)
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
    return {**builtin(), **_entry_points(), **_registered}


def names() -> list[str]:
    return list(locators())


def get(name: str, locator: str | None = None) -> Stage:
    """The stage called name (a given locator wins: what the parent resolved for a child)."""
    found = locator or locators().get(name)
    if found is None:
        known = names()
        raise InputError(f"unknown stage '{name}'", field="stage",
                         fix=did_you_mean(name, known).strip() or f"use one of {', '.join(known)}")
    return _load(name, found)


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


def options() -> list[tuple[str, Option]]:
    """(stage name, option) of every option the registered stages add to `day0 validate`."""
    return [(name, option) for name in names() for option in get(name).options]


def check_options(values: dict | None) -> dict:
    """Option values checked and normalised (a file made absolute), unset ones (None, False)
    left out. An unknown option or a bad value is a ConfigError (exit 2)."""
    declared = {option.name: option for _, option in options()}
    out = {}
    for key, value in (values or {}).items():
        if key not in declared:
            raise ConfigError(f"unknown option '{key}'", field="options", fix=did_you_mean(
                key, list(declared)).strip() or f"use one of {', '.join(declared) or 'none'}")
        if value is not None and value is not False:
            out[key] = _checked(declared[key], value)
    return out


def apply_options(configs: dict[str, dict], values: dict | None) -> dict[str, dict]:
    """Stage settings with the stages' options set (values: option name -> value, checked)."""
    values = check_options(values)
    out = {name: dict(settings) for name, settings in configs.items()}
    for name, option in options():
        if option.name in values:
            out.setdefault(name, {})[option.setting] = values[option.name]
    return out


def _checked(option: Option, value):
    if option.kind == "switch":
        if value is not True:
            raise ConfigError(f"option '{option.name}' is a switch", field=option.flag,
                              fix="set it to true, or leave it out")
        return True
    value = str(value)
    if option.kind == "file":
        if not Path(value).is_file():
            raise ConfigError(f"no such file: {value}", field=option.flag,
                              fix=f"check the {option.flag} path")
        value = str(Path(value).resolve())
    if option.check is not None:
        try:
            option.check(value)
        except ValueError as exc:
            raise ConfigError(f"bad {option.flag} {value!r}: {exc}", field=option.flag,
                              fix=option.help) from None
    return value


def by_hand_only(configs: dict[str, dict] | None, values: dict | None) -> list[str]:
    """The by-hand-only options (day0.execution.contract.Option) that these settings or values set."""
    return [option.flag for name, option in options() if option.by_hand_only and (
        (values or {}).get(option.name) not in (None, False)
        or ((configs or {}).get(name) or {}).get(option.setting) not in (None, False))]


__all__ = ["Stage", "Option", "ENTRY_POINT_GROUP", "builtin", "register", "unregister",
           "locators", "names", "get", "not_on", "plan", "options", "check_options", "apply_options",
           "by_hand_only"]
