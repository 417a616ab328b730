"""The alignment part of report.md: target vs control vs reference, with every piece of evidence
the gates read (windows, text, per-bucket KL, per-layer ratios, generation, per-op table)."""

from __future__ import annotations

from day0.rendering.tables import cell, table


DEFINITIONS = """\
How to read these numbers (every figure is against the reference: float32 on the reference device):
- *scored positions*: every position of every window except its first `context_tokens` (the start \
token and the context after it); all KL, top-1 and perplexity figures are over this one \
population (`positions` above), pooled across windows.
- *KL*: per scored position, KL(reference || x) of the next-token distributions over the whole \
vocabulary, in nats; x is the target or the control.
- `kl_mean`: the mean of those per-position KLs; `kl_p99`: their 99th percentile (linear \
interpolation); `kl_max`: the largest one. KL is heavy-tailed: when fewer than 1 % of the \
positions carry most of it, `kl_p99` sits below the mean (the mean is pulled up by positions \
above the 99th percentile); compare `kl_max`.
- *bucket*: the positions of a window cut into equal ranges; a bucket's KL is the mean over its \
scored positions in every window; `kl_max_bucket` is the largest bucket mean.
- *top-1 agreement*: the share of scored positions whose argmax token equals the reference's; \
*perplexity*: exp(mean NLL of the next token) over the scored positions that have one.
- *control*: the same implementation at the target's dtype on the reference device, no plugins: \
what a correct port costs. *ratio* = target / control (control floored at its noise level); \
*low*/*high*: its one-sided 95 % confidence bounds from a paired block bootstrap over \
positions. Relative gates read *low*.
- *layer error*: ||x - reference|| / ||reference|| of a decoder layer's output, per position, \
then averaged. A layer *diverges* when its target/control error ratio's lower bound in its worst \
bucket exceeds the claim's layer *bound* (or it produces non-finite values); `layers-aligned` \
counts those layers, the *first divergent layer* is the lowest of them.
"""


def _comparison(a: dict, name: str) -> dict:
    return next((c for c in a.get("comparisons") or [] if c.get("metric") == name), {})


def _worst_layer(a: dict) -> dict:
    layers = a.get("layers") or [{}]
    return max(layers, key=lambda r: r.get("ratio_low") if isinstance(r.get("ratio_low"), float)
               else float("inf"))


def _worst_bucket(a: dict) -> dict:
    buckets = [b for b in a.get("buckets") or [] if b.get("kl_ratio_low") is not None]
    return max(buckets, key=lambda b: b["kl_ratio_low"] if isinstance(b["kl_ratio_low"], float)
               else float("inf")) if buckets else {}


def _diverged(a: dict) -> str:
    return ", ".join(str(r.get("layer")) for r in a.get("layers") or [] if r.get("diverged"))


def _mean(values: list) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None


# What each alignment metric is, on each side: (what, target, control, reference).
SIDES = {
    "alignment.vs_control.kl_mean_ratio_low": lambda a: (
        "mean KL to the reference", _comparison(a, "kl_mean").get("target"),
        _comparison(a, "kl_mean").get("control"), 0.0),
    "alignment.vs_control.kl_bucket_ratio_low": lambda a: (
        f"mean KL, worst bucket ({_worst_bucket(a).get('start')}-"
        f"{(_worst_bucket(a).get('end') or 1) - 1})", _worst_bucket(a).get("kl_mean"),
        _worst_bucket(a).get("control_kl_mean"), 0.0),
    "alignment.vs_control.top1_disagreement_ratio_low": lambda a: (
        "top-1 disagreement", _comparison(a, "top1_disagreement").get("target"),
        _comparison(a, "top1_disagreement").get("control"), 0.0),
    "alignment.vs_control.perplexity_ratio_low": lambda a: (
        "perplexity", a.get("perplexity_target"), a.get("perplexity_control"),
        a.get("perplexity_reference")),
    "alignment.vs_control.expert_disagreement_ratio_low": lambda a: (
        "expert-set disagreement", _comparison(a, "expert_disagreement").get("target"),
        _comparison(a, "expert_disagreement").get("control"), 0.0),
    "alignment.layers.diverged": lambda a: (
        f"layers diverged: {_diverged(a) or 'none'}; relative error of the worst layer "
        f"({_worst_layer(a).get('layer')})",
        _worst_layer(a).get("rel_error"), _worst_layer(a).get("control_rel_error"), 0.0),
    "alignment.logits.kl_mean": lambda a: (
        "mean KL to the reference", a.get("kl_mean"), a.get("control_kl_mean"), 0.0),
    "alignment.logits.top1_agreement": lambda a: (
        "top-1 agreement", a.get("top1_agreement"), a.get("control_top1_agreement"), 1.0),
    "alignment.moe.expert_agreement": lambda a: (
        "expert-set Jaccard", a.get("expert_agreement"), a.get("control_expert_agreement"), 1.0),
    "alignment.generation.token_match_rate": lambda a: (
        "greedy tokens equal to the reference's",
        _mean([g.get("match_rate") for g in a.get("generation") or []]),
        _mean([g.get("control_match_rate") for g in a.get("generation") or []]), 1.0),
    "alignment.perplexity.rel_delta": lambda a: (
        "perplexity", a.get("perplexity_target"), a.get("perplexity_control"),
        a.get("perplexity_reference")),
}


