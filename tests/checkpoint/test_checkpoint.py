"""day0.checkpoint.headers: headers-only reading and every kind of broken checkpoint, on real safetensors;
day0.checkpoint.match: names and shapes against transformers' class (what scan and every model
loader check, :func:`matched`); day0.checkpoint.headers.classify: the header-only roles analysis counts
with."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from day0.checkpoint.headers import LocalReader, classify, read_checkpoint, read_header
from day0.checkpoint.match import check_checkpoint
from day0.errors import CheckpointError, InputError
from tests import breakers
from tests.conftest import MODELS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _save(model, path: Path, shard: str) -> Path:
    model.save_pretrained(path, max_shard_size=shard)
    return path


@pytest.fixture(scope="module")
def llama_src(tmp_path_factory) -> Path:
    """A tiny random Llama saved by transformers in 3 shards (plus index)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, intermediate_size=128)
    return _save(LlamaForCausalLM(cfg), tmp_path_factory.mktemp("llama"), "200KB")


@pytest.fixture(scope="module")
def moe_src(tmp_path_factory) -> Path:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=256, intermediate_size=128,
                         moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
    return _save(Qwen3MoeForCausalLM(cfg), tmp_path_factory.mktemp("moe"), "200KB")


@pytest.fixture
def llama(llama_src, tmp_path) -> Path:
    """A private copy each test may break."""
    return Path(shutil.copytree(llama_src, tmp_path / "ckpt"))


def shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def split_file(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_file(path: Path, header: dict | bytes, body: bytes) -> None:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + body)


def edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def matched(folder: Path):
    """The checkpoint against transformers' class for its config.json, on the meta device (what
    the scan stage and day0.checkpoint.modeling.load_pretrained do)."""
    from day0.checkpoint.files import read_config
    from day0.checkpoint.modeling import build_meta_model, resolve_config

    raw, file = read_config(folder)
    return check_checkpoint(folder, build_meta_model(resolve_config(raw, file=file)))


def problems_of(folder: Path) -> list:
    with pytest.raises(CheckpointError) as info:
        matched(folder)
    return info.value.problems


def tensor_names(header: dict) -> list[str]:
    return sorted(k for k in header if k != "__metadata__")


# ------------------------------------------------------------------------------- good checkpoints

def test_good_sharded_checkpoint_matches_safetensors_and_reads_only_headers(llama):
    from safetensors import safe_open

    ckpt = matched(llama)
    assert len(shards(llama)) >= 2 and ckpt.index_file == "model.safetensors.index.json"
    expected_read = (llama / "config.json").stat().st_size + \
        (llama / "model.safetensors.index.json").stat().st_size
    for shard in shards(llama):
        with safe_open(str(shard), "pt") as fh:
            for name in fh.keys():
                info = ckpt.tensors[name]
                sl = fh.get_slice(name)
                assert info.file == shard.name and list(info.shape) == sl.get_shape()
                assert info.dtype == sl.get_dtype()
        expected_read += 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
    assert ckpt.bytes_read == expected_read  # every byte read is accounted for, and no tensor data
    assert ckpt.total_bytes == sum(p.stat().st_size for p in llama.iterdir()
                                   if p.name != "generation_config.json")
    assert ckpt.bytes_read / ckpt.total_bytes < 0.05
    assert all(role == "model" for role in ckpt.roles.values()) and not ckpt.notes
    assert len(ckpt.roles) == len(ckpt.tensors)
    plain = read_checkpoint(llama)  # headers only: no roles until classify or the class match
    assert plain.tensors == ckpt.tensors and plain.bytes_read == ckpt.bytes_read and not plain.roles
    classify(plain, layers=2, model_class="LlamaForCausalLM")
    assert plain.roles == ckpt.roles and not plain.notes


def test_single_file_tied_checkpoint_without_index(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, intermediate_size=64,
                      tie_word_embeddings=True)
    folder = _save(LlamaForCausalLM(cfg), tmp_path / "single", "10GB")
    assert [p.name for p in shards(folder)] == ["model.safetensors"]
    ckpt = matched(folder)  # lm_head is tied: its absence is not a missing tensor
    assert ckpt.index_file is None and ckpt.tensors["model.embed_tokens.weight"].shape == (64, 32)
    assert "lm_head.weight" not in ckpt.tensors


