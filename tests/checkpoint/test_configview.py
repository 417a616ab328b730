"""day0.checkpoint.configview: config.json as transformers' class reads it, without transformers.

The view must agree with transformers' own config class wherever analysis reads it: for every
model_type of day0/data/model_types.yaml, the facts analysis computes (attention, layer split,
RoPE, MoE aliases, max context, dimensions) from the class's default config are compared both
ways; every difference is listed in day0/data/configview_differences.yaml with its reason, so a new
one fails here, and so does a listed one that went away. model_types.yaml must be what
scripts/make_model_types.py generates from the installed transformers.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
from pathlib import Path

import pytest

from day0.checkpoint import configview
from day0.checkpoint.files import data
from day0.checkpoint.configview import differences, model_types, resolve
from day0.errors import InputError
from day0.stages.analysis.model import attention_facts, cfg_alias, layer_split, rope_facts
from tests.conftest import FIXTURES, ROOT

ANALYSIS = ROOT / "day0" / "stages" / "analysis"
FACT_FIELDS = ("num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size",
               "tie_word_embeddings", "routed_scaling_factor", "scoring_func", "n_group",
               "topk_group", "shared_expert_intermediate_size")
ALIASES = ("num_experts", "experts_per_token", "shared_experts", "max_context")
# a layer count and sliding-window settings the default configs do not have: the layer_types
# rules must follow them (or say, in a note, that they cannot)
SETTINGS = {"num_hidden_layers": 7, "use_sliding_window": True, "sliding_window": 64,
            "max_window_layers": 3}


class TransformersView:
    """What analysis read before the view: transformers' config attribute, then config.json."""

    def __init__(self, config, raw: dict):
        self.config, self.raw = config, raw

    def value(self, name: str):
        found = getattr(self.config, name, None)
        return self.raw.get(name) if found is None else found

    def get(self, *names, default=None):
        for name in names:
            found = self.value(name)
            if found is not None:
                return found
        return default

    def require(self, name: str):
        found = self.value(name)
        if found is None:
            raise InputError(f"no {name}")
        return found


def facts(view) -> dict:
    """Every fact analysis derives from a config alone, each as its value or what it raised."""
    out: dict = {}

    def fact(name, compute):
        try:
            out[name] = compute()
        except Exception as exc:  # noqa: BLE001 - what raises is part of the comparison
            out[name] = f"raises {type(exc).__name__}"

    fact("attention", lambda: attention_facts(view).model_dump())
    fact("layer_split", lambda: layer_split(view, attention_facts(view)))
    fact("rope", lambda: (r.model_dump() if (r := rope_facts(view)) else None))
    for key in ALIASES:
        fact(key, lambda key=key: cfg_alias(view, key))
    for name in FACT_FIELDS:
        fact(name, lambda name=name: view.get(name))
    return out


def transformers_facts(raw: dict) -> dict | None:
    from day0.checkpoint.modeling import quiet_transformers, resolve_config

    try:
        with quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):
            config = resolve_config(dict(raw)).config
    except InputError:  # transformers refuses the class's own default (gemma4_assistant)
        return None
    return facts(TransformersView(config, raw))


def differing(raw: dict) -> tuple[set[str] | None, configview.ConfigView]:
    """(facts that differ between transformers and the view for raw, the view)."""
    view = resolve(dict(raw))
    theirs = transformers_facts(raw)
    if theirs is None:
        return None, view
    ours = facts(view)
    return {k for k in theirs if theirs[k] != ours[k]}, view


# ------------------------------------------------------------------------------- the data

def test_model_types_yaml_is_current():
    """Regenerated in memory from the installed transformers, it equals the committed file."""
    from scripts.make_model_types import OUT, build, render

    assert OUT == configview.MODEL_TYPES
    assert render(build()) == OUT.read_text(encoding="utf-8"), (
        "day0/data/model_types.yaml is stale: run scripts/make_model_types.py")


def test_every_causal_lm_type_is_there_and_the_file_stays_small():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = model_types()["types"]
    assert set(types) == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert configview.MODEL_TYPES.stat().st_size < 150_000
    assert all(v is not None for spec in types.values() for v in spec["defaults"].values())


