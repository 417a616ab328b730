"""Calibrate the alignment gates: correct software stacks must PASS, injected faults must FAIL.

For each model, every case runs the alignment stage (day0.stages.alignment.run) at default settings and
judges the alignment gates of gates.yaml with the target's claim. Reference and control are
computed once per text (day0.stages.alignment.KeptSides) and shared by all cases on that text.

* stacks (must PASS): bf16 and fp16 eager, torch.compile bf16 and fp32, bf16 on one thread,
  int8 weights under an `int8` claim; repeated on --repeats different texts (repeat 0: day0's
  built-in text; 1..: sections of the Python language reference from pydoc_data);
* faults (must FAIL, with the gate expected to catch them): tests/plugins/*.py.

Prints one table per model with the deciding gate and its margin (observed / bound: below 1
passes, above 1 fails; for ">=" gates on fractions the disagreement ratio (1-obs)/(1-bound)),
and the false-alarm count over the clean runs. Nothing is asserted: figures only.

    python bench/calibrate.py                     # SmolLM2-135M-Instruct (fetched, cached)
    python bench/calibrate.py --fixtures          # the three bundled fixtures (RoPE, MoE faults)
    python bench/calibrate.py --source DIR --repeats 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PLUGINS = ROOT / "tests" / "plugins"
FIXTURES = ROOT / "tests" / "fixtures"
# Independent text samples for repeats 1..4 (each well over 8192 tokens).
REPEAT_TOPICS = [("specialnames",), ("customization", "typesmapping", "comparisons", "calls", "try"), ("formatstrings", "string-methods"),
                 ("typesseq", "debugger", "attribute-access")]

STACKS = [  # name, dtype, plugins, claim
    ("bf16 eager", "bfloat16", [], "faithful"),
    ("fp16 eager", "float16", [], "faithful"),
    ("bf16 torch.compile", "bfloat16", ["stack_compile"], "faithful"),
    ("fp32 torch.compile", "float32", ["stack_compile"], "faithful"),
    ("bf16 1 thread", "bfloat16", ["stack_threads1"], "faithful"),
    ("int8 weights, int8 claim", "bfloat16", ["int8_weights"], "int8"),
]
FAULTS = [  # name, dtype, plugins, gates expected to fail (any of), moe only
    ("middle layer output x1.05", "bfloat16", ["scale_layer"], ["layers-aligned"], False),
    ("RoPE base -10 %", "bfloat16", ["rope_base_low"], ["kl-vs-control", "layers-aligned"], False),
    ("RMSNorm eps wrong", "bfloat16", ["rmsnorm_eps"], ["kl-vs-control", "layers-aligned"], False),
    ("NaN once", "bfloat16", ["nan_once"], ["no-nonfinite"], False),
    ("int4 weights (faithful claim)", "bfloat16", ["int4_weights"], ["kl-vs-control"], False),
    ("int4 weights at positions >= 75 %", "bfloat16", ["int4_late"], ["kl-far-vs-control"],
     False),
    ("MoE top-1/top-2 expert swap", "bfloat16", ["expert_swap"], ["kl-vs-control"], True),
]


def margin(gate) -> float | None:
    """How far a gate is from its bound: < 1 passes, > 1 fails."""
    obs, bound = gate.observed, gate.threshold
    if obs is None or not math.isfinite(obs):
        return math.inf
    if gate.metric.endswith("perplexity_ratio_low"):  # neutral is 1, not 0
        return max(obs - 1, 0.0) / (bound - 1)
    if gate.op in ("<=", "<"):
        return obs / bound if bound else (math.inf if obs > 0 else 0.0)
    if gate.op in (">=", ">"):
        return (1 - obs) / (1 - bound) if bound < 1 else bound / max(obs, 1e-300)
    return 0.0 if obs == bound else math.inf


def texts(repeats: int, first: Path | None) -> list[tuple[str, Path | None]]:
    """Repeat 0: `first`, or None = the stage's default (heldout.txt in the checkpoint folder,
    else the built-in text); then independent sections of the Python language reference."""
    from pydoc_data.topics import topics

    out: list[tuple[str, Path | None]] = [(first.name if first else "default text", first)]
    folder = Path(tempfile.mkdtemp(prefix="day0-calibrate-"))
    for i, names in enumerate(REPEAT_TOPICS[:max(0, repeats - 1)], start=1):
        path = folder / f"text{i}.txt"
        path.write_text("\n\n".join(topics[n].strip() for n in names if n in topics) + "\n")
        out.append(("+".join(names), path))
    return out


def judge(result, target, gates_file):
    from day0.verdict.gates import GatesFile, evaluate, verdict

    alignment = GatesFile(gates=[g for g in gates_file.gates if g.metric.startswith("alignment.")])
    results = evaluate(alignment, result.metrics(), is_moe=bool(result.routers),
                       claim=target.claim)
    applicable = [r for r in results if r.applicable]
    return verdict(applicable, {}), applicable


def run_case(source, text, kept, name, dtype, plugins, claim, gates_file):
    from day0.stages.alignment.core import Config, run
    from day0.execution.contract import StageInputs
    from day0.execution.targets import Target

    target = Target(name=name.replace(" ", "-"), device="cpu", dtype=dtype, claim=claim,
                    plugins=[str(PLUGINS / f"{p}.py") for p in plugins])
    started = time.monotonic()
    # generation is a warning-only gate; off here because it dominates torch.compile's cost
    # (every decoding shape compiles) and decides no verdict
    result = run(Config(text_file=str(text) if text else None, check_weights=False,
                        generation_prompts=0),
                 StageInputs(source=str(source), target=target), kept=kept)
    seconds = time.monotonic() - started
    verdict, gates = judge(result, target, gates_file)
    return result, verdict, [layer_gate(g, result) for g in gates], seconds


# A quantized deployment judged as if it claimed faithful bf16: on a real model it must fail and
# be localized to the layer where its error departs from the control; on the tiny fixtures its
# error hides below bf16 rounding. Reported, not counted as a fault.
DEPLOYMENTS = [("int8 weights (faithful claim)", "bfloat16", ["int8_weights"])]


def layer_gate(gate, result):
    """layers-aligned counts diverged layers; its margin is the worst layer's ratio bound."""
    if gate.id != "layers-aligned" or not result.layers:
        return gate
    worst = result.metrics()["alignment.layers.max_ratio_low"]
    return gate.model_copy(update={"observed": worst, "threshold": result.layers[0].bound,
                                   "op": "<=", "metric": "alignment.layers.max_ratio_low"})


