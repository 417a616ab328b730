"""Load YAML/JSON config files into pydantic models with every error at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from day0.errors import ConfigError, Problem, did_you_mean

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: str | Path, error: type[ConfigError] = ConfigError) -> Any:
    """Parse a YAML or JSON file; a missing or unparsable file is a ConfigError naming it."""
    path = Path(path)
    if not path.is_file():
        raise error("file not found", file=str(path), fix="check the path")
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise error(f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {first}",
                    file=str(path), fix="correct the syntax") from None


def problems_from_validation(exc: ValidationError, model: type[BaseModel], file: str,
                             prefix: str = "") -> list[Problem]:
    """Turn a pydantic ValidationError into Problems with dotted fields and 'did you mean'."""
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        field = prefix + ".".join(loc)
        message = err["msg"]
        fix = None
        if err["type"] == "extra_forbidden":
            known = _known_fields(model, err["loc"][:-1])
            message = f"unknown field '{loc[-1]}'"
            hint = did_you_mean(loc[-1], known)
            fix = (hint.strip().rstrip("?") if hint else f"remove it; known fields: {', '.join(sorted(known))}")
        elif err["type"] == "missing":
            fix = "add this field"
        elif err["type"] == "value_error" and err.get("ctx", {}).get("error"):
            message = str(err["ctx"]["error"])  # the validator's own words, not pydantic's prefix
        elif err["type"] == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            hint = did_you_mean(err.get("input"), [s.strip(" '") for s in expected.replace(" or ", ",").split(",")])
            fix = (hint.strip().rstrip("?") if hint else f"use one of {expected}")
        problems.append(Problem(message, file=file, field=field, fix=fix))
    return problems


def _known_fields(model: type[BaseModel], loc) -> list[str]:
    """Field names of the (possibly nested) model at loc; indices into lists are skipped."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _inner_model(field.annotation)
    return list(getattr(current, "model_fields", {}) or [])


def _inner_model(annotation):
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def load_model(model: type[M], data: Any, file: str, prefix: str = "") -> M:
    """Validate data as model; raise one ConfigError listing every problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError.from_problems(problems_from_validation(exc, model, file, prefix)) from None
