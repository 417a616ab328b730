"""The performance part of report.md, its tables, plots, per-request file and findings (from
the result as JSON)."""

from __future__ import annotations

import json

from day0.rendering.tables import cell, notes_and_findings, table

HEAD = ["run", "requests", "failed", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "ITL p99 ms",
        "E2EL p99 ms", "req/s", "out tok/s", "goodput"]


KERNEL_HEAD = ["run", "batch", "prompt tokens", "decode steps", "repeats", "prefill tok/s",
               "decode ms/token", "prefill ms p50/p90"]


def _kernel(result: dict) -> bool:
    return any(r.get("batch") is not None for r in result.get("runs", []))


def _kernel_rows(result: dict) -> list[list]:
    return [[r["run"], r["batch"], r["prompt_tokens"], r["decode_steps"], r["requests"],
             cell(r["prefill_tokens_per_s"]), cell(r["decode_ms_per_token"]),
             f"{cell(r['ttft_p50_ms'])} / {cell(r['ttft_p90_ms'])}"]
            for r in result.get("runs", [])]


def _rows(result: dict) -> list[list]:
    if _kernel(result):
        return _kernel_rows(result)
    rows = []
    for r in result.get("runs", []):
        if r.get("error"):
            rows.append([r["run"], r["requests"], "-", f"not measured: {r['error']}", "", "", "",
                         "", "", ""])
            continue
        flag = " (client-bound)" if r.get("client_bound") else ""
        rows.append([r["run"] + flag, r["requests"], r["failed"],
                     f"{cell(r['ttft_p50_ms'])} / {cell(r['ttft_p99_ms'])}",
                     f"{cell(r['tpot_p50_ms'])} / {cell(r['tpot_p99_ms'])}",
                     cell(r["itl_p99_ms"]), cell(r["e2el_p99_ms"]),
                     cell(r["request_throughput"]), cell(r["output_throughput"]),
                     cell(r.get("goodput_fraction"))])
    return rows


def markdown(result: dict, gates: list | None = None) -> str:
    try:
        head = KERNEL_HEAD if _kernel(result) else HEAD
        lines = ["## Performance", "",
                 f"Load generator: {result['load_generator']} against {result['endpoint']} "
                 f"(context {result['context']} tokens). Definitions: {result['definitions']}. "
                 f"Per-request figures: performance/requests.jsonl next to report.json.", "",
                 table(head, _rows(result))]
        lines += ["", *notes_and_findings(result.get("notes", []), findings(result))]
        return "\n".join(lines) + "\n"
    except (KeyError, TypeError):
        return ""


def tables(result: dict) -> dict:
    if _kernel(result):
        rows = [dict(zip(KERNEL_HEAD, row)) for row in _rows(result)]
        return {"performance": ("Kernel profile per workload and batch: prefill tokens/s, "
                                "decode ms/token", rows)} if rows else {}
    rows = [dict(zip(HEAD, row)) for row in _rows(result)]
    return {"performance": ("Per workload and load level: vLLM's latency percentiles and "
                            "throughput", rows)} if rows else {}


def findings(result: dict) -> list[str]:
    out = []
    for r in result.get("runs", []):
        if r.get("error"):
            out.append(f"performance: {r['run']}: not measured ({r['error']})")
        elif r.get("failed"):
            out.append(f"performance: {r['run']}: {r['failed']} of {r['requests']} requests "
                       "failed")
        if r.get("empty"):
            out.append(f"performance: {r['run']}: {r['empty']} requests returned no tokens")
        if r.get("length_mismatches"):
            out.append(f"performance: {r['run']}: {r['length_mismatches']} requests' token "
                       "counts differ from the trace")
    return out


def files(result: dict) -> dict[str, bytes]:
    requests = result.get("requests") or []
    if not requests:
        return {}
    return {"performance/requests.jsonl":
            "".join(json.dumps(r) + "\n" for r in requests).encode()}


def evidence(result: dict) -> dict:
    """report.json keeps the runs and each request's TTFT and E2EL (the plots' latency CDFs);
    the inter-token gaps stay in performance/requests.jsonl."""
    return {**result, "requests": [{k: v for k, v in r.items() if k != "itl_ms"}
                                   for r in result.get("requests") or []]}


def plots(result: dict) -> dict[str, bytes]:
    """Latency CDFs per workload (TTFT and E2EL, one line per level), TTFT/TPOT p99 against
    the level."""
    from day0.rendering import plots as drawing

    requests = result.get("requests") or []
    runs = [r for r in result.get("runs", []) if not r.get("error")]
    if not requests or not runs:
        return {}
    if _kernel(result):
        return _kernel_plots(runs)
    out = {}
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    fig = drawing.figure(width=4.0 * len(workloads), height=3.6)
    axes = fig.subplots(1, len(workloads), squeeze=False)[0]
    for ax, name in zip(axes, workloads):
        for run in (r for r in runs if r["workload"] == name):
            for key, style in (("ttft_ms", "-"), ("e2el_ms", "--")):
                values = sorted(q[key] for q in requests
                                if q["run"] == run["run"] and q.get(key) is not None)
                if values:
                    ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], style,
                            label=f"{run['level']} {key.split('_')[0].upper()}")
        ax.set_title(name)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.legend(fontsize=7)
    out["latency-cdf"] = drawing.png(fig)
    fig = drawing.figure(width=7.5, height=3.6)
    left, right = fig.subplots(1, 2)
    for name in workloads:
        mine = [r for r in runs if r["workload"] == name]
        x = [r["level"] for r in mine]
        left.plot(x, [drawing.number(r["ttft_p99_ms"]) for r in mine], "o-", label=name)
        right.plot(x, [drawing.number(r["tpot_p99_ms"]) for r in mine], "o-", label=name)
    left.set_title("TTFT p99 (ms) by load level")
    right.set_title("TPOT p99 (ms) by load level")
    left.legend(fontsize=7)
    out["latency-by-level"] = drawing.png(fig)
    return out


def _kernel_plots(runs: list[dict]) -> dict[str, bytes]:
    """Prefill tokens/s and decode ms/token against the batch size, one line per workload."""
    from day0.rendering import plots as drawing

    fig = drawing.figure(width=7.5, height=3.6)
    left, right = fig.subplots(1, 2)
    for name in dict.fromkeys(r["workload"] for r in runs):
        mine = [r for r in runs if r["workload"] == name]
        x = [r["batch"] for r in mine]
        left.plot(x, [drawing.number(r["prefill_tokens_per_s"]) for r in mine], "o-", label=name)
        right.plot(x, [drawing.number(r["decode_ms_per_token"]) for r in mine], "o-", label=name)
    left.set_title("prefill tokens/s by batch")
    right.set_title("decode ms/token by batch")
    left.set_xlabel("batch")
    right.set_xlabel("batch")
    left.legend(fontsize=7)
    return {"kernel-by-batch": drawing.png(fig)}
