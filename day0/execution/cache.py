"""Stage result cache keyed by what a stage reads: weights, target, its config, revision, code.

A repeated validation with nothing changed reuses every stage's outcome. Any change to the
checkpoint's files (their content, hashed on every run), the target profile (plugins' source
included), the stage config, the keys of the stages it requires (never their results, which
carry timings), the revision or the stage's code (day0's own code and data, and a plug-in
stage's package) gives a new key. A stage that does not read another's result is not keyed by
it: re-running analysis does not invalidate scan. Only successful outcomes are stored.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from functools import lru_cache
from pathlib import Path

from day0.atomic import write_atomic
# the checkpoint's names and digests are day0.store.identity's; imported here for the stage keys
from day0.store.identity import cache_dir, weights_key
from day0.store.identity import file_digest as _file_digest
from day0.execution.stage import StageOutcome, StageSpec

PACKAGE = Path(__file__).parents[1]


@lru_cache(maxsize=1)
def code_version() -> str:
    """Digest of day0's source and data files: editing the engine invalidates cached results."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE.rglob("*")):
        if f.suffix in {".py", ".yaml", ".txt"} and "__pycache__" not in f.parts:
            h.update(f"{f.relative_to(PACKAGE)}:".encode() + f.read_bytes())
    return h.hexdigest()


def _plugin_sources(plugins: list[str]) -> list[str]:
    """Content digests of file plugins (module plugins are keyed by name and version of day0)."""
    out = []
    for spec in plugins:
        p = Path(spec)
        out.append(_file_digest(p) if p.is_file() else spec)
    return out


def _stage_code(spec: StageSpec) -> str | None:
    """Digest of a plug-in stage's own package (day0's built-ins are in code_version)."""
    if not spec.locator or spec.locator.split(".")[0] == "day0":
        return None
    from day0 import stages

    stage = stages.get(spec.stage, spec.locator)
    origin = Path(inspect.getfile(type(stage)))
    # a stage folder: every module in it; a stage in a single module: that module
    files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def stage_key(spec: StageSpec, weights: str | None = None,
              required: dict[str, str] | None = None) -> str:
    """weights: weights_key(source) when the caller already has it (one LIST per run on s3);
    required: the cache keys of the stages this one requires (whose results it reads)."""
    inputs = spec.inputs
    material = {
        "stage": spec.stage,
        "locator": spec.locator,
        "stage_code": _stage_code(spec),
        "config": spec.config,
        "weights": weights or weights_key(inputs.source),
        "target": inputs.target.model_dump(mode="json"),
        "plugins": _plugin_sources(inputs.target.plugins),
        "reference": inputs.reference.model_dump(mode="json"),
        "required": dict(sorted((required or {}).items())),
        "trust_remote_code": inputs.trust_remote_code,
        # the alignment stage compares with (and stores) the score of this model and revision:
        # a result cached under another revision never did that for this one
        "revision": inputs.revision,
        "code": code_version(),
    }
    if inputs.bring_up:  # placeholder weights: 'untrained' findings are notes, not problems
        material["bring_up"] = True
    if inputs.target.runner == "docker":  # the image is the target's software stack
        from day0.execution.runners.docker import image_id

        material["image"] = image_id(inputs.target.container.image)
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def load(key: str) -> StageOutcome | None:
    path = cache_dir() / "stages" / f"{key}.json"
    if not path.is_file():
        return None
    try:
        outcome = StageOutcome.model_validate_json(path.read_text())
    except ValueError:  # a damaged entry is a miss, never an error
        return None
    return outcome.model_copy(update={"cached": True})


def store(key: str, outcome: StageOutcome) -> None:
    if not outcome.ok:
        return
    # the cache dir may be shared: never write through a guessable temp name (day0.atomic)
    write_atomic(cache_dir() / "stages" / f"{key}.json", outcome.model_dump_json())
