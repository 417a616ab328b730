"""Sane limits on an untrusted config.json, checked before transformers builds anything from it.

transformers builds what config.json says: ``num_hidden_layers: 1e9`` is a billion modules (a
hang growing by GBs) long before any tensor shape is compared, and a zero or negative width
crashes deep inside torch with an error that names no field. So, first of all:

* ``config_problems(raw, file)``: JSON types of the fields day0 and transformers rely on, every
  integer dimension within data/limits.yaml, and the parameter count the config implies
  (``implied_params``, a lower bound) under an absolute ceiling;
* ``size_problems(raw, file, stored_bytes)``: with weights, that implied count against the bytes
  the safetensors files actually hold (a config inflated past its checkpoint; both together at
  the start of a stage that loads the model: day0.checkpoint.modeling.check_source);
* ``limits()["max_safetensors_header_bytes"]``: the one limit on a safetensors header or shard
  index (day0.checkpoint.safetensors_header).

Everything is arithmetic on the parsed JSON: nothing here imports torch or transformers, so a
hostile config is refused in milliseconds.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from day0.errors import InputError, Problem, shorten

LIMITS_FILE = Path(__file__).parents[1] / "data" / "limits.yaml"
FIX = "restore config.json from the model's release"
EXPERT_FIELDS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
TYPE_NAMES = {"string": "a string", "list_of_strings": "a list of strings", "mapping": "a JSON object",
              "number": "a number", "boolean": "true or false"}
ROPE_FIELDS = ("rope_parameters", "rope_scaling")


@lru_cache(maxsize=1)
def limits() -> dict:
    return yaml.safe_load(LIMITS_FILE.read_text(encoding="utf-8"))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _per_layer(value) -> bool:
    """A size given per layer: a non-empty list of whole numbers, at most MAX_PER_LAYER long."""
    return (isinstance(value, list) and 0 < len(value) <= MAX_PER_LAYER
            and all(_is_int(v) for v in value))


MAX_PER_LAYER = 4096  # a per-layer list longer than any model's layers is not one


def _has_type(value, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "mapping":
        return isinstance(value, dict)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def sections(raw: dict) -> list[tuple[str, dict]]:
    """(field prefix, mapping) of the config and of its text_config (multimodal releases)."""
    text = raw.get("text_config")
    return [("", raw)] + ([("text_config.", text)] if isinstance(text, dict) else [])


def check_config_size(size: int, where: str) -> None:
    """Refuse a config.json too large to be one, before it is read and parsed."""
    limit = limits()["max_config_bytes"]
    if size > limit:
        raise InputError(f"{size} bytes, over the {limit} bytes a config.json may have", file=where,
                         fix=FIX)


def check_text_size(path: str | Path, field: str, *, in_checkpoint: bool = False) -> None:
    """Refuse an evaluation text too large to read and tokenize whole (limits.yaml:
    max_text_bytes) before anything reads it: InputError for a checkpoint's own heldout.txt,
    ConfigError for a configured file; never a stage killed by its memory budget."""
    from day0.errors import ConfigError

    size = Path(path).stat().st_size
    limit = limits()["max_text_bytes"]
    if size > limit:
        error = InputError if in_checkpoint else ConfigError
        raise error(f"evaluation text of {size} bytes, over the {limit} bytes one may have",
                    file=str(path), field=field,
                    fix="keep a few hundred KB of representative text (the windows use far less)")


def extent(value) -> tuple[int, int]:
    """(nesting depth, number of values) of parsed JSON, without recursion: the value is hostile."""
    deepest, count, stack = 0, 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        count += 1
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest, count


def config_problems(raw: dict, file: str) -> list[Problem]:
    """Every field of raw outside its type or bounds; then the implied size when all are sane."""
    spec = limits()
    deepest, count = extent(raw)
    if deepest > spec["max_depth"]:  # transformers and pydantic recurse into nested values
        return [Problem(f"nested deeper than {spec['max_depth']} levels", file=file, fix=FIX)]
    if count > spec["max_values"]:  # transformers copies the config several times
        return [Problem(f"{count} JSON values, over the {spec['max_values']} a config.json may hold",
                        file=file, fix=FIX)]
    problems: list[Problem] = [
        Problem(f"{len(section)} keys, over the {spec['max_keys']} a config may have", file=file,
                field=prefix.rstrip(".") or None, fix=FIX)
        for prefix, section in sections(raw) if len(section) > spec["max_keys"]]
    for prefix, section in sections(raw):
        for name, kind in spec["types"].items():
            value = section.get(name)
            if value is not None and not _has_type(value, kind):
                problems.append(Problem(f"must be {TYPE_NAMES[kind]}, not {_show(value)}", file=file,
                                        field=prefix + name, fix=FIX))
        problems += _rope_problems(section, prefix, file, spec["rope_types"])
        for name, bound in spec["integers"].items():
            value = section.get(name)
            if value is None:
                continue
            # one per layer is a whole-number list (Gemma-3n's intermediate_size, OpenELM's heads)
            values = value if name in spec["per_layer"] and _per_layer(value) else [value]
            if not all(_is_int(v) for v in values):
                problems.append(Problem(f"must be a whole number, not {_show(value)}", file=file,
                                        field=prefix + name,
                                        fix=f"write an integer from {bound['min']} to {bound['max']}"))
            elif not all(bound["min"] <= v <= bound["max"] for v in values):
                problems.append(Problem(
                    f"{_show(value)} is outside the sane range {bound['min']}..{bound['max']}",
                    file=file, field=prefix + name,
                    fix="set the model's real value (bounds: day0/data/limits.yaml)"))
    if problems:
        return problems  # the products below assume sane factors
    implied, field = implied_params(raw)
    ceiling = float(spec["implied_params"]["max"])
    if implied > ceiling:
        problems.append(Problem(f"the dimensions imply at least {implied:.3g} parameters, over the "
                                f"sane ceiling {ceiling:.3g}", file=file, field=field, fix=FIX))
    return problems


def _rope_problems(section: dict, prefix: str, file: str, types: dict) -> list[Problem]:
    """RoPE fields of the wrong JSON type, in a flat dict or one level down (per layer type)."""
    found = []
    for field in ROPE_FIELDS:
        rope = section.get(field)
        if not isinstance(rope, dict):
            continue
        parts = [("", rope)] + [(f"{k}.", v) for k, v in rope.items() if isinstance(v, dict)]
        for inner, part in parts:
            for name, kind in types.items():
                value = part.get(name)
                if value is not None and not _has_type(value, kind):
                    found.append(Problem(f"must be {TYPE_NAMES[kind]}, not {_show(value)}",
                                         file=file, field=f"{prefix}{field}.{inner}{name}", fix=FIX))
    return found


def check_config(raw: dict, file: str) -> None:
    """Raise one InputError listing every problem config_problems finds."""
    problems = config_problems(raw, file)
    if problems:
        raise InputError.from_problems(problems)


def _dims(raw: dict) -> dict:
    """The language model's fields: text_config's over the top level's."""
    merged = dict(raw)
    for prefix, section in sections(raw)[1:]:
        merged.update(section)
    # a per-layer size counts at its smallest (implied_params is a lower bound)
    per_layer = set(limits()["per_layer"])
    merged = {k: min(v) if k in per_layer and _per_layer(v) else v for k, v in merged.items()}
    return {k: v for k, v in merged.items() if _is_int(v) and v > 0}


