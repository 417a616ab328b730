"""The analysis stage's report: the summary `day0 analyze` prints, report.md's section, the facts."""

from __future__ import annotations

from day0.stages.analysis.core import DTYPES, GIB, SHAPES_CHECKED, Result

FACT_KEYS = ("architecture", "model_type", "attention", "moe", "params", "num_layers",
             "hidden_size", "vocab_size", "max_context")


def _g(value, spec: str = "g") -> str:
    """A number formatted by spec, or 'unknown' for None (or anything not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "unknown" if value is None else str(value)
    return format(value, spec)


def _fmt_count(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("TiB", 1024 ** 4), ("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def summary_text(result: Result) -> str:
    """A short human-readable summary (what `day0 analyze` prints without --json)."""
    r = result
    a, p, kv, plan = r.attention, r.params, r.kv_cache, r.plan
    att = (f"{a.kind.upper()} {a.num_heads} heads / {a.num_kv_heads} KV heads, head_dim {a.head_dim}"
           if a.kind != "none" else "none (state-space layers only)")
    if a.kind == "mla":
        att += f", kv_lora_rank {_g(a.kv_lora_rank)} + rope {_g(a.qk_rope_head_dim)}"
    if a.index_head_dim:
        att += (f"; DSA indexer {_g(a.index_n_heads)} heads x {a.index_head_dim}, "
                f"top-{_g(a.index_topk)}")
    lines = [f"{r.architecture} (model_type {r.model_type}"
             + (f", config says {r.config_model_type}" if r.config_model_type != r.model_type else "")
             + f"): {r.num_layers} layers, hidden {r.hidden_size}, vocab {r.vocab_size}",
             f"attention: {att}"]
    if r.moe:
        m = r.moe
        lines.append(f"MoE: {m.num_experts} experts, top-{m.experts_per_token}, "
                     f"{m.shared_experts} shared, {m.moe_layers} MoE layers")
    else:
        lines.append("MoE: none (dense)")
    if r.rope:
        lines.append(_rope_line(r.rope, r.max_context))
    if a.layout or a.chunk_size:
        lines.append("layers: " + (a.layout or ", ".join(f"{n} {k}" for k, n in a.layer_types.items()))
                     + (f"; sliding window {a.sliding_window}" if a.sliding_window else "")
                     + (f"; attention chunk {a.chunk_size}" if a.chunk_size else ""))
    lines.append(f"params: {_fmt_count(p.total)} total, {_fmt_count(p.active)} active"
                 f" (from {p.source}" + (f"; {_fmt_count(p.unused)} unused" if p.unused else "") + ")")
    w = r.memory.weights_bytes
    lines.append("weights: " + ", ".join(f"{d} {_fmt_bytes(w.get(d))}" for d in DTYPES))
    lines.append(f"KV cache: {_g(kv.bytes_per_token.get('bfloat16'), ',')} B/token bf16, "
                 f"{_fmt_bytes(kv.bytes_at_max_context.get('bfloat16'))} at {kv.max_context} tokens"
                 + "".join(f"; {k} {g.layers} layers x {g.tokens_held} tokens"
                           for k, g in kv.per_layer_type.items() if k != "full"))
    if r.state:
        st = r.state
        lines.append(f"recurrent state: {st.stateful_layers} stateful / {st.attention_layers} "
                     f"attention layers; per layer conv {_g(st.conv_elements_per_layer, ',')} + "
                     f"state {_g(st.ssm_elements_per_layer, ',')} elements; "
                     f"{_fmt_bytes((st.bytes_per_sequence or {}).get('bfloat16'))} per sequence bf16")
    if p.tied_embeddings or p.shared_layers:
        lines.append("shared: " + "; ".join(
            x for x in ("lm_head tied to the input embedding (stored once)" if p.tied_embeddings
                        else None, p.shared_layers) if x))
    for note in r.unknown:
        lines.append(f"  {note}")
    if r.reference:
        e = r.reference
        lines.append(f"alignment reference: resident {e.resident_gib:.3g} GiB"
                     + (f" ({e.available_gib:g} GiB available)" if e.available_gib else "")
                     + f" -> {e.mode}; streamed peak ~{e.streamed_peak_gib:g} GiB, "
                     f"~{e.pass_seconds:g} s per pass over the weights, "
                     f"~{e.seconds_per_1k_positions:g} s per 1000 positions (estimate); "
                     f"reference bank ~{e.bank_mib_per_1k_positions:g} MiB per 1000 positions")
    lines.append(f"plan ({plan.cards} x {plan.card_memory_gib:g} GiB, {plan.cards_per_domain}/domain): "
                 + (f"TP={plan.tp} PP={plan.pp}" + (f" EP={plan.ep}" if plan.ep else "")
                    + (f" DP={plan.dp}" if plan.dp > 1 else "") if plan.fits else "DOES NOT FIT"))
    lines.append(f"  {plan.rationale}")
    ck = r.checkpoint
    if ck.has_weights:
        lines.append(f"checkpoint: {ck.tensors} tensors in {len(ck.files)} files, "
                     f"{_fmt_bytes(ck.total_bytes)}; read {_fmt_bytes(ck.bytes_read)}"
                     f" ({(ck.bytes_read_ratio or 0):.2e} of it)")
        lines.append(f"  {SHAPES_CHECKED.format(cls=r.architecture)}")
    else:
        lines.append("checkpoint: config.json only (no weights)")
    lines.append(f"risks ({len(r.risks)}):")
    for risk in r.risks:
        lines.append(f"  [{risk.severity}] {risk.id}: {risk.message}")
    if r.checkpoint_problems:
        lines.append(f"the checkpoint is broken ({len(r.checkpoint_problems)}):")
        lines += [f"  {p}" for p in r.checkpoint_problems]
    return "\n".join(lines)


def _rope_line(rope, max_context) -> str:
    def one(sec) -> str:
        return (f"theta {_g(sec.theta)}, {sec.type}"
                + (f" x{_g(sec.factor)} from {_g(sec.original_max_positions)}" if sec.factor else "")
                + ("".join(f", {k} {v}" for k, v in sec.variant.items())))
    text = "RoPE: " + one(rope)
    if len(rope.per_layer_type) > 1 or (rope.per_layer_type and "full_attention" not in rope.per_layer_type):
        text += " (" + "; ".join(f"{k}: {one(sec)}" for k, sec in rope.per_layer_type.items()) + ")"
    if rope.partial_rotary_factor is not None:
        text += f", partial rotary {_g(rope.partial_rotary_factor)}"
    if rope.no_rope_layers:
        text += f", no RoPE in {len(rope.no_rope_layers)} layers"
    return text + f"; max context {max_context}"


def facts(result: dict) -> dict:
    """What the model is, for the report's header, the gates' applies_to (moe) and budgets."""
    return {k: result.get(k) for k in FACT_KEYS}


def markdown(result: dict, gates: list | None = None) -> str:
    """report.md's analysis section: the summary a terminal shows for `day0 analyze`."""
    try:
        text = summary_text(Result.model_validate(result))
    except ValueError:  # an older or foreign result: the report still renders
        return ""
    return "## Analysis\n\n```\n" + text + "\n```\n"
