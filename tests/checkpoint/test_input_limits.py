"""Issue 9, inputs: config.json and checkpoint headers are untrusted.

A hostile config is refused before anything is built (day0.checkpoint.limits, bounds in
day0/data/limits.yaml), construction and parse errors are input errors (exit 2) naming file, field
and fix, and every error is one bounded line. The fuzz corpus (tests/checkpoint/test_fuzz_inputs.py) checks
the same promises on a few hundred mutants; here each finding of the issue has its own case.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from day0 import cli
from day0.checkpoint import limits
from day0.errors import MAX_MESSAGE, CheckpointError, InputError, Problem
from tests import breakers
from tests.conftest import FIXTURES, MODELS

INDEX = "model.safetensors.index.json"


@pytest.fixture
def llama(tmp_path) -> Path:
    return breakers.copy_fixture(tmp_path / "tiny-llama")


def analyze(folder, capsys) -> tuple[int, str]:
    """`day0 analyze` in this process: (exit code, stderr)."""
    rc = cli.main(["analyze", str(folder)])
    return rc, capsys.readouterr().err


def scan(folder, capsys) -> tuple[int, str]:
    """`day0 scan` in this process (no probe): the stage that builds transformers' class."""
    rc = cli.main(["scan", str(folder), "--no-probe"])
    return rc, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    assert len(lines[0]) <= 500 and "Traceback" not in err
    assert lines[0].startswith("day0: error:") and "(fix: " in lines[0]
    return lines[0]


def set_config(folder: Path, **values) -> None:
    config = json.loads((folder / "config.json").read_text())
    for dotted, value in values.items():
        *parents, leaf = dotted.split("__")
        node = config
        for key in parents:
            node = node[key]
        node[leaf] = value
    (folder / "config.json").write_text(json.dumps(config))


# ------------------------------------------------------------------------------- unbounded work

