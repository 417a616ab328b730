"""How a verdict is shown (issue 11), without Prefect: run names, tags, artifact keys, final
states, the gates table (failing first, one "not evaluated" row per stage, thresholds that
render), the report's first lines, plots and the CLI's closing lines."""

from __future__ import annotations

import json
import re

import pytest

from day0.rendering import labels
from day0 import stages
from day0.verdict.gates import GateResult, load_gates, evaluate, verdict
from day0.verdict.report import Report, build
from day0.rendering.report import closing_lines, gate_rows, headline, to_markdown, verdict_table
from day0.rendering.publish import plots, write
from day0.execution.stage import StageOutcome
from day0.stages.alignment.report import DEFINITIONS, findings, layer_rows, markdown
from day0.execution.targets import REFERENCE, resolve_target

PNG = b"\x89PNG\r\n\x1a\n"


def _layer(i, low, bound=2.0, **extra):
    return {"layer": i, "rel_error": 0.01 * low, "control_rel_error": 0.01, "ratio": low,
            "ratio_low": low, "bound": bound, "worst_bucket": 0, "diverged": low > bound, **extra}


ALIGNMENT = {
    "target": "cpu-bf16", "control": "cpu/bfloat16", "layers": [
        _layer(0, 1.0), _layer(1, 1.1), _layer(2, 45.3), _layer(3, 37.2)],
    "first_divergent_layer": 2,
    "buckets": [{"bucket": b, "start": 64 * b, "end": 64 * (b + 1), "positions": 200,
                 "kl_mean": 0.02, "control_kl_mean": 5e-5, "kl_ratio": 400.0,
                 "kl_ratio_low": 350.0, "top1_agreement": 0.9, "control_top1_agreement": 0.99}
                for b in range(4)],
    "kl_mean": 2.1e-4, "kl_p99": 1.0e-4, "kl_max": 0.3, "control_kl_mean": 1e-4,
    "control_kl_p99": 9e-5, "control_kl_max": 0.01, "top1_agreement": 0.9,
    "control_top1_agreement": 0.99, "comparisons": [], "ops": [],
}


def _report(verdict_name: str, gates: list[GateResult], outcomes: dict | None = None, **kw):
    outcomes = outcomes or {
        "analysis": StageOutcome(stage="analysis", ok=True, result={}),
        "alignment": StageOutcome(stage="alignment", ok=True, result=ALIGNMENT)}
    return build(source="/m/tiny-llama", target=resolve_target("cpu-bf16"), reference=REFERENCE,
                 outcomes=outcomes, gate_results=gates, verdict=verdict_name,
                 identity={"model": "acme/tiny-llama", "revision": "r1"}, **kw)


def _gate(gid, passed, observed=1.0, op="<=", threshold=1.0, severity="error", **kw):
    return GateResult(id=gid, metric=f"alignment.{gid}", op=op, observed=observed,
                      threshold=threshold, passed=passed, severity=severity,
                      reason=kw.pop("reason", f"{observed} {op} {threshold}"), **kw)


def test_names_tags_and_keys():
    assert labels.run_name("acme/tiny-llama", "r1", "cpu-bf16") == "acme/tiny-llama@r1 on cpu-bf16"
    tags = labels.run_tags("acme/tiny-llama", "r1", "cpu-bf16", "FAIL")
    assert tags == ["model:acme/tiny-llama", "revision:r1", "target:cpu-bf16", "verdict:FAIL"]
    merged = labels.merge_tags(["day0", "day0-owner:1-2", "verdict:PASS"], ["verdict:FAIL"])
    assert merged == ["day0", "day0-owner:1-2", "verdict:FAIL"]
    key = labels.artifact_key("report", "Acme/Tiny_Llama.v2", "cpu-bf16")
    assert key == "day0-report-acme-tiny-llama-v2-cpu-bf16"
    long = labels.artifact_key("plot-alignment-layers", "x" * 300, "t")
    assert len(long) <= labels.KEY_MAX and re.fullmatch(r"[a-z0-9-]+", long)
    assert long != labels.artifact_key("plot-alignment-layers", "x" * 299 + "y", "t")


@pytest.mark.parametrize("name, completed", [("PASS", True), ("FAIL", False), ("ERROR", False),
                                             ("BROKEN", False)])
def test_final_state_is_named_after_the_verdict(name, completed):
    gates = [_gate("layers", name == "PASS", observed=2.0, op="==", threshold=0.0)]
    state = labels.final_state(_report(name, gates, checkpoint_problems=["zeros"] * (name == "BROKEN")))
    assert (state.completed, state.name) == (completed, name)
    assert state.message.startswith(name + ":")
    if name == "FAIL":
        assert "first failing gate layers" in state.message
        assert "first divergent layer: 2" in state.message


