"""The evaluation part of report.md, its tables, plot, per-item files and findings (from the
result as JSON)."""

from __future__ import annotations

import json
import re

from day0.rendering.tables import cell, table

DEFINITIONS = """\
How to read these numbers: both sides answer the same items of the same lm-eval tasks (same \
prompts, n-shot and seeds). *b*: items the reference got right and the target wrong; *c*: the \
reverse. A paired gate tests H1 "the target is worse" per category: exact one-sided McNemar \
(p = P(Binomial(b + c, 1/2) >= b)) on per-item correctness, or a paired bootstrap on the right \
choice's log-probability among the choices; it fails when p < alpha. *MDE*: the smallest drop \
the gate detects with its power at this many items; a gate whose allowed drop is below it \
cannot pass (it would prove nothing). Per-item outputs of both sides: evaluation/<task>.jsonl \
next to report.json.
"""


def evidence(result: dict) -> dict:
    """report.json keeps everything but the per-item lists (those go to evaluation/*.jsonl
    and stages/evaluation.json)."""
    return {k: v for k, v in result.items() if k not in ("items", "paired_items")}


def files(result: dict) -> dict[str, bytes]:
    """evaluation/<task>.jsonl: one line per item with both sides' outputs."""
    out = {}
    for task, rows in (result.get("items") or {}).items():
        safe = re.sub(r"[^A-Za-z0-9_.-]", "-", task).strip(".") or "task"
        out[f"evaluation/{safe}.jsonl"] = "".join(
            json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    return out


def findings(result: dict) -> list[str]:
    worse = [(t["task"], t["b"], t["c"]) for t in result.get("tasks") or [] if t["b"] > t["c"]]
    lines = [f"evaluation: {task} has {b} items the target gets wrong and the reference right "
             f"(and {c} the reverse)" for task, b, c in worse]
    if result.get("reference_source") == "stored":
        lines.append(f"evaluation: reference results reused from {result.get('reference_uri')}")
    return lines


def tables(result: dict) -> dict:
    cats = [{"category": r["category"], "items": r["items"], "reference": cell(r["reference_acc"]),
             "target": cell(r["target_acc"]), "drop": cell(r["drop"]), "b": r["b"], "c": r["c"]}
            for r in result.get("categories") or []]
    flips = [{"task": f["task"], "doc": f["doc_id"], "direction": f["direction"],
              "gold": f["gold"], "reference": f["reference_prediction"],
              "target": f["target_prediction"]}
             for t in result.get("tasks") or [] for f in t.get("flipped") or []]
    out = {"evaluation": ("Capability scores per category, reference vs target (paired)", cats)}
    if flips:
        out["evaluation-flipped"] = ("Items answered differently by reference and target",
                                     flips)
    return out


def markdown(result: dict, gates: list | None = None) -> str:
    if not result or "categories" not in result:
        return ""
    rows = [[r["category"], r["items"], r["reference_acc"], r["target_acc"], r["drop"], r["b"],
             r["c"], r.get("reference_gold_logprob"), r.get("target_gold_logprob")]
            for r in result["categories"]]
    parts = [DEFINITIONS, table(["category", "items", "reference acc", "target acc", "drop",
                                 "b", "c", "ref log p(gold)", "target log p(gold)"], rows)]
    tests = [g for g in gates or [] if (g.get("test") if isinstance(g, dict) else
                                        getattr(g, "test", None))]
    if tests:
        trows = []
        for g in tests:
            g = g if isinstance(g, dict) else g.model_dump()
            t = g["test"]
            trows.append([g["id"], t["n"], t["drop"], f"[{cell(t['ci_low'])}, {cell(t['ci_high'])}]",
                          t["p_value"], t["alpha"], t["mde"], t["allowed_drop"],
                          "pass" if g["passed"] else "FAIL"])
        parts.append("Paired gates:\n\n" + table(
            ["gate", "n", "drop", "CI", "p", "alpha", "MDE", "allowed drop", "result"], trows))
    s = result.get("settings") or {}
    parts.append(
        f"lm-eval {result.get('lm_eval_version')}; target model `{result.get('target_model')}`; "
        f"reference {result.get('reference_source')} ({result.get('reference_uri')}); n-shot "
        f"{s.get('num_fewshot')}; limit {s.get('limit')}; seeds {s.get('seeds')}; batch size "
        f"{s.get('batch_size')}; max length {s.get('max_length')}.\n")
    task_rows = [[t["task"], t["category"], t["items"], t.get("version"), t.get("n_shot"),
                  t["config_hash"], t["reference_score"], t["target_score"], t["b"], t["c"]]
                 for t in result.get("tasks") or []]
    parts.append(table(["task", "category", "items", "version", "n-shot", "config", "reference",
                        "target", "b", "c"], task_rows))
    flips = [[f["task"], f["doc_id"], f["direction"], f["gold"], f["reference_prediction"],
              f["target_prediction"], f["prompt"][-80:]]
             for t in result.get("tasks") or [] for f in t.get("flipped") or []]
    if flips:
        parts.append("Flipped items:\n\n" + table(
            ["task", "doc", "direction", "gold", "reference", "target", "prompt (end)"], flips))
    for note in result.get("notes") or []:
        parts.append(f"- note: {note}\n")
    return "\n".join(parts)


def plots(result: dict) -> dict[str, bytes]:
    """Accuracy per category, reference vs target."""
    from day0.rendering import plots as drawing

    cats = result.get("categories") or []
    if not cats:
        return {}
    fig = drawing.figure()
    ax = fig.add_subplot()
    x = list(range(len(cats)))
    ax.bar([i - 0.2 for i in x], [c["reference_acc"] for c in cats], 0.4, label="reference")
    ax.bar([i + 0.2 for i in x], [c["target_acc"] for c in cats], 0.4, label="target")
    ax.set_xticks(x, [f"{c['category']}\n(n={c['items']})" for c in cats])
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title("Capabilities per category (same items on both sides)")
    ax.legend()
    return {"categories": drawing.png(fig)}