def test_missing_parameter_is_named(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, intermediate_size=64)
    folder = _save(LlamaForCausalLM(cfg), tmp_path / "single", "10GB")
    state = load_file(folder / "model.safetensors")
    del state["model.layers.0.mlp.up_proj.weight"]
    save_file(state, folder / "model.safetensors")
    (p,) = problems_of(folder)
    assert p.field == "model.layers.0.mlp.up_proj.weight" and "not in the checkpoint" in p.message


def test_lone_config_means_no_weights():
    ckpt = read_checkpoint(FIXTURES / "configs" / "Llama-3.1-8B.json")
    assert not ckpt.has_weights and ckpt.config["model_type"] == "llama"
    assert ckpt.bytes_read == (FIXTURES / "configs" / "Llama-3.1-8B.json").stat().st_size


def test_moe_per_expert_tensors_match_fused_parameters(moe_src):
    ckpt = matched(moe_src)
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in ckpt.tensors
    assert ckpt.roles["model.layers.0.mlp.experts.3.gate_proj.weight"] == "model"


def test_a_fused_tensor_split_on_load_matches_every_part(fused_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt = matched(fused_checkpoint)
    fused = "model.layers.0.attention.query_key_value.weight"
    assert ckpt.roles[fused] == "model"
    # one row too few: the split cannot fill q, k and v, and the problem names the tensor
    folder = Path(shutil.copytree(fused_checkpoint, tmp_path / "short"))
    for shard in shards(folder):
        state = load_file(shard)
        if fused in state:
            state[fused] = state[fused][:-1]
            save_file(state, shard, metadata={"format": "pt"})
    (problem,) = problems_of(folder)
    assert problem.field == fused and "elements" in problem.message


def test_custom_reader_plugs_in(llama):
    """Any object with names/size/read_range/location works (the seam for ranged GETs)."""

    class MemoryReader:
        def __init__(self, folder):
            self.blobs = {p.name: p.read_bytes() for p in folder.iterdir()}
            self.calls = 0

        def names(self):
            return sorted(self.blobs)

        def size(self, name):
            return len(self.blobs[name])

        def read_range(self, name, start, length):
            self.calls += 1
            return self.blobs[name][start:start + length]

        def location(self, name):
            return f"mem://{name}"

    reader = MemoryReader(llama)
    ckpt = read_checkpoint(reader)
    assert ckpt.tensors.keys() == read_checkpoint(llama).tensors.keys()
    assert reader.calls == 2 + 2 * len(shards(llama))  # config, index, (length, header) per shard


# ------------------------------------------------------------------------------- broken shards

def test_truncated_shard_names_file_and_tensor(llama):
    shard = shards(llama)[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    (p,) = problems_of(llama)
    assert shard.name in p.file and "truncated" in p.message
    header, _ = split_file(Path(shard))
    last = max(tensor_names(header), key=lambda n: header[n]["data_offsets"][1])
    assert p.field == last


def test_offsets_beyond_file(llama):
    shard = shards(llama)[1]
    header, body = split_file(shard)
    name = tensor_names(header)[0]
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 10**6, end + 10**6]
    write_file(shard, header, body)
    problems = problems_of(llama)
    assert any(p.field == name and shard.name in p.file and "ends past" in p.message for p in problems)
    [past] = [p for p in problems if "ends past" in p.message]
    assert f"needs {end + 10**6} data bytes, file has {len(body)}" in past.message


def test_a_tensor_ending_past_the_file_names_the_bytes_it_needs(llama):
    """The last tensor's data 100 bytes longer than the file (its size no longer its shape's):
    was "needs 988160 data bytes, file has 988160" (issue 27)."""
    shard = shards(llama)[0]
    header, body = split_file(shard)
    last = max(tensor_names(header), key=lambda n: header[n]["data_offsets"][1])
    begin, end = header[last]["data_offsets"]
    header[last]["data_offsets"] = [begin, end + 100]
    write_file(shard, header, body)
    [past] = [p for p in problems_of(llama) if "ends past" in p.message]
    assert f"needs {end + 100} data bytes, file has {len(body)}" in past.message


def test_a_file_that_is_no_safetensors_is_never_echoed(llama):
    """Its first 8 bytes read as a header length: an error must not print them (issue 27: a
    shard symlinked to /etc/passwd published 'header length 3475222254926655346')."""
    shard = shards(llama)[0]
    shard.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 4)
    (p,) = problems_of(llama)
    assert "the first 8 bytes" in p.message and "runs past the end" in p.message
    assert str(int.from_bytes(b"root:x:0", "little")) not in p.message


