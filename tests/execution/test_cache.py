"""Stage cache keys change with weights, target, plugin source, config and code; hits round-trip."""

import math
import shutil

from day0.execution import cache
from day0.execution.contract import StageInputs
from day0.execution.stage import StageOutcome, StageSpec
from day0.execution.targets import resolve_target
from tests import breakers
from tests.conftest import MODELS


def make_spec(source, config=None, revision=None, **target):
    tgt = resolve_target("cpu-bf16").model_copy(update=target)
    return StageSpec(stage="alignment", config=config or {},
                     inputs=StageInputs(source=str(source), target=tgt, revision=revision))


def test_key_is_stable_and_sensitive(tmp_path):
    model = tmp_path / "m"
    shutil.copytree(MODELS / "tiny-llama", model)
    base = cache.stage_key(make_spec(model))
    assert base == cache.stage_key(make_spec(model))
    assert base != cache.stage_key(make_spec(model, config={"max_windows": 1}))
    assert base != cache.stage_key(make_spec(model, dtype="float16"))
    assert base != cache.stage_key(make_spec(model, revision="v1"))
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



def test_in_place_edit_with_mtime_restored_changes_the_key(tmp_path):
    """The key is the content: overwriting a tensor's bytes and restoring the mtime (and size)
    must not reuse stale results."""
    model = breakers.copy_fixture(tmp_path / "tiny-llama")
    name = "lm_head.weight"
    shard = breakers.span(model, name)[0]
    before = (shard.stat().st_size, shard.stat().st_mtime_ns)
    key = cache.stage_key(make_spec(model))
    original = breakers.read_float(model, name, 0)
    breakers.put_float(model, name, 0, math.nan)
    assert (shard.stat().st_size, shard.stat().st_mtime_ns) == before
    assert cache.stage_key(make_spec(model)) != key
    breakers.put_float(model, name, 0, original)
    assert cache.stage_key(make_spec(model)) == key  # the same bytes again: the same key
