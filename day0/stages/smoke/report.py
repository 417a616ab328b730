"""The smoke stage's report hooks: markdown(result, gates), findings(result), tables(result).

They read the result as report.json keeps it (a dict), never import the engine client, and
render an older or foreign result as best they can.
"""

from __future__ import annotations

from day0.rendering.tables import cell, table

MISMATCH_ROWS = 20  # mismatch rows shown per table in report.md (all are in report.json)


def _result(passed) -> str:
    return "n/a" if passed is None else ("PASS" if passed else "**FAIL**")


def _mismatch_rows(mismatches: list[dict]) -> list[list]:
    return [[m.get("case"), m.get("index"), m.get("engine_id"), m.get("checkpoint_id"),
             f"{m.get('engine_len')} / {m.get('checkpoint_len')}",
             m.get("error") or m.get("preview")] for m in mismatches[:MISMATCH_ROWS]]


MISMATCH_HEAD = ["case", "first diff", "engine id", "checkpoint id", "lengths (engine / ckpt)",
                 "text or error"]


def check_rows(result: dict) -> list[dict]:
    return [{"check": c.get("name"), "family": c.get("family"), "result": _result(c.get("passed")),
             "detail": c.get("detail", "")} for c in result.get("checks") or []]


def markdown(result: dict, gates: list | None = None) -> str:
    """report.md's smoke section: the summary, every check, the parity mismatches."""
    checks = result.get("checks") or []
    if not checks:
        return ""
    failed = sum(c.get("passed") is False for c in checks)
    na = sum(c.get("passed") is None for c in checks)
    parts = ["## Smoke: the engine's API against the checkpoint\n",
             f"- engine: `{result.get('base_url')}` serving `{result.get('served_name')}`",
             f"- checks: {len(checks) - na} run, **{failed} failed**, {na} not applicable; "
             f"{result.get('wall_s')} s"]
    tok, chat = result.get("tokenizer") or {}, result.get("chat_template") or {}
    if tok:
        parts.append(f"- tokenizer parity: {len(tok.get('mismatches') or [])} of "
                     f"{tok.get('cases')} texts differ (via {tok.get('via')})")
    if chat:
        parts.append(f"- chat-template parity: {len(chat.get('mismatches') or [])} of "
                     f"{chat.get('conversations')} conversations differ (via {chat.get('via')})"
                     if chat.get("applicable") else f"- chat-template parity: not applicable: "
                                                    f"{chat.get('note')}")
    if over := result.get("overlong"):
        parts.append(f"- over-long prompt: {over.get('prompt_tokens')} tokens > max_model_len "
                     f"{over.get('max_model_len')}: HTTP {over.get('status')}, healthy after: "
                     f"{over.get('healthy_after')}")
    if conc := result.get("concurrency"):
        parts.append(f"- concurrency: {conc.get('requests', 0) - conc.get('failed', 0)}/"
                     f"{conc.get('requests')} succeeded in {conc.get('seconds')} s")
    parts += [f"- note: {n}" for n in result.get("notes") or []]
    if gates:
        rows = [[_get(g, "id"), _get(g, "metric"), _get(g, "observed"),
                 f"{_get(g, 'op')} {_get(g, 'threshold')}", _get(g, "reason")]
                for g in gates if str(_get(g, "metric") or "").startswith("smoke.")]
        if rows:
            parts += ["", "### Smoke gates\n",
                      table(["gate", "metric", "observed", "bound", "result"], rows)]
    parts += ["", "### Checks\n", table(["check", "family", "result", "detail"],
                                         [list(r.values()) for r in check_rows(result)])]
    if tok.get("mismatches"):
        parts += ["### Tokenizer mismatches\n", table(MISMATCH_HEAD,
                                                        _mismatch_rows(tok["mismatches"]))]
    if chat.get("mismatches"):
        parts += ["### Chat-template mismatches\n", table(MISMATCH_HEAD,
                                                            _mismatch_rows(chat["mismatches"]))]
    return "\n".join(parts) + "\n"


def _get(gate, key):
    return getattr(gate, key) if hasattr(gate, key) else (gate or {}).get(key)


def findings(result: dict) -> list[str]:
    """One line per failed check (and one per family not applicable, so it is never mistaken
    for a pass)."""
    lines = [" ".join(f"smoke: {c.get('name')} failed: {c.get('detail', '')}".split())
             for c in result.get("checks") or [] if c.get("passed") is False]
    chat = result.get("chat_template") or {}
    if chat and not chat.get("applicable", True):
        lines.append(f"smoke: chat checks not applicable: {chat.get('note')}")
    return lines


def tables(result: dict) -> dict:
    """Prefect table artifacts: every check with its result."""
    rows = check_rows(result)
    return {"day0-smoke-checks": ("Smoke checks of the engine against the checkpoint", rows)} \
        if rows else {}


__all__ = ["markdown", "findings", "tables", "check_rows"]
