"""Build transformers models from a config.json: on the meta device (no memory) or with weights.

config.json itself is read by day0.checkpoint.files;
``check_source`` refuses a hostile one before ``load_pretrained`` reads a weight.

Uses transformers' own model classes. An unknown ``model_type`` falls back to ``architectures``
(e.g. Kimi-K2 ships ``model_type: kimi_k2`` with ``DeepseekV3ForCausalLM``); remote code from
``auto_map`` only runs when the caller passes ``trust_remote_code=True``.
"""

from __future__ import annotations

import contextlib
import copy
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from day0.checkpoint import limits
from day0.checkpoint.files import (check_loader_files, config_path, open_reader, read_config,
                                   read_config_dict)
from day0.checkpoint.configview import builtin_class_note, fallback_note, unknown_model_type
from day0.checkpoint.match import check_checkpoint
from day0.errors import InputError


@dataclass
class ResolvedConfig:
    """A transformers config plus how it was found (notes feed the analysis risk list)."""

    config: Any
    model_class: type
    notes: list[str] = field(default_factory=list)
    file: str = "config.json"

    @property
    def class_config(self):
        """What model_class is built from (config_for_class): the text part for a class that
        is a multimodal type's language model alone."""
        return config_for_class(self.config, self.model_class)


def resolve_config(data: dict, *, trust_remote_code: bool = False, file: str = "config.json"
                   ) -> ResolvedConfig:
    """transformers config + causal-LM class for a config dict, with the fallbacks noted."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    limits.check_config(data, file)  # before transformers builds anything from it
    notes: list[str] = []
    data = dict(data)
    model_type = data.get("model_type")
    architectures = data.get("architectures") or []
    known_type = model_type in CONFIG_MAPPING
    if not known_type:
        fallback = next((_type_for_architecture(a, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
                         for a in architectures
                         if a in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()), None)
        if fallback is None:
            if trust_remote_code and data.get("auto_map"):
                return _remote_config(data, file, notes)
            raise unknown_model_type(model_type, architectures, transformers.__version__, file)
        notes.append(fallback_note(model_type, fallback, architectures, data))
        model_type = fallback
    elif data.get("auto_map"):
        notes.append(builtin_class_note(model_type))
    config_cls = CONFIG_MAPPING[model_type]
    data["model_type"] = model_type
    try:
        with quiet_transformers():  # its warnings about odd fields would break the one-line error
            config = config_cls.from_dict({k: v for k, v in data.items() if k != "auto_map"})
    except Exception as exc:  # transformers validates fields in many ways
        raise InputError(f"transformers rejects this config: {exc}", file=file,
                         fix="correct the named field") from None
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if class_name is None:
        raise InputError(f"'{model_type}' has no causal-LM class in transformers", file=file,
                         field="model_type", fix="day0 validates causal language models only")
    return ResolvedConfig(config, getattr(transformers, class_name), notes, file)


def config_for_class(config, model_class):
    """The config the class builds from: a multimodal type whose causal-LM class is its
    language model alone (Emu3ForCausalLM, Llama4ForCausalLM) takes the text part, as
    transformers' AutoModelForCausalLM hands it; any other config as it is."""
    wanted = getattr(model_class, "config_class", None)
    text = text_config(config)
    if wanted is not None and text is not config and not isinstance(config, wanted) \
            and isinstance(text, wanted):
        return text
    return config


def text_config(config):
    """The language model's config (config.get_text_config()); the config itself where
    transformers finds no single one (several candidates raise there) or has no such method."""
    try:
        return config.get_text_config()
    except Exception:  # noqa: BLE001 - ambiguous sub-configs (text_encoder and decoder)
        return config


def _type_for_architecture(arch: str, mapping) -> str:
    """The model_type whose causal-LM class is arch; several types can share one class
    (e.g. DeepseekV3ForCausalLM), so prefer the type whose name matches the class name."""
    types = [mt for mt, cls in mapping.items() if cls == arch]
    squashed = arch.lower().replace("forcausallm", "")
    return next((mt for mt in types if mt.replace("_", "") == squashed), types[0])


