"""Which models the alignment stage runs, and how: the reference, the control (the reference
implementation at the target's dtype) and the target, each resident or streamed, and the
reference and control replayed from the reference bank when it holds them (bank.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from day0.execution import progress
from day0.errors import Day0Error
from day0.checkpoint.modeling import load_pretrained
from day0.execution.plugins import apply_plugins
from day0.stages.alignment import streamed as stream
from day0.stages.alignment.bank import Bank, BankWriter, bank_key, bank_root, size_text
from day0.stages.alignment.banked import BankSide, Recorder
from day0.stages.alignment.engine import Side
from day0.torchkit.dtypes import torch_dtype


@dataclass
class BankPlan:
    """What the bank holds for this run (hits) and what this run will add to it (writers)."""

    root: str | None = None
    key: str | None = None
    reference: Bank | None = None
    control: Bank | None = None
    control_part: str = ""
    writers: dict[str, BankWriter] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # part -> why it was not replayed
    own_control: bool = False  # the control runs at another dtype than the reference

    def provenance(self) -> dict[str, str]:
        """Each part this run used: replayed from the verified bank, or computed (and why a
        stored one was not replayed)."""
        from day0.store.seal import keyed_by

        out = {}
        parts = [("reference", self.reference)] + (
            [(self.control_part, self.control)] if self.own_control else [])
        for part, bank in parts:
            if bank is not None:
                out[part] = (f"replayed from {self.where}: seal and file digests verified with "
                             f"{keyed_by()}")
            else:
                why = self.rejected.get(part)
                out[part] = "computed here" + (f" (the stored part {why}: not replayed)"
                                               if why else "")
        return out

    @property
    def where(self) -> str | None:
        return f"{self.root}/{self.key}" if self.root else None


def bank_bytes(model_config, wins, dtypes: list[str]) -> int:
    """Size of bank parts at these dtypes: logits and every layer's output per position."""
    text = getattr(model_config, "get_text_config", lambda: model_config)()
    per_position = (getattr(text, "vocab_size", 0) or 0) + (
        getattr(text, "num_hidden_layers", 0) or 0) * (getattr(text, "hidden_size", 0) or 0)
    positions = sum(len(w.ids) for w in wins)
    return sum(positions * per_position * torch_dtype(d).itemsize
               for d in dtypes)


def _room(plan: BankPlan, need: int, config, log) -> bool:
    """Whether the parts to compute may be stored: within reference_bank_max_gib, and within
    the free space of a local bank folder."""
    import shutil

    limit = config.reference_bank_max_gib * 2**30
    free = None
    if not plan.root.startswith("s3://"):
        folder = Path(plan.root)
        while not folder.exists():
            folder = folder.parent
        free = shutil.disk_usage(folder).free
    if need <= limit and (free is None or need * 2 < free):  # staging copy + the part
        return True
    why = (f"over reference_bank_max_gib ({config.reference_bank_max_gib:g})" if need > limit
           else f"{size_text(free)} free at {plan.root}")
    log(f"reference bank: {', '.join(plan.writers)} would take {size_text(need)}, {why}: not "
        "stored (raise reference_bank_max_gib, or lower seq_len_cap/max_windows)")
    return False


def open_bank(config, source: str, reference, control_profile, wins, op_ids, prompts,
              model_config=None, revision: str | None = None, log=print) -> BankPlan:
    """The bank parts this run reads, and writers for the parts it must compute."""
    if config.reference_bank == "off":
        return BankPlan()
    from day0.store.identity import weights_key

    weights = weights_key(source)
    if weights.startswith("unlisted:"):  # the store cannot be listed now: no identity to key
        log(f"reference bank: {source} cannot be listed: not used")
        return BankPlan()
    root = bank_root(config.reference_bank_uri, source, revision=revision,
                     reference=f"{reference.device}/{reference.dtype}", weights=weights)
    key = bank_key(weights=weights, reference=f"{reference.device}/{reference.dtype}",
                   windows=[w.ids for w in wins], op_ids=op_ids, prompts=prompts,
                   new_tokens=config.new_tokens if prompts else 0)
    own_control = control_profile.dtype != reference.dtype
    plan = BankPlan(root, key, control_part=f"control-{control_profile.dtype}",
                    own_control=own_control)
    if config.reference_bank == "use":
        plan.reference = Bank.open(root, key, "reference", log, plan.rejected)
        if plan.reference is not None and op_ids is not None and plan.reference.meta.ops is None:
            log(f"reference bank: {plan.where}: the op check's inputs could not be banked; "
                "recomputing the reference")
            plan.reference = None
        if plan.reference is not None and own_control:
            plan.control = Bank.open(root, key, plan.control_part, log, plan.rejected)
    try:  # a bank that cannot be written never stops the validation
        if plan.reference is None:
            plan.writers["reference"] = BankWriter(root, key, "reference")
        if own_control and plan.control is None:
            plan.writers[plan.control_part] = BankWriter(
                root, key, plan.control_part, compact=torch_dtype(control_profile.dtype))
    except OSError as exc:
        log(f"reference bank: cannot stage a new part ({exc}): not stored")
        abort(plan)
    dtypes = [reference.dtype if p == "reference" else control_profile.dtype
              for p in plan.writers]
    if plan.writers and not _room(plan, bank_bytes(model_config, wins, dtypes), config, log):
        abort(plan)
    hits = [b for b in (plan.reference, plan.control) if b is not None]
    if hits:
        log(f"reference bank: {plan.where}: replaying "
            + ", ".join(f"{b.meta.part} ({size_text(b.meta.bytes)}, computed {b.meta.built} in "
                        f"{b.meta.seconds:.0f} s at {b.meta.created_at})" for b in hits)
            + ": no forward of " + " or ".join(b.meta.part.split("-")[0] for b in hits))
    if plan.writers:
        log(f"reference bank: {plan.where}: computing {', '.join(plan.writers)}")
    return plan


