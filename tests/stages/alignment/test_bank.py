"""The reference bank: a second target replays what the reference and control computed (no
forward of either), its metrics equal a run without the bank, and a bank on the object store
serves a fresh process."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from day0.execution.contract import StageInputs
from day0.stages.alignment.core import Config, run
from day0.stages.alignment import sides
from day0.execution.targets import Target

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "tests" / "fixtures" / "models"
PLUGINS = ROOT / "tests" / "plugins"
SMALL = dict(max_windows=2, seq_len=64, generation_prompts=2, new_tokens=6, op_tokens=16)


def _target(dtype="bfloat16", plugin=None) -> Target:
    return Target(name=f"cpu-{dtype}", device="cpu", dtype=dtype,
                  plugins=[str(PLUGINS / f"{plugin}.py")] if plugin else [])


def _run(source, target, bank, **settings):
    mode = settings.pop("reference_bank", "use") if bank is not None else "off"
    uri = {} if bank is None else dict(reference_bank_uri=str(bank))
    config = Config(**{**SMALL, **uri, **settings}, reference_bank=mode)
    return run(config, StageInputs(source=str(source), target=target))


def _same(a: dict, b: dict) -> dict:
    """Metrics that differ (NaN equals NaN)."""
    return {k: (a[k], b.get(k)) for k in a
            if not (a[k] == b.get(k) or (isinstance(a[k], float) and math.isnan(a[k])
                                           and isinstance(b.get(k), float)
                                           and math.isnan(b[k])))}


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """The dtypes of every model loaded resident (a banked reference is never loaded)."""
    seen: list[str] = []
    real = sides.load_pretrained

    def spy(source, *, device="cpu", dtype="float32", **kw):
        seen.append(dtype)
        return real(source, device=device, dtype=dtype, **kw)

    monkeypatch.setattr(sides, "load_pretrained", spy)
    return seen


def test_a_second_target_replays_reference_and_control(tmp_path, loads, capsys, monkeypatch):
    bank = tmp_path / "bank"
    first = _run(MODELS / "tiny-llama", _target(plugin="noop"), bank)
    assert not first.reference_bank_hit and first.reference_bank_bytes > 0
    assert sorted(loads) == ["bfloat16", "bfloat16", "float32"]  # reference, control, target
    stored = sorted(p.name for p in (bank / first.reference_bank.rsplit("/", 1)[1]).iterdir())
    assert stored == ["control-bfloat16", "reference"]

    loads.clear()
    capsys.readouterr()
    from day0.stages.alignment import core

    monkeypatch.setattr(core, "record_ops", _forbidden)  # the op inputs come from the bank
    second = _run(MODELS / "tiny-llama", _target(plugin="scale_layer"), bank)
    log = capsys.readouterr().out
    assert second.reference_bank_hit and "no forward of reference or control" in log
    assert loads == ["bfloat16"]  # the target alone
    monkeypatch.undo()
    fresh = _run(MODELS / "tiny-llama", _target(plugin="scale_layer"), None)
    assert _same(second.metrics(), fresh.metrics()) == {}
    assert second.ops == fresh.ops and second.generation == fresh.generation
    assert second.layers == fresh.layers

    # a target that is the control itself: nothing runs at all
    loads.clear()
    control = _run(MODELS / "tiny-llama", _target(), bank)
    assert loads == [] and control.target_is_control
    assert _same(control.metrics(), _run(MODELS / "tiny-llama", _target(), None).metrics()) == {}


def _forbidden(*args, **kwargs):
    raise AssertionError("the reference ran a forward for the op check")


def test_another_dtype_adds_its_control_and_reuses_the_reference(tmp_path, loads):
    bank = tmp_path / "bank"
    _run(MODELS / "tiny-llama", _target(plugin="noop"), bank)
    loads.clear()
    half = _run(MODELS / "tiny-llama", _target("float16", "noop"), bank)
    assert half.reference_bank_hit and sorted(loads) == ["float16", "float16"]  # control, target
    assert _same(half.metrics(), _run(MODELS / "tiny-llama", _target("float16", "noop"),
                                      None).metrics()) == {}
    loads.clear()
    _run(MODELS / "tiny-llama", _target("float16", "noop"), bank)
    assert loads == ["float16"]


def test_moe_routes_and_streamed_sides_replay_exactly(tmp_path):
    """A MoE bank built resident serves a streamed target (windows within one chunk: the same
    numbers), and a streamed bank a resident one."""
    source = MODELS / "tiny-qwen3moe"
    bank = tmp_path / "bank"
    built = _run(source, _target(plugin="flip_routing"), bank)
    assert built.routers and not built.reference_bank_hit
    streamed = _run(source, _target(plugin=None, dtype="float16"), bank, streaming="on")
    assert streamed.streamed and streamed.reference_bank_hit
    fresh = _run(source, _target(dtype="float16"), None, streaming="on")
    assert _same(streamed.metrics(), fresh.metrics()) == {}
    assert streamed.routers == fresh.routers
    again = _run(source, _target(plugin="flip_routing"), bank)
    assert again.reference_bank_hit and again.routers == built.routers


def test_a_broken_bank_is_recomputed_and_a_changed_text_is_a_new_key(tmp_path, capsys, eval_text):
    bank = tmp_path / "bank"
    first = _run(MODELS / "tiny-llama", _target(plugin="noop"), bank)
    part = bank / first.reference_bank.rsplit("/", 1)[1] / "reference"
    shard = next(part.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    again = _run(MODELS / "tiny-llama", _target(plugin="noop"), bank)
    assert not again.reference_bank_hit and "fails verification" in capsys.readouterr().out
    assert _same(again.metrics(), first.metrics()) == {}
    assert _run(MODELS / "tiny-llama", _target(plugin="noop"), bank).reference_bank_hit
    other = _run(MODELS / "tiny-llama", _target(plugin="noop"), bank, text_file=str(eval_text))
    assert not other.reference_bank_hit and other.reference_bank != first.reference_bank
    refreshed = _run(MODELS / "tiny-llama", _target(plugin="noop"), bank,
                     reference_bank="refresh")
    assert not refreshed.reference_bank_hit and refreshed.reference_bank == first.reference_bank



@pytest.mark.integration  # `day0 reference` then a validation, each its own process
def test_a_bank_on_the_object_store_survives_a_restart(s3_server, monkeypatch, tmp_path):
    """Built by `day0 reference` in one process, replayed by a validation in a fresh one (its
    own empty cache): the bank lives on the store, read by ranged GETs, replayed because both
    hold the shared secret it is sealed with (without it, a machine recomputes)."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    s3_server.create_bucket("banks")
    uri = "s3://banks/reference-bank"
    config = tmp_path / "settings.yaml"
    config.write_text("alignment: {max_windows: 2, seq_len: 64, generation_prompts: 2, "
                      f"new_tokens: 6, op_tokens: 16, reference_bank_uri: '{uri}'}}\n")
    env = {**s3_server.env(), "DAY0_CACHE_DIR": str(tmp_path / "first"),
           "DAY0_EVIDENCE_SECRET": "the-platform-team-s-secret"}
    built = _cli(["reference", str(MODELS / "tiny-llama"), "--dtype", "bfloat16", "--config",
                  str(config)], env)
    assert built.returncode == 0, built.stderr
    assert "stored reference" in built.stdout and f"reference bank: {uri}/" in built.stdout

    env["DAY0_CACHE_DIR"] = str(tmp_path / "second")  # a restarted machine: nothing local
    script = (
        "import sys, json\n"
        "from day0.stages.alignment.core import Config, run\n"
        "from day0.execution.contract import StageInputs\n"
        "from day0.execution.targets import Target\n"
        f"c = Config(max_windows=2, seq_len=64, generation_prompts=2, new_tokens=6, "
        f"op_tokens=16, reference_bank_uri='{uri}')\n"
        "t = Target(name='t', device='cpu', dtype='bfloat16', "
        f"plugins=['{PLUGINS / 'scale_layer.py'}'])\n"
        f"r = run(c, StageInputs(source='{MODELS / 'tiny-llama'}', target=t))\n"
        "print('HIT', r.reference_bank_hit, r.reference_bank_bytes)\n")
    second = subprocess.run([sys.executable, "-c", script], env={**_base_env(), **env},
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "HIT True" in second.stdout and "no forward of reference or control" in second.stdout
    assert not list((tmp_path / "second").rglob("*.safetensors"))  # never downloaded
    # a machine without the secret verifies with its own key: the bank is not replayed there
    env.pop("DAY0_EVIDENCE_SECRET")
    env["DAY0_CACHE_DIR"] = str(tmp_path / "third")
    third = subprocess.run([sys.executable, "-c", script], env={**_base_env(), **env},
                           capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-2000:]
    assert "HIT False" in third.stdout and "its seal does not verify" in third.stdout


def _base_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("DAY0_")}


