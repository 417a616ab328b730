"""Operator scan: which aten ops the model needs, and which of them the target runs.

1. The model at its full configured size is built on the meta device and one forward
   (batch 1, ``seq_len`` tokens) is recorded op by op (:mod:`day0.stages.scan.meta`).
2. Coverage on the target: from the target's ``op_manifest`` when it has one, otherwise by
   probing a tiny copy of the model on the target device (:mod:`day0.stages.scan.probe`).
   Each op is ``covered`` (ran on the device), ``uncovered`` (raised there, or missing from the
   manifest), ``unprobed`` (needed at full size, never exercised by the probe) or ``manifest``
   (listed as supported). coverage = (covered + manifest) / all. An op meta tensors dispatch
   where a device dispatches another for the same code (``meta_equivalents.yaml``: ``x[mask] = 0``
   is aten.scalar_tensor on meta, aten.lift_fresh on a device) is probed when its equivalent is.
3. Ops outside ``day0/stages/scan/common_ops.yaml`` are long-tail: the first to lack a kernel on a new
   backend.

Before the forward, with weights present, every tensor's name and shape in the safetensors
headers is compared with that same full-size model after transformers' own loading conversions
(day0.checkpoint.match; ``check_shapes``): a mismatch is one CheckpointError listing every problem
(exit 2), tensors the class does not use are reported (``checkpoint``), and where the header-only
roles analysis counted with differ from the class's, a note says so.

What it proves: every aten op the full-size model needs, whether the target runs each, and that
the checkpoint's tensors are the ones transformers' class loads. What it needs: config.json (meta
tensors, no weights data) and the safetensors headers, the target's device (or its op_manifest);
runs after analysis and reads no other stage's result.
"""

from __future__ import annotations

from day0.execution.contract import Stage, import_core


class Scan(Stage):
    config_module = "core"
    after = ("analysis",)

    def core(self):
        return import_core(__name__)  # torch and transformers: only when it runs

    def warm(self) -> None:
        from day0.stages.scan import meta  # noqa: F401 - what run() imports for the meta forward

    def evidence(self, result: dict) -> dict:
        """report.json keeps coverage and the op names that matter; stages/scan.json keeps all."""
        return {k: result[k] for k in ("coverage", "uncovered", "long_tail") if k in result}

    def markdown(self, evidence: dict, gates: list) -> str:
        def names(key):
            return ", ".join(map(str, evidence.get(key) or [])) or "none"

        coverage = evidence.get("coverage")
        return "\n".join(["## Operator coverage\n",
                          f"- coverage: {'—' if coverage is None else f'{coverage:.6g}'}",
                          f"- uncovered: {names('uncovered')}",
                          f"- long-tail: {names('long_tail')}\n"])