def gate_sides(a: dict, gates: list) -> str:
    """Each alignment gate with the quantity behind it on the target, control and reference."""
    rows = []
    for g in gates:
        metric = g.metric if hasattr(g, "metric") else g["metric"]
        if metric in SIDES and a.get("layers") is not None:
            what, t, c, r = SIDES[metric](a)
            gid = g.id if hasattr(g, "id") else g["id"]
            rows.append([gid, what, t, c, r])
    return table(["gate", "quantity", "target", "control", "reference"], rows)


def markdown(a: dict, gates: list | None = None) -> str:
    """report.md's alignment section."""
    if not a or "layers" not in a:
        return ""
    parts = ["## Alignment: target vs control vs reference\n", first_divergent_layer_line(a)]
    max_pos = a.get("max_position_embeddings")
    parts += [
        f"- target: {a.get('target')}, claim **{a.get('claim', 'faithful')}**; control: "
        f"{a.get('control')}" + (" (the target *is* the control: relative gates compare it with "
                                 "itself; absolute bounds decide)" if a.get("target_is_control")
                                 else ""),
        f"- text: `{a.get('text_file')}` ({cell(a.get('text_tokens'))} tokens); "
        f"{cell(a.get('windows'))} window(s) of {cell(a.get('seq_len'))} positions, start token "
        f"{cell(a.get('prefix_token'))}, first {cell(a.get('context_tokens'))} positions context only; "
        f"{cell(a.get('positions'))} scored positions",
        f"- coverage: {cell(a.get('covered_fraction'))} of the trained context {cell(max_pos)}",
        f"- layers diverged: {_diverged(a) or 'none'}",
    ]
    parts += [f"- note: {n}" for n in a.get("notes") or []]
    parts += ["", DEFINITIONS]
    if gates:
        parts += ["### Alignment gates: target vs control vs reference\n", gate_sides(a, gates)]
    rows = [[c.get("metric"), c.get("target"), c.get("control"), c.get("ratio"), c.get("low"), c.get("high"),
             c.get("positions")] for c in a.get("comparisons") or []]
    parts += ["### Paired comparisons\n",
              table(["statistic", "target", "control", "ratio", "low", "high", "positions"], rows)]
    parts += ["### Logits against the reference\n", table(
        ["side", "KL mean", "KL p99", "KL max", "top-1 agreement", "perplexity"],
        [["target", a.get("kl_mean"), a.get("kl_p99"), a.get("kl_max"), a.get("top1_agreement"),
          a.get("perplexity_target")],
         ["control", a.get("control_kl_mean"), a.get("control_kl_p99"), a.get("control_kl_max"),
          a.get("control_top1_agreement"), a.get("perplexity_control")],
         ["reference", 0.0, 0.0, 0.0, 1.0, a.get("perplexity_reference")]])]
    parts += ["### KL by position bucket\n", table(
        ["bucket", "positions", "n", "target KL", "control KL", "ratio", "low", "target top-1",
         "control top-1"],
        [[b.get("bucket"), f"{b['start']}-{b['end'] - 1}", b.get("positions"), b.get("kl_mean"),
          b.get("control_kl_mean"), b.get("kl_ratio"), b.get("kl_ratio_low"),
          b.get("top1_agreement"), b.get("control_top1_agreement")] for b in a.get("buckets") or []])]
    parts += ["### Per-layer relative error ||x - reference|| / ||reference||\n",
              "A layer diverges when *low* (worst bucket) exceeds *bound*.\n", table(
        ["layer", "target", "control", "ratio", "low (worst bucket)", "bound", "worst bucket",
         "diverged"],
        [[r.get("layer"), r.get("rel_error"), r.get("control_rel_error"), r.get("ratio"),
          r.get("ratio_low"), r.get("bound"), r.get("worst_bucket"), r.get("diverged")]
         for r in a["layers"]])]
    if a.get("routers"):
        parts += ["### MoE routing (Jaccard of expert sets with the reference)\n", table(
            ["router", "tokens", "target", "exact", "control"],
            [[r.get("router"), r.get("tokens"), r.get("jaccard"), r.get("exact"), r.get("control_jaccard")]
             for r in a["routers"]])]
    if a.get("generation"):
        parts += ["### Greedy generation\n", table(
            ["prompt at", "target match", "control match", "first divergence", "reference",
             "target"],
            [[g.get("prompt_start"), g.get("match_rate"), g.get("control_match_rate"),
              g.get("first_divergence"), (g.get("reference_text") or "")[:80], (g.get("target_text") or "")[:80]]
             for g in a["generation"]])]
    parts += ["### Operator replay\n", a.get("op_check_scope", ""), ""]
    ops = a.get("ops") or []
    bad = [o for o in ops if o.get("status") != "ok"]
    parts.append(f"{len(ops)} ops, {sum(o['status'] == 'ok' for o in ops)} ok, "
                 f"{len(bad)} not ok.\n")
    parts.append(table(["op", "kind", "calls", "status", "max |t-r|", "tolerance ratio",
                         "reason"],
                        [[o.get("op"), o.get("kind"), o.get("calls"), o.get("status"), o.get("max_abs_error"),
                          o.get("tolerance_ratio"), o.get("reason") or ""]
                         for o in bad + [o for o in ops if o.get("status") == "ok"]]))
    return "\n".join(parts)