def row(kind, name, text_name, verdict, gates, seconds, expected=None) -> dict:
    errors = [g for g in gates if g.severity == "error"]
    failing = [g for g in errors if not g.passed]
    if kind == "stack":
        decisive = max(errors, key=lambda g: margin(g) or 0.0)
    else:
        pool = [g for g in failing if g.id in (expected or [])] or failing or errors
        decisive = max(pool, key=lambda g: margin(g) or 0.0)
    return {"kind": kind, "case": name, "text": text_name, "verdict": verdict,
            "expected": "PASS" if kind == "stack" else "FAIL",
            "failing": [g.id for g in failing], "gate": decisive.id,
            "observed": decisive.observed, "bound": decisive.threshold,
            "margin": margin(decisive), "seconds": round(seconds, 1)}


def calibrate(source: Path, repeats: int, moe: bool, gates_file, fault_filter=None,
              first_text: Path | None = None) -> list[dict]:
    from day0.stages.alignment.core import KeptSides

    rows = []
    for i, (text_name, text) in enumerate(texts(repeats, first_text)):
        kept = KeptSides()
        if i == 0:
            for name, dtype, plugins, expected, moe_only in FAULTS:
                if (moe_only and not moe) or (fault_filter and plugins[0] not in fault_filter):
                    continue
                result, verdict, gates, secs = run_case(source, text, kept, name, dtype,
                                                        plugins, "faithful", gates_file)
                r = row("fault", name, text_name, verdict, gates, secs, expected)
                r["first_divergent_layer"] = result.first_divergent_layer
                r["caught_by_expected"] = bool(set(expected) & set(r["failing"]))
                rows.append(r)
                print(_line(rows[-1]), flush=True)
            for name, dtype, plugins in DEPLOYMENTS:
                result, verdict, gates, secs = run_case(source, text, kept, name, dtype,
                                                        plugins, "faithful", gates_file)
                r = row("deployment", name, text_name, verdict, gates, secs, ["layers-aligned"])
                r["expected"] = "—"
                r["first_divergent_layer"] = result.first_divergent_layer
                rows.append(r)
                print(_line(rows[-1]), flush=True)
        for name, dtype, plugins, claim in STACKS:
            result, verdict, gates, secs = run_case(source, text, kept, name, dtype, plugins,
                                                    claim, gates_file)
            rows.append(row("stack", name, text_name, verdict, gates, secs))
            print(_line(rows[-1]), flush=True)
        del kept
    return rows


