"""``day0 reference``: the reference bank computed ahead of time, on a big-memory CPU machine,
while targets run elsewhere. Each dtype's control is the target of an alignment run on the
reference machine (the target is the control), which stores the reference (once) and that
control; nothing else is kept."""

from __future__ import annotations

from day0.errors import ConfigError, InputError, StageError


def build(source: str, dtypes: list[str], *, config: str | None = None, text: str | None = None,
          trust_remote_code: bool = False) -> list[str]:
    """One line per dtype: where the bank is and its size. Raises ConfigError/InputError (exit 2) or StageError (3)."""
    from day0 import request_rules, stages
    from day0.execution.contract import StageInputs
    from day0.execution.stage import StageSpec, execute
    from day0.execution.targets import Target

    configs = stages.apply_options(request_rules.stage_configs(config), {"text": text})
    settings = configs.get("alignment", {})
    source = request_rules.check_source(source)
    lines = []
    for dtype in dtypes:
        target = Target(name=f"cpu-{dtype}", device="cpu", dtype=dtype)
        outcome = execute(StageSpec(stage="alignment", config=settings, inputs=StageInputs(
            source=source, target=target, trust_remote_code=trust_remote_code)))
        if not outcome.ok:
            error = ConfigError if outcome.failure == "config" else InputError
            if outcome.failure in ("config", "input"):
                raise error(outcome.error, file=config or source)
            raise StageError(outcome.error)
        found = outcome.result
        if not found.get("reference_bank"):
            raise ConfigError("the reference bank is off: nothing to store", file=config,
                              field="alignment.reference_bank", fix="set it to use or refresh")
        size = found.get("reference_bank_bytes") or 0
        lines.append(f"reference bank: {found['reference_bank']} ({size / 2**20:.1f} MiB): "
                     f"reference and control-{dtype}"
                     + (" (already there)" if found["reference_bank_hit"] else ""))
    return lines
