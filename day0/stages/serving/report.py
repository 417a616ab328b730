"""report.md section and one-line findings of the serving stage (from its result as JSON)."""

from __future__ import annotations


def _num(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):  # NaN/inf as JSON keeps them
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def markdown(result: dict, gates: list | None = None) -> str:
    """The prompt set, batching, and one row per variant."""
    try:
        plan, batching = result["plan"], result["batching"]
        agree = batching["agreement"]
        lines = [
            "## Serving features",
            "",
            f"{plan['count']} prompts of {plan['shortest']}-{plan['longest']} tokens (shared "
            f"prefix {plan['shared_prefix']}), {plan['new_tokens']} greedy tokens, "
            f"top-{result['top_k']} logprobs; tolerance max |Δlogprob| <= "
            f"{_num(result['tolerance'])}. Repeat of the baseline: max |Δlogprob| "
            f"{_num(result['repeat']['max_logprob_diff'])}, "
            f"{result['repeat']['not_close']} not close.",
            "",
            "| check | features | result | not close | diverged (near tie) | max \\|Δlogprob\\| "
            "| prefix-cache hits | prompts over budget |",
            "|---|---|---|---|---|---|---|---|",
            f"| batching ({batching['concurrency']} at once, max {batching['max_in_flight']} "
            f"in flight) | continuous batching | {'PASS' if batching['passed'] else 'FAIL'} "
            f"| {agree['not_close']} | {agree['diverged']} | {_num(agree['max_logprob_diff'])} "
            "| - | - |",
        ]
        for row in result.get("variants", []):
            lines.append(
                f"| {row['name']} (`{' '.join(row['args'])}`) | {', '.join(row['features']) or '-'} "
                f"| {'PASS' if row['passed'] else 'FAIL'} | {row['not_close']} "
                f"| {sum(p['diverged'] for p in row['passes'])} | {_num(row['max_logprob_diff'])} "
                f"| {_num(row.get('prefix_cache_hits'))} "
                f"| {_num(row.get('prompts_over_budget'))} |")
        problems = findings(result)
        if problems:
            lines += ["", *[f"- {p}" for p in problems]]
        if result.get("notes"):
            lines += ["", *[f"- note: {n}" for n in result["notes"]]]
        return "\n".join(lines) + "\n"
    except (KeyError, TypeError):  # an older or foreign result: the report still renders
        return ""


def findings(result: dict) -> list[str]:
    """A line per failed check."""
    out: list[str] = []
    batching = result.get("batching") or {}
    for reason in batching.get("reasons", []):
        out.append(f"serving: batching: {reason}")
    for row in result.get("variants", []):
        for reason in row.get("reasons", []):
            out.append(f"serving: variant {row.get('name')}: {reason}")
    return out


__all__ = ["markdown", "findings"]