def test_overlapping_offsets(llama):
    shard = shards(llama)[0]
    header, body = split_file(shard)
    a, b = sorted(tensor_names(header), key=lambda n: header[n]["data_offsets"][0])[:2]
    header[b]["data_offsets"] = [o - 4 for o in header[b]["data_offsets"]]
    write_file(shard, header, body)
    problems = problems_of(llama)
    assert any(p.field == b and "overlap" in p.message for p in problems)


def test_header_length_beyond_file_size(llama):
    shard = shards(llama)[0]
    raw = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", len(raw) * 2) + raw[8:])
    (p,) = [p for p in problems_of(llama) if shard.name in (p.file or "")]
    assert "header length" in p.message and "past the end" in p.message


def test_header_not_json(llama):
    shard = shards(llama)[0]
    header, body = split_file(shard)
    blob = json.dumps(header).encode()
    write_file(shard, b"{not json" + blob[9:], body)
    problems = problems_of(llama)
    assert any(shard.name in p.file and "not valid JSON" in p.message for p in problems)


def test_unknown_dtype(llama):
    shard = shards(llama)[0]
    header, body = split_file(shard)
    name = tensor_names(header)[0]
    header[name]["dtype"] = "F7"
    write_file(shard, header, body)
    problems = problems_of(llama)
    assert any(p.field == name and "unknown safetensors dtype 'F7'" in p.message for p in problems)


def test_reader_alone_reports_layout_problems(llama):
    shard = shards(llama)[0]
    shard.write_bytes(shard.read_bytes() + b"junk")
    problems: list = []
    found = read_header(LocalReader(llama), shard.name, problems)
    assert found and len(problems) == 1 and "after the last tensor" in problems[0].message


# ------------------------------------------------------------------------------- index

def test_missing_shard_named_by_index(llama):
    gone = shards(llama)[1]
    listed = sorted(t for t, s in json.loads((llama / "model.safetensors.index.json").read_text())
                    ["weight_map"].items() if s == gone.name)
    gone.unlink()
    problems = problems_of(llama)
    assert any(gone.name in p.file and p.field == listed[0] and "missing" in p.message for p in problems)


def test_index_missing_with_several_shards(llama):
    (llama / "model.safetensors.index.json").unlink()
    problems = problems_of(llama)
    assert any("model.safetensors.index.json" in p.file and "no model.safetensors.index.json"
               in p.message for p in problems)


def test_index_and_headers_disagree(llama):
    index_path = llama / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = shards(llama)[0].name
    dropped = next(t for t, s in sorted(index["weight_map"].items()) if s == shard)
    del index["weight_map"][dropped]
    index["weight_map"]["model.layers.0.ghost.weight"] = shard
    index_path.write_text(json.dumps(index))
    problems = problems_of(llama)
    assert any(p.field == dropped and "does not list it" in p.message for p in problems)
    assert any(p.field == "model.layers.0.ghost.weight" and shard in p.file
               and "not in this shard's header" in p.message for p in problems)


# ------------------------------------------------------------------------------- config vs shapes

def test_vocab_mismatch_names_embedding_and_head(llama):
    edit_config(llama, vocab_size=300)
    problems = problems_of(llama)
    fields = {p.field for p in problems}
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= fields
    p = next(p for p in problems if p.field == "lm_head.weight")
    assert "[256, 64]" in p.message and "[300, 64]" in p.message and "vocab_size=300" in p.message
    assert p.file.endswith(".safetensors")


def test_kv_heads_mismatch_names_k_and_v_proj(llama):
    edit_config(llama, num_key_value_heads=4)
    fields = {p.field for p in problems_of(llama)}
    assert fields == {f"model.layers.{i}.self_attn.{n}_proj.weight" for i in (0, 1) for n in "kv"}


def test_layer_count_vs_config(llama):
    edit_config(llama, num_hidden_layers=4)
    (p,) = problems_of(llama)
    assert "num_hidden_layers=4" in p.message and "2 decoder layers" in p.message
    assert p.field == "model.layers.2"


def test_extra_layers_are_notes_not_errors(llama):
    """Like DeepSeek-V3's MTP layer 61: tensors the class does not build load fine -> a note."""
    edit_config(llama, num_hidden_layers=1)
    ckpt = matched(llama)
    (note,) = [n for n in ckpt.notes if n.id == "extra_tensors"]
    assert "beyond num_hidden_layers=1" in note.message and note.tensor.startswith("model.layers.1.")
    assert ckpt.params("extra") > 0
    # header-only (analysis): the same tensors unused, the same note, without the class
    plain = read_checkpoint(llama)
    classify(plain, layers=1, model_class="LlamaForCausalLM")
    assert plain.roles == ckpt.roles and plain.params("extra") == ckpt.params("extra")
    assert [n.message for n in plain.notes if n.id == "extra_tensors"] == [note.message]


