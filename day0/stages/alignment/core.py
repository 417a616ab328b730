"""The alignment stage's core: models, windows and comparisons (see the package docstring).

The stage's settings are config.py, its evidence result.py, the statistics summary.py and the
sides kept between calls in one process kept_sides.py; run() takes the steps below in order."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from day0.checkpoint.configview import trained_context
from day0.execution import progress
from day0.checkpoint.files import read_config_dict
from day0.execution.contract import Laps, StageInputs
from day0.errors import ConfigError
from day0.checkpoint.modeling import check_source, resolve_config
from day0.store.sources import local_checkpoint
from day0.stages.alignment import generation as gen
from day0.stages.alignment import sides
from day0.stages.alignment import streamed as stream
from day0.stages.alignment.bank import size_text
from day0.stages.alignment.banked import RecordedOps, encode_ops
from day0.stages.alignment.config import Config
from day0.stages.alignment.engine import evaluate
from day0.stages.alignment.kept_sides import KeptSides
from day0.stages.alignment.result import Result
from day0.stages.alignment.summary import summarize
from day0.torchkit.evaltext import (Window, load_tokenizer, prefix_token, prompts, read_text,
                                    resolve_text_file, tokenize, tokenizer_problems, windows)
from day0.torchkit.replay import dtypes_at, record_ops, replay_recorded
from day0.torchkit.tolerances import load_tolerances


def _is_control(target, reference) -> bool:
    return (not target.plugins and target.device.split(":")[0] == reference.device.split(":")[0]
            and target.runner != "deployment")


@dataclass
class _EvalText:
    """The evaluation text as this run uses it: windows, generation prompts, the op check's
    input, and the notes on what they cover."""

    path: Path
    content: str
    tokenizer: object
    model_config: object
    ids: list[int]
    prefix: int | None
    seq_len: int
    max_pos: int | None
    wins: list[Window]
    chosen: list[tuple[int, list[int]]]
    batch: list[list[int]]
    op_ids: list[int] | None
    notes: list[str]

    @property
    def span(self) -> int:
        return max(len(w.ids) for w in self.wins)


def run(config: Config, inputs: StageInputs, *, kept: KeptSides | None = None) -> Result:
    laps = Laps()
    lap = laps.lap

    target, reference = inputs.target, inputs.reference
    # rough shares of the stage's time on a CPU target (the windows dominate)
    progress.plan({"weights": 1, "models": 1, "ops": 1, "windows": 6, "generation": 1})
    tolerances = load_tolerances(config.tolerance_file)
    source_name = inputs.source
    check_source(source_name)  # a hostile config.json is refused before any weight is read
    same = _is_control(target, reference)
    # s3:// sources: config, tokenizer and texts first; the shards only if a model runs resident
    local = local_checkpoint(source_name, log=print, weights=False)
    lap("fetch")
    _check_tolerances(config, tolerances, target.dtype)
    text = _prepare_text(config, inputs, local)
    notes = text.notes
    control_profile = reference.model_copy(update={"dtype": target.dtype})
    plan = sides.open_bank(config, source_name, reference, control_profile, text.wins,
                           text.op_ids, text.batch, text.model_config, inputs.revision)
    lap("bank")  # identifying the weights (a local folder: every byte hashed) and the bank
    live = sides.live_dtypes(plan, reference, control_profile, same, target)
    streamed = sides.streaming(config, source_name, live)
    if live and not streamed:  # a model runs resident: its shards, local
        inputs = inputs.model_copy(update={"source": local_checkpoint(source_name, log=print)})
    weights_source = source_name if streamed else inputs.source
    problems = _scan_weights(config, plan, weights_source if live else source_name, lap)
    scanned = list(problems)  # what the bank keeps of the weight scan
    problems += tokenizer_problems(text.tokenizer, getattr(text.model_config, "vocab_size", None))
    if inputs.bring_up:
        problems = _untrained_as_notes(problems, notes)
    try:
        ref, ctl, tgt = sides.load_sides(
            plan, streamed=streamed, same=same, kept=kept, wins=text.wins, reference=reference,
            inputs=inputs.model_copy(update={"source": weights_source}), target=target,
            control_profile=control_profile,
            expert_group_bytes=int(config.expert_group_gib * 2**30))
        lap("load")
        op_rows, recorded, op_dtypes = _ops(config, plan, ref, text.op_ids, reference, target,
                                            tolerances, at_target=(ctl, tgt))
        if op_rows is not None:
            lap("ops")
        n_buckets = min(config.position_buckets, text.span)
        if streamed:
            notes.append(stream.NOTE)
        evidence = _compare_windows(config, text, ref, ctl, tgt, streamed, n_buckets)
        sides.flush(plan)  # the bank's tensors to disk before generation
        lap("windows")
        result = summarize(evidence, tolerances, target, text.span, n_buckets)
        problems += _reference_problems(config, evidence, result["perplexity_reference"], text,
                                        source_name, inputs, broken=bool(problems),
                                        notes=notes)
        made: dict[str, list] = {}
        gen_rows = gen.compared(config.new_tokens, text.chosen, text.batch, text.tokenizer, ref,
                                ctl, tgt, reference.device, target,
                                kept.greedy if kept else None, streamed, made, notes)
        lap("generation")
        bank_bytes = sides.commit(
            plan, {"reference": (ref, reference), plan.control_part: (ctl, control_profile)},
            made, built="streamed" if streamed else "resident", wins=text.wins, ops=recorded,
            op_dtypes=op_dtypes, weight_problems=scanned if config.check_weights else None)
    finally:
        sides.abort(plan)  # a run that did not finish stores nothing
    if plan.root:
        notes.append(_bank_note(plan, bank_bytes))
    covered = int(evidence.column("position_of").max()) + 1 if result["positions"] else 0
    return Result(
        target=target.label, claim=target.claim,
        control=f"{reference.device}/{target.dtype}, no plugins", target_is_control=same,
        plugins=list(target.plugins), text_file=str(text.path), text_tokens=len(text.ids),
        seq_len=text.seq_len, prefix_token=text.prefix, context_tokens=text.wins[0].score_from,
        max_position_embeddings=text.max_pos,
        covered_fraction=covered / text.max_pos if text.max_pos else None,
        windows=len(text.wins), ops=op_rows or [], generation=gen_rows, notes=notes,
        timings=laps.timings, peak_rss_mib=laps.peak_rss_mib, streamed=streamed,
        reference_bank=plan.where, reference_bank_hit=plan.reference is not None,
        reference_bank_bytes=bank_bytes if plan.root else None,
        reference_bank_parts=plan.provenance() if plan.root else {},
        checkpoint_problems=problems, **result)


def _check_tolerances(config: Config, tolerances, dtype: str) -> None:
    if dtype not in tolerances.ops.tolerances or \
            dtype not in tolerances.control.floors.layer_rel_error:
        raise ConfigError(f"no tolerances for dtype {dtype}",
                          file=config.tolerance_file or "day0/data/tolerances.yaml",
                          field="ops.tolerances", fix=f"add a '{dtype}' entry under "
                          "ops.tolerances and control.floors.layer_rel_error")


def _prepare_text(config: Config, inputs: StageInputs, local: str) -> _EvalText:
    """The text tokenized, cut into windows up to seq_len, and its generation prompts."""
    path = resolve_text_file(config.text_file, local)
    text = read_text(path)
    tokenizer = load_tokenizer(local, inputs.trust_remote_code)
    model_config = resolve_config(read_config_dict(local),
                                  trust_remote_code=inputs.trust_remote_code).config
    max_pos = trained_context(model_config)  # mpt's max_seq_len, gpt2's n_positions too
    seq_len = config.seq_len or min(max_pos or config.seq_len_cap, config.seq_len_cap)
    ids = tokenize(tokenizer, text, getattr(model_config, "vocab_size", None))
    prefix = prefix_token(tokenizer)
    wins, text_notes = windows(ids, seq_len, config.max_windows, prefix, config.context_tokens)
    chosen = prompts(ids, config.generation_prompts, config.prompt_tokens) \
        if config.generation_prompts else []
    return _EvalText(
        path=path, content=text, tokenizer=tokenizer, model_config=model_config, ids=ids,
        prefix=prefix, seq_len=seq_len, max_pos=max_pos, wins=wins, chosen=chosen,
        batch=[([prefix] if prefix is not None else []) + prompt for _, prompt in chosen],
        op_ids=wins[0].ids[:config.op_tokens] if config.check_ops else None,
        notes=text_notes + _window_notes(config, wins, seq_len, max_pos, prefix))


def _window_notes(config: Config, wins, seq_len: int, max_pos, prefix) -> list[str]:
    notes = []
    span = max(len(w.ids) for w in wins)
    if max_pos and seq_len > max_pos:
        notes.append(f"seq_len {seq_len} exceeds the trained context {max_pos}")
    if max_pos and span < max_pos:
        notes.append(f"windows cover positions 0-{span - 1} of the trained context {max_pos} "
                     f"({span / max_pos:.1%}); raise seq_len_cap to reach further")
    if prefix is None:
        notes.append("the tokenizer has no BOS/EOS token: windows start mid-text; the first "
                     f"{config.context_tokens} positions are context only")
    return notes



def _untrained_as_notes(problems: list[str], notes: list[str]) -> list[str]:
    """Bring-up (placeholder weights): what their initialization gives (all-zero or constant
    matrices) is a note, not a finding; the other problems are returned."""
    from day0.checkpoint.sanity import means_untrained

    notes += [f"bring-up, weights untrained (not a finding): {p}" for p in problems
              if means_untrained(p)]
    return [p for p in problems if not means_untrained(p)]


def _scan_weights(config: Config, plan, source: str, lap) -> list[str]:
    """The weight scan's findings: from the bank when it holds them, else read from source."""
    problems: list[str] = []
    banked_scan = plan.reference.meta.weight_problems if plan.reference is not None else None
    if config.check_weights and banked_scan is not None:
        problems += banked_scan
        progress.update("weights", 1, 1, detail="the weight scan's findings, from the bank")
    elif config.check_weights:  # shards read in place when no model needs them local
        from day0.checkpoint import sanity

        problems += sanity.check_weights(source)
        lap("weights")
    return problems


