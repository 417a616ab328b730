"""The configuration reference page: every field of every file or request a user writes.

Each section starts from a pydantic model found by class name wherever it is defined (see
source.find), or, for the stage settings, from every stage the registry knows; the models a
field refers to (a target's container, a gate's paired test, ...) follow with sections of
their own. Field name, type, default and description all come from the models.
"""

from __future__ import annotations

import importlib
import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from day0docs.source import cell, code, find, log, rst, table

# (anchor, title, the model's class name, where a user writes it): the only list here; fields,
# types, defaults and nested models are read from the classes
ROOTS = (
    ("validate-request", "Validate request", "ValidateRequest",
     "The `validate` flow's parameters: `prefect deployment run 'validate/day0' -p NAME=VALUE`, "
     "the receiver's `flow_parameters`, and what `day0 validate` builds from its options."),
    ("targets-file", "Targets file", "TargetsFile",
     "`./targets.yaml`, `deploy/targets.yaml`; `--target-file` holds one target profile."),
    ("gates-file", "Gates file", "GatesFile", "`gates.yaml`, or `--gates FILE`."),
    ("receiver-settings", "Receiver settings", "ReceiverSettings",
     "`day0 hooks serve --config FILE` (example: `deploy/receiver.yaml`)."),
    ("release-webhook-body", "Release webhook body", "GenericRelease",
     "The JSON body of a signed `POST /v1/webhooks/release`."),
    ("budget-factors", "Budget factors", "BudgetFactors",
     "`day0/data/budgets.yaml`, or the file `DAY0_BUDGETS` names; each stage's own `budget.yaml` "
     "holds one stage's factors (the nested section below)."),
    ("workloads-file", "Workloads file", "WorkloadFile",
     "The performance and soak stages' `workloads_file` (default `day0/data/workloads.yaml`)."),
    ("tolerances-file", "Tolerances file", "Tolerances",
     "The alignment stage's `tolerance_file` (default `day0/data/tolerances.yaml`)."),
    ("business-file", "Business regression set", "BusinessRow",
     "One JSON object per line of the evaluation stage's `business_file`."),
)
STAGE_INTRO = ("`day0 validate --config stages.yaml` (and the request's `stage_configs`) maps stage "
               "names to settings, `{alignment: {max_windows: 4}}`; each stage's `Config` "
               "validates its own part. One section per registered stage.")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _args(annotation) -> tuple:
    return typing.get_args(annotation)


def _is_model(annotation) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def nested_models(annotation) -> list[type[BaseModel]]:
    """Every pydantic model a field's type names (through Optional, list, dict, Union, ...)."""
    if _is_model(annotation):
        return [annotation]
    return [model for arg in _args(annotation) for model in nested_models(arg)]


class Page:
    """The Markdown of the page, one section per model; a model reached twice is linked."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.anchors: dict[type, str] = {}

    def anchor(self, model: type[BaseModel], prefix: str) -> str:
        if model not in self.anchors:
            taken = set(self.anchors.values())
            name = f"{prefix}-{_slug(model.__name__.strip('_'))}"
            self.anchors[model] = name if name not in taken else f"{name}-{len(taken)}"
        return self.anchors[model]

    def type_name(self, annotation) -> str:
        if annotation is type(None):
            return "None"
        if _is_model(annotation):
            return f"[{annotation.__name__}](#{self.anchors.get(annotation, '')})"
        origin = typing.get_origin(annotation)
        args = _args(annotation)
        if origin is typing.Literal:
            return " or ".join(code(repr(a)) for a in args)
        if origin in (typing.Union, types.UnionType):
            return " or ".join(self.type_name(a) for a in args)
        if origin is typing.Annotated:
            return self.type_name(args[0])
        if origin is not None:
            inner = ", ".join(self.type_name(a) for a in args)
            return f"{getattr(origin, '__name__', str(origin))}[{inner}]" if inner else origin.__name__
        return getattr(annotation, "__name__", str(annotation))

    def section(self, model: type[BaseModel], title: str, anchor: str, intro: str, depth: int,
                prefix: str = "") -> None:
        """model's table, then a section for each model its fields name, not yet on the page;
        their anchors start with the root section's (prefix)."""
        prefix = prefix or anchor
        self.anchors.setdefault(model, anchor)
        later = [m for field in model.model_fields.values() for m in nested_models(field.annotation)]
        for nested in later:
            self.anchor(nested, prefix)  # links resolve before the sections are written
        self.lines += [f"{'#' * depth} {title} {{#{self.anchors[model]}}}", ""]
        doc = model.__dict__.get("__doc__")
        for text in (intro, rst(" ".join(doc.split())) if doc else ""):
            if text:
                self.lines += [text, ""]
        if model.model_config.get("extra") == "forbid":
            self.lines += ["Unknown fields are an error.", ""]
        rows = [self.row(model, name, field) for name, field in model.model_fields.items()]
        self.lines += [table(["field", "type", "default", "description"], rows), ""]
        written = {anchor}
        for nested in dict.fromkeys(later):
            if self.anchors[nested] not in written and not self.done(nested):
                written.add(self.anchors[nested])
                self.section(nested, f"`{nested.__name__}`", self.anchors[nested], "",
                             min(depth + 1, 6), prefix)

    def done(self, model: type[BaseModel]) -> bool:
        return f"{{#{self.anchors[model]}}}" in "\n".join(self.lines)

    def row(self, model: type[BaseModel], name: str, field: FieldInfo) -> list[str]:
        if not field.description:
            log.warning("day0 docs: %s.%s has no description", model.__name__, name)
        kind = self.type_name(field.annotation) + _constraints(field)
        return [code(field.alias or name), cell(kind), _default(field), cell(field.description or "")]


_BOUNDS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "length ≥",
           "max_length": "length ≤", "pattern": "matches"}


def _constraints(field: FieldInfo) -> str:
    found = []
    for meta in field.metadata:
        for attr, word in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{word} {code(value) if attr == 'pattern' else value}")
    return ", " + ", ".join(found) if found else ""


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value: Any = field.default_factory() if field.default_factory else field.default
    if isinstance(value, BaseModel):
        return "defaults below"
    return code(repr(value) if isinstance(value, str) else value)


def stage_configs() -> list[tuple[str, type[BaseModel]]]:
    stages = importlib.import_module("day0.stages")
    return [(name, stages.get(name).load().Config) for name in stages.names()]


def page() -> str:
    out = Page()
    out.lines += ["# Configuration reference", "",
                  "Generated from the pydantic models when this site is built: every field of every "
                  "file or request you write, its type, default and description.", ""]
    out.lines += ["## Stage settings {#stage-settings}", "", STAGE_INTRO, ""]
    for name, config in stage_configs():
        out.section(config, f"Stage `{name}`", f"stage-{_slug(name)}", "", 3)
    for anchor, title, class_name, intro in ROOTS:
        model = find(class_name)
        if model is not None:
            out.section(model, title, anchor, intro, 2)
    return "\n".join(out.lines)
