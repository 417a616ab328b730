"""config.json as transformers' causal-LM class reads it, without importing transformers or torch.

Header-only work (analysis) needs what transformers' config class would hold: config.json's
values, the class defaults for what config.json leaves out, and what the class derives in code
(``layer_types`` from its sliding-window settings, ``rope_parameters``). day0/data/model_types.yaml
holds, for every model_type with a causal-LM class in transformers: the class name, its defaults
for the fields analysis reads, its config's attribute aliases (gpt2's ``n_embd`` is
``hidden_size``) and its layer_types rule. scripts/make_model_types.py generates it from the
installed transformers; tests/checkpoint/test_configview.py keeps it current and compares the view with
transformers' own config for every model_type.

``resolve(raw, file=...)`` finds the model_type as day0.checkpoint.modeling.resolve_config does (the same
fallback through ``architectures``, the same notes and errors) and returns a :class:`ConfigView`:
``view.get(*names, default=None)`` is the first non-null of the names. Where a class computes a
value in code this module does not reproduce (day0/data/configview_differences.yaml), the view
says so in a note rather than be silently wrong.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata

import yaml

from day0 import DATA_DIR
from day0.checkpoint import limits
from day0.errors import InputError

MODEL_TYPES = DATA_DIR / "model_types.yaml"
DIFFERENCES = DATA_DIR / "configview_differences.yaml"
GENERATOR = "scripts/make_model_types.py"
SCALED_ROPE = ("llama3", "yarn", "longrope")  # RoPE types transformers gives an original context


def _load(path) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader: ~10x faster
    return yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}


@lru_cache(maxsize=1)
def model_types() -> dict:
    """day0/data/model_types.yaml (see the module docstring)."""
    return _load(MODEL_TYPES)


@lru_cache(maxsize=1)
def differences() -> dict:
    """day0/data/configview_differences.yaml: model_type -> {fields, reason}."""
    return _load(DIFFERENCES).get("differences") or {}


@dataclass
class ConfigView:
    """What the class derives, else config.json (an explicit null included), else the class
    default."""

    raw: dict
    model_type: str
    class_name: str
    file: str = "config.json"
    notes: list[str] = field(default_factory=list)
    spec: dict = field(default_factory=dict)  # model_types.yaml's entry for model_type
    derived: dict = field(default_factory=dict)

    def value(self, name: str):
        """One field as transformers' config attribute would give it (None: not set)."""
        key = (self.spec.get("aliases") or {}).get(name, name)
        if key in self.derived:
            return self.derived[key]
        for candidate in dict.fromkeys((key, name)):
            if candidate in self.raw:  # an explicit null is null, as in transformers' config
                return self.raw[candidate]
        # a multimodal class (gemma4, fuyu) keeps its language model's fields in text_config:
        # what it says there beats the outer class's defaults, which have none of them
        text = self.raw.get("text_config")
        if isinstance(text, dict):
            for candidate in dict.fromkeys((key, name)):
                if text.get(candidate) is not None:
                    return text[candidate]
        found = (self.spec.get("defaults") or {}).get(key)
        if found is None and isinstance(text, dict):
            inner = model_types()["types"].get(text.get("model_type")) or {}
            found = (inner.get("defaults") or {}).get(key)
        return found

    def get(self, *names: str, default=None):
        """First non-null of the names' values (:meth:`value`), else default."""
        for name in names:
            value = self.value(name)
            if value is not None:
                return value
        return default

    def require(self, name: str):
        """A field analysis cannot do without; InputError when neither config.json nor the
        class gives it (e.g. a multimodal config whose language model is in text_config)."""
        value = self.value(name)
        if value is None:
            raise InputError(f"no {name}, and {self.class_name} has no default for it",
                             file=self.file, field=name,
                             fix=f"add {name} (a multimodal config keeps the language model's "
                                 "fields in text_config: analyse that model's own config.json)")
        return value


# where configs keep their trained context: transformers' name first, then older models' own
# (gpt2 n_positions, mpt max_seq_len, qwen-1 seq_length, ctrl n_ctx)
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                  "max_sequence_length", "n_ctx")


