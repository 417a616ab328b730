"""The analysis risk checklist: long-tail structure that a port to a new accelerator must handle.

This module decides *when* each risk applies; ids, severities and wording are in
data/analysis.yaml (``risks:``) so they can be reviewed without reading code.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from day0.stages.analysis.model import cfg, mla_expanded_per_token
from day0.checkpoint.headers import data, risk_text

GIB = 1024 ** 3


class Risk(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Stable identifier (data/analysis.yaml risks).")
    severity: Literal["info", "warning", "error"] = Field(description="info, warning or error.")
    message: str = Field(description="What to look at and why.")


def _add(risks: list[Risk], rid: str, severity: str | None = None, **fields) -> None:
    sev, message = risk_text(rid, **fields)
    risks.append(Risk(id=rid, severity=severity or sev, message=message))


def collect_risks(*, view, notes: list[str], attention, moe, rope, kv: dict, params,
                  weights_bf16: int, plan, ckpt, param_names: list[str], state=None,
                  unknown: list[str] = ()) -> list[Risk]:
    """Every risk that applies, in checklist order (view: day0.checkpoint.configview.ConfigView)."""
    raw = view.raw
    risks: list[Risk] = []
    for note in notes:
        # the plain "has auto_map" note of the type resolution is what remote_code says, in detail
        if "unknown" in note or "auto_map" not in note:
            _add(risks, "config_fallback", note=note)
    if raw.get("auto_map"):
        classes = sorted({str(v).split(".")[-1] for v in raw["auto_map"].values()})
        _add(risks, "remote_code", classes=", ".join(classes))
    for note in unknown:
        _add(risks, "unknown_field", note=note)
    _attention_risks(risks, view, attention, kv, state)
    _moe_risks(risks, view, moe, int(view.require("num_hidden_layers")))
    _context_risks(risks, rope, kv, weights_bf16, int(view.require("num_hidden_layers")))
    if cfg(view, "tie_word_embeddings") is True:
        _add(risks, "tied_embeddings")
    if params.shared_layers:
        _add(risks, "shared_layers", what=params.shared_layers)
    qk = re.compile(data()["patterns"]["qk_norm"])
    if any(qk.search(n) for n in param_names):
        _add(risks, "qk_norm")
    caps = [f"{f}={raw[f]}" for f in data()["config_fields"]["softcapping"] if raw.get(f)]
    if caps:
        _add(risks, "softcapping", fields=", ".join(caps))
    _quant_risks(risks, raw)
    mtp = next((raw[f] for f in data()["config_fields"]["mtp_layers"] if raw.get(f)), None)
    if mtp:
        _add(risks, "mtp_layers", count=mtp)
    if ckpt is None or not ckpt.has_weights:
        _add(risks, "no_weights")
    else:
        for note in ckpt.notes:
            rid = note.id if note.id in data()["risks"] else "checkpoint_note"
            risks.append(Risk(id=rid, severity=note.severity, message=note.message))
    if plan.tp > 1 and (attention.num_heads % plan.tp or
                        (attention.num_kv_heads % plan.tp and plan.tp % attention.num_kv_heads)):
        _add(risks, "tp_uneven_heads", tp=plan.tp, heads=attention.num_heads,
             kv_heads=attention.num_kv_heads)
    if not plan.fits:
        _add(risks, "plan_does_not_fit", reason=f"parallel plan does not fit: {plan.reason}")
    return risks


def _attention_risks(risks, view, attention, kv, state) -> None:
    layers = int(view.require("num_hidden_layers"))
    if attention.kind == "mla":
        _add(risks, "mla", kv_lora_rank=attention.kv_lora_rank, q_lora_rank=attention.q_lora_rank,
             rope_dim=attention.qk_rope_head_dim)
        latent = kv["bytes_per_token"]["bfloat16"]
        expanded = mla_expanded_per_token(attention, layers)
        _add(risks, "mla_cache_expanded", expanded=f"{expanded:,}", latent=f"{latent:,}",
             ratio=expanded / latent if latent else 0.0)
    groups = kv.get("per_layer_type") or {}
    if groups.get("sliding"):
        _add(risks, "sliding_window", window=attention.sliding_window,
             sliding=groups["sliding"]["layers"], layers=layers)
    if groups.get("chunked"):
        _add(risks, "chunked_attention", chunk=attention.chunk_size,
             chunked=groups["chunked"]["layers"], layers=layers)
    if kv["layers"]["stateful"]:
        kinds = sorted(k for k in attention.layer_types
                       if k not in ("full_attention", "sliding_attention", "chunked_attention"))
        size = state.bytes_per_sequence if state else None
        _add(risks, "linear_attention", count=kv["layers"]["stateful"], layers=layers,
             kinds=", ".join(kinds) or "state-space", state=(f"{size['bfloat16']:,} B" if size
                                                             else "unknown"))


def _moe_risks(risks, view, moe, layers: int) -> None:
    if moe is None:
        return
    _add(risks, "moe", num_experts=moe.num_experts, k=moe.experts_per_token,
         shared=moe.shared_experts, moe_layers=moe.moe_layers, layers=layers)
    if moe.routed_params == 0:
        _add(risks, "experts_not_found", num_experts=moe.num_experts)
    if moe.n_group and moe.n_group > 1:
        _add(risks, "moe_grouped_routing", n_group=moe.n_group, topk_group=moe.topk_group,
             topk_method=view.raw.get("topk_method", "n/a"))
    if moe.scoring:
        bias = (" with a learned score-correction bias (noaux_tc)"
                if view.raw.get("topk_method") == "noaux_tc" else "")
        _add(risks, "sigmoid_scoring", scoring=moe.scoring, bias=bias)
    factor = cfg(view, "routed_scaling_factor")
    if factor not in (None, 1, 1.0):
        _add(risks, "routed_scaling", factor=factor)


def _context_risks(risks, rope, kv, weights_bf16: int, layers: int = 0) -> None:
    if rope is not None and len({(s.theta, s.type) for s in rope.per_layer_type.values()}) > 1:
        _add(risks, "rope_per_layer_type", types="; ".join(
            f"{k}: theta {s.theta}, {s.type}" for k, s in rope.per_layer_type.items()))
    if rope is not None and rope.no_rope_layers:
        shown = rope.no_rope_layers[:8]
        _add(risks, "no_rope_layers", count=len(rope.no_rope_layers), layers=layers,
             layer_list=", ".join(map(str, shown)) + (", ..." if len(rope.no_rope_layers) > 8 else ""))
    if rope is not None and rope.type not in ("default", None):
        if rope.type == "yarn":
            mscale = rope.parameters.get("mscale_all_dim", rope.parameters.get("mscale"))
            _add(risks, "rope_yarn", factor=rope.factor, original=rope.original_max_positions,
                 mscale=mscale)
        else:
            _add(risks, "rope_scaling", type=rope.type, factor=rope.factor,
                 original=rope.original_max_positions)
    ctx = kv["max_context"]
    kv_gib = kv["bytes_at_max_context"]["bfloat16"] / GIB
    if ctx >= data()["thresholds"]["very_long_context"]:
        _add(risks, "very_long_context", max_context=ctx, kv_gib=kv_gib)
    if weights_bf16 and kv_gib * GIB > data()["thresholds"]["kv_heavier_than_weights"] * weights_bf16:
        _add(risks, "kv_heavier_than_weights", kv_gib=kv_gib, weights_gib=weights_bf16 / GIB)


def _quant_risks(risks, raw) -> None:
    q = raw.get("quantization_config")
    if not q:
        return
    method = str(q.get("quant_method", "unknown")) if isinstance(q, dict) else "unknown"
    if method == "fp8" or "fp8" in method:
        details = ", ".join(f"{k}={v}" for k, v in sorted(q.items()) if k != "quant_method")
        _add(risks, "fp8_quantization", method=method, details=details or "no details")
    else:
        _add(risks, "quantization", method=method)


__all__ = ["Risk", "collect_risks"]
