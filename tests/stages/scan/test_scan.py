"""Operator scan: full-size meta forward, coverage by probe or manifest, long-tail ops."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from day0 import stages
from day0.stages.scan import core as scan
from day0.execution.contract import StageInputs
from day0.errors import CheckpointError, ConfigError
from day0.execution.targets import Target
from tests.conftest import MODELS

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
PLUGINS = Path(__file__).parents[2] / "plugins"
CPU32 = Target(name="cpu-fp32", device="cpu", dtype="float32")
CPU16 = Target(name="cpu-bf16", device="cpu", dtype="bfloat16")


def tiny_llama(tmp_path: Path) -> Path:
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=256, intermediate_size=128,
                architectures=["LlamaForCausalLM"]).to_json_file(tmp_path / "config.json")
    return tmp_path


def qwen3_moe(tmp_path: Path) -> Path:
    """transformers' own Qwen3MoeConfig defaults (30B-A3B-like: 128 experts, top-8)."""
    from transformers import Qwen3MoeConfig

    Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"]).to_json_file(tmp_path / "config.json")
    return tmp_path


def scan_of(source, target=CPU16, **config) -> scan.Result:
    return scan.run(scan.Config(**config), StageInputs(source=str(source), target=target))


def by_op(result: scan.Result) -> dict[str, scan.OpRow]:
    return {r.op: r for r in result.ops}


@pytest.fixture
def failing_kernel():
    """Replace an aten op's CPU kernel by one that raises, like a backend missing it."""
    libs = []

    def install(op: str):
        def missing(*args, **kwargs):
            raise NotImplementedError(f"aten::{op} has no kernel on this backend (test)")
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": intended
            warnings.simplefilter("ignore")
            lib.impl(op, missing, "CPU")
        libs.append(lib)
    yield install
    for lib in libs:
        lib._destroy()