def trained_context(config) -> int | None:
    """The trained context of a config (a transformers config or a config.json dict): the
    first of CONTEXT_FIELDS that is a positive whole number, else None."""
    for name in CONTEXT_FIELDS:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def unknown_model_type(model_type, architectures: list, version: str, file) -> InputError:
    """A model_type transformers lacks, whose architectures name no class it has either (the
    same words here and where transformers builds the model, day0.checkpoint.modeling)."""
    return InputError(f"model_type '{model_type}' is unknown to transformers {version} and "
                      f"architectures {architectures} name no class it has", file=file,
                      field="model_type", fix="upgrade transformers, or allow the model's "
                                              "remote code (--trust-remote-code)")


def fallback_note(model_type, fallback: str, architectures: list, raw: dict) -> str:
    return (f"model_type '{model_type}' unknown to transformers; using '{fallback}' from "
            f"architectures {architectures}" + (" (auto_map remote code ignored: "
                                                "trust_remote_code is off)"
                                                if raw.get("auto_map") else ""))


def builtin_class_note(model_type: str) -> str:
    return (f"config has auto_map (remote code); transformers' built-in '{model_type}' class is "
            "used instead")


def resolve(raw: dict, *, trust_remote_code: bool = False, file: str = "config.json"
            ) -> ConfigView:
    """model_type, class and notes for a config.json dict, as day0.checkpoint.modeling.resolve_config
    finds them (InputError with the same texts when transformers has no class for it)."""
    limits.check_config(raw, file)
    data = model_types()
    types, version = data["types"], data["transformers"]
    notes: list[str] = []
    model_type = raw.get("model_type")
    architectures = raw.get("architectures") or []
    if model_type not in types and model_type not in data["other_types"]:
        fallback = next((data["architectures"][a] for a in architectures
                         if a in data["architectures"]), None)
        if fallback is None:
            if trust_remote_code and raw.get("auto_map"):
                return _remote(raw, file, version)
            raise unknown_model_type(model_type, architectures, version, file)
        notes.append(fallback_note(model_type, fallback, architectures, raw))
        model_type = fallback
    elif raw.get("auto_map"):
        notes.append(builtin_class_note(model_type))
    spec = types.get(model_type)
    if spec is None:
        raise InputError(f"'{model_type}' has no causal-LM class in transformers", file=file,
                         field="model_type", fix="day0 validates causal language models only")
    view = ConfigView(raw, model_type, spec["class"], file, notes, spec)
    _derive(view)
    _note_installed(view, version)
    return view


def _remote(raw: dict, file: str, version: str) -> ConfigView:
    """An unknown type only the checkpoint's own code can resolve: that code needs torch, so the
    view keeps config.json's own values (no class defaults) and says so."""
    auto_map = raw["auto_map"]
    refs = [auto_map.get("AutoConfig"), auto_map.get("AutoModelForCausalLM")]
    if not all(isinstance(r, str) and r for r in refs) or str(file).startswith("s3://"):
        raise InputError("auto_map must name AutoConfig and AutoModelForCausalLM in local files",
                         file=file, field="auto_map",
                         fix="run on the local checkpoint folder that ships the model's code")
    class_name = refs[1].rsplit(".", 1)[-1]
    note = (f"model_type '{raw.get('model_type')}' is unknown to transformers {version}: its "
            f"remote code ({refs[1]}) is not run here (header-only analysis imports no torch), "
            "so config.json's own values are used without class defaults; day0 scan builds the "
            "model from that code")
    view = ConfigView(raw, str(raw.get("model_type")), class_name, file, [note], {})
    _derive(view)
    return view


def _note_installed(view: ConfigView, version: str) -> None:
    try:
        installed = metadata.version("transformers")  # the distribution's metadata: no import
    except metadata.PackageNotFoundError:
        return
    if installed != version:
        view.notes.append(f"class defaults are those of transformers {version} "
                          f"(day0/data/model_types.yaml) but {installed} is installed: "
                          f"regenerate them with {GENERATOR}")


# --------------------------------------------------------------------------- derived values

def _alias(view: ConfigView, name: str) -> str:
    return (view.spec.get("aliases") or {}).get(name, name)