def implied_params(raw: dict) -> tuple[int, str]:
    """(lower bound of the parameters raw implies, the field that dominates it).

    vocab x hidden (input embedding) + layers x min(attention output projection, MLP): a decoder
    layer holds at least one of the two, and each is at least that big (MLA's o_proj is heads x
    v_head_dim x hidden; an MLP has an up and a down projection of its width). Published models
    hold 7.6x (Llama-3.1-8B) to 83x (DeepSeek-V3) more: a bound for refusing gross inflation."""
    d = _dims(raw)
    hidden, layers = d.get("hidden_size", 0), d.get("num_hidden_layers", 0)
    vocab = d.get("vocab_size", 0)
    heads = d.get("num_attention_heads", 0)
    head_dim = d.get("v_head_dim") or d.get("head_dim") or (hidden // heads if heads else 0)
    experts = next((d[k] for k in EXPERT_FIELDS if k in d), 1)
    # an MLP is dense (intermediate_size, which Mixtral-style configs use per expert) or all the
    # routed experts of an MoE layer (num_experts x moe_intermediate_size)
    widths = [d[k] * (experts if k == "moe_intermediate_size" else 1)
              for k in ("intermediate_size", "moe_intermediate_size") if k in d]
    parts = [heads * head_dim * hidden, 2 * hidden * min(widths) if widths else 0]
    per_layer = min((p for p in parts if p), default=0)
    embedding, body = vocab * hidden, layers * per_layer
    return embedding + body, "num_hidden_layers" if body >= embedding else "vocab_size"


def size_problems(raw: dict, file: str, stored_bytes: int, where: str) -> list[Problem]:
    """The config's implied parameters against the bytes its safetensors files hold."""
    if stored_bytes <= 0:
        return []
    spec = limits()["implied_params"]
    implied, field = implied_params(raw)
    need = implied * spec["min_bits"] / 8
    if need <= spec["slack"] * stored_bytes:
        return []
    return [Problem(f"implies at least {implied:.3g} parameters ({need:.3g} bytes even at "
                    f"{spec['min_bits']} bit each) but the safetensors files in {where} hold "
                    f"{stored_bytes} bytes", file=file, field=field,
                    fix="correct config.json to the model's dimensions, or add the missing shards")]


def stored_bytes(reader) -> int:
    """Bytes of every .safetensors file a checkpoint Reader lists (what config.json must fit)."""
    return sum(reader.size(n) for n in reader.names() if n.endswith(".safetensors"))


def _show(value) -> str:
    """A bounded rendering of an untrusted value for a message."""
    kind = type(value).__name__
    if isinstance(value, (dict, list)):
        return f"a {kind} of {len(value)} items"
    return shorten(repr(value), 40) + ("" if _is_int(value) or isinstance(value, str) else f" ({kind})")


__all__ = ["limits", "check_config_size", "extent", "config_problems", "check_config",
           "implied_params", "size_problems", "stored_bytes"]
