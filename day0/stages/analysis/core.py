"""The analysis stage's core: config.json and safetensors headers in, its Result out.
What it proves and needs: the face, __init__.py.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from day0.checkpoint import chat_template, tokenizer_ids
from day0.checkpoint.files import open_reader
from day0.checkpoint.headers import classify, read_checkpoint
from day0.checkpoint.configview import resolve
from day0.execution.contract import StageInputs, StageResult
from day0.checkpoint.header_sanity import header_problems
from day0.stages.analysis.metaparams import meta_parameters
from day0.stages.analysis.layouts import layer_split
from day0.stages.analysis.model import (DTYPES, Attention, MoE, Params, Rope, attention_facts, cfg,
                                        cfg_alias, count_params, kv_cache, moe_facts, rope_facts,
                                        weights_bytes)
from day0.stages.analysis.state import StateCache, shared_layers, state_facts
from day0.stages.analysis.plan import GIB, Plan, make_plan
from day0.stages.analysis.reference import ReferenceEstimate, available_gib, estimate
from day0.stages.analysis.risks import Risk, collect_risks

DtypeName = Literal["bfloat16", "float8", "float16", "float32"]
SHAPES_CHECKED = ("names and shapes against transformers' {cls}: not checked by this header-only "
                  "analysis; `day0 scan` checks them, as does every validation (its scan stage, "
                  "and each stage before it loads the model)")


class Config(BaseModel):
    """Settings of the analysis stage."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(1, ge=1, description=(
        "Sequences at max context whose KV cache the parallelism plan must hold."))
    max_context: int | None = Field(None, ge=1, description=(
        "Context length for the KV cache and plan; default: config.json's max_position_embeddings."))
    headroom_fraction: float = Field(0.1, ge=0.0, lt=1.0, description=(
        "Share of each card's memory reserved for activations and workspaces."))
    weights_dtype: DtypeName = Field("bfloat16", description="dtype the plan places weights in.")
    kv_dtype: DtypeName = Field("bfloat16", description="dtype the plan places the KV cache in.")
    count_timeout_s: float = Field(300.0, gt=0, description=(
        "Without weights: seconds the child process that builds transformers' class on the meta "
        "device (to count its parameters) may take before analysis gives up with an input error."))


class Memory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weights_bytes: dict[str, int] = Field(description="params.total in each dtype (float8: see note).")
    stored_bytes: int | None = Field(None, description="Tensor bytes as stored in the checkpoint.")
    note: str = Field(description="How the figures are computed.")


class KVGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layers: int = Field(description="Layers of this kind.")
    tokens_held: int = Field(description=(
        "Tokens each layer holds at max_context: all of them, the sliding window, or the chunk."))
    bytes_at_max_context: dict[str, int] = Field(description="These layers' KV at max_context, per dtype.")