def test_analysis_reads_only_fields_whose_defaults_are_recorded():
    """Every config field analysis names (cfg, view.get, view.require) has its class default in
    model_types.yaml: data/analysis.yaml's class_fields or config_fields aliases."""
    known = set(data()["class_fields"]) | {a for v in data()["config_fields"].values() for a in v}
    named = set()
    for path in ANALYSIS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("cfg", "get", "require") and node.args:
                args = node.args[1:] if name == "cfg" else node.args
                receiver = func.value.id if isinstance(func, ast.Attribute) and isinstance(
                    func.value, ast.Name) else None
                if name != "cfg" and receiver != "view":
                    continue
                named |= {a.value for a in args if isinstance(a, ast.Constant)
                          and isinstance(a.value, str)}
            if name == "cfg_alias" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                assert node.args[1].value in data()["config_fields"]
    assert named and named <= known, sorted(named - known)


# ------------------------------------------------------------------------------- view vs class

def test_every_default_config_reads_as_transformers_reads_it():
    """The class's default config (config.json = just its model_type), read both ways."""
    listed = differences()
    found, refused = {}, []
    for model_type in sorted(model_types()["types"]):
        diff, _ = differing({"model_type": model_type})
        if diff is None:
            refused.append(model_type)
        elif diff:
            found[model_type] = diff
    assert refused == ["gemma4_assistant"]  # transformers refuses its own default config
    unlisted = {t: sorted(d) for t, d in found.items() if set(listed.get(t, {}).get("facts", [])) != d}
    assert not unlisted, f"differences not in configview_differences.yaml: {unlisted}"
    gone = sorted(set(listed) - set(found))
    assert not gone, f"listed in configview_differences.yaml but now read alike: {gone}"
    assert len(listed) <= 30 and all(v["reason"] for v in listed.values())


def test_layer_rules_follow_other_layer_counts_and_window_settings():
    """Another layer count with the window turned on: the fitted layer_types rules agree with
    transformers, or the view says in a note that it cannot derive them (never silently)."""
    silent = {}
    for model_type in sorted(model_types()["types"]):
        diff, view = differing({"model_type": model_type, **SETTINGS})
        if not diff or model_type in differences():
            continue
        if not any(n.startswith("layer_types:") for n in view.notes):
            silent[model_type] = sorted(diff)
    assert not silent, silent


def test_gaps_are_noted_where_config_json_does_not_fill_them():
    falcon = resolve({"model_type": "falcon", "num_attention_heads": 8})
    assert any("num_key_value_heads" in n and "property" in n for n in falcon.notes)
    assert not [n for n in resolve({"model_type": "falcon", "num_key_value_heads": 1}).notes]
    moe = resolve({"model_type": "qwen2_moe", "use_sliding_window": False,
                   "sliding_window": 32768, "max_window_layers": 21})
    (note,) = moe.notes
    assert note.startswith("layer_types: Qwen2MoeForCausalLM derives them in code")
    assert "max_window_layers, sliding_window" in note and moe.get("layer_types") is None


# ------------------------------------------------------------------------------- real configs

@pytest.mark.parametrize("name", ["Llama-3.1-8B", "Mixtral-8x7B-v0.1", "DeepSeek-V3"])
def test_published_configs_read_alike(name):
    raw = json.loads((FIXTURES / "configs" / f"{name}.json").read_text())
    assert facts(resolve(dict(raw))) == transformers_facts(raw)


@pytest.mark.parametrize("raw,split", [
    # Qwen2.5: a window in config.json, switched off: every layer full (transformers drops it)
    ({"model_type": "qwen2", "num_hidden_layers": 28, "sliding_window": 131072,
      "use_sliding_window": False, "max_window_layers": 28}, {"full": 28, "windowed": 0}),
    ({"model_type": "qwen2", "num_hidden_layers": 28, "sliding_window": 4096,
      "use_sliding_window": True, "max_window_layers": 20}, {"full": 20, "windowed": 8}),
    # Gemma 2: alternating local and global layers
    ({"model_type": "gemma2", "num_hidden_layers": 42, "sliding_window": 4096},
     {"full": 21, "windowed": 21}),
    # Gemma 3: one global layer in sliding_window_pattern (6)
    ({"model_type": "gemma3_text", "num_hidden_layers": 26, "sliding_window": 512},
     {"full": 4, "windowed": 22}),
    ({"model_type": "gemma3_text", "num_hidden_layers": 26, "sliding_window": 512,
      "sliding_window_pattern": 2}, {"full": 13, "windowed": 13}),
    # Mistral v0.3 says "sliding_window": null: an explicit null is no window, not the default
    ({"model_type": "mistral", "num_hidden_layers": 32, "sliding_window": None},
     {"full": 32, "windowed": 0}),
    ({"model_type": "mistral", "num_hidden_layers": 32}, {"full": 0, "windowed": 32}),
])
def test_layer_split_of_released_layouts(raw, split):
    theirs, ours = transformers_facts(raw), facts(resolve(dict(raw)))
    assert ours == theirs
    assert {k: ours["layer_split"][k] for k in split} == split