def test_header_only_roles_leave_out_buffers_and_quantization_scales(tmp_path):
    """DeepSeek-V3's router bias is a buffer of the class, block scales are quantization side
    tensors: classify gives them the roles the class match gives, so params.total agrees."""
    folder = Path(shutil.copytree(MODELS / "tiny-deepseekv3", tmp_path / "ds"))
    ckpt = matched(folder)
    plain = read_checkpoint(folder)
    classify(plain, layers=3)
    assert {n for n, r in plain.roles.items() if r == "buffer"} == {
        n for n, r in ckpt.roles.items() if r == "buffer"} != set()
    assert plain.roles == ckpt.roles
    edit_config(folder, quantization_config={"quant_method": "fp8"})
    plain = read_checkpoint(folder)
    plain.tensors["model.layers.0.mlp.down_proj.weight_scale_inv"] = plain.tensors[
        "model.layers.0.mlp.down_proj.weight"]
    classify(plain, layers=3)
    assert plain.roles["model.layers.0.mlp.down_proj.weight_scale_inv"] == "quant"


def test_expert_count_vs_config(moe_src, tmp_path):
    folder = Path(shutil.copytree(moe_src, tmp_path / "moe"))
    edit_config(folder, num_local_experts=8)
    problems = problems_of(folder)
    experts = [p for p in problems if ".mlp.experts." in p.field]
    routers = [p for p in problems if p.field.endswith(".mlp.gate.weight")]
    assert len(experts) == 4 and len(routers) == 2 and len(problems) == 6  # 2 layers x (gate_up, down)
    assert all("4 experts in the checkpoint" in p.message and "num_local_experts=8" in p.message
               for p in experts)
    assert all("[4, 64]" in p.message and "[8, 64]" in p.message for p in routers)


def test_dtype_surprise_is_a_note(llama):
    edit_config(llama, dtype="bfloat16")
    ckpt = read_checkpoint(llama)
    (note,) = [n for n in ckpt.notes if n.id == "dtype_surprise"]
    assert note.severity == "warning" and "F32" in note.message and "bfloat16" in note.message


def test_every_problem_reported_at_once(llama):
    edit_config(llama, vocab_size=300)
    shard = shards(llama)[-1]
    shard.write_bytes(shard.read_bytes()[:-8])
    err = pytest.raises(CheckpointError, matched, llama).value
    kinds = {("truncated" in p.message, "vocab_size" in p.message) for p in err.problems}
    assert (True, False) in kinds and (False, True) in kinds
    assert str(err).startswith(f"{len(err.problems)} problems:")


def test_no_config_is_input_error(llama):
    (llama / "config.json").unlink()
    with pytest.raises(InputError, match="no config.json"):
        read_checkpoint(llama)


def test_stray_single_file_next_to_index_is_an_error_for_analysis_and_loading(tmp_path):
    """transformers would load a stray model.safetensors instead of the index's shards."""
    from day0.checkpoint.modeling import load_pretrained

    folder = breakers.copy_fixture(tmp_path / "tiny-llama")
    stray = breakers.add_zero_single_file(folder)
    for attempt in (read_checkpoint, load_pretrained):
        with pytest.raises(CheckpointError) as info:
            attempt(folder)
        (p,) = info.value.problems
        assert p.file == str(stray) and "would load model.safetensors instead" in p.message
        assert p.fix == "remove model.safetensors or model.safetensors.index.json"
    stray.unlink()  # the fix: one truth left
    assert read_checkpoint(folder).tensors == read_checkpoint(MODELS / "tiny-llama").tensors


def test_other_unnamed_safetensors_are_a_warning_not_loaded(llama):
    """e.g. Mistral ships consolidated.safetensors next to the HF shards: transformers never
    loads it, so it is no second truth; it is said plainly that it is not checked."""
    shutil.copy(shards(llama)[0], llama / "consolidated.safetensors")
    ckpt = read_checkpoint(llama)
    (note,) = [n for n in ckpt.notes if "consolidated.safetensors" in n.message]
    assert note.severity == "warning" and "not loaded" in note.message
    assert "consolidated.safetensors" not in ckpt.files
