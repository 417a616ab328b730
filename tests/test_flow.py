"""The validate flow end to end on a real Prefect server (session harness) and real fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from day0.rendering import labels
from tests import breakers
from tests.conftest import HELDOUT, MODELS, PLUGINS

pytestmark = pytest.mark.integration
STAGES = {"alignment": {"text_file": str(HELDOUT)}}
# faults of the computation that these tests localize through alignment: the run selects it
# (and what it runs after); the evaluation stage's own fault tests are in tests/stages/evaluation
ALIGNMENT = ["alignment"]


def target_file(tmp_path, *plugins, name="cpu-bf16-test", **extra):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "device": "cpu", "dtype": "bfloat16",
                                    "plugins": [str(PLUGINS / p) for p in plugins], **extra}))
    return str(path)


def run_flow(source, tfile, **kwargs):
    from flows.results import report_of
    from flows.validate import validate

    state = validate(source=str(source), target_file=tfile, stage_configs=STAGES,
                     return_state=True, **kwargs)
    report = report_of(state)  # FAIL/ERROR/BROKEN end Failed: their result() would raise
    assert state.name == report["verdict"]
    assert state.is_completed() == (report["verdict"] == "PASS")
    return report, state.state_details.flow_run_id


def failing(report):
    return {g["id"] for g in report["gates"] if not g["passed"] and g["severity"] == "error"}


def artifacts_of(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key: a for a in found}


@pytest.fixture(scope="module")
def noop_validation(prefect_server, tmp_path_factory):
    """The noop-plugin validation of a fixture, run once: (report, flow run id, target file,
    work folder); test_repeat_reuses_every_stage repeats tiny-llama's."""
    done = {}

    def of(model):
        if model not in done:
            tmp_path = tmp_path_factory.mktemp(f"noop-{model}")
            tfile = target_file(tmp_path, "noop.py")
            report, run_id = run_flow(MODELS / model, tfile, out=str(tmp_path / "out"))
            done[model] = report, run_id, tfile, tmp_path
        return done[model]
    return of


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3moe", "tiny-deepseekv3"])
def test_noop_plugin_passes_and_publishes_artifacts(noop_validation, model):
    report, run_id, _, tmp_path = noop_validation(model)
    assert report["verdict"] == "PASS", failing(report)
    keys = {labels.artifact_key(kind, model, "cpu-bf16-test")
            for kind in ("report", "gates", "layers", "plot-alignment-layers",
                         "plot-alignment-kl-buckets", "evaluation", "plot-evaluation-categories")}
    found = artifacts_of(run_id)
    assert keys <= set(found), sorted(found)
    assert all(found[k].flow_run_id == run_id and found[k].task_run_id is None for k in keys)
    assert (tmp_path / "out" / "plots" / "alignment-layers.png").is_file()
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["verdict"] == "PASS" and (tmp_path / "out" / "report.md").is_file()
    for gate in on_disk["gates"]:
        assert {"id", "metric", "observed", "threshold", "passed", "severity", "reason"} <= set(gate)
    assert "first_divergent_layer" in on_disk["evidence"]["alignment"]
    # capabilities: every evaluation gate evaluated and passed, per-category scores reported,
    # both sides' per-item outputs next to report.json
    evaluation = [g for g in on_disk["gates"] if g["metric"].startswith("evaluation.")]
    judged = [g for g in evaluation if g["applicable"]]
    assert len(judged) == 8 and all(g["passed"] for g in judged), judged
    # no bundled task is commonsense (the standard hellaswag, piqa, winogrande are): said so
    skipped = [g for g in evaluation if not g["applicable"]]
    assert [g["id"] for g in skipped] == ["eval-commonsense"]
    assert "no task of category 'commonsense'" in skipped[0]["reason"]
    categories = {c["category"] for c in on_disk["evidence"]["evaluation"]["categories"]}
    assert categories == {"knowledge", "code", "math", "long_context", "agent", "all"}
    rows = (tmp_path / "out" / "evaluation" / "day0_knowledge.jsonl").read_text().splitlines()
    assert len(rows) == 120 and "target" in json.loads(rows[0])