def test_stage_task_state():
    assert labels.stage_state("target", "raised", "alignment").name == "FAIL"
    crashed = labels.stage_state("crash", "killed by SIGKILL", "scan")
    assert crashed.name == "ERROR" and "scan" in crashed.message


def other_stages() -> tuple[str, ...]:
    """Every registered stage but the four this test is about (a new one included)."""
    from day0 import stages

    return tuple(n for n in stages.names()
                 if n not in ("analysis", "scan", "alignment", "evaluation"))


def test_missing_metrics_are_one_not_evaluated_row_and_error_still_wins():
    gates = load_gates()
    results = evaluate(gates, {"scan.coverage": 1.0, "scan.complete": 1.0,
                               "analysis.plan_fits": 1.0}, is_moe=False,
                       missing_reasons={"alignment": "failed: killed by SIGKILL",
                                        "evaluation": "not run: not selected"},
                       inapplicable={name: "not this test's" for name in other_stages()})
    missing = [r for r in results if r.metric.startswith("alignment.") and r.applicable]
    assert missing and all(not r.passed for r in missing)
    assert {r.not_evaluated for r in missing} == {"stage alignment: failed: killed by SIGKILL"}
    assert verdict(results, {"alignment": "killed"}) == "ERROR"
    assert verdict(results, {}) == "FAIL"  # a target that raised: its gates fail
    outcomes = {"analysis": StageOutcome(stage="analysis", ok=True, result={}),
                "alignment": StageOutcome(stage="alignment", ok=False, failure="crash",
                                          error="killed by SIGKILL")}
    report = _report("ERROR", results, outcomes)
    rows = gate_rows(report)
    not_evaluated = [r for r in rows if r["result"] == "not evaluated"]
    assert [r["reason"] for r in not_evaluated] == [  # one row per stage
        "not evaluated (stage alignment: failed: killed by SIGKILL)",
        "not evaluated (stage evaluation: not run: not selected)"]
    assert headline(report).startswith("ERROR: stage alignment could not finish: killed by SIGKILL")
    assert sum("not evaluated" in line for line in verdict_table(report).splitlines()) == 2


def test_gate_rows_failing_first_with_severity_and_symbols():
    gates = [_gate("a", True), _gate("w", False, severity="warning", op=">=", threshold=0.95),
             _gate("f", False, observed=2.0, op="==", threshold=0.0),
             _gate("m", True, applicable=False)]
    rows = gate_rows(_report("FAIL", gates))
    assert [r["gate"] for r in rows] == ["f", "w", "a", "m"]
    assert [r["result"] for r in rows] == ["FAIL", "WARN", "PASS", "n/a"]
    assert rows[0]["severity"] == "error" and rows[1]["severity"] == "warning"
    ui = gate_rows(_report("FAIL", gates), markup=True)
    assert ui[1]["threshold"] == "≥ 0.95" and ui[0]["result"] == "**FAIL**"
    assert not any(str(v).lstrip().startswith(">") for r in ui for v in r.values())


def test_gates_of_stages_that_never_run_on_the_targets_kind_are_one_counted_line(tmp_path):
    """On a torch target the engine stages' gates are not applicable: one line, last, naming
    the stages; a gate not applicable for another reason keeps its row; report.json keeps all."""
    gates_file = load_gates()
    metrics = {"alignment.logits.kl_mean": 1e-4, "analysis.plan_fits": 1.0}
    engine_stages = ["smoke", "api_alignment", "serving", "soak"]
    results = evaluate(gates_file, metrics, is_moe=False,
                       inapplicable={name: f"stage {name} does not run on torch targets"
                                     for name in engine_stages})
    elsewhere = [r for r in results if r.metric.split(".")[0] in engine_stages]
    assert len(elsewhere) > 10 and all(not r.applicable for r in elsewhere)
    report = _report("PASS", results)
    rows = gate_rows(report)
    last = rows[-1]
    assert last["gate"] == f"{len(elsewhere)} gates" and last["result"] == "n/a"
    assert last["reason"] == ("not applicable: their stages (" + ", ".join(
        dict.fromkeys(r.metric.split(".")[0] for r in elsewhere)) + ") do not run on torch "
        "targets")
    listed = {r["gate"] for r in rows}
    assert not listed & {r.id for r in elsewhere}
    moe = [r for r in results if r.reason.startswith("not applicable: dense model")]
    assert moe and {r.id for r in moe} <= listed  # n/a for another reason: its own row
    assert len(rows) == len(results) - len(elsewhere) + 1 - sum(
        r["gate"].count(",") for r in rows if r["result"] == "not evaluated")
    assert sum("do not run on torch targets" in line for line in
               verdict_table(report).splitlines()) == 1
    assert to_markdown(report).count("do not run on torch targets") == 1
    write(report, tmp_path)
    kept = json.loads((tmp_path / "report.json").read_text())["gates"]
    assert len(kept) == len(results)


