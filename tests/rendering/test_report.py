"""report.json keeps NaN as evidence, report.md and the terminal table show every gate."""

import json

from day0.verdict.gates import GateResult
from day0.verdict.report import Report, build
from day0.rendering.report import to_markdown, verdict_table
from day0.rendering.publish import write
from day0.execution.stage import StageOutcome
from day0.execution.targets import REFERENCE, resolve_target


def make_report():
    outcomes = {
        "analysis": StageOutcome(stage="analysis", ok=True, result={"architecture": "LlamaForCausalLM", "moe": None}),
        "alignment": StageOutcome(stage="alignment", ok=True, metrics={"alignment.logits.kl_mean": float("nan")},
                                  result={"first_divergent_layer": 2, "layers": [{"layer": 0, "rel_error": 0.1}]}),
        "scan": StageOutcome(stage="scan", ok=False, failure="crash", error="stage 'scan' was killed by SIGKILL"),
    }
    gates = [GateResult(id="kl", metric="alignment.logits.kl_mean", op="<=", observed=float("nan"),
                        threshold=0.01, passed=False, severity="error", reason="observed nan is not finite")]
    return build(source="/m", target=resolve_target("cpu-bf16"), reference=REFERENCE, outcomes=outcomes,
                 gate_results=gates, verdict="ERROR")


def test_report_json_keeps_nan_and_names_failed_stage(tmp_path):
    report = make_report()
    json_path, md_path = write(report, tmp_path)
    doc = json.loads(json_path.read_text())  # strict JSON: no bare NaN tokens
    assert doc["verdict"] == "ERROR" and doc["gates"][0]["observed"] == "NaN"
    assert doc["evidence"]["alignment"]["first_divergent_layer"] == 2
    assert doc["errors"] == ["stage scan: stage 'scan' was killed by SIGKILL"]
    assert Report.model_validate(doc).exit_code == 3
    assert "first divergent layer: 2" in md_path.read_text()


def test_terminal_table_lists_gates_errors_and_verdict():
    text = verdict_table(make_report())
    assert "kl" in text and "nan" in text and "FAIL" in text
    assert "ERROR stage scan" in text and text.splitlines()[-1].startswith("verdict: ERROR")
    assert "| kl |" in to_markdown(make_report())


def test_broken_checkpoint_heads_the_report_and_exits_5(tmp_path):
    problem = "/m/model-00001-of-00004.safetensors: every one of its 10 tensors is zero"
    outcomes = {"analysis": StageOutcome(stage="analysis", ok=True, result={})}
    gates = [GateResult(id="kl", metric="alignment.logits.kl_mean", op="<=", observed=None,
                        threshold=0.01, passed=False, severity="error",
                        reason="not evaluated (stage alignment: not run: the checkpoint is broken)",
                        not_evaluated="stage alignment: not run: the checkpoint is broken")]
    report = build(source="/m", target=resolve_target("cpu-bf16"), reference=REFERENCE,
                   outcomes=outcomes, gate_results=gates, verdict="BROKEN",
                   checkpoint_problems=[problem])
    json_path, md_path = write(report, tmp_path)
    doc = json.loads(json_path.read_text())
    assert doc["checkpoint_problems"] == [problem] and Report.model_validate(doc).exit_code == 5
    lines = md_path.read_text().splitlines()
    assert lines[0] == "# day0 validation: BROKEN"
    assert lines[2] == f"**BROKEN**: the checkpoint itself is broken: {problem}"
    assert lines[4] == "## The checkpoint is broken" and lines[6] == f"- {problem}"
    assert f"BROKEN checkpoint: {problem}" in verdict_table(report)


def test_a_partial_or_interrupted_run_is_published_without_taking_latest(tmp_path, monkeypatch):
    from day0.rendering.publish import publish_to_store
    from day0.store import identity

    monkeypatch.setenv("DAY0_RESULTS_URI", str(tmp_path))
    stopped = StageOutcome(stage="scan", ok=False, failure="interrupted", error="signal 15")
    published = []
    for n, (partial, outcomes) in enumerate([([], {}), (["analysis"], {}),
                                             ([], {"scan": stopped})]):
        report = make_report()
        report.partial = partial
        report.identity = {"revision": "r1", "run_id": f"20261206T0{n}0000Z-0000000{n}"}
        published.append(publish_to_store(report, outcomes))
        assert published[-1].endswith(report.identity["run_id"] + "/")
    latest = identity.read_latest(source="/m", target_name="cpu-bf16", revision="r1")
    assert latest["uri"] == published[0]  # the full run, though the other two came later