def test_repeat_reuses_every_stage(noop_validation):
    first, _, tfile, _ = noop_validation("tiny-llama")
    second, _ = run_flow(MODELS / "tiny-llama", tfile)
    # every stage but the one that measures time (the machine now, never a cached figure)
    assert {n for n, s in second["stages"].items() if not s["cached"]} == {"performance"}
    assert second["verdict"] == first["verdict"]

    def unmeasured(metrics):
        return {k: v for k, v in metrics.items() if not k.startswith("performance.")}

    assert unmeasured(second["metrics"]) == unmeasured(first["metrics"])


def test_perturbed_layer_fails_and_is_localized(prefect_server, tmp_path):
    report, _ = run_flow(MODELS / "tiny-llama", target_file(tmp_path, "perturb_layer.py"),
                         stages=ALIGNMENT)
    assert report["verdict"] == "FAIL"
    assert "layers-aligned" in failing(report)
    assert report["evidence"]["alignment"]["first_divergent_layer"] == 2


def test_far_position_corruption_is_caught(prefect_server, tmp_path):
    report, _ = run_flow(MODELS / "tiny-llama", target_file(tmp_path, "corrupt_far_positions.py"),
                         stages=ALIGNMENT)
    assert report["verdict"] == "FAIL", report["metrics"]
    assert failing(report) & {"logits-kl-worst-bucket", "layers-aligned"}


def test_flipped_routing_is_caught(prefect_server, tmp_path):
    report, _ = run_flow(MODELS / "tiny-qwen3moe", target_file(tmp_path, "flip_routing.py"),
                         stages=ALIGNMENT)
    assert report["verdict"] == "FAIL"
    assert "expert-selection" in failing(report)


def test_nan_target_fails_not_errors(prefect_server, tmp_path):
    report, _ = run_flow(MODELS / "tiny-llama", target_file(tmp_path, "nan_output.py"),
                         stages=ALIGNMENT)
    assert report["verdict"] == "FAIL" and "no-nonfinite" in failing(report)


def test_crashing_stage_gives_error_verdict(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    report, run_id = run_flow(MODELS / "tiny-llama", target_file(tmp_path, "crash.py"),
                              stages=ALIGNMENT)
    assert report["verdict"] == "ERROR"
    assert any("alignment" in e and "SIGKILL" in e for e in report["errors"])
    assert not report["stages"]["alignment"]["ok"] and report["stages"]["analysis"]["ok"]
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        tasks = {t.name: t.state for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))}
    # the run: named after the release and the resolved target, tagged, Failed "ERROR"
    revision = report["identity"]["revision"]
    assert run.name == f"tiny-llama@{revision} on cpu-bf16-test"
    assert {"verdict:ERROR", "target:cpu-bf16-test", "model:tiny-llama",
            f"revision:{revision}"} <= set(run.tags)
    assert run.state.is_failed() and run.state.name == "ERROR"
    # a partial run (alignment selected) says so first, then the stage that could not finish
    assert run.state.message.startswith("ERROR: partial: stages analysis, alignment; stage ")
    assert "SIGKILL" in run.state.message
    # a stage that could not finish is a Failed task run; one that finished is Completed
    assert tasks["alignment"].is_failed() and tasks["alignment"].name == "ERROR"
    assert tasks["analysis"].is_completed()
    # its gates: one "not evaluated" row per stage, not a FAIL per gate
    from day0.verdict.report import Report
    from day0.rendering.report import gate_rows

    rows = [r for r in gate_rows(Report.model_validate(report)) if r["result"] == "not evaluated"]
    stages_named = [r["reason"].split(":")[0] for r in rows]
    assert "not evaluated (stage alignment" in stages_named
    assert len(stages_named) == len(set(stages_named)), rows