def test_report_starts_with_verdict_and_first_failing_gate(tmp_path):
    gates = [_gate("ok", True), _gate("layers-aligned", False, observed=2.0, op="==",
                                      threshold=0.0, reason="2 == 0 violated")]
    report = _report("FAIL", gates)
    lines = to_markdown(report).splitlines()
    assert lines[0] == "# day0 validation: FAIL"
    assert lines[2].startswith("**FAIL**: first failing gate layers-aligned")
    made = plots(report)
    assert set(made) == {"alignment-layers", "alignment-kl-buckets"}
    assert all(p.startswith(PNG) and len(p) < 150_000 for p in made.values())
    json_path, md_path = write(report, tmp_path, plots=made)
    assert (tmp_path / "plots" / "alignment-layers.png").read_bytes() == made["alignment-layers"]
    assert "![alignment-layers](plots/alignment-layers.png)" in md_path.read_text()
    assert json.loads(json_path.read_text())["findings"] == report.findings
    inline = to_markdown(report, images={"alignment-layers": "data:image/png;base64,AAAA"})
    assert "![alignment-layers](data:image/png;base64,AAAA)" in inline
    lines = closing_lines(report, tmp_path)
    assert lines[0].startswith("first divergent layer: 2")
    assert f"report: {tmp_path / 'report.md'}" in lines[1]


def test_layer_metric_and_table_agree_and_kl_statistics_are_defined():
    rows = layer_rows(ALIGNMENT)
    assert sum(r["diverged"] != "no" for r in rows) == 2 == sum(l["diverged"] for l in ALIGNMENT["layers"])
    assert "bound" in " ".join(rows[0])  # the tolerance the ratio is held to
    assert set(stages.get("alignment").tables(ALIGNMENT)) == {"day0-layers"}
    assert findings(ALIGNMENT)[0].startswith("first divergent layer: 2")
    section = markdown(ALIGNMENT, [])
    for term in ("kl_mean", "kl_p99", "kl_max", "scored positions", "below the mean",
                 "first divergent layer", "bound"):
        assert term in DEFINITIONS, term
    assert DEFINITIONS.splitlines()[0] in section
    assert "| control | 0.0001 | 9e-05 | 0.01 |" in section  # control's KL max shown too


def test_report_json_reads_back_without_new_fields():
    old = json.loads(_report("PASS", [_gate("a", True)]).model_dump_json())
    old.pop("findings")
    for gate in old["gates"]:
        gate.pop("not_evaluated")
    assert Report.model_validate(old).verdict == "PASS"


def test_which_final_states_carry_a_report():
    from prefect.states import Cancelled, Completed, Crashed, Failed

    from flows.results import is_verdict

    assert all(is_verdict(s) for s in (Completed(name="PASS"), Failed(name="FAIL"),
                                       Failed(name="ERROR"), Failed(name="BROKEN")))
    assert not any(is_verdict(s) for s in (None, Failed(), Crashed(), Cancelled()))


def test_a_partial_run_says_so_everywhere_and_shows_unselected_gates_once_per_stage():
    """`--stages alignment`: the headline (the run's state message), report.md's title, the
    terminal table and the tags say "partial: stages analysis, alignment"; each stage not
    selected is one "not selected" row, after the gates judged."""
    results = evaluate(load_gates(), {"analysis.plan_fits": 1.0}, is_moe=False,
                       unselected=["scan", "evaluation", "performance"],
                       inapplicable={name: "engine stage" for name in stages.not_on("torch")})
    partial = ["analysis", "alignment"]
    report = _report("PASS", [r for r in results if not r.metric.startswith("alignment.")],
                     partial=partial)
    assert headline(report).startswith("PASS: partial: stages analysis, alignment; all 1 gates hold")
    assert to_markdown(report).startswith("# day0 validation: PASS (partial: stages analysis, alignment)")
    assert labels.final_state(report).message.startswith("PASS: partial: stages analysis, alignment")
    table = verdict_table(report)
    assert "verdict: PASS (partial: stages analysis, alignment)" in table
    rows = [r for r in gate_rows(report) if r["result"] == "not selected"]
    assert [r["reason"] for r in rows] == [
        f"not selected: stage {name} did not run in this partial validation"
        for name in ("scan", "evaluation", "performance")]
    assert gate_rows(report)[0]["result"] == "PASS"  # judged gates first
    assert sum("not selected" in line for line in table.splitlines()) == 3
    assert labels.PARTIAL_TAG in labels.run_tags("m", "r", "cpu-bf16", "PASS", partial=True)
    assert labels.PARTIAL_TAG not in labels.run_tags("m", "r", "cpu-bf16", "PASS")
    assert "partial" not in headline(_report("PASS", []))  # a full run: no mark
