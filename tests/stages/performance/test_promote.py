"""Baselines are only ever made on request: `day0 baseline promote RUN_FOLDER` for a finished
run, `--promote-baseline` / the deployment parameter for the run itself."""

from __future__ import annotations

import json

import pytest

from day0 import stages
from day0.cli import _stage_option_values, main
from day0.stages.performance import baseline
from tests.conftest import MODELS


def run_folder(tmp_path, *, failed=0):
    folder = tmp_path / "out"
    (folder / "performance").mkdir(parents=True)
    runs = [{"run": "short_qa-c4", "workload": "short_qa", "baseline_key": "k1", "failed": failed}]
    report = {"source": str(MODELS / "tiny-llama"), "target": {"name": "vllm-cpu-bf16"},
              "identity": {"revision": "r1"}, "evidence": {"performance": {"runs": runs}}}
    (folder / "report.json").write_text(json.dumps(report))
    (folder / "performance" / "requests.jsonl").write_text("".join(
        json.dumps({"run": "short_qa-c4", "index": i, "ttft_ms": 10.0 + i, "e2el_ms": 50.0 + i,
                    "output_tokens": 16}) + "\n" for i in range(20)))
    return folder


def test_a_finished_run_becomes_the_baseline(tmp_path, capsys):
    store = tmp_path / "store"
    assert main(["baseline", "promote", str(run_folder(tmp_path)), "--store", str(store)]) == 0
    assert "1 runs: short_qa-c4" in capsys.readouterr().out
    stored = baseline.load(str(store) + "/")
    assert stored["runs"]["short_qa-c4"]["key"] == "k1"
    assert len(stored["runs"]["short_qa-c4"]["requests"]) == 20
    assert stored["promoted"]["from"].endswith("out")


def test_a_run_with_failed_requests_or_no_performance_is_refused_with_exit_2(tmp_path, capsys):
    assert main(["baseline", "promote", str(run_folder(tmp_path, failed=3)),
                 "--store", str(tmp_path / "s")]) == 2
    assert "a run with failures is no baseline" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["baseline", "promote", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "report.json not found" in err and "\n" == err[-1] and err.count("\n") == 1


def test_promotion_is_a_setting_of_the_performance_stage_only_when_asked():
    """The performance stage declares the option; the registry sets it, and only when asked."""
    assert stages.apply_options({"alignment": {"x": 1}}, {"promote_baseline": False}) == {
        "alignment": {"x": 1}}
    assert stages.apply_options({"performance": {"seed": 3}}, {"promote_baseline": True}) == {
        "performance": {"seed": 3, "promote_baseline": True}}
    assert stages.by_hand_only(None, {"promote_baseline": True}) == ["--promote-baseline"]
    assert stages.by_hand_only({"performance": {"promote_baseline": True}}, None) == [
        "--promote-baseline"]
    assert stages.by_hand_only({"performance": {"seed": 3}}, {"duration": "1m"}) == []


@pytest.mark.parametrize("flag", [[], ["--promote-baseline"]])
def test_validate_accepts_the_flag(flag):
    from day0.cli import _parser

    args = _parser().parse_args(["validate", "x", *flag])
    assert _stage_option_values(args)["promote_baseline"] is bool(flag)