class KVCache(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bytes_per_token: dict[str, int] = Field(description="KV cache bytes per token, per dtype.")
    bytes_at_max_context: dict[str, int] = Field(description="One sequence at max_context, per dtype.")
    max_context: int = Field(description="Tokens per sequence used above.")
    layers: dict[str, int] = Field(description=(
        "Layers: full (grows), windowed (capped by a window or chunk), stateful (a recurrent "
        "state: see state), no_cache (MLP-only layers, when there are some)."))
    formula: str = Field(description="How bytes_per_token is computed.")
    per_layer_type: dict[str, KVGroup] = Field(default_factory=dict, description=(
        "Attention layers by what they hold at max context: full, sliding, chunked."))


class CheckpointInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    has_weights: bool = Field(description="Whether safetensors were found.")
    files: list[str] = Field(description="Files read (config, index, shards).")
    index_file: str | None = Field(None, description="The shard index, if any.")
    tensors: int = Field(description="Tensors in the headers.")
    dtypes: dict[str, int] = Field(description="Tensors per stored dtype.")
    total_bytes: int = Field(description="Size of the files above.")
    bytes_read: int = Field(description="Bytes actually read (config, index, headers).")
    bytes_read_ratio: float | None = Field(None, description="bytes_read / total_bytes.")
    notes: list[str] = Field(default_factory=list, description="Checkpoint observations.")


class Result(StageResult):
    """The analysis document (`day0 analyze --json`)."""

    source: str = Field(description="Checkpoint folder or config.json analysed.")
    architecture: str = Field(description="transformers class used (e.g. LlamaForCausalLM).")
    model_type: str = Field(description="model_type transformers resolved.")
    config_model_type: str | None = Field(None, description="model_type as written in config.json.")
    num_layers: int = Field(description="Decoder layers (num_hidden_layers).")
    hidden_size: int = Field(description="Model width.")
    vocab_size: int | None = Field(None, description="Vocabulary size.")
    attention: Attention
    moe: MoE | None = Field(None, description="null for dense models.")
    rope: Rope | None = None
    state: StateCache | None = Field(None, description=(
        "Recurrent state of state-space / linear-attention layers (null: none)."))
    unknown: list[str] = Field(default_factory=list, description=(
        "Facts that could not be derived from the config: 'unknown: <field> (<why>)'."))
    max_context: int = Field(description="Context length used for KV and plan.")
    params: Params
    memory: Memory
    kv_cache: KVCache
    plan: Plan
    risks: list[Risk]
    checkpoint: CheckpointInfo
    reference: ReferenceEstimate | None = Field(None, description=(
        "The alignment stage's reference and control on this host: resident or streamed, "
        "peak memory and time, estimated before anything runs."))
    wall_s: float = Field(description="Seconds the analysis took.")

    def metrics(self) -> dict[str, float | None]:
        c = self.checkpoint
        return {
            "analysis.params_total": float(self.params.total),
            "analysis.params_active": float(self.params.active),
            "analysis.weights_gib_bf16": self.memory.weights_bytes["bfloat16"] / GIB,
            "analysis.kv_bytes_per_token_bf16": float(self.kv_cache.bytes_per_token["bfloat16"]),
            "analysis.kv_gib_max_context_bf16": self.kv_cache.bytes_at_max_context["bfloat16"] / GIB,
            "analysis.plan_fits": 1.0 if self.plan.fits else 0.0,
            "analysis.plan_cards": float(self.plan.tp * self.plan.pp),
            "analysis.risk_errors": float(sum(r.severity == "error" for r in self.risks)),
            "analysis.risk_warnings": float(sum(r.severity == "warning" for r in self.risks)),
            "analysis.bytes_read": float(c.bytes_read),
            "analysis.bytes_read_ratio": c.bytes_read_ratio if c.has_weights else None,
        }


def _file_problems(reader, vocab_size) -> list[str]:
    """Findings in the checkpoint's other files: its chat templates (rendered under limits) and
    tokenizer.json's ids against vocab_size."""
    return chat_template.problems(reader) + tokenizer_ids.problems(reader, vocab_size)


def run(config: Config, inputs: StageInputs) -> Result:
    """Analyse inputs.source for inputs.target. Raises InputError/CheckpointError on bad input."""
    started = time.monotonic()
    reader = open_reader(inputs.source)  # one listing (s3) for the headers and the other files
    ckpt = read_checkpoint(reader)
    view = resolve(ckpt.config, trust_remote_code=inputs.trust_remote_code, file=ckpt.config_file)
    architecture = view.class_name
    if ckpt.has_weights:
        classify(ckpt, layers=view.get("num_hidden_layers"), model_class=view.class_name)
        tensors = [(n, t.shape) for n, t in sorted(ckpt.tensors.items())
                   if ckpt.roles[n] == "model"]
    else:
        tensors, architecture = meta_parameters(view, trust_remote_code=inputs.trust_remote_code,
                                                timeout_s=config.count_timeout_s)
    unknown: list[str] = []  # facts the config does not give as numbers: reported, not guessed
    attention = attention_facts(view, unknown)
    moe, _ = moe_facts(view, tensors)
    unused = ckpt.params("extra") if ckpt.has_weights else 0
    params = count_params(tensors, moe, "checkpoint" if ckpt.has_weights else "config", unused)
    params.buffers = ckpt.params("buffer") if ckpt.has_weights else 0
    tied = cfg(view, "tie_word_embeddings")
    params.tied_embeddings = tied if isinstance(tied, bool) else None
    params.shared_layers = shared_layers(view)
    memory = Memory(weights_bytes=weights_bytes(tensors),
                    stored_bytes=(sum(ckpt.tensors[n].nbytes for n, _ in tensors)
                                  if ckpt.has_weights else None),
                    note=("params.total x bytes per dtype; float8 keeps embeddings, lm_head, router "
                          "gates and norms in 2 bytes and leaves out block scales"))
    max_context = int(config.max_context or cfg_alias(view, "max_context", default=4096))
    split = layer_split(view, attention, unknown)
    kv = kv_cache(attention, split, max_context)
    state = state_facts(view, split, unknown)
    layers = int(view.require("num_hidden_layers"))
    hidden = int(view.require("hidden_size"))
    target = inputs.target
    plan = make_plan(weights=memory.weights_bytes[config.weights_dtype],
                     kv=kv["bytes_at_max_context"][config.kv_dtype] * config.batch_size,
                     layers=layers, moe_layers=moe.moe_layers if moe else 0, hidden=hidden,
                     heads=max(attention.num_heads, 1), kv_heads=max(attention.num_kv_heads, 1),
                     mla=attention.kind == "mla", num_experts=moe.num_experts if moe else None,
                     experts_per_token=moe.experts_per_token if moe else None,
                     card_memory_gib=target.card_memory_gib, cards=target.cards,
                     cards_per_domain=target.cards_per_domain,
                     headroom_fraction=config.headroom_fraction, weights_dtype=config.weights_dtype,
                     kv_dtype=config.kv_dtype, batch=config.batch_size, context=max_context)
    rope = rope_facts(view, unknown)
    risks = collect_risks(view=view, notes=view.notes, attention=attention, moe=moe, rope=rope,
                          state=state, unknown=unknown,
                          kv=kv, params=params, weights_bf16=memory.weights_bytes["bfloat16"],
                          plan=plan, ckpt=ckpt, param_names=[n for n, _ in tensors])
    intermediate = cfg(view, "intermediate_size")
    return Result(source=str(inputs.source), architecture=architecture,
                  model_type=view.model_type, config_model_type=view.raw.get("model_type"),
                  num_layers=layers, hidden_size=hidden, vocab_size=cfg(view, "vocab_size"),
                  attention=attention, moe=moe, rope=rope, state=state, unknown=unknown,
                  max_context=max_context,
                  params=params, memory=memory, kv_cache=KVCache(**kv), plan=plan, risks=risks,
                  checkpoint=CheckpointInfo(**ckpt.summary()),
                  reference=estimate(tensors, active_params=params.active, hidden=hidden,
                                     vocab=cfg(view, "vocab_size"), target_dtype=target.dtype,
                                     intermediate=intermediate if isinstance(intermediate, int)
                                     else None, available_gib=available_gib()),
                  checkpoint_problems=(header_problems(ckpt) if ckpt.has_weights else [])
                  + _file_problems(reader, cfg(view, "vocab_size")),
                  wall_s=round(time.monotonic() - started, 3))