def test_a_billion_layers_are_refused_without_building_anything(llama):
    """The issue's hang: a fresh process answers with exit 2 (how fast: bench_analysis_bytes.py
    prints it; the timeout here only turns a hang into a failure)."""
    set_config(llama, num_hidden_layers=10**9)
    proc = subprocess.run([sys.executable, "-m", "day0.cli", "analyze", str(llama)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc.stderr)
    assert "config.json" in line and "num_hidden_layers" in line and "1000000000" in line


@pytest.mark.parametrize("layers", [10**6, 2**63])
def test_huge_layer_counts_are_refused(llama, capsys, layers):
    set_config(llama, num_hidden_layers=layers)
    rc, err = analyze(llama, capsys)
    assert rc == 2 and "num_hidden_layers" in one_line(err)


def test_config_far_bigger_than_its_weights_is_refused_before_building(llama, capsys, monkeypatch):
    """Within every bound, yet 1000x the checkpoint: the model is never built."""
    import day0.checkpoint.modeling
    from day0.stages.analysis import core as analysis

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(day0.checkpoint.modeling, "build_meta_model", no_build)
    monkeypatch.setattr(analysis, "meta_parameters", no_build)
    set_config(llama, vocab_size=4_000_000)
    rc, err = analyze(llama, capsys)
    line = one_line(err)
    assert rc == 2 and "vocab_size" in line and "implies at least" in line and "bytes" in line


# ------------------------------------------------------------------------------- exit 2, not 4

@pytest.mark.parametrize("field,value", [
    ("hidden_size", -128), ("hidden_size", 0), ("intermediate_size", -1), ("vocab_size", 0),
    ("num_key_value_heads", 0), ("num_attention_heads", 0), ("head_dim", 0),
    ("max_position_embeddings", -1), ("num_hidden_layers", -1), ("hidden_size", "128"),
    ("num_hidden_layers", 4.0), ("vocab_size", True), ("model_type", 123),
    ("architectures", "LlamaForCausalLM"),
])
def test_bad_dimension_or_type_is_input_error_naming_the_field(llama, capsys, field, value):
    set_config(llama, **{field: value})
    rc, err = analyze(llama, capsys)
    line = one_line(err)
    assert rc == 2 and field in line and "config.json" in line


@pytest.mark.parametrize("field,value,named", [
    ("hidden_act", "nonesuch", "hidden_act"),
    ("rope_parameters__rope_type", "nonesuch", "rope_type"),
])
def test_unknown_enum_names_field_and_choices(llama, capsys, field, value, named):
    """transformers' class refuses it when built: scan's to find (header-only analysis builds
    nothing and reads neither field)."""
    set_config(llama, **{field: value})
    rc, err = scan(llama, capsys)
    line = one_line(err)
    assert rc == 2 and named in line and "'nonesuch'" in line and "use one of" in line


def test_construction_error_of_transformers_is_input_error(llama, capsys):
    """Whatever transformers' own asserts say (here: padding index outside the vocabulary); the
    stage that builds the class (scan) or, without weights, analysis's child process."""
    set_config(llama, pad_token_id=10**6)
    rc, err = scan(llama, capsys)
    line = one_line(err)
    assert rc == 2 and "transformers cannot build LlamaForCausalLM" in line
    rc, err = analyze(llama / "config.json", capsys)
    line = one_line(err)
    assert rc == 2 and "transformers cannot build LlamaForCausalLM" in line


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"model_type": "llama", "x": ' + "[" * 500 + "]" * 500 + "}"])
def test_deeply_nested_config_is_input_error(llama, capsys, text):
    (llama / "config.json").write_text(text)
    rc, err = analyze(llama, capsys)
    line = one_line(err)
    assert rc == 2 and "config.json" in line and "nested" in line


def test_non_string_metadata_is_refused_like_the_loader_does(llama, capsys):
    from safetensors import SafetensorError, safe_open

    shard = breakers.shards(llama)[0]
    header, data = breakers.header_of(shard)
    header["__metadata__"] = {"format": 1}
    blob = json.dumps(header).encode()
    body = shard.read_bytes()[data:]
    shard.write_bytes(struct.pack("<Q", len(blob)) + blob + body)
    with pytest.raises(SafetensorError):  # the loader's truth, which analysis must agree with
        safe_open(str(shard), "pt")
    rc, err = analyze(llama, capsys)
    line = one_line(err)
    assert rc == 2 and "__metadata__" in line and shard.name in line


def test_empty_weight_map_is_input_error(llama, capsys):
    doc = json.loads((llama / INDEX).read_text())
    doc["weight_map"] = {}
    (llama / INDEX).write_text(json.dumps(doc))
    rc, err = analyze(llama, capsys)
    assert rc == 2 and "weight_map is empty" in one_line(err)


def test_100k_extra_index_entries_give_one_short_line(llama, capsys):
    doc = json.loads((llama / INDEX).read_text())
    shard = sorted(set(doc["weight_map"].values()))[0]
    doc["weight_map"].update({f"model.extra.{i}.weight": shard for i in range(100_000)})
    (llama / INDEX).write_text(json.dumps(doc))
    rc, err = analyze(llama, capsys)
    line = one_line(err)
    assert rc == 2 and line.startswith("day0: error: 100000 problems:") and "more" in line


# ------------------------------------------------------------------------------- messages and data

def test_error_line_is_bounded_and_keeps_file_and_fix():
    many = [Problem("m\n" * 10_000, file="/very/long/" + "d/" * 500 + "model-00001-of-00004.safetensors",
                    field="t" * 1000, fix="re-download " + "x" * 1000) for _ in range(100_000)]
    text = str(CheckpointError.from_problems(many))
    assert len(text) <= MAX_MESSAGE and "\n" not in text
    assert "model-00001-of-00004.safetensors" in text and "(fix: re-download" in text
    assert text.endswith("and 99999 more")
    short = str(InputError("bad", file="config.json", field="vocab_size", fix="set it"))
    assert short == "config.json: vocab_size: bad (fix: set it)"


def test_released_configs_and_fixtures_are_within_limits():
    """The bounds must never refuse a real release (published configs and the bundled fixtures)."""
    configs = sorted((FIXTURES / "configs").glob("*.json")) + sorted(MODELS.glob("*/config.json"))
    assert len(configs) >= 6
    for path in configs:
        raw = json.loads(path.read_text())
        assert limits.config_problems(raw, str(path)) == [], path
    for folder in sorted(MODELS.iterdir()):  # and their weights hold what their configs imply
        raw = json.loads((folder / "config.json").read_text())
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        assert limits.size_problems(raw, "config.json", size, str(folder)) == [], folder


def test_implied_params_is_a_lower_bound_of_released_models():
    """Against the published totals (tests/stages/analysis/test_analysis.py): Llama-3.1-8B 8.03B, Mixtral 46.7B,
    DeepSeek-V3 671B; the bound must stay under each and not be trivially small."""
    published = {"Llama-3.1-8B": 8.03e9, "Mixtral-8x7B-v0.1": 46.7e9, "DeepSeek-V3": 671e9}
    for name, total in published.items():
        raw = json.loads((FIXTURES / "configs" / f"{name}.json").read_text())
        implied, _ = limits.implied_params(raw)
        assert total / 100 < implied <= total, (name, implied)


# ------------------------------------------------------------------------------- loading stages

@pytest.mark.parametrize("stage", ["alignment", "scan"])
def test_stage_start_refuses_bad_config_as_input_error(llama, stage):
    """At the start of each stage that builds or loads the model: failure 'input', exit 2."""
    from day0.execution.contract import StageInputs
    from day0.execution.stage import StageSpec, execute
    from day0.execution.targets import resolve_target

    set_config(llama, max_position_embeddings=-1)
    outcome = execute(StageSpec(stage=stage, inputs=StageInputs(source=str(llama),
                                                                target=resolve_target("cpu-bf16"))))
    assert not outcome.ok and outcome.failure == "input" and outcome.exit_code == 2
    assert "max_position_embeddings" in outcome.error and len(outcome.error) <= MAX_MESSAGE


def test_load_pretrained_refuses_an_inflated_config_before_loading(llama):
    from day0.checkpoint.modeling import load_pretrained

    set_config(llama, vocab_size=4_000_000)
    with pytest.raises(InputError, match="implies at least"):
        load_pretrained(llama)


# ------------------------------------------------------------------------------- validate

def _validate(folder, prefect_server):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    return subprocess.run([sys.executable, "-m", "day0.cli", "validate", str(folder), "--no-cache"],
                          capture_output=True, text=True, timeout=900, env=env)


def _empty_weight_map(folder: Path) -> None:
    doc = json.loads((folder / INDEX).read_text())
    doc["weight_map"] = {}
    (folder / INDEX).write_text(json.dumps(doc))


@pytest.mark.integration
@pytest.mark.parametrize("case,named", [
    ("empty_weight_map", "weight_map"), ("num_hidden_layers", "num_hidden_layers"),
    ("max_position_embeddings", "max_position_embeddings"),
])
def test_validate_exits_2_for_bad_input(prefect_server, tmp_path, case, named):
    """These ended as ERROR (3): the analysis stage now refuses them as input errors."""
    folder = breakers.copy_fixture(tmp_path / "tiny-llama")
    if case == "empty_weight_map":
        _empty_weight_map(folder)
    else:
        set_config(folder, **{case: -1})
    proc = _validate(folder, prefect_server)
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    error_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("day0: error:")]
    assert len(error_lines) == 1 and named in error_lines[0] and len(error_lines[0]) <= 500
    assert "Traceback" not in proc.stderr


def test_a_per_layer_width_is_a_list_a_scalar_field_is_not():
    """Gemma-3n gives intermediate_size once per layer; hidden_size as a list is still refused."""
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 512}
    assert limits.config_problems({**base, "intermediate_size": [128, 256]}, "config.json") == []
    problems = limits.config_problems({**base, "intermediate_size": [128, 0]}, "config.json")
    assert any("outside the sane range" in p.message for p in problems)
    problems = limits.config_problems({**base, "hidden_size": [64, 64]}, "config.json")
    assert any("must be a whole number" in p.message for p in problems)