LAYER_COLUMNS = {"layer": "layer", "rel_error": "target error", "control_rel_error": "control error",
                 "ratio": "ratio", "ratio_low": "ratio low (worst bucket)",
                 "bound": "bound (diverged above)", "diverged": "diverged"}


def layer_rows(a: dict) -> list[dict]:
    """Per-layer table: target and control error against the reference, ratio and its bound;
    its diverged rows are what `alignment.layers.diverged` (gate layers-aligned) counts."""
    first = a.get("first_divergent_layer")
    rows = []
    for row in a.get("layers") or []:
        cells = {label: cell(row.get(key), 6) for key, label in LAYER_COLUMNS.items()}
        if row.get("diverged"):
            cells["diverged"] = "**first divergent**" if row.get("layer") == first else "**yes**"
        rows.append(cells)
    return rows


def findings(a: dict) -> list[str]:
    """One-line findings for the headline and the CLI: the first divergent layer."""
    first = a.get("first_divergent_layer")
    if first is None:
        return []
    row = next((r for r in a.get("layers") or [] if r.get("layer") == first), {})
    return [f"first divergent layer: {first} (target/control error ratio at least "
            f"{cell(row.get('ratio_low'), 3)}, bound {cell(row.get('bound'), 3)}; layers diverged: "
            f"{_diverged(a)})"]


def first_divergent_layer_line(a: dict) -> str:
    return f"- first divergent layer: {cell(a.get('first_divergent_layer'))}"


def evidence(a: dict) -> dict:
    """report.json keeps the whole alignment result: tables, windows, text, comparisons."""
    return dict(a)


__all__ = ["markdown", "layer_rows", "evidence", "findings", "first_divergent_layer_line",
           "gate_sides", "DEFINITIONS"]