def _remote_config(data: dict, file: str, notes: list[str]) -> ResolvedConfig:
    """Config and model classes from the checkpoint's own code (auto_map), when allowed."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    auto_map, folder = data["auto_map"], Path(file).parent
    refs = [auto_map.get("AutoConfig"), auto_map.get("AutoModelForCausalLM")]
    if not all(refs) or str(file).startswith("s3://"):
        raise InputError("auto_map must name AutoConfig and AutoModelForCausalLM in local files",
                         file=file, field="auto_map",
                         fix="run on the local checkpoint folder that ships the model's code")
    try:
        with quiet_transformers():
            config_cls, model_cls = (get_class_from_dynamic_module(ref, str(folder)) for ref in refs)
            config = config_cls.from_dict({k: v for k, v in data.items() if k != "auto_map"})
    except Exception as exc:  # the model's own code: any failure is the checkpoint's
        raise InputError(f"the model's remote code does not load: {type(exc).__name__}: {exc}",
                         file=file, field="auto_map",
                         fix="ship the files auto_map names next to config.json") from None
    notes.append(f"model code loaded from the checkpoint ({refs[1]}) because trust_remote_code is on")
    return ResolvedConfig(config, model_cls, notes, file)


@contextlib.contextmanager
def quiet_transformers():
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


def build_meta_model(resolved: ResolvedConfig, dtype=None):
    """The model at full configured size with every parameter on the meta device."""
    import torch

    try:
        # torch warns about zero-sized tensors etc.: the config's problem, reported below or not at all
        with quiet_transformers(), torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = resolved.model_class._from_config(resolved.class_config,
                                                      dtype=dtype or torch.bfloat16)
    except (ImportError, MemoryError):
        raise  # the environment, not the config
    except Exception as exc:  # on meta nothing but the config can make construction fail
        raise build_error(exc, resolved) from None
    return model.eval()


def build_error(exc: Exception, resolved: ResolvedConfig) -> InputError:
    """An InputError for a model transformers could not build; a failed registry lookup (an
    unknown hidden_act or rope_type is a KeyError deep inside) names its field and choices."""
    from transformers.activations import ACT2CLS
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from day0.errors import shorten

    choices = {"hidden_act": sorted(ACT2CLS), "hidden_activation": sorted(ACT2CLS),
               "rope_type": ["default", *sorted(ROPE_INIT_FUNCTIONS)]}
    missing = exc.args[0] if isinstance(exc, KeyError) and exc.args else None
    for name, value in _fields(resolved.config.to_dict() if hasattr(resolved.config, "to_dict") else {}):
        leaf = name.rsplit(".", 1)[-1]
        if missing is not None and value == missing and leaf in choices:
            return InputError(f"unknown value {shorten(repr(value), 40)}", file=resolved.file,
                              field=name, fix=f"use one of {', '.join(choices[leaf])}")
    return InputError(f"transformers cannot build {resolved.model_class.__name__} from it: "
                      f"{type(exc).__name__}: {shorten(exc, 200)}", file=resolved.file,
                      fix="correct the field the error names (compare with the model's release)")


def _fields(mapping: dict, prefix: str = "", depth: int = 0):
    """(dotted name, value) of a config dict and of the mappings inside it, two levels deep."""
    for key, value in mapping.items():
        if isinstance(value, dict) and depth < 2:
            yield from _fields(value, f"{prefix}{key}.", depth + 1)
        else:
            yield f"{prefix}{key}", value


def load_pretrained(source: str | Path, *, device: str = "cpu", dtype: str = "float32",
                    trust_remote_code: bool = False):
    """Load a local HF checkpoint with transformers' own class, on device in dtype.

    Raises CheckpointError when transformers would load other files than the index names, or
    when a tensor's name or shape disagrees with the class (day0.checkpoint.match)."""
    from day0.torchkit.dtypes import torch_dtype  # torch: only when a model is loaded

    check_loader_files(source)
    check_source(str(source))  # config.json within limits and within the weights' size
    raw, file = read_config_dict(source), str(config_path(source))
    resolved = resolve_config(copy.deepcopy(raw), trust_remote_code=trust_remote_code, file=file)
    # construction errors of the config as input errors before any memory is used (on a copy:
    # building sets implementation fields on the config it is given), then every tensor's name
    # and shape against that model: header-only analysis leaves this to the stages that build it
    meta = build_meta_model(resolve_config(raw, trust_remote_code=trust_remote_code, file=file))
    check_checkpoint(source, meta)
    with quiet_transformers():
        model = resolved.model_class.from_pretrained(
            str(source), config=resolved.class_config, dtype=torch_dtype(dtype),
            trust_remote_code=trust_remote_code)
    return model.to(device).eval()


def check_source(source: str) -> None:
    """At the start of a stage that loads the model: config.json within day0.checkpoint.limits, and within
    the size of the weights next to it. Raises InputError."""
    raw, file = read_config(source)
    limits.check_config(raw, file)
    problems = limits.size_problems(raw, file, limits.stored_bytes(open_reader(source)), str(source))
    if problems:
        raise InputError.from_problems(problems)


def decoder_layers(model) -> list:
    """The list of decoder blocks of a causal LM: ``model.model.layers`` for most HF decoders,
    else the module list that holds ``num_hidden_layers`` blocks, the shallowest first
    (``backbone.layers`` of mamba, ``transformer.h`` of gpt2, ``model.language_model.layers``
    of a multimodal class), so an architecture named nowhere in day0 is still walked layer
    by layer. A per-layer list inside a block (MoE experts) is deeper, never taken."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is not None:
        return list(layers)
    import torch

    config = getattr(model, "config", None)
    text = text_config(config)
    wanted = getattr(text, "num_hidden_layers", None)
    # a tower's blocks (an audio or vision encoder beside the language model) are never the
    # decoder's, even at the same depth and count
    lists = [(_TOWER_NAME.search(name) is not None, name.count("."), name, module)
             for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) > 0]
    fitting = [entry for entry in lists if len(entry[3]) == wanted] or lists
    if not fitting:
        raise InputError(f"{type(model).__name__} has no list of decoder blocks",
                         fix="day0 supports decoder-only models whose blocks are a ModuleList")
    return list(min(fitting, key=lambda entry: entry[:3])[3])


_TOWER_NAME = re.compile(r"(^|\.)(audio|vision|visual|image|speech|vq)[a-z_]*(\.|$)|tower")