@lru_cache(maxsize=1)
def layer_count_rules() -> dict:
    """day0/data/layer_count.yaml: model_type -> how its class computes num_hidden_layers."""
    return _load(DATA_DIR / "layer_count.yaml")


def _layer_count(view: ConfigView) -> int | None:
    """num_hidden_layers where the class computes it (layer_count.yaml) and config.json lacks it."""
    rule = layer_count_rules().get(view.model_type)
    if not rule or view.raw.get(_alias(view, "num_hidden_layers")) is not None:
        return None
    if "length_of" in rule:
        given = view.raw.get(rule["length_of"], view.value(rule["length_of"]))
        return len(given) if isinstance(given, (list, str)) and given else None
    given = view.raw.get(rule["of"], view.value(rule["of"]))
    return given * rule["times"] if isinstance(given, int) and not isinstance(given, bool) else None


def _derive(view: ConfigView) -> None:
    """What transformers' config computes in __post_init__ that analysis reads."""
    key = _alias(view, "layer_types")
    given = view.raw.get(key, view.raw.get("layer_types"))
    if isinstance(given, list):
        names = model_types().get("layer_type_names") or {}
        view.derived[key] = [names.get(k, k) for k in given]
    else:
        rule = view.spec.get("layer_types")
        if rule:
            kinds, unmodelled = layer_types_of(rule, view)
            if kinds is not None:
                view.derived[key] = kinds
            else:
                view.notes.append(
                    f"layer_types: {view.class_name} derives them in code day0 does not reproduce"
                    + (f" from {', '.join(unmodelled)}" if unmodelled else "")
                    + " and config.json lists none; the KV split falls back to sliding_window "
                    "and use_sliding_window, the same for every layer")
    off = view.spec.get("window_off")
    if off and not any(k in view.raw for k in ("sliding_window", _alias(view, "sliding_window"))) \
            and not view.get("use_sliding_window"):
        view.derived[_alias(view, "sliding_window")] = off["value"]
    rope = rope_parameters(view)
    if rope is not None:
        view.derived["rope_parameters"] = rope
    layers = _layer_count(view)
    if layers is not None:
        view.derived[_alias(view, "num_hidden_layers")] = layers
    gap = differences().get(view.model_type)
    given = gap.get("fields") if gap else None
    if gap and not (given and all(view.raw.get(f) is not None for f in given)):
        view.notes.append(f"{view.class_name} computes {', '.join(gap['fields'])} in code the "
                          f"header-only view does not reproduce: {gap['reason']}")


def layer_types_of(rule: dict, view: ConfigView) -> tuple[list[str] | None, list[str]]:
    """(layer kinds by the class's rule, []) or (None, the fields config.json sets that the rule
    does not model). Rules (model_types.yaml, fitted to transformers by the generator):

    * ``pattern: [k0, k1, ...]``: layer i is pattern[i % len];
    * ``every: FIELD`` (``period`` its default), ``on``/``off``, ``at: end|start``: layer i is
      ``on`` when (i + 1) % P == 0 (end) or i % P == 0 (start), P = the field's value;
    * ``from_layer: FIELD``: windowed from that layer on, full before it;
    * ``needs: [FIELD, ...]``: all ``full_attention`` unless every field is set and not false
      (e.g. Qwen2: sliding_window and use_sliding_window);
    * ``first`` / ``last``: the kind of the first / last layer;
    * ``inputs``: fields transformers also reads that the rule does not model.
    """
    defaults = view.spec.get("defaults") or {}
    unmodelled = [f for f in rule.get("inputs") or []
                  if f in view.raw and view.raw[f] != defaults.get(f)]
    layers = view.get("num_hidden_layers")
    if unmodelled or not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
        return None, unmodelled
    if any(view.get(f) is None or view.get(f) is False for f in rule.get("needs") or []):
        return ["full_attention"] * layers, []
    if "pattern" in rule:
        kinds = [rule["pattern"][i % len(rule["pattern"])] for i in range(layers)]
    elif "every" in rule:
        period = view.get(rule["every"], default=rule["period"])
        if not isinstance(period, int) or isinstance(period, bool) or period < 1:
            return None, [rule["every"]]
        phase = 1 if rule.get("at", "end") == "end" else 0
        kinds = [rule["on"] if (i + phase) % period == 0 else rule["off"] for i in range(layers)]
    elif "from_layer" in rule:
        start = view.get(rule["from_layer"], default=0)
        if not isinstance(start, int) or isinstance(start, bool):
            return None, [rule["from_layer"]]
        kinds = ["sliding_attention" if i >= start else "full_attention" for i in range(layers)]
    else:
        return None, []
    if layers and rule.get("first"):
        kinds[0] = rule["first"]
    if layers and rule.get("last"):
        kinds[-1] = rule["last"]
    return kinds, []


