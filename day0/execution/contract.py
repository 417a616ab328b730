"""The stage contract: a stage is one folder, a light face and a pure core, in one definition.

The face, the folder's ``__init__.py``, is a subclass of :class:`Stage` (it imports no torch):
what the stage requires and runs on, the options it adds, its report hooks. Its core,
``core.py`` next to it, is imported only when the stage runs and provides:

* ``Config``  - pydantic, ``extra="forbid"``: the stage's own settings;
* ``Result``  - pydantic, subclass of :class:`StageResult`: JSON-serialisable evidence;
* ``run(config: Config, inputs: StageInputs) -> Result``: pure core, no Prefect inside.

``Result.metrics()`` returns the flat ``{metric_name: value}`` that gates read; the names it may
produce are declared in the stage folder's ``metrics.yaml`` (a test checks they agree), its
resource budget factors in ``budget.yaml`` (day0.execution.budget). The runner (day0.execution.stage) executes a
stage in a subprocess: spec JSON in, result JSON out. day0.stages registers and plans them.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from day0.engines.settings import Endpoint
from day0.errors import InputError
from day0.execution.memory import peak_rss_bytes, reset_peak_rss
from day0.execution.targets import REFERENCE, Target


class StageInputs(BaseModel):
    """What every stage receives besides its own Config."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="Checkpoint folder or config.json path.")
    target: Target = Field(description="The target profile under test.")
    reference: Target = Field(REFERENCE, description="The reference, normally cpu/float32.")
    upstream: dict[str, dict] = Field(default_factory=dict, description=(
        "Results of earlier stages of the same run, by stage name, as JSON."))
    trust_remote_code: bool = Field(False, description="Allow the model's own code (auto_map).")
    revision: str | None = Field(None, description=(
        "The release's revision when one is named (keys stored reference scores of this "
        "model/revision); None for an anonymous run."))
    bring_up: bool = Field(False, description=(
        "The weights are untrained placeholders (day0.request.ValidateRequest.bring_up): a "
        "finding that only means 'untrained' is a note, not a checkpoint problem."))
    endpoint: Endpoint | None = Field(None, description=(
        "Engine targets: where the engine under test answers (attached, or launched by the "
        "flow for the run's engine stages); None for torch targets."))


class Row(BaseModel):
    """A row of a result table; NaN/inf are findings, so JSON keeps them ("NaN", "Infinity")
    instead of null."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class StageResult(BaseModel):
    """Base of every stage Result."""

    model_config = ConfigDict(extra="forbid")

    checkpoint_problems: list[str] = Field(default_factory=list, description=(
        "Findings that the checkpoint itself is broken (not the target): the verdict is then "
        "BROKEN whatever the gates say."))

    def metrics(self) -> dict[str, float | None]:
        """Flat metric name -> value; None when the stage could not compute it."""
        raise NotImplementedError


class Laps:
    """A stage's phase timings for its Result: ``lap(name)`` records the seconds since the
    previous lap (or since construction), and the phase's peak resident memory in MiB (Linux;
    elsewhere the peak since the process started)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.peak_rss_mib: dict[str, float] = {}
        self._clock = time.monotonic()
        reset_peak_rss()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - self._clock, 3)
        self.peak_rss_mib[name] = round(peak_rss_bytes() / 2**20, 1)
        reset_peak_rss()
        self._clock = now


TARGET_KINDS = get_args(Target.model_fields["kind"].annotation)  # "torch", "engine"


@dataclass(frozen=True)
class Option:
    """A `day0 validate` option a stage adds: ``--<name with dashes>`` on the command line, the
    key ``name`` of the request's ``options`` (a deployment run's parameter). It sets one field
    of the stage's Config."""

    name: str  # an identifier: "duration" is --duration, "promote_baseline" --promote-baseline
    setting: str  # the Config field it sets
    help: str
    kind: Literal["value", "file", "switch"] = "value"  # file: must exist, passed absolute
    metavar: str | None = None
    # only a person asks for it (the CLI, a deployment run): an automatic run that sets it
    # (the release receiver's flow parameters) is refused
    by_hand_only: bool = False
    check: Callable[[str], object] | None = None  # raises ValueError on a bad value: exit 2

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def import_core(face: str) -> ModuleType:
    """``<face>.core``, imported now: a face's :meth:`Stage.core` (by name, so importing a face
    never imports its core)."""
    return importlib.import_module(f"{face}.core")