# ------------------------------------------------------------------------------- resolution

def _both(raw: dict, **kwargs):
    """(model_type, class name, notes) or the error text, by day0.checkpoint.modeling and by the view."""
    from day0.checkpoint.modeling import resolve_config

    out = []
    for how in (lambda: resolve_config(dict(raw), **kwargs), lambda: resolve(dict(raw), **kwargs)):
        try:
            found = how()
        except InputError as exc:
            out.append(("error", str(exc), exc.field, exc.fix))
            continue
        if hasattr(found, "model_class"):
            out.append((found.config.model_type, found.model_class.__name__, found.notes))
        else:
            out.append((found.model_type, found.class_name,
                        [n for n in found.notes if not n.startswith("class defaults are")]))
    return out


@pytest.mark.parametrize("raw", [
    {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64,
     "num_hidden_layers": 2},
    {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
     "auto_map": {"AutoConfig": "c.C", "AutoModelForCausalLM": "m.M"}},
    {"model_type": "llama", "auto_map": {"AutoConfig": "c.C", "AutoModelForCausalLM": "m.M"}},
    {"model_type": "brand_new", "architectures": ["BrandNewForCausalLM"]},
    {"model_type": "clip"},
    {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]},
])
def test_type_resolution_notes_and_errors_are_transformers_own(raw):
    modeling, view = _both(raw)
    assert modeling == view


def test_remote_code_is_not_run_and_said_so(tmp_path):
    raw = {"model_type": "tiny_custom", "architectures": ["TinyCustomForCausalLM"],
           "auto_map": {"AutoConfig": "configuration_tiny.TinyCustomConfig",
                        "AutoModelForCausalLM": "modeling_tiny.TinyCustomForCausalLM"},
           "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    with pytest.raises(InputError, match="--trust-remote-code"):
        resolve(raw, file=str(tmp_path / "config.json"))
    view = resolve(raw, trust_remote_code=True, file=str(tmp_path / "config.json"))
    assert view.class_name == "TinyCustomForCausalLM" and view.get("hidden_size") == 32
    assert view.get("vocab_size") is None  # no class defaults without the class
    (note,) = view.notes
    assert "unknown" in note and "not run here" in note and "config.json's own values" in note


def test_a_stale_table_is_said(monkeypatch):
    monkeypatch.setattr(configview.metadata, "version", lambda name: "0.0.1")
    view = resolve({"model_type": "llama"})
    assert any("but 0.0.1 is installed" in n and "make_model_types.py" in n
               for n in view.notes)


def test_missing_dimension_is_an_input_error_naming_the_field():
    view = resolve({"model_type": "gemma3"})  # multimodal: the language model is in text_config
    with pytest.raises(InputError, match="text_config") as info:
        view.require("hidden_size")
    assert info.value.field == "hidden_size"


def test_view_module_is_data_driven_and_small():
    assert len(Path(configview.__file__).read_text().splitlines()) < 500


def test_a_multimodal_class_reads_its_language_model_from_text_config():
    """gemma4/fuyu-style: the outer class has no num_attention_heads; text_config has it, and
    what text_config leaves out comes from its own class's defaults."""
    raw = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
           "text_config": {"model_type": "llama", "num_attention_heads": 6}}
    view = resolve(raw)
    assert view.require("num_attention_heads") == 6
    raw["num_attention_heads"] = 8  # the top level, when it says so, wins
    assert resolve(raw).require("num_attention_heads") == 8


@pytest.mark.parametrize("model_type, fields", [
    ("nemotron_h", {"layers_block_type": ["mamba", "attention", "moe", "mamba"]}),
    ("longcat_flash", {"num_layers": 3})])
def test_a_layer_count_the_class_computes_is_derived_as_transformers_does(model_type, fields):
    from transformers import AutoConfig

    expected = AutoConfig.for_model(model_type, **fields).num_hidden_layers
    assert resolve({"model_type": model_type, **fields}).require("num_hidden_layers") == expected