def test_deepseek_v3_full_size_scan_in_subprocess():
    """671B parameters on meta: MoE and matmul ops found, cpu/float32 probe (time and memory:
    bench/bench_scan.py)."""
    code = ("import json, sys; from day0.stages.scan import core as scan; from day0.execution.contract import StageInputs; "
            "from day0.execution.targets import Target; "
            "r = scan.run(scan.Config(), StageInputs(source=sys.argv[1], target=Target("
            "name='cpu-fp32', device='cpu', dtype='float32'))); print(r.model_dump_json())")
    proc = subprocess.run([sys.executable, "-c", code, str(CONFIGS / "DeepSeek-V3.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = scan.Result.model_validate_json(proc.stdout.strip().splitlines()[-1])
    ops = by_op(result)
    assert result.scan_error is None and result.metrics()["scan.complete"] == 1.0
    assert result.params > 600e9                     # the full configured size, not a shrunk one
    embedding_fp32 = 129280 * 7168 * 4   # one full-size weight: none may be materialised
    assert 0 < result.peak_rss_bytes < embedding_fp32
    assert {"aten._grouped_mm.default", "aten.mm.default", "aten.topk.default"} <= set(ops)
    assert "aten.bmm.default" in ops or "aten.scaled_dot_product_attention.default" in ops
    assert ops["aten._grouped_mm.default"].module == "DeepseekV3Experts"
    assert ops["aten._grouped_mm.default"].count == 2 * (61 - 3)   # up+down, MoE layers only
    assert "aten._grouped_mm.default" in result.long_tail
    assert "aten.mm.default" not in result.long_tail
    assert result.coverage == 1.0 and result.coverage_source == "probe"
    assert result.probe_dims["first_k_dense_replace"] == 1 and result.probe_dims["num_hidden_layers"] == 2
    text = scan.summary_text(result)
    assert "coverage (probe): 100.0%" in text and "aten._grouped_mm.default" in text


def test_small_llama_scan_and_metrics(tmp_path):
    result = scan_of(tiny_llama(tmp_path))
    ops = by_op(result)
    assert {"aten.embedding.default", "aten.mm.default", "aten.silu.default",
            "aten.scaled_dot_product_attention.default"} <= set(ops)
    assert ops["aten.mm.default"].count == 2 * 7 + 1   # q,k,v,o,gate,up,down per layer + lm_head
    assert "bfloat16" in ops["aten.mm.default"].dtypes
    assert ops["aten.mm.default"].module == "LlamaAttention"   # q_proj runs first
    assert result.long_tail == [] and result.coverage == 1.0
    declared = yaml.safe_load((stages.get("scan").metrics_file)
                              .read_text())["metrics"]
    assert set(result.metrics()) == set(declared)
    assert all(isinstance(v, float) for v in result.metrics().values())


def test_an_op_meta_dispatches_for_code_a_device_runs_otherwise_counts_as_probed(tmp_path):
    """Gemma3Model masks image tokens with `ids[mask] = 0`: on meta tensors (the full-size
    scan) the 0 becomes aten.scalar_tensor, on a device aten.lift_fresh (the probe), as each
    pair in meta_equivalents.yaml says. The scan counts it probed: coverage 1."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from day0.torchkit.tiny import build_tiny

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    for meta_op, device_op in scan.meta_equivalents().items():
        dispatched = {}
        for device in ("meta", "cpu"):
            ids = torch.zeros(2, 5, dtype=torch.long, device=device)
            with Ops() as ops:
                ids[ids == 7] = 0
            dispatched[device] = ops.seen
        assert meta_op in dispatched["meta"] and meta_op not in dispatched["cpu"]
        assert device_op in dispatched["cpu"]
    gemma3 = build_tiny("gemma3", tmp_path / "gemma3", tokenizer_from=MODELS / "tiny-llama")
    result = scan_of(gemma3.folder)
    assert by_op(result)["aten.scalar_tensor.default"].status == "covered"
    assert result.coverage == 1.0 and result.unprobed == []


def test_no_probe_leaves_coverage_unknown(tmp_path):
    result = scan_of(tiny_llama(tmp_path), probe=False)
    assert result.coverage is None and result.metrics()["scan.coverage"] is None
    assert result.unprobed == [r.op for r in result.ops] and result.coverage_source == "none"


@pytest.mark.parametrize("experts", [None, "eager"])
def test_qwen3_moe_scan(tmp_path, experts):
    """Eager experts loop over .nonzero() hits: data-dependent on meta, must still scan."""
    result = scan_of(qwen3_moe(tmp_path), experts_implementation=experts)
    ops = by_op(result)
    assert result.scan_error is None and result.probe_error is None
    assert result.coverage == 1.0
    if experts == "eager":
        assert {"aten.nonzero.default", "aten.index_add_.default"} <= set(ops)
        assert any("aten.nonzero.default" in n for n in result.notes)
        assert "aten.index_add_.default" in result.long_tail
    else:
        assert "aten._grouped_mm.default" in ops and "aten.nonzero.default" not in ops


def test_forced_uncovered_op_with_fallback(tmp_path, failing_kernel):
    """silu raises on the target: uncovered; the probe computes it another way and goes on."""
    failing_kernel("silu")
    result = scan_of(tiny_llama(tmp_path))
    row = by_op(result)["aten.silu.default"]
    assert row.status == "uncovered" and "no kernel on this backend" in row.error
    assert result.uncovered == ["aten.silu.default"] and result.probe_error is None
    assert result.unprobed == [] and result.coverage == pytest.approx(1 - 1 / len(result.ops))
    assert result.metrics()["scan.uncovered_ops"] == 1.0
    assert "UNCOVERED aten.silu.default" in scan.summary_text(result)


def test_forced_uncovered_op_without_fallback(tmp_path, failing_kernel):
    """topk has no decomposition: the probe stops there, later ops are reported unprobed."""
    failing_kernel("topk")
    result = scan_of(qwen3_moe(tmp_path))
    assert by_op(result)["aten.topk.default"].status == "uncovered"
    assert "aten.topk.default" in result.probe_error
    assert result.unprobed and "aten._grouped_mm.default" in result.unprobed
    assert result.coverage < 1 and result.scan_error is None   # the meta scan is unaffected


def test_meta_scan_stopping_early_is_reported(tmp_path):
    """An op that cannot run on meta (no rule for it) stops the scan: named, no coverage."""
    def refuse(*args, **kwargs):
        raise RuntimeError("no meta kernel (test)")

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("silu", refuse, "Meta")
    try:
        result = scan_of(tiny_llama(tmp_path))
    finally:
        lib._destroy()
    assert result.scan_failed_op == "aten.silu.default" and "no meta kernel" in result.scan_error
    assert result.coverage is None and result.metrics()["scan.complete"] == 0.0
    assert "stopped early at aten.silu.default" in scan.summary_text(result)
    assert "aten.embedding.default" in by_op(result)        # the ops before it are kept


def test_plugin_raising_above_the_probe_is_blamed(tmp_path, monkeypatch):
    """A target plugin whose own dispatch mode raises: the op its error names is uncovered."""
    monkeypatch.setenv("DAY0_RAISE_OP", "mm")
    target = CPU16.model_copy(update={"plugins": [str(PLUGINS / "raise_on_op.py")]})
    result = scan_of(tiny_llama(tmp_path), target=target)
    ops = by_op(result)
    assert ops["aten.mm.default"].status == "uncovered" and "mm" in ops["aten.mm.default"].error
    assert result.probe_error and result.coverage < 1 and result.unprobed


def test_noop_plugin_is_applied(tmp_path):
    target = CPU16.model_copy(update={"plugins": [str(PLUGINS / "noop.py")]})
    assert scan_of(tiny_llama(tmp_path), target=target).coverage == 1.0


def test_op_manifest_missing_an_op(tmp_path):
    source = tiny_llama(tmp_path)
    everything = scan_of(source, probe=False)
    listed = sorted({r.packet for r in everything.ops} - {"aten.silu"})
    manifest = tmp_path / "ops.yaml"
    manifest.write_text(yaml.safe_dump({"ops": listed}))
    target = CPU16.model_copy(update={"op_manifest": str(manifest)})
    result = scan_of(source, target=target)
    assert result.coverage_source == "manifest" and result.probe_dims == {}
    assert result.uncovered == ["aten.silu.default"]
    assert "ops.yaml" in by_op(result)["aten.silu.default"].error
    assert {r.status for r in result.ops if r.op != "aten.silu.default"} == {"manifest"}
    assert result.coverage == pytest.approx(1 - 1 / len(result.ops))


def test_bad_op_manifest_names_the_file(tmp_path):
    bad = tmp_path / "ops.yaml"
    bad.write_text("ops: {mm: yes}\n")
    with pytest.raises(ConfigError, match="ops.yaml"):
        scan_of(tiny_llama(tmp_path), target=CPU16.model_copy(update={"op_manifest": str(bad)}))
    with pytest.raises(ConfigError, match="not found"):
        scan_of(tmp_path, target=CPU16.model_copy(update={"op_manifest": str(tmp_path / "x")}))


def test_unusable_device_is_a_clear_error(tmp_path):
    from day0.errors import TargetFault

    if torch.cuda.is_available():
        pytest.skip("a CUDA device exists here")
    with pytest.raises(TargetFault, match="cuda"):
        scan_of(tiny_llama(tmp_path), target=Target(name="gpu", device="cuda", dtype="bfloat16"))


def test_config_rejects_unknown_fields():
    with pytest.raises(Exception, match="extra"):
        scan.Config(seq_lenn=4)
    assert all(f.description for f in scan.Config.model_fields.values())


def test_result_round_trips_as_json(tmp_path):
    result = scan_of(tiny_llama(tmp_path), probe=False)
    again = scan.Result.model_validate(json.loads(result.model_dump_json()))
    assert again.metrics() == result.metrics()


# ------------------------------------------------------------------------------- names and shapes
# Header-only analysis builds no model: the scan, which builds the full-size one anyway, checks
# every tensor's name and shape against it (what analysis raised before; same messages).

def _copy_fixture(tmp_path: Path, name: str = "tiny-llama") -> Path:
    import shutil

    return Path(shutil.copytree(MODELS / name, tmp_path / name))


def _edit(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_shape_mismatch_is_one_checkpoint_error_naming_every_tensor(tmp_path):
    folder = _copy_fixture(tmp_path)
    _edit(folder, vocab_size=600, num_key_value_heads=4)
    with pytest.raises(CheckpointError) as info:
        scan_of(folder, probe=False)
    problems = info.value.problems
    fields = {p.field for p in problems}
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= fields
    assert {f"model.layers.{i}.self_attn.{n}_proj.weight" for i in range(4) for n in "kv"} <= fields
    p = next(p for p in problems if p.field == "lm_head.weight")
    assert "[512, 128]" in p.message and "[600, 128]" in p.message and "vocab_size=600" in p.message
    assert p.file.endswith(".safetensors") and str(info.value).startswith(f"{len(problems)} problems:")
    # check_shapes off: the forward runs on the config as given
    assert scan_of(folder, probe=False, check_shapes=False).checkpoint is None


def test_matching_checkpoint_and_unused_layers_are_reported(tmp_path):
    clean = scan_of(MODELS / "tiny-deepseekv3", probe=False)
    ck = clean.checkpoint
    assert ck.model_class == "DeepseekV3ForCausalLM" and ck.tensors == 91 and ck.unused_params == 0
    assert ck.notes == [] and clean.checkpoint_problems == []  # header-only roles agree
    folder = _copy_fixture(tmp_path)
    _edit(folder, num_hidden_layers=1)
    cut = scan_of(folder, probe=False)
    assert cut.checkpoint.unused_params > 0
    assert any("beyond num_hidden_layers=1" in n for n in cut.checkpoint.notes)
    # three of four layers unused: the class's roles make the checkpoint broken, as analysis says
    assert len(cut.checkpoint_problems) == 1 and "not used by" in cut.checkpoint_problems[0]
    assert "checkpoint: 39 tensors match" in scan.summary_text(cut)
    assert scan_of(tiny_llama(tmp_path), probe=False).checkpoint is None  # config.json alone


def test_header_only_roles_that_differ_from_the_class_are_a_note(tmp_path, monkeypatch):
    from day0.checkpoint.files import data

    patterns = {**data()["patterns"], "buffers": []}  # forget DeepSeek-V3's router bias
    monkeypatch.setitem(data(), "patterns", patterns)
    (note,) = scan_of(MODELS / "tiny-deepseekv3", probe=False).checkpoint.notes
    assert "as 'model' that transformers' DeepseekV3ForCausalLM holds as 'buffer'" in note
    assert "e_score_correction_bias" in note and "params.total" in note
