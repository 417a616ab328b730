"""day0.verdict.hooks: a stage hook that raises costs a note, never the evidence or the verdict;
a day0 bug that leaves no verdict (exit 4) still leaves report.json with what finished."""

from __future__ import annotations

import json

import pytest

from day0 import stages
from day0.execution.stage import StageOutcome
from day0.execution.targets import REFERENCE, resolve_target
from day0.rendering import publish
from day0.rendering.report import stage_tables, to_markdown
from day0.verdict import report as reporting
from tests.conftest import MODELS


def boom(*args, **kwargs):
    raise TypeError("unsupported format string passed to NoneType.__format__")


@pytest.fixture()
def raising_analysis(monkeypatch):
    """The analysis stage's presentation hooks raise, as a formatting slip on an unseen config
    did (``f"{r.rope.theta:g}"`` on None)."""
    face = type(stages.get("analysis"))
    for hook in ("markdown", "findings", "tables", "plots"):
        monkeypatch.setattr(face, hook, boom)
    return face


def analysis_gates(tmp_path) -> str:
    """Gates on analysis alone (the default gates want every stage)."""
    path = tmp_path / "gates.yaml"
    path.write_text("version: 1\ngates:\n  - {id: plan-fits, metric: analysis.plan_fits, "
                    "op: '==', threshold: 1}\n")
    return str(path)


def outcome(name: str = "analysis") -> StageOutcome:
    return StageOutcome(stage=name, ok=True, result={"params": {"total": 5}},
                        metrics={f"{name}.plan_fits": 1.0}, seconds=0.1)


def built(**extra) -> reporting.Report:
    return reporting.build(source="m", target=resolve_target("cpu-bf16"), reference=REFERENCE,
                           outcomes={"analysis": outcome()}, gate_results=[], verdict="PASS",
                           **extra)


def test_a_raising_hook_is_a_note_and_the_section_falls_back_to_metrics(raising_analysis,
                                                                        tmp_path):
    report = built(notes=["stage scan: model facts could not be rendered: X (a day0 bug)"])
    assert report.verdict == "PASS" and report.findings == []
    assert any("analysis: findings could not be rendered: TypeError" in n for n in report.notes)
    markdown = to_markdown(report)
    assert "## analysis" in markdown and "analysis.plan_fits" in markdown  # the metrics instead
    assert "report.md section could not be rendered: TypeError: unsupported format" in markdown
    assert stage_tables(report) == {} and publish.plots(report) == {}
    assert "## Notes" in markdown and "stage scan: model facts" in markdown
    json_path, md_path = publish.write(report, tmp_path / "out")
    kept = json.loads(json_path.read_text())
    assert kept["verdict"] == "PASS" and kept["evidence"]["analysis"]["params"]["total"] == 5
    assert sum("could not be rendered" in n for n in kept["notes"]) == 5  # each once
    assert "## Notes" in md_path.read_text()


def test_write_keeps_report_json_when_rendering_dies(tmp_path, monkeypatch):
    """report.json is written before anything is rendered: a renderer that dies outright (not a
    hook: the renderer itself) still leaves the evidence."""
    monkeypatch.setattr(publish, "to_markdown", boom)
    with pytest.raises(TypeError):
        publish.write(built(), tmp_path / "out")
    assert json.loads((tmp_path / "out" / "report.json").read_text())["verdict"] == "PASS"


@pytest.mark.integration
def test_flow_with_a_raising_report_hook_keeps_its_verdict_and_report(raising_analysis,
                                                                      prefect_server, tmp_path):
    from flows.results import report_of
    from flows.validate import validate

    out = tmp_path / "out"
    report = report_of(validate(source=str(MODELS / "tiny-llama"), target="cpu-bf16",
                                stages=["analysis"], out=str(out), gates=analysis_gates(tmp_path),
                                return_state=True))
    assert report["verdict"] == "PASS", report["gates"]
    assert any("report.md section could not be rendered" in n for n in report["notes"])
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["verdict"] == "PASS" and on_disk["evidence"]["analysis"]["params"]["total"]
    assert on_disk["notes"] == report["notes"]
    assert "could not be rendered" in (out / "report.md").read_text()


@pytest.mark.integration
def test_a_bug_with_no_verdict_exits_4_and_out_keeps_what_finished(prefect_server, tmp_path,
                                                                   monkeypatch, capsys):
    from day0.cli import main
    from day0.verdict import pipeline

    def conclude(*args, **kwargs):
        raise RuntimeError("gate evaluation broke")

    monkeypatch.setattr(pipeline, "conclude", conclude)
    out = tmp_path / "out"
    (out).mkdir()
    (out / "report.json").write_text('{"verdict": "PASS"}')  # an earlier run's: replaced
    assert main(["validate", str(MODELS / "tiny-llama"), "--stages", "analysis",
                 "--out", str(out)]) == 4
    assert "internal error" in capsys.readouterr().err
    kept = reporting.Report.model_validate_json((out / "report.json").read_text())
    assert kept.verdict == "ERROR" and kept.gates == []
    assert kept.stages["analysis"].ok and kept.evidence["analysis"]["params"]["total"] > 0
    assert "no verdict reached: RuntimeError: gate evaluation broke" in kept.errors[-1]


def test_a_bug_before_the_flow_still_leaves_report_json(tmp_path, monkeypatch, capsys):
    """Even a bug before any stage (here: in the request's checks) gives out a report.json
    that names it, never none."""
    from day0 import cli, request_rules

    monkeypatch.setattr(request_rules, "build", boom)
    out = tmp_path / "out"
    assert cli.main(["validate", str(MODELS / "tiny-llama"), "--out", str(out)]) == 4
    assert "internal error" in capsys.readouterr().err
    kept = reporting.Report.model_validate_json((out / "report.json").read_text())
    assert kept.verdict == "ERROR" and kept.stages == {}
    assert "no verdict reached: TypeError" in kept.errors[-1]
