"""Stage cache keys change with weights, target, plugin source, config and code; hits round-trip."""

import shutil

from day0 import cache
from day0.contract import StageInputs
from day0.stage import StageOutcome, StageSpec
from day0.targets import resolve_target
from tests.conftest import MODELS


def make_spec(source, config=None, **target):
    tgt = resolve_target("cpu-bf16").model_copy(update=target)
    return StageSpec(stage="alignment", config=config or {}, inputs=StageInputs(source=str(source), target=tgt))


def test_key_is_stable_and_sensitive(tmp_path):
    model = tmp_path / "m"
    shutil.copytree(MODELS / "tiny-llama", model)
    base = cache.stage_key(make_spec(model))
    assert base == cache.stage_key(make_spec(model))
    assert base != cache.stage_key(make_spec(model, config={"max_windows": 1}))
    assert base != cache.stage_key(make_spec(model, dtype="float16"))
    plugin = tmp_path / "p.py"
    plugin.write_text("def apply(model):\n    pass\n")
    with_plugin = cache.stage_key(make_spec(model, plugins=[str(plugin)]))
    plugin.write_text("def apply(model):\n    model.eval()\n")
    assert with_plugin != cache.stage_key(make_spec(model, plugins=[str(plugin)]))
    config = model / "config.json"
    config.write_text(config.read_text() + "\n")  # any byte of the checkpoint counts
    assert base != cache.stage_key(make_spec(model))


def test_store_and_load_only_successes(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_CACHE_DIR", str(tmp_path))
    ok = StageOutcome(stage="scan", ok=True, metrics={"scan.coverage": 1.0})
    cache.store("k1", ok)
    hit = cache.load("k1")
    assert hit.cached and hit.metrics == ok.metrics
    cache.store("k2", StageOutcome(stage="scan", ok=False, failure="crash", error="x"))
    assert cache.load("k2") is None
    (tmp_path / "stages" / "k3.json").write_text("{broken")
    assert cache.load("k3") is None