def _field(raw: dict, defaults: dict, name: str):
    return raw[name] if name in raw else defaults.get(name)


def rope_parameters(view: ConfigView) -> dict | None:
    """rope_parameters as transformers 5 standardises them (PreTrainedConfig.__post_init__:
    convert_rope_params_to_dict, standardize_rope_params); None for a class without them.
    model_types.yaml's ``rope`` adds what a class does in its own code: ``default_parameters``
    when config.json gives none, ``adds`` (keys set for a given dict), ``theta_into`` (where
    config.json's rope_theta goes: a nested section, or "nowhere" when the class keeps its own)."""
    rope = view.spec.get("rope")
    if rope is None:
        return None
    raw, defaults = view.raw, view.spec.get("defaults") or {}
    into = rope.get("theta_into")
    # a class field holds config.json's value (or its default); an extra key stays in kwargs
    field_theta = _field(raw, defaults, "rope_theta") if rope.get("theta_field") else None
    field_partial = (_field(raw, defaults, "partial_rotary_factor")
                     if rope.get("partial_field") else None)
    if rope.get("theta_field"):
        theta = field_theta
    elif "rope_theta" in raw and into != "nowhere":
        theta = raw["rope_theta"]
    else:
        theta = rope.get("default_theta", 10_000.0)
    partial = (raw["partial_rotary_factor"] if "partial_rotary_factor" in raw
               and not rope.get("partial_field") else field_partial)
    params = _given(view, rope, into)
    labels = rope.get("labels") or view.get("layer_types") or ()
    nested = [k for k in params if k in labels]
    sections = [s for s in ([params[k] for k in nested] or [params]) if isinstance(s, dict)]
    for section in sections:
        section.setdefault("rope_theta", theta)
        if partial is not None:
            section.setdefault("partial_rotary_factor", partial)
    if not nested:
        for key, value in (rope.get("adds") or {}).items():
            params.setdefault(key, copy.deepcopy(value))
    # standardize_rope_params sees only the class's own fields (config.json's extras come later)
    if not (params or field_theta):
        return params
    default_type = rope.get("default_rope_type", "default")
    for section in sections:
        section.setdefault("rope_type", section.get("type", "default"))
        section.setdefault("rope_theta", field_theta)
        if field_partial is not None:
            section.setdefault("partial_rotary_factor", field_partial)
        if default_type != "default" and section["rope_type"] == "default":
            section["rope_type"] = default_type
        if section["rope_type"] in SCALED_ROPE:
            if rope.get("original_max") and not nested:
                section["original_max_position_embeddings"] = view.get(
                    "original_max_position_embeddings")
            else:
                section.setdefault("original_max_position_embeddings",
                                   view.get("max_position_embeddings"))
    return params


def _given(view: ConfigView, rope: dict, into: str | None) -> dict:
    """A copy of the RoPE dict config.json gives (rope_scaling first, as transformers reads it),
    else the class default, else what the class sets in its own code."""
    raw, defaults = view.raw, view.spec.get("defaults") or {}
    given = raw.get("rope_scaling") or raw.get("rope_parameters") or defaults.get("rope_parameters")
    own = given is None and "default_parameters" in rope
    params = copy.deepcopy(rope["default_parameters"] if own else given)
    params = params if isinstance(params, dict) else {}
    if own and "rope_theta" in raw and into != "nowhere":  # config.json's theta over the class's
        section = params.get(into) if into else params
        if isinstance(section, dict):
            section["rope_theta"] = raw["rope_theta"]
    return params


__all__ = ["ConfigView", "resolve", "model_types", "differences", "layer_types_of",
           "rope_parameters", "MODEL_TYPES", "DIFFERENCES"]
