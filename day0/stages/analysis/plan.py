"""A TP/PP/EP parallelism plan for the target's cards, from weights, KV cache and headroom.

Memory per card for tensor-parallel size t and pipeline size p:

* weights / (t x p): attention and dense layers split by TP, routed experts split by EP over
  the same t cards (EP inside the fastest domain, like serving engines' expert parallelism);
* KV cache / p / min(t, kv_heads): KV heads split by TP until each rank has one (then replicated);
  MLA's latent cache cannot be split by heads, so every TP rank holds all of it;
* headroom_fraction x card memory reserved for activations and workspaces.

The smallest power-of-two t inside one domain that fits wins (preferring t that divides the
attention and KV heads); if the whole domain is not enough, PP stages are added across domains,
because PP moves one activation per stage boundary while TP all-reduces twice per layer and EP
all-to-alls k copies of every token per MoE layer.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

GIB = 1024 ** 3


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fits: bool = Field(description="Whether the model, KV and headroom fit on the target's cards.")
    tp: int = Field(description="Tensor-parallel size (inside one domain).")
    pp: int = Field(description="Pipeline stages (across domains).")
    ep: int | None = Field(None, description="Expert-parallel size (MoE only; inside one domain).")
    dp: int = Field(1, description="Replicas on the remaining cards.")
    cards_used: int = Field(description="tp x pp x dp.")
    card_memory_gib: float = Field(description="Memory of one card.")
    cards: int = Field(description="Cards available.")
    cards_per_domain: int = Field(description="Cards sharing the fastest interconnect.")
    weights_dtype: str = Field(description="dtype the weights are planned in.")
    kv_dtype: str = Field(description="dtype of the KV cache.")
    batch: int = Field(description="Sequences at max context the KV cache is sized for.")
    context: int = Field(description="Tokens per sequence.")
    per_card_bytes: dict[str, int] = Field(description="weights, kv, headroom, total, usable, card.")
    traffic_bytes_per_token: dict[str, int] = Field(description=(
        "Bytes each card sends per token, forward pass, bf16 activations: tp all-reduce, "
        "ep all-to-all, pp stage boundaries."))
    heaviest_traffic: str | None = Field(None, description="Dimension with the most traffic.")
    min_cards: int | None = Field(None, description="Cards of this size needed when it does not fit.")
    reason: str | None = Field(None, description="Why it does not fit.")
    rationale: str = Field(description="How the plan was chosen, in words.")


def _powers_of_two(limit: int) -> list[int]:
    return [2 ** i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else [1]


def _per_card(t: int, p: int, weights: int, kv: int, kv_heads: int, mla: bool) -> tuple[int, int]:
    kv_split = 1 if mla else min(t, kv_heads)
    return math.ceil(weights / (t * p)), math.ceil(kv / p / kv_split)


def make_plan(*, weights: int, kv: int, layers: int, moe_layers: int, hidden: int, heads: int,
              kv_heads: int, mla: bool, num_experts: int | None, experts_per_token: int | None,
              card_memory_gib: float, cards: int, cards_per_domain: int, headroom_fraction: float,
              weights_dtype: str, kv_dtype: str, batch: int, context: int) -> Plan:
    card = int(card_memory_gib * GIB)
    headroom = int(card * headroom_fraction)
    usable = card - headroom
    domain = max(1, min(cards_per_domain, cards))
    candidates = _powers_of_two(domain)
    even = [t for t in candidates if heads % t == 0 and (kv_heads % t == 0 or t % kv_heads == 0)]
    ordered = even + [t for t in candidates if t not in even]

    def fits(t, p):
        w, k = _per_card(t, p, weights, kv, kv_heads, mla)
        return w + k <= usable

    choice = next(((t, 1) for t in ordered if fits(t, 1)), None)
    tp_max = max(ordered, key=lambda t: (t in even, t)) if ordered else 1
    if choice is None:
        p_max = max(1, min(cards // tp_max, layers))
        choice = next(((tp_max, p) for p in range(2, p_max + 1) if fits(tp_max, p)), None)
    ok = choice is not None
    t, p = choice or (tp_max, max(1, min(cards // tp_max, layers)))
    w_card, kv_card = _per_card(t, p, weights, kv, kv_heads, mla)
    ep = math.gcd(t, num_experts) if num_experts else None
    dp = max(1, cards // (t * p)) if ok else 1
    traffic = _traffic(t, p, ep, layers, moe_layers, hidden, experts_per_token)
    moving = {k: v for k, v in traffic.items() if v}
    heaviest = max(moving, key=moving.get) if moving else None
    min_cards = reason = None
    per_card = {"weights": w_card, "kv": kv_card, "headroom": headroom,
                "total": w_card + kv_card + headroom, "usable": usable, "card": card}
    if not ok:
        p_need = next((q for q in range(p + 1, layers + 1) if fits(t, q)), None)
        min_cards = t * p_need if p_need else None
        reason = (f"needs {(w_card + kv_card) / GIB:.1f} GiB per card at TP={t} PP={p} but only "
                  f"{usable / GIB:.1f} GiB is usable on a {card_memory_gib:g} GiB card; "
                  + (f"about {min_cards} such cards (TP={t} x PP={p_need}) would fit"
                     if min_cards else "even one layer per pipeline stage does not fit"))
    plan = Plan(fits=ok, tp=t, pp=p, ep=ep, dp=dp, cards_used=t * p * dp, card_memory_gib=card_memory_gib,
                cards=cards, cards_per_domain=cards_per_domain, weights_dtype=weights_dtype,
                kv_dtype=kv_dtype, batch=batch, context=context, per_card_bytes=per_card,
                traffic_bytes_per_token=traffic, heaviest_traffic=heaviest, min_cards=min_cards,
                reason=reason, rationale="")
    plan.rationale = _rationale(plan, weights, kv, even, heads, kv_heads, mla, headroom_fraction)
    return plan


def _traffic(t, p, ep, layers, moe_layers, hidden, k) -> dict[str, int]:
    """Per token, bf16: ring all-reduce sends 2(t-1)/t of the hidden state, twice per layer; EP
    dispatch + combine send k copies of the hidden state, (ep-1)/ep of them off-card; PP sends
    the hidden state once per stage boundary."""
    act = hidden * 2
    tp = round(2 * layers * act * 2 * (t - 1) / t) if t > 1 else 0
    ep_bytes = round(2 * moe_layers * (k or 0) * act * (ep - 1) / ep) if ep and ep > 1 else 0
    return {"tp": tp, "ep": ep_bytes, "pp": (p - 1) * act}


def _rationale(plan: Plan, weights, kv, even, heads, kv_heads, mla, headroom_fraction) -> str:
    pc = plan.per_card_bytes
    parts = [f"{plan.weights_dtype} weights {weights / GIB:.1f} GiB + KV {kv / GIB:.1f} GiB "
             f"({plan.batch} x {plan.context} tokens, {plan.kv_dtype}) + {headroom_fraction:.0%} "
             f"headroom per card."]
    if plan.fits:
        parts.append(f"Smallest TP inside one {plan.cards_per_domain}-card domain that fits: "
                     f"TP={plan.tp}, PP={plan.pp}: {(pc['weights'] + pc['kv']) / GIB:.1f} of "
                     f"{pc['usable'] / GIB:.1f} GiB usable per {plan.card_memory_gib:g} GiB card"
                     + (f"; {plan.dp} replicas on the {plan.cards} cards." if plan.dp > 1 else "."))
    else:
        parts.append(f"Does not fit: {plan.reason}.")
    if plan.tp not in even:
        parts.append(f"TP={plan.tp} does not divide {heads} heads / {kv_heads} KV heads evenly.")
    if mla and plan.tp > 1:
        parts.append("MLA latent KV is replicated on every TP rank.")
    elif plan.tp > kv_heads:
        parts.append(f"TP={plan.tp} > {kv_heads} KV heads: KV heads are replicated.")
    if plan.ep and plan.ep > 1:
        parts.append(f"EP={plan.ep} over the same cards, inside the fastest domain.")
    if plan.pp > 1:
        parts.append(f"PP={plan.pp} stages across domains: only stage-boundary activations cross "
                     "the slower links.")
    if plan.heaviest_traffic:
        t = plan.traffic_bytes_per_token
        parts.append(f"Most traffic: {plan.heaviest_traffic.upper()} "
                     f"({t[plan.heaviest_traffic] / 1024:.0f} KiB/token per card), kept inside one "
                     f"domain" + (f"; PP {t['pp'] / 1024:.0f} KiB/token crosses domains." if t["pp"] else "."))
    else:
        parts.append("One card: no parallel traffic.")
    return " ".join(parts)


__all__ = ["Plan", "make_plan", "GIB"]