class Work(BaseModel):
    """What a stage's configuration asks of it beyond the allowance of its budget.yaml (which
    sizes its default work by the model): added to its time budget (day0.execution.budget)."""

    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(0.0, ge=0, description="Wall time it is configured to run for.")
    items: int = Field(0, ge=0, description="Items it scores (e.g. benchmark questions).")
    generated_tokens: int = Field(0, ge=0, description="Tokens it generates, over all items.")


class Stage(ABC):
    """A registered stage (day0.stages): subclass it in the stage folder's ``__init__.py``.

    Declare with class attributes what it needs; override the hooks it has. The registry
    instantiates it with its name and where it was found; a subclass is checked when it is
    defined, its core when first loaded."""

    requires: ClassVar[tuple[str, ...]] = ()  # stages whose results it reads (in its cache key)
    after: ClassVar[tuple[str, ...]] = ()  # stages it only runs after (not read, not keyed)
    target_kinds: ClassVar[tuple[str, ...]] = ("torch",)
    # talks to an engine target's endpoint (inputs.endpoint); never cached
    uses_endpoint: ClassVar[bool] = False
    # measures time: runs alone after every other stage; never cached
    exclusive: ClassVar[bool] = False
    options: ClassVar[tuple[Option, ...]] = ()
    # the module of its folder that holds Config, when not its core: settings are checked when
    # a run is requested, before anything starts, without importing the core's dependencies
    config_module: ClassVar[str | None] = None
    metrics_name: ClassVar[str] = "metrics.yaml"  # in its folder: the metrics Result produces
    budget_name: ClassVar[str] = "budget.yaml"  # in its folder: day0.execution.budget.StageFactors

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        problems = [f"{attr} must be a tuple of stage names" for attr in ("requires", "after")
                    if not _names(getattr(cls, attr))]
        if not cls.target_kinds or not set(cls.target_kinds) <= set(TARGET_KINDS):
            problems.append(f"target_kinds must name some of {', '.join(TARGET_KINDS)}")
        if not all(isinstance(o, Option) and o.name.isidentifier() for o in cls.options):
            problems.append("options must be day0.execution.contract.Option with identifier names")
        if not _doc(cls):
            problems.append("its docstring must say what it proves (`day0 stages` lists it)")
        if problems:
            raise TypeError(f"stage {cls.__module__}.{cls.__qualname__}: " + "; ".join(problems))

    def __init__(self, name: str, locator: str) -> None:
        self.name = name
        self.locator = locator  # "pkg.module" or "pkg.module:Class", as it was registered

    @abstractmethod
    def core(self) -> ModuleType:
        """The stage's pure core, imported now: a module with Config, Result and run."""

    def load(self) -> ModuleType:
        """core(), checked once: Config (extra="forbid"), Result (a StageResult) and run."""
        if getattr(self, "_core", None) is None:
            core = self.core()
            config, result = getattr(core, "Config", None), getattr(core, "Result", None)
            missing = [what for what, ok in (
                ("Config (pydantic, extra='forbid')", isinstance(config, type)
                 and issubclass(config, BaseModel) and config.model_config.get("extra") == "forbid"),
                ("Result (a day0.execution.contract.StageResult)", isinstance(result, type)
                 and issubclass(result, StageResult)),
                ("run(config, inputs)", callable(getattr(core, "run", None))),
                (f"the Config of config_module '{self.config_module}'",
                 self.config_module is None or config is self.config_model())) if not ok]
            if missing:
                raise InputError(f"stage '{self.name}' core {core.__name__} lacks "
                                 f"{', '.join(missing)}", field="stage",
                                 fix="see day0.execution.contract for what a stage's core provides")
            self._core = core
        return self._core

    def config_model(self) -> type[BaseModel]:
        """The stage's Config class: from config_module when declared (light), else its core."""
        if self.config_module is None:
            return self.load().Config
        face = inspect.getmodule(type(self))
        package = face.__name__ if hasattr(face, "__path__") else face.__name__.rpartition(".")[0]
        return importlib.import_module(f"{package}.{self.config_module}").Config

    @property
    def folder(self) -> Path:
        """Its folder: where its face is (a module's: the folder the module is in)."""
        return Path(inspect.getfile(type(self))).parent

    @property
    def metrics_file(self) -> Path:
        return self.folder / self.metrics_name

    @property
    def budget_file(self) -> Path:
        return self.folder / self.budget_name

    @property
    def builtin(self) -> bool:
        return self.locator == f"day0.stages.{self.name}"

    @property
    def summary(self) -> str:
        """What it proves: its docstring's first sentence."""
        paragraph = " ".join(_doc(type(self)).split("\n\n")[0].split())
        for end in (". ", "? "):
            if end in paragraph:
                paragraph = paragraph[:paragraph.index(end) + 1]
        return paragraph

    def describe(self) -> dict:
        """What `day0 stages` lists: what it proves, needs and runs on, how it runs, the
        options it adds."""
        return {"name": self.name, "proves": self.summary, "runs_on": list(self.target_kinds),
                "requires": list(self.requires), "after": list(self.after),
                "uses_endpoint": self.uses_endpoint, "exclusive": self.exclusive,
                "options": [o.flag for o in self.options], "locator": self.locator}

    # hooks: the report gets the stage's evidence as report.json keeps it (NaN/inf may be
    # strings); each returns its empty default unless the stage overrides it

    def facts(self, result: dict) -> dict:
        """Model facts (architecture, params, moe, dimensions) for the report, the gates'
        applies_to and the budgets."""
        return {}

    def evidence(self, result: dict) -> dict:
        """What report.json keeps under evidence[name]."""
        return dict(result)

    def findings(self, evidence: dict) -> list[str]:
        """One-line findings (e.g. the first divergent layer) for the headline and the CLI."""
        return []

    def markdown(self, evidence: dict, gates: list) -> str | None:
        """Its report.md section; None: a table of its metrics."""
        return None

    def tables(self, result: dict) -> dict:
        """Extra Prefect table artifacts: {key: (description, rows)}."""
        return {}

    def plots(self, result: dict) -> dict[str, bytes]:
        """PNG figures by name (day0.rendering.plots), kept as plots/<stage>-<name>.png and shown in the
        Prefect UI; a plot that raises is logged and left out."""
        return {}

    def files(self, result: dict) -> dict[str, bytes]:
        """Files kept next to report.json (e.g. per-item outputs as JSONL), from the whole
        result."""
        return {}

    def warm(self) -> None:
        """Work every run of this stage repeats in its process (lm-eval's templates, a lazily
        imported module): the warm stage host calls it once, after loading the core, before it
        forks the stages."""

    def work(self, config: dict) -> Work:
        """What its config asks beyond its default work (a soak's duration, an evaluation's
        benchmark items), for its time budget; called before it runs, without its core. A config
        it cannot read is no extra work (the config check reports it)."""
        return Work()

    def check_gates(self, config: dict, gates: list) -> list:
        """Before any stage runs: what is wrong with the gates on its metrics given its config
        (day0.errors.Problem; e.g. a paired gate its items cannot power): exit 2."""
        return []


def _doc(cls: type) -> str:
    """What a stage proves: its class's own docstring, else its module's (the face's)."""
    module = sys.modules.get(cls.__module__)
    return inspect.cleandoc(cls.__dict__.get("__doc__") or getattr(module, "__doc__", None) or "")


def _names(value) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) and v.isidentifier() for v in value)
