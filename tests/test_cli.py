"""The `day0` CLI: help, exit codes, and malformed inputs that must never yield a traceback or PASS."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest
import yaml

from tests.conftest import MODELS

LLAMA = MODELS / "tiny-llama"


def day0(*args, env=None, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "day0.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def first_shard(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder / sorted(set(index["weight_map"].values()))[0]


@pytest.fixture
def ckpt(tmp_path):
    dest = tmp_path / "ckpt"
    shutil.copytree(LLAMA, dest)
    return dest


@pytest.mark.parametrize("command", ["analyze", "scan", "validate", "stages", "targets", "metrics",
                                     "gates"])
def test_help(command):
    proc = day0(command, "--help")
    assert proc.returncode == 0 and "usage: day0" in proc.stdout


def test_analyze_json_document():
    proc = day0("analyze", LLAMA, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for key in ("architecture", "model_type", "attention", "moe", "params", "memory", "kv_cache", "plan", "risks"):
        assert key in doc
    assert doc["attention"]["kind"] == "gqa" and doc["moe"] is None


def test_the_stages_that_validate_help_points_to_are_listed_without_torch():
    assert "`day0 stages`" in day0("validate", "--help").stdout.replace("\n", " ")
    script = ("import sys; from day0 import cli; code = cli.main(['stages']); "
              "assert code == 0 and 'torch' not in sys.modules, code")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    for name in ("analysis", "scan", "alignment", "evaluation", "performance", "soak"):
        assert any(line.startswith(name + " ") for line in lines), name


def test_targets_and_metrics_list():
    assert "cpu-bf16" in day0("targets").stdout
    assert "alignment.logits.kl_mean" in day0("metrics").stdout
    assert day0("gates").returncode == 0


def _rewrite_header(path, mutate):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    mutate(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def truncate_shard(ckpt):
    shard = first_shard(ckpt)
    shard.write_bytes(shard.read_bytes()[:-1000])
    return shard.name


def offsets_out_of_range(ckpt):
    shard = first_shard(ckpt)

    def mutate(header):
        name = next(k for k in header if k != "__metadata__")
        header[name]["data_offsets"] = [0, 10**12]
    _rewrite_header(shard, mutate)
    return shard.name


def index_names_missing_shard(ckpt):
    shard = first_shard(ckpt)
    shard.unlink()
    return shard.name


def shape_disagrees_with_config(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["hidden_size"] *= 2
    (ckpt / "config.json").write_text(json.dumps(config))
    return "embed_tokens"  # its [vocab, hidden] shape no longer matches the config


def header_not_json(ckpt):
    shard = first_shard(ckpt)
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    shard.write_bytes(data[:8] + b"{" * n + data[8 + n:])
    return shard.name


def bad_config_json(ckpt):
    (ckpt / "config.json").write_text('{"model_type": "llama",')
    return "config.json"


def missing_config(ckpt):
    (ckpt / "config.json").unlink()
    return "config.json"


def unknown_model_type_without_architectures(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["model_type"], config["architectures"] = "nonesuch", ["NoneSuchForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(config))
    return "nonesuch"


def stray_single_file_next_to_index(ckpt):
    from tests.breakers import add_zero_single_file

    return add_zero_single_file(ckpt).name  # transformers would load it instead of the index


BROKEN = [truncate_shard, offsets_out_of_range, index_names_missing_shard, header_not_json,
          bad_config_json, missing_config, unknown_model_type_without_architectures,
          stray_single_file_next_to_index]


@pytest.mark.parametrize("breaker", BROKEN, ids=lambda f: f.__name__)
def test_broken_checkpoint_analyze_exits_2_with_one_line(ckpt, breaker):
    needle = breaker(ckpt)
    proc = day0("analyze", ckpt)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    message = proc.stderr.strip()
    assert message.startswith("day0: error:") and needle in message
    assert "fix:" in message


def test_shape_mismatch_is_scans_to_find_and_exits_2_with_one_line(ckpt):
    """Names and shapes need transformers' class: header-only analysis says who checks them;
    scan, which builds the class anyway, refuses the checkpoint as analysis did before."""
    needle = shape_disagrees_with_config(ckpt)
    proc = day0("analyze", ckpt)
    assert proc.returncode == 0, proc.stderr
    assert "`day0 scan` checks them" in proc.stdout
    proc = day0("scan", ckpt, "--no-probe")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    message = proc.stderr.strip()
    assert message.startswith("day0: error:") and needle in message and "hidden_size=" in message
    assert "fix:" in message and len(message.splitlines()) == 1


def test_missing_source_exits_2(tmp_path):
    proc = day0("analyze", tmp_path / "nowhere")
    assert proc.returncode == 2 and "nowhere" in proc.stderr


def test_unknown_target_name_exits_2_with_suggestion():
    proc = day0("validate", LLAMA, "--target", "cpu-bf61")
    assert proc.returncode == 2 and "did you mean 'cpu-bf16'" in proc.stderr


def test_target_with_unknown_device_exits_2(tmp_path):
    target = tmp_path / "target.yaml"
    target.write_text(yaml.safe_dump({"name": "x", "device": "cdua", "dtype": "bfloat16"}))
    proc = day0("validate", LLAMA, "--target-file", target)
    assert proc.returncode == 2
    assert str(target) in proc.stderr and "device" in proc.stderr and "did you mean 'cuda'" in proc.stderr


def test_target_with_unknown_field_exits_2(tmp_path):
    target = tmp_path / "target.yaml"
    target.write_text(yaml.safe_dump({"name": "x", "device": "cpu", "dtype": "bfloat16", "plugin": []}))
    proc = day0("scan", LLAMA, "--target-file", target)
    assert proc.returncode == 2 and "did you mean 'plugins'" in proc.stderr


def test_gates_with_unknown_metric_exits_2(tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump({"gates": [{"id": "a", "metric": "alignment.logits.kl_avg",
                                                "op": "<=", "threshold": 0.1}]}))
    proc = day0("validate", LLAMA, "--gates", gates)
    assert proc.returncode == 2 and "unknown metric" in proc.stderr and str(gates) in proc.stderr


def test_unknown_stage_in_config_exits_2(tmp_path):
    config = tmp_path / "stages.yaml"
    config.write_text(yaml.safe_dump({"alignmnet": {}}))
    proc = day0("validate", LLAMA, "--config", config)
    assert proc.returncode == 2 and "did you mean 'alignment'" in proc.stderr


def test_bad_stage_settings_exit_2_with_every_problem_before_any_run(tmp_path):
    """Each stage's settings are checked against its Config when the run is requested: every
    problem of every stage at once, file, field and fix on one line; nothing runs (no server)."""
    config = tmp_path / "stages.yaml"
    config.write_text(yaml.safe_dump({"evaluation": {"limt": 5, "suite": "quik"},
                                      "alignment": {"max_windos": 3}, "soak": {}}))
    proc = day0("validate", LLAMA, "--config", config, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "3 problems" in proc.stderr and str(config) in proc.stderr
    assert "evaluation.limt: unknown field 'limt' (fix: did you mean 'limit')" in proc.stderr
    assert "evaluation.suite: unknown suite 'quik': did you mean 'quick'?" in proc.stderr
    assert "alignment.max_windos: unknown field 'max_windos' (fix: did you mean 'max_windows')" \
        in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_every_stage_checks_its_settings_with_its_cores_config():
    """A stage's config_module names where its Config is (checked without its core's imports):
    the very class its core runs with."""
    from day0 import stages

    for name in stages.names():
        stage = stages.get(name)
        assert stage.config_model() is stage.load().Config, name


def test_target_file_with_deployment_exits_2(tmp_path):
    target = tmp_path / "target.yaml"
    target.write_text(yaml.safe_dump({"name": "x", "device": "cpu", "dtype": "bfloat16"}))
    proc = day0("validate", LLAMA, "--target-file", target, "--deployment", "validate/day0")
    assert proc.returncode == 2 and "--target NAME" in proc.stderr
