"""The checkpoint's tensors against the full-size meta model the scan builds anyway.

Header-only analysis counts parameters without transformers; whether every tensor's name and
shape is what transformers' class loads needs the class, so it is checked here, on the model
:func:`day0.stages.scan.meta.meta_scan` built, before its forward: day0.checkpoint.match raises one
CheckpointError listing every problem (the files' and the shapes'), exactly as analysis did before
it became header-only. The class's roles then give the header-level sanity findings
(day0.checkpoint.header_sanity) and are compared with the header-only roles analysis counted with
(day0.checkpoint.headers.classify): a difference is a note, so params.total/unused are never silently
off.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict, Field

from day0.checkpoint.headers import classify
from day0.checkpoint.match import check_checkpoint
from day0.checkpoint.configview import resolve
from day0.errors import InputError
from day0.checkpoint.header_sanity import header_problems

SHOWN = 3  # tensors named per role difference


class CheckpointMatch(BaseModel):
    """The checkpoint's tensors against transformers' class (check_shapes, weights present)."""

    model_config = ConfigDict(extra="forbid")

    model_class: str = Field(description="transformers class the tensors were compared with.")
    tensors: int = Field(description="Tensors in the safetensors headers.")
    unused_params: int = Field(description=(
        "Checkpoint parameters the class does not use (e.g. MTP layers)."))
    notes: list[str] = Field(default_factory=list, description=(
        "Tensors the class does not use, conversions unavailable, and where analysis's "
        "header-only roles differ from the class's."))


def match_checkpoint(inputs, model) -> dict:
    """{"match": CheckpointMatch, "problems": [...]} for a checkpoint with weights; {} for a
    config.json alone. Raises CheckpointError on any mismatch."""
    ckpt = check_checkpoint(inputs.source, model)
    if not ckpt.has_weights:
        return {}
    cls = type(model).__name__
    notes = [n.message for n in ckpt.notes if n.id in ("extra_tensors", "checkpoint_note")]
    notes += role_differences(ckpt, inputs.trust_remote_code, cls)
    match = CheckpointMatch(model_class=cls, tensors=len(ckpt.tensors),
                            unused_params=ckpt.params("extra"), notes=notes)
    return {"match": match, "problems": header_problems(ckpt)}


def role_differences(ckpt, trust_remote_code: bool, cls: str) -> list[str]:
    """Where analysis's header-only roles differ from the class's, one note per pair of roles."""
    try:
        view = resolve(ckpt.config, trust_remote_code=trust_remote_code, file=ckpt.config_file)
    except InputError:  # the class was built, so only a view-only refusal gets here
        return []
    header = dataclasses.replace(ckpt, roles={}, notes=[])
    classify(header, layers=view.get("num_hidden_layers"), model_class=view.class_name)
    pairs: dict[tuple[str, str], list[str]] = {}
    for name in sorted(ckpt.tensors):
        theirs, ours = ckpt.roles.get(name, "model"), header.roles.get(name, "model")
        if theirs != ours:
            pairs.setdefault((ours, theirs), []).append(name)
    notes = []
    for (ours, theirs), names in sorted(pairs.items()):
        params = sum(ckpt.tensors[n].numel for n in names)
        notes.append(f"analysis (header-only) counted {len(names)} tensor(s) ({params:,} "
                     f"parameters) as '{ours}' that transformers' {cls} holds as '{theirs}', "
                     f"e.g. {', '.join(names[:SHOWN])}: its params.total and params.unused are "
                     "off by that much (extend data/analysis.yaml's patterns)")
    return notes


__all__ = ["CheckpointMatch", "match_checkpoint", "role_differences"]
