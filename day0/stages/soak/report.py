"""The soak part of report.md, its tables, plots and findings (from the result as JSON)."""

from __future__ import annotations

from day0.rendering.tables import cell, notes_and_findings, table


def _trend(t: dict | None, unit: str) -> str:
    if not t or t.get("slope_per_h") is None:
        return "not enough samples"
    return (f"{cell(t['slope_per_h'])} {unit}/h [{cell(t['low_per_h'])}, "
            f"{cell(t['high_per_h'])}] over {t['points']} points")


def markdown(result: dict, gates: list | None = None) -> str:
    try:
        status = (f"**interrupted**: {result['interrupted']} (the figures are what was "
                  "measured until then)" if result.get("interrupted") else "completed")
        lines = ["## Soak", "",
                 f"{result['workload']} at {result['concurrency']} in flight for "
                 f"{cell(result['elapsed_s'])} s of {cell(result['planned_s'])} s: {status}; "
                 f"{len(result['windows'])} load windows ({result['load_generator']}). Memory: "
                 f"{result['memory_source']}.", "",
                 f"- RSS trend after warm-up: {_trend(result.get('rss_trend'), 'MiB')}",
                 f"- USS trend: {_trend(result.get('uss_trend'), 'MiB')}",
                 f"- median end-to-end latency drift: {_trend(result.get('latency_trend'), '%')}",
                 f"- output throughput trend: {_trend(result.get('throughput_trend'), 'tok/s')}",
                 ""]
        if result.get("boundaries"):
            lines += [table(["boundary", "prompt", "max tokens", "expected", "HTTP", "result"],
                            [[b["name"], b["prompt_tokens"], b["max_tokens"], b["expect"],
                              b["status"], "ok" if b["passed"] else f"FAIL {b['detail']}"]
                             for b in result["boundaries"]]), ""]
        changed = [p for p in result.get("probes", []) if p["changed"]]
        lines.append(f"Probes before/after: {len(result.get('probes', [])) - len(changed)} of "
                     f"{len(result.get('probes', []))} unchanged.")
        lines += ["", *notes_and_findings(result.get("notes", []), findings(result))]
        return "\n".join(lines) + "\n"
    except (KeyError, TypeError):
        return ""


def tables(result: dict) -> dict:
    rows = [{"window": w["window"], "start s": w["start_s"], "requests": w["requests"],
             "failed": w["failed"], "TTFT p50/p99 ms": f"{cell(w['ttft_p50_ms'])} / "
             f"{cell(w['ttft_p99_ms'])}", "out tok/s": cell(w["output_throughput"])}
            for w in result.get("windows", [])]
    return {"soak": ("Load windows of the soak", rows)} if rows else {}


def findings(result: dict) -> list[str]:
    out = []
    if result.get("interrupted"):
        out.append(f"soak: interrupted: {result['interrupted']}")
    failed = sum(w["failed"] for w in result.get("windows", []))
    if failed:
        out.append(f"soak: {failed} requests failed")
    for b in result.get("boundaries", []):
        if not b["passed"]:
            out.append(f"soak: boundary '{b['name']}': {b['detail']}")
    changed = [p["index"] for p in result.get("probes", []) if p["changed"]]
    if changed:
        out.append(f"soak: greedy probes {changed} changed after the soak")
    if not result.get("healthy_after", True):
        out.append("soak: the engine did not answer after the soak")
    return out


def plots(result: dict) -> dict[str, bytes]:
    """Memory over time with its fitted slope; latency and throughput per window."""
    from day0.rendering import plots as drawing

    samples = result.get("samples") or []
    windows = [w for w in result.get("windows", []) if not w.get("error")]
    if not samples and not windows:
        return {}
    fig = drawing.figure(width=7.5, height=6.0)
    top, mid, low = fig.subplots(3, 1)
    t = [s["t_s"] for s in samples]
    rss = [drawing.number(s["rss_mb"]) for s in samples]
    top.plot(t, rss, ".", markersize=3, label="RSS")
    trend = result.get("rss_trend") or {}
    if trend.get("slope_per_h") is not None and samples:
        fitted_at = [x for x, y in zip(t, rss) if y == y]
        if fitted_at:
            mid_t = fitted_at[len(fitted_at) // 2]
            mid_y = sorted(y for y in rss if y == y)[len(fitted_at) // 2]
            top.plot(fitted_at, [mid_y + trend["slope_per_h"] * (x - mid_t) / 3600
                                 for x in fitted_at], "-",
                     label=f"slope {trend['slope_per_h']:.3g} MiB/h")
    top.set_ylabel("MiB")
    top.legend(fontsize=7)
    top.set_title("Engine memory")
    x = [(w["start_s"] + w["end_s"]) / 2 for w in windows]
    mid.plot(x, [drawing.number(w["ttft_p50_ms"]) for w in windows], "o-", label="TTFT p50")
    mid.plot(x, [drawing.number(w["ttft_p99_ms"]) for w in windows], "o-", label="TTFT p99")
    mid.set_ylabel("ms")
    mid.legend(fontsize=7)
    low.plot(x, [drawing.number(w["output_throughput"]) for w in windows], "o-")
    low.set_ylabel("output tok/s")
    low.set_xlabel("seconds")
    return {"over-time": drawing.png(fig)}
