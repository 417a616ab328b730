"""The alignment stage end to end on tiny checkpoints, with the example fault plugins.

Every fault plugin must move the metric that is meant to catch it, relative to the noop run on
the same checkpoint and target, and the noop run must stay within sane bounds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from day0.stages.alignment.core import Config, Result, run
from day0.execution.contract import StageInputs
from day0.errors import ConfigError, TargetFault
from day0.checkpoint.files import read_config_dict
from day0.execution.stage import StageOutcome, StageSpec, execute
from day0.execution.targets import Target

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
METRICS_FILE = Path(__file__).resolve().parents[3] / "day0" / "stages" / "alignment" / "metrics.yaml"
# Fault runs only need the windows; one window, little generation, no op replay keeps them fast.
FAST = dict(max_windows=1, generation_prompts=2, new_tokens=8, check_ops=False)


def _run(source, plugins=(), dtype="bfloat16", text=None, **config) -> Result:
    target = Target(name=f"cpu-{dtype}", device="cpu", dtype=dtype,
                    plugins=[str(PLUGINS / f"{p}.py") for p in plugins])
    return run(Config(text_file=str(text) if text else None, **config),
               StageInputs(source=str(source), target=target))


@pytest.fixture(scope="module")
def noop(tiny_llama, eval_text) -> Result:
    return _run(tiny_llama, ["noop"], text=eval_text)


@pytest.fixture(scope="module")
def noop_fast(tiny_llama, eval_text) -> Result:
    return _run(tiny_llama, ["noop"], text=eval_text, **FAST)


def test_noop_metrics_are_sane(noop, tiny_llama):
    m = noop.metrics()
    max_pos = read_config_dict(tiny_llama)["max_position_embeddings"]
    assert noop.seq_len == min(max_pos, 256)  # windows reach the trained context (capped)
    assert noop.first_divergent_layer is None and m["alignment.layers.diverged"] == 0.0
    assert m["alignment.ops.checked"] > 10 and m["alignment.ops.failed"] == 0
    assert m["alignment.ops.discrete_mismatches"] == 0
    assert 0 <= m["alignment.logits.kl_mean"] < 1e-3
    assert m["alignment.logits.kl_p99"] < 1e-2
    assert m["alignment.logits.top1_agreement"] > 0.9
    assert m["alignment.perplexity.rel_delta"] < 0.01
    assert m["alignment.nonfinite"] == 0
    assert m["alignment.moe.expert_agreement"] is None  # dense model
    assert 0 <= m["alignment.generation.token_match_rate"] <= 1
    assert len(noop.layers) == read_config_dict(tiny_llama)["num_hidden_layers"]
    assert len(noop.buckets) == 4 and noop.buckets[-1].end == noop.seq_len
    # a plugin makes the target a separate model; noop computes exactly what the control does
    assert not noop.target_is_control
    assert m["alignment.vs_control.kl_mean_ratio"] == 1.0
    assert m["alignment.vs_control.kl_mean_ratio_low"] == 1.0
    assert m["alignment.layers.max_ratio_low"] == 1.0
    assert m["alignment.control.kl_mean"] == m["alignment.logits.kl_mean"]
    assert noop.context_tokens == 8 and noop.prefix_token is not None
    assert noop.positions == noop.windows * (noop.seq_len - noop.context_tokens)


def test_a_target_without_plugins_on_the_reference_device_is_the_control(tiny_llama, eval_text):
    result = _run(tiny_llama, text=eval_text, **FAST)
    assert result.target_is_control and result.control == "cpu/bfloat16, no plugins"
    assert result.metrics()["alignment.vs_control.kl_mean_ratio"] == 1.0
    assert result.kl_mean > 0  # bf16 still differs from the float32 reference


def test_chunked_long_window_equals_one_forward(tiny_llama, eval_text):
    whole = _run(tiny_llama, ["noop"], dtype="float32", text=eval_text, **FAST)
    chunked = _run(tiny_llama, ["noop"], dtype="float32", text=eval_text, chunk_tokens=48,
                   **FAST)
    assert chunked.perplexity_reference == pytest.approx(whole.perplexity_reference, rel=1e-5)
    assert chunked.positions == whole.positions
    assert chunked.kl_max < 1e-6 and chunked.first_divergent_layer is None


def test_metric_names_match_the_declared_list(noop):
    declared = set(yaml.safe_load(METRICS_FILE.read_text())["metrics"])
    assert set(noop.metrics()) == declared
    assert all(v is None or isinstance(v, float) for v in noop.metrics().values())


def test_perturbed_layer_is_the_first_divergent(tiny_llama, eval_text, noop_fast, monkeypatch):
    layers = read_config_dict(tiny_llama)["num_hidden_layers"]
    chosen = min(2, layers - 1)
    monkeypatch.setenv("DAY0_PERTURB_LAYER", str(chosen))
    result = _run(tiny_llama, ["perturb_layer"], text=eval_text, **FAST)
    assert result.first_divergent_layer == chosen
    assert all(not row.diverged for row in result.layers[:chosen])
    assert result.kl_mean > 50 * noop_fast.kl_mean
    assert result.metrics()["alignment.layers.diverged"] >= 1.0


def test_far_position_corruption_is_localized(tiny_llama, eval_text, noop_fast):
    result = _run(tiny_llama, ["corrupt_far_positions"], text=eval_text, **FAST)
    first, last = result.buckets[0], result.buckets[-1]
    # Positions >= 75% of the context are corrupted: only the last bucket of four sees it.
    assert last.kl_mean > 50 * max(first.kl_mean, noop_fast.buckets[-1].kl_mean)
    assert first.kl_mean < 10 * noop_fast.buckets[0].kl_mean + 1e-9
    assert result.kl_max_bucket == pytest.approx(last.kl_mean)
    layer = result.layers[result.first_divergent_layer]
    assert layer.worst_bucket == len(result.buckets) - 1
    # Short generation prompts never reach the corrupted positions: they cannot tell.
    assert [g.first_divergence for g in result.generation] == \
        [g.first_divergence for g in noop_fast.generation]


def test_short_windows_alone_miss_far_position_corruption(tiny_llama, eval_text):
    result = _run(tiny_llama, ["corrupt_far_positions"], text=eval_text, seq_len=64, **FAST)
    assert result.first_divergent_layer is None
    assert result.metrics()["alignment.logits.kl_max_bucket"] < 1e-3


def test_nan_output_propagates_and_never_passes(tiny_llama, eval_text):
    result = _run(tiny_llama, ["nan_output"], text=eval_text, **FAST)
    m = result.metrics()
    assert m["alignment.nonfinite"] > 0
    for name in ("alignment.logits.kl_mean", "alignment.logits.kl_p99",
                 "alignment.logits.kl_max_bucket", "alignment.layers.max_rel_error",
                 "alignment.perplexity.target", "alignment.perplexity.rel_delta"):
        assert math.isnan(m[name]), name
    assert m["alignment.logits.top1_agreement"] == 0.0
    assert result.first_divergent_layer == len(result.layers) - 1
    # NaN survives the JSON the stage runner writes (not turned into null).
    dumped = json.loads(result.model_dump_json())
    assert dumped["kl_mean"] == "NaN" and dumped["layers"][-1]["rel_error"] == "NaN"
    back = Result.model_validate_json(result.model_dump_json())
    assert math.isnan(back.kl_mean) and math.isnan(back.layers[-1].rel_error)
    assert math.isnan(Result.model_validate(result.model_dump(mode="json")).kl_mean)


def test_target_raising_on_an_op_is_a_stage_error(tiny_llama, eval_text):
    with pytest.raises(TargetFault, match="target forward raised NotImplementedError.*aten::mm"):
        _run(tiny_llama, ["raise_on_op"], text=eval_text, **FAST)


def test_float16_target(tiny_llama, eval_text, noop_fast):
    result = _run(tiny_llama, ["noop"], dtype="float16", text=eval_text, **FAST)
    assert result.first_divergent_layer is None
    # fp16 has 3 more mantissa bits than bf16: its errors are smaller.
    assert result.layers[-1].rel_error < noop_fast.layers[-1].rel_error


def test_moe_routing_flip_drops_expert_agreement(tiny_moe, eval_text):
    noop = _run(tiny_moe, ["noop"], text=eval_text, **FAST)
    flipped = _run(tiny_moe, ["flip_routing"], text=eval_text, **FAST)
    assert noop.routers and all(r.router.endswith("gate") for r in noop.routers)
    assert noop.expert_agreement > 0.9 and noop.first_divergent_layer is None
    assert flipped.expert_agreement < 0.3
    assert flipped.metrics()["alignment.moe.expert_agreement"] == flipped.expert_agreement


def test_default_text_is_checkpoint_heldout_then_builtin(tiny_llama, tmp_path):
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_llama, copy)
    result = _run(copy, generation_prompts=0, check_ops=False, max_windows=1)
    assert Path(result.text_file).name == "eval_text.txt"
    (copy / "heldout.txt").write_text(Path(result.text_file).read_text() * 2)
    result = _run(copy, generation_prompts=0, check_ops=False, max_windows=1)
    assert result.text_file == str(copy / "heldout.txt")


def test_missing_text_file_and_unknown_field_are_config_errors(tiny_llama, tmp_path):
    with pytest.raises(ConfigError, match="text_file") as err:
        _run(tiny_llama, text=tmp_path / "nope.txt")
    assert str(tmp_path / "nope.txt") in str(err.value)
    with pytest.raises(Exception, match="extra"):
        Config(seq_lenn=5)


def test_through_the_stage_contract(tiny_llama, eval_text):
    """day0.execution.stage.execute: config from JSON, result as JSON, metrics; a bad field is a config
    failure. (Crashes in a child process are covered by tests/execution/test_stage.py with crash.py.)"""
    target = Target(name="cpu-bf16", device="cpu", dtype="bfloat16",
                    plugins=[str(PLUGINS / "nan_output.py")])
    inputs = StageInputs(source=str(tiny_llama), target=target)
    config = dict(FAST, text_file=str(eval_text) if eval_text else None)
    outcome = execute(StageSpec(stage="alignment", config=config, inputs=inputs))
    assert outcome.ok, outcome.error
    assert math.isnan(outcome.metrics["alignment.logits.kl_mean"])
    back = StageOutcome.model_validate_json(outcome.model_dump_json())
    assert math.isnan(back.metrics["alignment.logits.kl_mean"])
    assert math.isnan(Result.model_validate(back.result).kl_mean)
    bad = execute(StageSpec(stage="alignment", config={"seq_lenn": 3}, inputs=inputs))
    assert bad.failure == "config" and "seq_len" in bad.error


def _alignment_gates_failing(result: Result, claim: str = "faithful") -> set[str]:
    from day0.verdict.gates import GatesFile, evaluate, load_gates

    checked = result.metrics()
    # FAST runs skip the op replay: its gates have nothing to judge here
    gates = GatesFile(gates=[g for g in load_gates().gates if g.metric.startswith("alignment.")
                             and g.severity == "error"
                             and not (g.metric.startswith("alignment.ops.")
                                      and checked[g.metric] is None)])
    return {g.id for g in evaluate(gates, result.metrics(), is_moe=bool(result.routers),
                                   claim=claim) if g.applicable and not g.passed}


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["tiny-llama", "tiny-qwen3moe", "tiny-deepseekv3"])
def test_rope_base_and_expert_swap_fail_on_every_fixture(fixture, eval_text):
    """Faults that absolute thresholds tuned on the fixtures let through (RoPE base 10 % low:
    KL 7e-4 on DeepSeek) fail against the control; the control itself passes."""
    from day0.stages.alignment.core import KeptSides

    source = PLUGINS.parents[0] / "fixtures" / "models" / fixture
    kept = KeptSides()

    def check(plugins):
        target = Target(name="cpu-bf16", device="cpu", dtype="bfloat16",
                        plugins=[str(PLUGINS / f"{p}.py") for p in plugins])
        return run(Config(text_file=str(eval_text), **FAST),
                   StageInputs(source=str(source), target=target), kept=kept)

    assert _alignment_gates_failing(check(["noop"])) == set()
    rope = _alignment_gates_failing(check(["rope_base_low"]))
    assert {"kl-vs-control", "layers-aligned"} <= rope
    if fixture != "tiny-llama":
        swap = _alignment_gates_failing(check(["expert_swap"]))
        assert {"kl-vs-control", "layers-aligned"} <= swap


def test_a_memo_judges_a_target_again_under_another_claim_without_a_forward(tiny_llama,
                                                                           eval_text,
                                                                           monkeypatch):
    """The last target is kept with the reference and control: judged again (another claim),
    no model is loaded and no window runs, and the result equals a run without the kept."""
    from day0.stages.alignment.core import KeptSides
    from day0.stages.alignment import sides

    kept = KeptSides()

    def judged(claim, kept):
        target = Target(name="cpu-bf16", device="cpu", dtype="bfloat16", claim=claim,
                        plugins=[str(PLUGINS / "int8_weights.py")])
        # no bank: the sides a run without the kept needs are all computed
        return run(Config(text_file=str(eval_text), reference_bank="off", **FAST),
                   StageInputs(source=str(tiny_llama), target=target), kept=kept)

    judged("faithful", kept)
    loads = []
    real_load = sides.load_pretrained
    monkeypatch.setattr(sides, "load_pretrained",
                        lambda *a, **k: loads.append(a) or real_load(*a, **k))
    again = judged("int8", kept)
    assert loads == []
    fresh = judged("int8", None)
    assert len(loads) == 3  # reference, control and target: what the kept saved
    a, b = again.metrics(), fresh.metrics()
    assert {k: (a[k], b[k]) for k in a if not (a[k] == b[k] or a[k] != a[k] and b[k] != b[k])} \
        == {}
    assert again.layers == fresh.layers and again.generation == fresh.generation
