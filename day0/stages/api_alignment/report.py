"""The api_alignment part of report.md, its findings and tables (from the result as JSON)."""

from __future__ import annotations

from day0.rendering.tables import cell, table

KL_DEFINITION = (
    "truncated KL over a top-k set: per position, with S the side's own top-k tokens (the "
    "engine: the tokens it returns with rank <= k, k = the prompt_logprobs requested, capped by "
    "the engine's max_logprobs; the control: its k most likely tokens), the reference and the "
    "side are both renormalized over S and KL_S(ref || side) = sum over t in S of "
    "p_S(t) (log p_S(t) - log side_S(t)). It sees neither the mass outside S nor a constant "
    "shift of the side's logprobs (the perplexity, from the actual token's logprob, does).")

DEFINITIONS = """\
How to read these numbers (all against the reference: the checkpoint in float32, in process):
- *engine*: the serving engine through its OpenAI-compatible API (token ids in, \
`prompt_logprobs` out); *control*: the same transformers implementation at the target's \
dtype on the reference device, a known-good port.
- *scored positions*: every position of every window past its first `context_tokens`, with \
a next token; windows are `max_model_len - 1` long (the prompt leaves room for one token).
- *KL (top-k)*: {kl}
- *top-1 agreement*: the reference's argmax is among the side's rank-1 tokens (ties count).
- *perplexity*: exp(mean NLL of the actual next token); the engine's NLL is minus its \
returned logprob of that token.
- *ratio* = engine / control (control floored); *low*: its one-sided 95 % lower bound from a \
paired block bootstrap over positions. Relative gates read *low*.
- *generation*: greedy (temperature 0, EOS ignored) from prompts of the text; *close* as \
vLLM's check_logprobs_close: equal up to the first difference, where each token is in the \
other side's top-k.
""".format(kl=KL_DEFINITION)


def _comparison(a: dict, name: str) -> dict:
    return next((c for c in a.get("comparisons") or [] if c.get("metric") == name), {})


def markdown(a: dict, gates: list | None = None) -> str:
    """report.md's api_alignment section."""
    if not a or "comparisons" not in a:
        return ""
    parts = ["## API alignment: engine vs control vs reference\n",
             f"- target: {a.get('target')}; engine: {a.get('engine')} "
             f"({cell(a.get('engine_fingerprint'))}); control: {a.get('control')}",
             f"- text: `{a.get('text_file')}` ({cell(a.get('text_tokens'))} tokens); "
             f"{cell(a.get('windows'))} window(s) of {cell(a.get('seq_len'))} positions "
             f"(max_model_len {cell(a.get('max_model_len'))}), first {cell(a.get('context_tokens'))} "
             f"context only; {cell(a.get('positions'))} scored positions; top-k {cell(a.get('top_k'))}"
             f", reference mass inside the engine's top-k {cell(a.get('topk_reference_mass'))}",
             f"- non-finite logprobs from the engine: {cell(a.get('nonfinite'))}"]
    parts += [f"- note: {n}" for n in a.get("notes") or []]
    parts += ["", DEFINITIONS, "### Paired comparisons\n", table(
        ["statistic", "engine", "control", "ratio", "low", "high", "positions"],
        [[c.get("metric"), c.get("target"), c.get("control"), c.get("ratio"), c.get("low"),
          c.get("high"), c.get("positions")] for c in a.get("comparisons") or []])]
    parts += ["### Against the reference\n", table(
        ["side", "KL top-k mean", "KL top-k p99", "top-1 agreement", "perplexity",
         "perplexity rel. delta"],
        [["engine", a.get("kl_topk_mean"), a.get("kl_topk_p99"), a.get("top1_agreement"),
          a.get("perplexity_engine"), a.get("perplexity_rel_delta")],
         ["control", a.get("control_kl_topk_mean"), a.get("control_kl_topk_p99"),
          a.get("control_top1_agreement"), a.get("perplexity_control"),
          a.get("control_perplexity_rel_delta")],
         ["reference", 0.0, 0.0, 1.0, a.get("perplexity_reference"), 0.0]])]
    parts += ["### KL (top-k) by position bucket\n", table(
        ["bucket", "positions", "n", "engine KL", "control KL", "ratio", "low", "engine top-1",
         "control top-1"],
        [[b.get("bucket"), f"{b.get('start')}-{(b.get('end') or 1) - 1}", b.get("positions"),
          b.get("kl_topk_mean"), b.get("control_kl_topk_mean"), b.get("kl_topk_ratio"),
          b.get("kl_topk_ratio_low"), b.get("top1_agreement"), b.get("control_top1_agreement")]
         for b in a.get("buckets") or []])]
    if a.get("generation"):
        parts += ["### Greedy generation\n", generation_table(a)]
    return "\n".join(parts)


def generation_table(a: dict) -> str:
    return table(["prompt at", "close", "first difference", "control close", "reference",
                   "engine", "why"],
                  [[g.get("prompt_start"), g.get("close"), g.get("first_difference"),
                    g.get("control_close"), (g.get("reference_text") or "")[:60],
                    (g.get("engine_text") or "")[:60], g.get("why") or ""]
                   for g in a.get("generation") or []])


def findings(a: dict) -> list[str]:
    """One-line findings: the engine's logprobs far from the control's, non-finite values,
    greedy continuations that are not close."""
    out = []
    if isinstance(a.get("nonfinite"), (int, float)) and a["nonfinite"] > 0:
        out.append(f"the engine returned {a['nonfinite']} non-finite logprobs")
    kl = _comparison(a, "kl_topk")
    if isinstance(kl.get("low"), (int, float)) and kl["low"] > 2.0:
        worst = max((b for b in a.get("buckets") or []
                     if isinstance(b.get("kl_topk_ratio_low"), (int, float))),
                    key=lambda b: b["kl_topk_ratio_low"], default={})
        out.append(f"engine top-k KL is {cell(kl.get('ratio'), 3)}x the control's (at least "
                   f"{cell(kl['low'], 3)}x); worst positions {worst.get('start')}-"
                   f"{(worst.get('end') or 1) - 1} ({cell(worst.get('kl_topk_ratio'), 3)}x)")
    bad = [g for g in a.get("generation") or [] if not g.get("close")]
    if bad:
        out.append(f"{len(bad)} of {len(a['generation'])} greedy continuations not close to "
                   f"the reference's; first: {bad[0].get('why')}")
    return out


def tables(a: dict) -> dict:
    """Prefect table artifacts: KL (top-k) per position bucket."""
    rows = [{"positions": f"{b.get('start')}-{(b.get('end') or 1) - 1}",
             "engine KL": cell(b.get("kl_topk_mean"), 6),
             "control KL": cell(b.get("control_kl_topk_mean"), 6),
             "ratio": cell(b.get("kl_topk_ratio")), "ratio low": cell(b.get("kl_topk_ratio_low")),
             "engine top-1": cell(b.get("top1_agreement")),
             "control top-1": cell(b.get("control_top1_agreement"))}
            for b in a.get("buckets") or []]
    return {"day0-api-kl-buckets": ("Truncated KL (engine top-k) to the reference per position "
                                    "bucket, engine vs control", rows)} if rows else {}


def evidence(a: dict) -> dict:
    return dict(a)


__all__ = ["markdown", "findings", "tables", "evidence", "KL_DEFINITION", "DEFINITIONS"]