def _cli(args: list[str], env: dict):
    return subprocess.run([sys.executable, "-m", "day0.cli", *args], env={**_base_env(), **env},
                          capture_output=True, text=True, timeout=600)


def test_a_bank_over_its_size_limit_is_not_stored(tmp_path, capsys):
    bank = tmp_path / "bank"
    result = _run(MODELS / "tiny-llama", _target(plugin="noop"), bank,
                  reference_bank_max_gib=1e-6)
    assert "not stored (raise reference_bank_max_gib" in capsys.readouterr().out
    assert not bank.exists() and not result.reference_bank_hit


def test_a_bank_built_without_the_weight_scan_does_not_skip_it(tmp_path):
    bank = tmp_path / "bank"
    _run(MODELS / "tiny-llama", _target(plugin="noop"), bank, check_weights=False)
    replayed = _run(MODELS / "tiny-llama", _target(plugin="noop"), bank)
    assert replayed.reference_bank_hit and "weights" in replayed.timings  # scanned now


def test_day0_reference_refuses_a_bad_setting_in_one_line(tmp_path, capsys):
    from day0.cli import main

    config = tmp_path / "settings.yaml"
    config.write_text("alignment: {max_windowz: 2}\n")
    assert main(["reference", str(MODELS / "tiny-llama"), "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "max_windows" in err  # did you mean


def test_a_bank_that_cannot_be_written_leaves_the_verdict_alone(tmp_path, capsys):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    result = _run(MODELS / "tiny-llama", _target(plugin="noop"), blocked)
    assert "not stored at" in capsys.readouterr().out and not result.reference_bank_hit
    assert _same(result.metrics(), _run(MODELS / "tiny-llama", _target(plugin="noop"),
                                        None).metrics()) == {}