def live_dtypes(plan: BankPlan, reference, control_profile, same: bool, target) -> list[str]:
    """Dtypes of the models this run holds (what the streaming decision weighs)."""
    dtypes = [] if plan.reference is not None else [reference.dtype]
    if control_profile.dtype != reference.dtype and plan.control is None:
        dtypes.append(control_profile.dtype)
    if not same:
        dtypes.append(target.dtype)
    return dtypes


def load_sides(plan: BankPlan, *, streamed: bool, inputs, reference, control_profile, target,
               same: bool, kept, expert_group_bytes: int, wins) -> tuple:
    """(reference, control, target or None) sides: banked, recorded or live."""
    store = None
    ids = [w.ids for w in wins]

    def live(name, profile):
        nonlocal store
        if streamed:
            from day0.torchkit.weights import WeightStore

            store = store or WeightStore(inputs.source)
            return stream.side(name, inputs, profile, expert_group_bytes, store)
        load = lambda: load_pretrained(inputs.source, device=profile.device,  # noqa: E731
                                       dtype=profile.dtype,
                                       trust_remote_code=inputs.trust_remote_code)
        if kept is not None:  # the kept's target comes with its plugins applied
            if name == "target":
                return kept.target(inputs.source, profile, load)
            return kept.side(name, inputs.source, profile.device, profile.dtype, load)
        return Side(name, load(), profile.device, profile.plugins if name == "target" else None)

    def side(name, profile, bank, part):
        if bank is not None:
            return BankSide(name, bank)
        found = live(name, profile)
        writer = plan.writers.get(part)
        return Recorder(found, writer, ids) if writer is not None else found

    if streamed and not same and target.plugins:
        stream.refuse_plugins()
    total = 1 + (control_profile.dtype != reference.dtype) + (not same)
    progress.update("models", 0, total, detail="the reference")
    ref = side("reference", reference, plan.reference, "reference")
    progress.update("models", 1, total, detail="reference ready")
    ctl = ref if control_profile.dtype == reference.dtype else side(
        "control", control_profile, plan.control, plan.control_part)
    tgt = None
    if not same:
        tgt = live("target", target)
        if not streamed and kept is None:
            apply_plugins(tgt.model, target.plugins)
    progress.update("models", total, total, detail="streamed: skeletons built, no weights"
                    if streamed else "models ready")
    return ref, ctl, tgt


def commit(plan: BankPlan, parts: dict, generations: dict, *, built: str, wins,
           ops: list[dict] | None = None, op_dtypes: dict[str, set[str]] | None = None,
           weight_problems: list[str] | None = None, log=print) -> int:
    """Store the parts this run computed (parts: part -> (recorded side, profile)); returns the
    bank's size in bytes, all parts of this run."""
    from day0.stages.alignment.bank import window_digest

    total = sum(b.meta.bytes for b in (plan.reference, plan.control) if b is not None)
    for part, writer in plan.writers.items():
        recorder, profile = parts[part]
        if writer.unsupported:
            log(f"reference bank: {part} not stored: {writer.unsupported}")
            writer.abort()
            continue
        meta = dict(device=profile.device, dtype=profile.dtype,
                    windows=[window_digest(w.ids) for w in wins], n_layers=recorder.n_layers,
                    routers=sorted(recorder.routers), built=built,
                    generations=generations.get(part))
        if part == "reference":
            meta["weight_problems"] = weight_problems
            meta["ops"] = ops
        elif op_dtypes is not None:
            meta["op_dtypes"] = {name: sorted(kinds) for name, kinds in op_dtypes.items()}
        try:
            done = writer.commit(meta)
        except (OSError, Day0Error) as exc:  # the verdict stands without the bank
            log(f"reference bank: {part} not stored at {plan.where}: {exc}")
            continue
        total += done.bytes
        log(f"reference bank: stored {part} at {plan.where} ({size_text(done.bytes)}, "
            f"{done.seconds:.0f} s to compute)")
    plan.writers.clear()
    return total


def flush(plan: BankPlan) -> None:
    for writer in plan.writers.values():
        writer.flush()


def abort(plan: BankPlan) -> None:
    for writer in plan.writers.values():
        writer.abort()
    plan.writers.clear()


def streaming(config, source: str, dtypes: list[str]) -> bool:
    """Whether to stream: as configured, or (auto) when the resident copies do not fit."""
    if config.streaming != "auto":
        return config.streaming == "on"
    return bool(dtypes) and not stream.resident_fits(source, dtypes)


__all__ = ["BankPlan", "open_bank", "live_dtypes", "load_sides", "commit", "flush", "abort",
           "streaming"]