def _ops(config: Config, plan, ref, op_ids, reference, target, tolerances, at_target=()) -> tuple:
    """(op rows or None, the op list for bank.json or None, the op dtypes at the target dtype or
    None): replayed from the bank's recorded inputs, or recorded from a short reference forward
    (its inputs then go to the bank). Each op is replayed at the dtype the model runs it at the
    target dtype: what a forward of the control records (at_target: control and target sides;
    the first with a live model), else what the control's bank part kept of it."""
    if op_ids is None:
        return None, None, None
    recorded = None
    if plan.reference is not None:  # a bank part without its op inputs is not opened
        recorder = RecordedOps(plan.reference.meta.ops, plan.reference.ops())
    else:
        recorder = record_ops(ref.model, torch.tensor([op_ids], device=reference.device))
        writer = plan.writers.get("reference")
        if writer is not None and (encoded := encode_ops(recorder)) is not None:
            recorded, examples = encoded
            writer.put_ops(examples)  # to disk now, not held until the end
    # a resident model only (a streamed side's forward loads every layer again)
    live = next((side for side in at_target
                 if isinstance(getattr(side, "model", None), torch.nn.Module)), None)
    run_dtypes = None
    kept = plan.control.meta.op_dtypes if plan.control is not None else None
    if kept is not None:  # the control's bank part: as its live run recorded them
        run_dtypes = {name: set(kinds) for name, kinds in kept.items()}
    elif live is not None and target.dtype != "float32":
        run_dtypes = dtypes_at(live.model, torch.tensor([op_ids], device=live.device))
    rows = replay_recorded(recorder, device=target.device, dtype=target.dtype,
                           tolerances=tolerances, reference_inputs=config.reference_inputs,
                           run_dtypes=run_dtypes)
    return rows, recorded, run_dtypes