def _fmt(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _line(r: dict) -> str:
    ok = "ok " if r["verdict"] == r["expected"] else "   " if r["expected"] == "—" else "BAD"
    extra = f" layer {r['first_divergent_layer']}" if r.get("first_divergent_layer") is not None \
        else ""
    return (f"{ok} {r['kind']:5} {r['case']:34} {r['text'][:28]:28} {r['verdict']:5} "
            f"{r['gate']:22} obs {_fmt(r['observed']):>9} bound {_fmt(r['bound']):>6} "
            f"margin {_fmt(r['margin']):>6} {r['seconds']:6.1f}s{extra}")


def summary(model: str, rows: list[dict]) -> str:
    clean = [r for r in rows if r["kind"] == "stack"]
    faults = [r for r in rows if r["kind"] == "fault"]
    false_alarms = sum(r["verdict"] != "PASS" for r in clean)
    missed = sum(r["verdict"] == "PASS" for r in faults)
    lines = [f"## {model}", "", "| case | expected | PASS/FAIL | deciding gate | observed | bound | "
             "margin (worst) | first divergent layer |", "|---|---|---|---|---|---|---|---|"]
    by_case: dict[str, list[dict]] = {}
    for r in rows:
        by_case.setdefault(r["case"], []).append(r)
    for case, rs in by_case.items():
        worst = max(rs, key=lambda r: r["margin"] if r["kind"] == "stack" else -r["margin"])
        passed = sum(r["verdict"] == "PASS" for r in rs)
        lines.append(f"| {case} | {rs[0]['expected']} | {passed}/{len(rs)} PASS | {worst['gate']} "
                     f"| {_fmt(worst['observed'])} | {_fmt(worst['bound'])} | "
                     f"{_fmt(worst['margin'])} | {_fmt(worst.get('first_divergent_layer'))} |")
    lines += ["", f"false alarms: {false_alarms} of {len(clean)} clean runs; "
                  f"missed faults: {missed} of {len(faults)}"]
    return "\n".join(lines)


def main() -> int:
    from day0.verdict.gates import load_gates

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", help="a checkpoint folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--fixtures", action="store_true", help="the bundled fixtures instead")
    p.add_argument("--repeats", type=int, default=5, help="texts per clean stack (default 5)")
    p.add_argument("--faults", nargs="*", help="only these fault plugins")
    p.add_argument("--gates", default=str(ROOT / "gates.yaml"))
    p.add_argument("--json", help="write all rows here")
    args = p.parse_args()
    gates_file = load_gates(args.gates)
    if args.fixtures:
        models = [(m, FIXTURES / "models" / m) for m in
                  ("tiny-llama", "tiny-qwen3moe", "tiny-deepseekv3")]
    elif args.source:
        models = [(Path(args.source).name, Path(args.source))]
    else:
        out = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_real_models.py")],
                             check=True, capture_output=True, text=True).stdout.strip()
        models = [("SmolLM2-135M-Instruct", Path(out.splitlines()[-1]))]
    report, all_rows = [], {}
    for name, source in models:
        print(f"=== {name} ({source})", flush=True)
        config = json.loads((source / "config.json").read_text())
        moe = any(k in config for k in ("num_experts", "n_routed_experts", "num_local_experts"))
        first = FIXTURES / "text" / "heldout.txt" if args.fixtures else None
        rows = calibrate(source, args.repeats, moe, gates_file, args.faults, first)
        all_rows[name] = rows
        report.append(summary(name, rows))
    print("\n\n".join(report))
    if args.json:
        Path(args.json).write_text(json.dumps(all_rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