def _cli(*args, prefect_server):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    return subprocess.run([sys.executable, "-m", "day0.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=900, env=env)


def test_cli_exit_codes_fail_and_error(prefect_server, tmp_path):
    proc = _cli("validate", MODELS / "tiny-llama", "--target-file", target_file(tmp_path, "perturb_layer.py"),
                "--text", HELDOUT, "--out", tmp_path / "o1", "--stages", "alignment",
                prefect_server=prefect_server)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "verdict: FAIL" in proc.stdout and "layers-aligned" in proc.stdout
    assert "first divergent layer: 2" in proc.stdout
    assert f"report: {tmp_path / 'o1' / 'report.md'}" in proc.stdout
    proc = _cli("validate", MODELS / "tiny-llama", "--target-file", target_file(tmp_path, "crash.py"),
                "--text", HELDOUT, "--stages", "alignment", prefect_server=prefect_server)
    assert proc.returncode == 3 and "verdict: ERROR" in proc.stdout


def test_a_partial_run_passes_on_what_ran_and_says_partial(prefect_server, tmp_path):
    """`--stages alignment` with the shipped gates (issue 27): PASS over what ran, the other
    stages' gates "not selected"; the flow's report, its run's state and tags, and the CLI
    (exit 0) all say "partial: stages analysis, alignment"."""
    from prefect.client.orchestration import get_client

    tfile = target_file(tmp_path)
    out = tmp_path / "out"
    report, run_id = run_flow(MODELS / "tiny-llama", tfile, stages=ALIGNMENT, out=str(out))
    assert report["verdict"] == "PASS", failing(report)
    assert report["partial"] == ["analysis", "alignment"]
    unselected = {g["metric"].split(".")[0] for g in report["gates"] if g["not_selected"]}
    assert unselected == {"scan", "evaluation", "performance"}
    assert all(g["passed"] or not g["applicable"] for g in report["gates"])
    assert (out / "report.md").read_text().startswith(
        "# day0 validation: PASS (partial: stages analysis, alignment)")
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    assert run.state.name == "PASS" and run.state.is_completed()
    assert run.state.message.startswith("PASS: partial: stages analysis, alignment")
    assert labels.PARTIAL_TAG in run.tags and "verdict:PASS" in run.tags

    proc = _cli("validate", MODELS / "tiny-llama", "--target-file", tfile, "--text", HELDOUT,
                "--stages", "alignment", prefect_server=prefect_server)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "verdict: PASS (partial: stages analysis, alignment)" in proc.stdout
    assert "not selected: stage evaluation did not run in this partial validation" in proc.stdout


def test_cli_input_error_in_stage_exits_2(prefect_server, tmp_path):
    proc = _cli("validate", MODELS / "tiny-llama", "--target-file",
                target_file(tmp_path, "does_not_exist.py"), "--stages", "alignment",
                "--out", tmp_path / "out", prefect_server=prefect_server)
    assert proc.returncode == 2 and "does_not_exist.py" in proc.stderr
    assert "Traceback" not in proc.stderr
    # the report says the same exit code as the command (issue 27: it said ERROR, exit 2)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["exit_status"] == 2 and report["verdict"] == "ERROR"
    assert "- exit code: 2 (a stage refused its input or config" in (
        tmp_path / "out" / "report.md").read_text()


def test_nan_in_weights_is_a_broken_checkpoint(prefect_server, tmp_path):
    """Target and reference load the same NaN: not the port's fault, the checkpoint's."""
    ckpt = breakers.copy_fixture(tmp_path / "tiny-llama")
    name = "model.layers.1.mlp.down_proj.weight"
    breakers.put_float(ckpt, name, 0, float("nan"))
    report, _ = run_flow(ckpt, target_file(tmp_path), out=str(tmp_path / "out"),
                         stages=ALIGNMENT)
    assert report["verdict"] == "BROKEN", (report["errors"], report["checkpoint_problems"])
    assert any(name in p and "non-finite" in p for p in report["checkpoint_problems"])
    assert "## The checkpoint is broken" in (tmp_path / "out" / "report.md").read_text()


def test_zero_layers_are_broken_and_nothing_is_compared(prefect_server, tmp_path):
    ckpt = breakers.copy_fixture(tmp_path / "tiny-llama")
    breakers.edit_config(ckpt, num_hidden_layers=0)
    report, _ = run_flow(ckpt, target_file(tmp_path))
    assert report["verdict"] == "BROKEN" and set(report["stages"]) == {"analysis"}
    (problem,) = report["checkpoint_problems"]
    assert "85%" in problem and "num_hidden_layers=0" in problem


def test_stray_single_file_is_an_input_error(prefect_server, tmp_path):
    ckpt = breakers.copy_fixture(tmp_path / "tiny-llama")
    breakers.add_zero_single_file(ckpt)
    report, _ = run_flow(ckpt, target_file(tmp_path))
    analysis = report["stages"]["analysis"]
    assert analysis["failure"] == "input" and "model.safetensors" in analysis["error"]
    assert "remove model.safetensors or model.safetensors.index.json" in analysis["error"]


def test_swapped_tensors_edited_in_place_rerun_and_are_broken(prefect_server, tmp_path):
    """Revision v1 is validated clean (its reference perplexity is stored); then two layers'
    down_proj data are swapped in place with the mtimes restored: the stages must re-run (the
    weights digest is the content) and the perplexity, far above v1's, makes it BROKEN."""
    ckpt = breakers.copy_fixture(tmp_path / "tiny-llama")
    tfile = target_file(tmp_path)
    clean, _ = run_flow(ckpt, tfile, revision="v1")
    assert clean["verdict"] == "PASS", failing(clean)
    # the same bytes ran in earlier tests without a revision: v1's score is stored only if the
    # revision is part of the stage key
    assert not clean["stages"]["alignment"]["cached"]
    breakers.swap_tensors(ckpt, "model.layers.1.mlp.down_proj.weight",
                          "model.layers.2.mlp.down_proj.weight")
    swapped, _ = run_flow(ckpt, tfile, revision="v1", stages=ALIGNMENT)
    assert not any(s["cached"] for s in swapped["stages"].values())
    assert swapped["verdict"] == "BROKEN", (failing(swapped), swapped["checkpoint_problems"])
    assert any("stored for this model and revision" in p for p in swapped["checkpoint_problems"])


def test_target_missing_a_kernel_fails_not_errors(prefect_server, tmp_path):
    report, _ = run_flow(MODELS / "tiny-llama", target_file(tmp_path, "raise_on_op.py"),
                         stages=["scan", "alignment"])
    assert report["verdict"] == "FAIL"
    assert "op-coverage" in failing(report) and "aten.mm" in " ".join(report["evidence"]["scan"]["uncovered"])
    assert report["stages"]["alignment"]["failure"] == "target"
    assert any("NotImplementedError" in e for e in report["errors"])


def test_bring_up_judges_the_port_of_untrained_weights_and_says_so(prefect_server, tmp_path):
    """Random weights (a port brought up before trained weights exist): BROKEN as a release
    (perplexity near uniform); with bring_up the same weights get the alignment gates' verdict,
    the untrained finding as a note, and 'bring-up' in the report, state and tags."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    ckpt = tmp_path / "random-llama"
    LlamaForCausalLM(LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=512, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, pad_token_id=2)).save_pretrained(ckpt)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (ckpt / name).write_bytes((MODELS / "tiny-llama" / name).read_bytes())
    shipped = yaml.safe_load((MODELS.parents[2] / "gates.yaml").read_text())
    gates = tmp_path / "alignment-gates.yaml"
    gates.write_text(yaml.safe_dump({"version": 1, "gates": [
        g for g in shipped["gates"] if g["metric"].startswith("alignment.")]}))
    tfile = target_file(tmp_path)

    release, _ = run_flow(ckpt, tfile, stages=ALIGNMENT, gates=str(gates))
    assert release["verdict"] == "BROKEN" and not release["bring_up"]
    assert any("uniform guess" in p for p in release["checkpoint_problems"])

    out = tmp_path / "out"
    report, run_id = run_flow(ckpt, tfile, stages=ALIGNMENT, gates=str(gates), bring_up=True,
                              out=str(out))
    assert report["verdict"] == "PASS", failing(report)
    assert report["bring_up"] and report["checkpoint_problems"] == []
    assert any(n.startswith("bring-up, weights untrained") and "uniform guess" in n
               for n in report["evidence"]["alignment"]["notes"])
    assert (out / "report.md").read_text().startswith(
        "# day0 validation: PASS (bring-up, weights untrained; partial: stages analysis, "
        "alignment)")
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    assert labels.BRING_UP_TAG in run.tags and "bring-up" in run.state.message