def _compare_windows(config: Config, text: _EvalText, ref, ctl, tgt, streamed: bool,
                     n_buckets: int):
    """Every window through the three sides: layer, logit and routing evidence."""
    if streamed:
        return stream.evaluate_streamed(text.wins, ref, ctl, tgt, span=text.span,
                                        n_buckets=n_buckets, logit_chunk=config.chunk_tokens)
    return evaluate(text.wins, ref, ctl, tgt, span=text.span, n_buckets=n_buckets,
                    chunk=config.chunk_tokens)


def _reference_problems(config: Config, evidence, ppl_ref: float, text: _EvalText, source: str,
                        inputs: StageInputs, *, broken: bool, notes: list[str]) -> list[str]:
    """What the reference's own numbers say of the checkpoint (`broken`: found so far); in
    bring-up (placeholder weights) what only means 'untrained' goes to notes instead."""
    problems = []
    if bad_ref := evidence.logits.reference_nonfinite:
        problems.append(f"the cpu/float32 reference produced {bad_ref} non-finite logits")
    if config.check_weights:
        problems += _perplexity_check(ppl_ref, text.model_config, source, inputs, text.content,
                                      text.seq_len, len(text.wins), broken or bool(problems))
    if inputs.bring_up:
        from day0.checkpoint import sanity

        vocab = getattr(text.model_config, "vocab_size", 0) or 0
        notes += [f"bring-up, weights untrained (not a finding): {line}"
                  for line in sanity.untrained_findings(ppl_ref, vocab)]
    return problems


def _perplexity_check(ppl_ref: float, model_config, source: str, inputs: StageInputs, text: str,
                      seq_len: int, n_windows: int, already_broken: bool) -> list[str]:
    """The reference perplexity must be far from a uniform guess and near the score this
    model/revision had before on the same text and windows (stored after a sane run)."""
    from day0.checkpoint import sanity

    revision = getattr(inputs, "revision", None)
    key = None
    if revision and not inputs.bring_up:  # placeholder weights have no score to keep
        digest = hashlib.sha256(f"{text}|{seq_len}|{n_windows}".encode()).hexdigest()[:16]
        key = f"{source}@{revision}#{digest}"
    stored = sanity.stored_reference_perplexity(key) if key else None
    found = sanity.perplexity_problems(ppl_ref, getattr(model_config, "vocab_size", 0) or 0,
                                       stored, untrained=inputs.bring_up)
    if key and stored is None and not found and not already_broken and math.isfinite(ppl_ref):
        sanity.store_reference_perplexity(key, ppl_ref)
    return found



def _bank_note(plan, bank_bytes: int) -> str:
    return (f"reference bank {plan.where} ({size_text(bank_bytes)}): "
            + "; ".join(f"{part} {how}" for part, how in plan.provenance().items()))


__all__ = ["Config", "Result", "run", "KeptSides"]
