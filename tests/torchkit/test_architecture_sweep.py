"""The architecture sweep (bench/sweep_architectures.py) trimmed to one model type per layout
family: a tiny random checkpoint from day0.torchkit.tiny, `day0 analyze` counting exactly the
saved tensors, and `day0 validate --bring-up` on analysis, scan and alignment reaching a
verdict with no internal error (exit 4) and no traceback."""

from __future__ import annotations

import json
import os

import pytest

from bench.sweep_architectures import REACHED, TOKENIZER, bug_of, last_json, run, sweep_gates
from day0.torchkit.tiny import build_tiny

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAMILIES = {
    "gemma3_text": "sliding and full attention",
    "deepseek_v3": "multi-head latent attention, dense then MoE layers",
    "falcon_h1": "state-space (Mamba-2) mixer beside attention in every layer",
    "qwen3_moe": "MoE",
}




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


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_analyze_counts_the_saved_tensors_exactly(model_type, checkpoints):
    """Parameters plus the persistent buffers a checkpoint stores (DeepSeek's router
    e_score_correction_bias, reported apart) are every saved element."""
    tiny = checkpoints(model_type)
    analyzed = run(["analyze", str(tiny.folder), "--json"], dict(os.environ), 120)
    assert analyzed["rc"] == 0, analyzed["err"][-2000:]
    params = last_json(analyzed["out"])["params"]
    assert params["total"] + params["buffers"] == tiny.tensor_elements
    assert params["buffers"] == (0 if model_type != "deepseek_v3" else
                                 sum(e.numel() for n, e in _router_biases(tiny.folder)))


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_bring_up_validation_reaches_a_verdict(model_type, checkpoints, env, tmp_path):
    tiny = checkpoints(model_type)
    out = tmp_path / "report"
    validated = run(["validate", str(tiny.folder), "--target", "cpu-bf16", "--bring-up",
                     "--stages", "analysis,scan,alignment", "--gates", str(sweep_gates(tmp_path)),
                     "--out", str(out)], env, 240)
    assert bug_of("validate", validated) is None, validated["err"][-3000:]
    assert validated["rc"] in REACHED, validated["err"][-3000:]
    report = json.loads((out / "report.json").read_text())
    failing = [g["id"] for g in report["gates"] if g["applicable"] and not g["passed"]]
    # a correct bf16 port of untrained weights: every gate of the stages that ran holds
    assert report["verdict"] == "PASS" and report["bring_up"] is True, (failing, report["errors"])


def _router_biases(folder):
    from safetensors import safe_open

    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                if name.endswith("e_score_correction_bias"):
                    yield name, f.get_tensor(name)
