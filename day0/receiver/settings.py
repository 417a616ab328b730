"""Receiver settings: one YAML file (``day0 hooks serve --config FILE``), validated strictly.

Secrets may be written as ``env:VARIABLE`` so the file itself holds no secret; they are resolved
once at load time and the missing variables are one ConfigError naming them all. The journal
defaults to ``${XDG_STATE_HOME:-~/.local/state}/day0/receiver/journal.sqlite`` (day0.store.paths).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from day0.errors import ConfigError
from day0.store.paths import state_home
from day0.yamlio import load_model, read_mapping

DEFAULTS = Path(__file__).resolve().parents[1] / "data" / "receiver.yaml"
# trust_remote_code is not among them: it is granted per source prefix (ReceiverSettings below)
FLOW_PARAMETERS = ("target_file", "gates", "out", "stage_configs", "use_cache")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Secrets(_Strict):
    """Shared secrets, one per sender. An endpoint whose secret is unset answers 401 to all."""

    release_hmac: SecretStr | None = Field(None, description=(
        "HMAC-SHA256 key for the generic release webhook (X-Day0-Signature)."))
    hf_webhook: SecretStr | None = Field(None, description=(
        "Secret the Hugging Face Hub sends in X-Webhook-Secret."))
    seaweedfs_token: SecretStr | None = Field(None, description=(
        "Bearer token the SeaweedFS filer sends (notification.webhook bearer_token)."))
    s3_token: SecretStr | None = Field(None, description=(
        "Token for /v1/events/s3: 'Authorization: Bearer T' (MinIO auth_token, EventBridge API "
        "destination), Basic auth with password T (SNS https://user:T@host/...) or ?token=T."))
    admin_token: SecretStr | None = Field(None, description=(
        "Bearer token for GET /healthz with journal statistics."))


class HubSettings(_Strict):
    """How a Hugging Face Hub webhook becomes a release."""

    branches: list[str] = Field(["main"], description="Refs (branch names) whose updates count.")
    repo_types: list[str] = Field(["model"], description="Hub repo types that count.")
    source: str = Field("s3://hub-mirror/{repo}/{revision}", description=(
        "Template for the flow's `source`: {repo} and {revision} are filled in. day0 reads "
        "weights from local folders and s3:// only, so point this at the object-store mirror "
        "your sync job fills from the Hub (e.g. 's3://mirror/{repo}/{revision}')."))


    @field_validator("source")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            example = value.format(repo="org/name", revision="0" * 40)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{repo}} and {{revision}} may appear in braces ({exc!r})") from None
        from day0.receiver.safety import parse_source

        parse_source(example)  # s3:// or an absolute folder, so Hub releases cannot name others
        return value


class S3Settings(_Strict):
    """Object store the completeness check reads; unset fields fall back to day0.store.s3/AWS env."""

    endpoint_url: str | None = Field(None, description="S3 endpoint URL (MinIO, SeaweedFS, Ceph).")
    region: str | None = Field(None, description="Region name.")
    access_key_id: SecretStr | None = Field(None, description="Access key (env:VAR allowed).")
    secret_access_key: SecretStr | None = Field(None, description="Secret key (env:VAR allowed).")
    request_timeout_s: float = Field(5.0, gt=0, le=300, description=(
        "Connect and read timeout of each store request made by a completeness check."))
    max_attempts: int = Field(2, ge=1, le=10, description=(
        "Attempts per store request (botocore standard retry mode), first one included."))


class CheckSettings(_Strict):
    """How completeness checks use the store: bounded, and isolated from everything else."""

    concurrency: int = Field(4, ge=1, le=64, description=(
        "Checks running at once (threads); a store that never answers ties up at most these."))
    timeout_s: float = Field(30.0, gt=0, le=3600, description=(
        "A check of one prefix running longer than this counts as failed: the store is reported "
        "degraded in /healthz and the prefix is checked again with backoff."))
    inline_wait_s: float = Field(8.0, ge=0, le=60, description=(
        "How long an object-store event waits, in total, for its checks before the answer; "
        "later results are the worker's. Not waited while the store is degraded."))
    queue: int = Field(64, ge=1, le=10000, description=(
        "Checks queued behind the running ones at most; more events are journaled and left "
        "to the worker."))


class LimitSettings(_Strict):
    """What one client may cost the receiver: connection time, header and JSON size."""

    header_timeout_s: float = Field(10.0, gt=0, le=300, description=(
        "From connection open (or the end of the previous answer) until the request headers "
        "are complete; slower connections get 408 and are closed."))
    body_timeout_s: float = Field(30.0, gt=0, le=600, description=(
        "From the end of the headers until the body is complete; slower connections are closed."))
    keep_alive_s: int = Field(15, ge=1, le=600, description=(
        "Idle keep-alive connections are closed after this (uvicorn timeout_keep_alive)."))
    max_connections: int = Field(500, ge=2, le=100_000, description=(
        "Open connections at most (uvicorn limit_concurrency): requests beyond it get 503. "
        "Keep it below the process's open-file limit."))
    max_header_bytes: int = Field(16 << 10, ge=1024, le=1 << 20, description=(
        "Largest request head (request line and headers; h11_max_incomplete_event_size)."))
    max_json_keys: int = Field(10_000, ge=10, le=1_000_000, description=(
        "Bodies with more than this many ':' (an upper bound on the JSON keys) get 413 before "
        "they are parsed."))
    max_prefixes_per_event: int = Field(100, ge=1, le=10_000, description=(
        "Distinct checkpoint prefixes one object-store event may name; more get 422."))


class CheckpointSettings(_Strict):
    """When a prefix of the object store counts as a complete checkpoint."""

    require: list[str] = Field(default_factory=list, description=(
        "Files required besides config.json, the index and its shards (e.g. tokenizer.json)."))
    max_index_bytes: int = Field(64 << 20, gt=0, description="Largest index file read.")
    verify_headers: bool = Field(True, description=(
        "Read each shard's safetensors header (one ranged GET) and require the object size to "
        "equal 8 + header length + end of the last tensor; off: size > 0 is enough."))
    include: list[str] = Field(["*"], description=(
        "fnmatch patterns on 'bucket/key'; events for other objects are ignored."))
    seaweedfs_buckets_dir: str = Field("/buckets", description=(
        "Filer folder holding the S3 buckets (filer -s3 default /buckets)."))
    settle_s: float = Field(5.0, ge=0, le=3600, description=(
        "A complete prefix becomes a release only when a listing taken this long after its "
        "last event finds it complete: an upload that sends the index before tokenizer.json is "
        "one release named with the whole upload's revision. "
        "Raise it for uploaders that pause between files; 0 releases at the first complete check."))


class SubmitSettings(_Strict):
    """The background worker that turns accepted releases into Prefect flow runs."""

    concurrency: int = Field(4, ge=1, le=64, description="Flow-run submissions in flight at once.")
    backoff_initial_s: float = Field(1.0, gt=0, description="First retry delay when Prefect fails.")
    backoff_max_s: float = Field(60.0, gt=0, description="Longest retry delay.")
    poll_s: float = Field(5.0, gt=0, description="Idle wake-up interval of the worker.")
    crash_attempts: int = Field(3, ge=1, le=20, description=(
        "Runs of one release whose process died (Crashed: no verdict) before the receiver gives "
        "up on it; each crash submits the release again at once. The journal's last row then "
        "names every attempt (GET /healthz counts crashed runs)."))
    emit_events: bool = Field(True, description=(
        "Emit a Prefect event 'day0.release.accepted' (resource day0.release.<model>) per release."))


class ReceiverSettings(_Strict):
    """Everything `day0 hooks serve` needs."""

    host: str = Field("127.0.0.1", description="Listen address.")
    port: int = Field(8787, ge=0, le=65535, description="Listen port (0: any free port).")
    journal: str | None = Field(None, description=(
        "SQLite journal (WAL, synchronous=FULL); relative paths are relative to the config file; "
        "default ${XDG_STATE_HOME:-~/.local/state}/day0/receiver/journal.sqlite. One receiver "
        "per journal: a second one on the same file refuses to start."))
    deployment: str = Field("validate/day0", description="Prefect deployment 'flow/deployment'.")
    prefect_api_url: str | None = Field(None, description=(
        "Prefect API URL; default: Prefect's own settings (PREFECT_API_URL, profile)."))
    prefect_csrf: bool = Field(False, description=(
        "Whether the Prefect server enforces CSRF protection (its "
        "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED, off by default). false: the client neither "
        "asks for nor sends a CSRF token (a server without protection answers that request with "
        "422); true: it fetches one before its first change."))
    targets: list[str] = Field(["cpu-bf16"], min_length=1, description=(
        "Targets validated for every release that names none."))
    allowed_targets: list[str] | None = Field(None, description=(
        "Targets a signed release may ask for; default: the targets day0 knows here."))
    flow_parameters: dict[str, Any] = Field(default_factory=dict, description=(
        f"Extra parameters for every flow run; keys among {', '.join(FLOW_PARAMETERS)}."))
    trust_remote_code: list[str] = Field(default_factory=list, description=(
        "Sources ('s3://bucket/prefix' or '/abs/folder') whose flow runs get "
        "trust_remote_code=true (a checkpoint's own Python code runs); no event can ask for it."))
    release_sources: list[str] = Field(["s3://*"], description=(
        "Where a signed release's `source` may point: 's3://bucket', 's3://bucket/prefix', "
        "'s3://*' (any bucket of the configured store) or an absolute folder '/srv/ckpt'. "
        "Anything else (other schemes, '..', other buckets) gets 422."))
    max_body_bytes: int = Field(1 << 20, gt=0, description="Larger request bodies get 413.")
    replay_window_s: int = Field(300, gt=0, description=(
        "Signed releases whose X-Day0-Timestamp is further than this from now get 401."))
    sns_allowed_hosts: list[str] = Field(default_factory=list, description=(
        "fnmatch patterns of hosts whose SubscribeURL is confirmed (e.g. 'sns.*.amazonaws.com'); "
        "https only, except loopback hosts. Empty: never call out."))
    public_healthz: bool = Field(False, description=(
        "Answer GET /healthz without a token (status only, no statistics)."))
    secrets: Secrets = Field(default_factory=Secrets, description="Shared secrets per sender.")
    hub: HubSettings = Field(default_factory=HubSettings, description="Hugging Face Hub webhooks.")
    s3: S3Settings = Field(default_factory=S3Settings, description="Object store access.")
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings,
                                           description="Completeness rules.")
    submit: SubmitSettings = Field(default_factory=SubmitSettings, description="Submission worker.")
    checks: CheckSettings = Field(default_factory=CheckSettings, description="Store checks.")
    limits: LimitSettings = Field(default_factory=LimitSettings, description="Per-client limits.")

    @field_validator("flow_parameters")
    @classmethod
    def _known_parameters(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "trust_remote_code" in value:
            raise ValueError("trust_remote_code is set per source, not for every run; write "
                             "trust_remote_code: ['s3://bucket/prefix'] at the top level")
        from day0 import stages

        if set_by_hand := stages.by_hand_only(value.get("stage_configs"), value.get("options")):
            raise ValueError(f"automatic runs never set {', '.join(set_by_hand)} (a stage's "
                             "by-hand option: `day0 stages`); ask for it by hand: the CLI, or "
                             "a deployment run with that option")
        if by_hand := sorted(set(value) & {"stages", "bring_up"}):
            raise ValueError(f"automatic runs never set {', '.join(by_hand)}: a release run "
                             "always runs the full plan on its weights as released; ask for a "
                             "partial or bring-up validation by hand (the CLI, or a deployment "
                             "run with that parameter)")
        unknown = sorted(set(value) - set(FLOW_PARAMETERS))
        if unknown:
            raise ValueError(f"unknown flow parameter(s) {unknown}; known: {list(FLOW_PARAMETERS)}")
        from day0.request import ValidateRequest

        ValidateRequest(source="s3://bucket/prefix", **value)  # types checked now, not per run
        return value

    @field_validator("trust_remote_code", "release_sources")
    @classmethod
    def _source_prefixes(cls, value: list[str]) -> list[str]:
        from day0.receiver.safety import source_prefix

        return [source_prefix(v) for v in value]

    @field_validator("deployment")
    @classmethod
    def _deployment_name(cls, value: str) -> str:
        if value.count("/") != 1 or not all(value.split("/")):
            raise ValueError("must be 'flow-name/deployment-name', e.g. 'validate/day0'")
        return value


def _resolve_secrets(data: Any, missing: dict[str, str], path: str = "") -> Any:
    """Replace every 'env:VAR' string under secrets/s3 with the variable's value; unset ones
    are added to missing (VAR -> field) and left as they are."""
    if isinstance(data, dict):
        return {k: _resolve_secrets(v, missing, f"{path}{k}.") for k, v in data.items()}
    if isinstance(data, str) and data.startswith("env:"):
        var = data[4:]
        if var not in os.environ:
            missing[var] = path.rstrip(".")
            return data
        return os.environ[var]
    return data


def _missing_variables(missing: dict[str, str], file: str) -> ConfigError:
    """One error naming every unset variable and the fields that read them."""
    names = ", ".join(missing)
    return ConfigError(f"environment variable{'s' if len(missing) > 1 else ''} not set: {names}",
                       file=file, field=", ".join(missing.values()),
                       fix="export each (docs/releases.md, 'Receiver secrets', lists them) "
                           "or write the value")


def load_settings(path: str | Path | None = None, **overrides: Any) -> ReceiverSettings:
    """Defaults from day0/data/receiver.yaml, then the file at `path`, then `overrides`."""
    data = read_mapping(DEFAULTS) or {}
    file = str(DEFAULTS)
    base = Path.cwd()
    if path is not None:
        file = str(path)
        user = read_mapping(path) or {}
        if not isinstance(user, dict):
            raise ConfigError("must be a mapping of settings", file=file, fix="see day0/data/receiver.yaml")
        data = _merge(data, user)
        base = Path(path).resolve().parent
    data = _merge(data, overrides)
    missing: dict[str, str] = {}
    for section in ("secrets", "s3"):
        if isinstance(data.get(section), dict):
            data[section] = _resolve_secrets(data[section], missing, f"{section}.")
    if missing:
        raise _missing_variables(missing, file)
    settings = load_model(ReceiverSettings, data, file)
    journal = Path(settings.journal).expanduser() if settings.journal else (
        state_home() / "receiver" / "journal.sqlite")
    if not journal.is_absolute():
        journal = base / journal
    return settings.model_copy(update={"journal": str(journal)})


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def secret(value: SecretStr | None) -> bytes | None:
    """A secret's bytes, or None when unset or empty (an empty secret never authenticates)."""
    if value is None:
        return None
    raw = value.get_secret_value().encode()
    return raw or None
