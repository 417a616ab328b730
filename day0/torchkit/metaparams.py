"""``python -m day0.torchkit.metaparams``: transformers' class for a config.json, built on the
meta device, as JSON (for header-only analysis, which imports no torch itself).

Without weights, exact parameter counts need the class (tied weights once, fused experts, the
biases a config implies). The analysis stage runs this module in a child process
(day0.stages.analysis.metaparams), forked from the warm stage host when there is one (the file
of the request as its argument) or cold (the request on stdin): ``{"config": {...}, "file": PATH,
"trust_remote_code": false}``, one JSON document as the last line of stdout:

* ``{"class": ..., "model_type": ..., "notes": [...], "parameters": [[name, [dims]], ...]}``
  (``named_parameters``: shared parameters once), exit status 0;
* ``{"error": {"type": "InputError", "problems": [{message, file, field, fix}, ...]}}`` for a
  config transformers refuses (day0.checkpoint.modeling's InputError), exit status 2.

Anything else (a crash, a kill) the caller reports as one InputError naming config.json.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from day0.errors import Day0Error


def describe(config: dict, *, file: str, trust_remote_code: bool = False) -> dict:
    """The class transformers resolves for config and its parameters' names and shapes."""
    from day0.checkpoint.modeling import build_meta_model, resolve_config

    resolved = resolve_config(config, trust_remote_code=trust_remote_code, file=file)
    model = build_meta_model(resolved)
    return {"class": type(model).__name__,
            "model_type": str(getattr(resolved.config, "model_type", "") or ""),
            "notes": list(resolved.notes),
            "parameters": [[name, list(p.shape)] for name, p in model.named_parameters()]}


def main(argv: list[str] | None = None) -> int:
    """The request from the file argv names (a child forked from the warm stage host), else
    from stdin (``python -m``)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        from day0.execution import lifecycle

        lifecycle.guard_stage()  # dies with its owner, as a stage child does
        with open(argv[0], encoding="utf-8") as handle:
            request = json.load(handle)
    else:
        request = json.loads(sys.stdin.read())
    try:
        doc, status = describe(request["config"], file=request["file"],
                               trust_remote_code=bool(request.get("trust_remote_code"))), 0
    except Day0Error as exc:
        doc, status = {"error": {"type": type(exc).__name__,
                                 "problems": [dataclasses.asdict(p) for p in exc.problems]}}, 2
    sys.stdout.write("\n" + json.dumps(doc) + "\n")
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
