"""The architecture sweep (bench/sweep_architectures.py) trimmed to one model type per layout
family: a tiny random checkpoint from day0.torchkit.tiny, `day0 analyze` counting exactly the
saved tensors, and `day0 validate --bring-up` on analysis, scan and alignment reaching a
verdict with no internal error (exit 4) and no traceback."""

from __future__ import annotations

import json
import os

import pytest

from bench.sweep_architectures import REACHED, TOKENIZER, bug_of, last_json, run
from day0.torchkit.tiny import build_tiny

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAMILIES = {
    "gemma3_text": "sliding and full attention",
    "deepseek_v3": "multi-head latent attention, dense then MoE layers",
    "qwen3_next": "linear attention (gated delta net) beside full attention, MoE",
    "qwen3_moe": "MoE",
}


# analysis counts parameters, not the persistent buffers a checkpoint also holds (DeepSeek's
# router e_score_correction_bias): the lead's to decide; strict, so a fix shows here
INEXACT = {"deepseek_v3": "params.total leaves out the saved router e_score_correction_bias"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One tiny checkpoint per model type, built on first use."""
    folder, built = tmp_path_factory.mktemp("tiny"), {}

    def get(model_type):
        if model_type not in built:
            built[model_type] = build_tiny(model_type, folder / model_type,
                                           tokenizer_from=TOKENIZER)
        return built[model_type]
    return get


@pytest.fixture
def env(prefect_server):
    """The session's server and cache (tests/conftest.py), for the CLI subprocesses."""
    return {**os.environ, "PREFECT_API_URL": prefect_server, "HF_HUB_OFFLINE": "1"}


@pytest.mark.parametrize("model_type", [
    pytest.param(t, marks=pytest.mark.xfail(reason=INEXACT[t], strict=True)) if t in INEXACT
    else t for t in FAMILIES])
def test_analyze_counts_the_saved_tensors_exactly(model_type, checkpoints):
    tiny = checkpoints(model_type)
    analyzed = run(["analyze", str(tiny.folder), "--json"], dict(os.environ), 120)
    assert analyzed["rc"] == 0, analyzed["err"][-2000:]
    assert last_json(analyzed["out"])["params"]["total"] == tiny.tensor_elements


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_bring_up_validation_reaches_a_verdict(model_type, checkpoints, env, tmp_path):
    tiny = checkpoints(model_type)
    out = tmp_path / "report"
    validated = run(["validate", str(tiny.folder), "--target", "cpu-bf16", "--bring-up",
                     "--stages", "analysis,scan,alignment", "--out", str(out)], env, 240)
    assert bug_of("validate", validated) is None, validated["err"][-3000:]
    assert validated["rc"] in REACHED, validated["err"][-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] and report["bring_up"] is True
