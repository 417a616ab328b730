"""Target profiles: a device + dtype + software stack that a model is validated on.

Built-in targets live in ``day0/data/targets.yaml``; a user's ``targets.yaml`` (top level or
``deploy/``) adds or overrides them; ``--target-file`` reads one target from any file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from day0.engines.settings import EngineSettings
from day0.errors import ConfigError, Problem, did_you_mean
from day0.yamlio import load_model, read_mapping

DATA = Path(__file__).parents[1] / "data"
KNOWN_DEVICES = ("cpu", "cuda", "xpu", "mps", "npu", "hpu", "mlu", "musa", "meta")
SEARCH_PATHS = ("targets.yaml", "deploy/targets.yaml")


class ContainerSettings(BaseModel):
    """How the docker runner starts a stage container (``runner: docker``).

    Every stage container runs with all capabilities dropped, no-new-privileges, a read-only
    root filesystem (writable: its scratch folder, a tmpfs /tmp and ``tmpfs``), and memory,
    CPU and pids limits; the fields below tune those limits, never switch the hardening off.
    """

    model_config = ConfigDict(extra="forbid")

    image: str = Field(description=(
        "Image holding Python, torch and day0 (the vendor stack + day0, see Dockerfile); "
        "it is never pulled implicitly: build it (`make image`) or `docker pull` it first."))
    gpus: Literal["all"] | int | list[str] | None = Field(None, description=(
        "GPU device request like `docker run --gpus`: 'all', a count, or device ids."))
    devices: list[str] = Field(default_factory=list, description=(
        "Device nodes passed through, 'HOST[:CONTAINER[:PERMS]]', e.g. /dev/davinci0."))
    env: dict[str, str] = Field(default_factory=dict, description=(
        "Extra environment of the stage container (e.g. the vendor's visible-devices variable)."))
    shm_size: str = Field("1g", description="Size of /dev/shm (dataloaders, NCCL/HCCL), e.g. 8g.")
    network: Literal["none", "host"] = Field("none", description=(
        "'none' isolates the stage (weights are mounted, nothing is downloaded); 'host' when the "
        "target must reach a device service or an s3:// source directly."))
    user: str = Field("10001:10001", description=(
        "Who the stage runs as: 'UID:GID' (numbers), or a user/group name that the image's "
        "/etc/passwd and /etc/group resolve; uid 0 and gid 0 (root) are refused, and a uid "
        "without a group must have an /etc/passwd entry in the image."))
    memory_gib: float | None = Field(None, gt=0, description=(
        "Memory limit (swap included) of a stage container when the target sets no "
        "memory_limit_gib (the stage budget, which wins when set). None: 75% of the Docker "
        "host's memory divided by the target's concurrency."))
    cpus: float | None = Field(None, gt=0, description=(
        "CPU limit of a stage container, like `docker run --cpus` (capped at the Docker host's "
        "CPUs). None: the host's CPUs divided by the target's concurrency, at least 1."))
    pids_limit: int = Field(4096, ge=64, description=(
        "Most processes and threads in a stage container (a fork bomb stops here); torch "
        "starts about one thread per core, so raise it only on hosts with very many cores."))
    tmpfs_size: str = Field("1g", pattern=r"^[1-9][0-9]*[kmgKMG]?$", description=(
        "Size of the writable tmpfs /tmp (and of each `tmpfs` folder), e.g. 2g; its contents "
        "count against the memory limit."))
    tmpfs: list[str] = Field(default_factory=list, description=(
        "Further container folders the image needs writable on its read-only root (e.g. a "
        "vendor runtime's log folder); each becomes a tmpfs of `tmpfs_size`."))
    mount_roots: list[str] = Field(default_factory=list, description=(
        "Host folders that files named in a stage config (text_file, tolerance_file) must lie "
        "in to be mounted read-only. Empty: the working directory and the checkpoint's folder. "
        "System folders (/, /etc, /proc, /var/run, ...) are never allowed."))

    @field_validator("user")
    @classmethod
    def _not_root(cls, value: str) -> str:
        cls.parse_user(value)
        return value

    @field_validator("tmpfs")
    @classmethod
    def _container_folders(cls, value: list[str]) -> list[str]:
        for path in value:
            parts = path.split("/")
            if not path.startswith("/") or path == "/" or ".." in parts or "," in path:
                raise ValueError(f"'{path}' is not an absolute container folder below / "
                                 "(no '..' or ','), e.g. /var/log/vendor")
        return value

    @staticmethod
    def parse_user(value: str) -> tuple[int | str, int | str | None]:
        """(uid or name, gid or group name or None) of a user string; ValueError when it is
        malformed or names root. Strict on purpose: Docker reads ' 0', '+0' and '00' as uid 0."""
        import re

        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
                                                           r"(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?", value):
            raise ValueError(f"user {value!r} is not 'UID:GID' or 'NAME[:GROUP]' (digits, letters, "
                             "'_', '.', '-'; no spaces or signs); use a non-root uid:gid such as "
                             "10001:10001")
        user, _, group = value.partition(":")
        parts = [int(p) if p and re.fullmatch(r"[0-9]+", p) else p or None for p in (user, group)]
        if parts[0] in (0, "root") or parts[1] in (0, "root"):
            raise ValueError(f"user {value!r} names root (uid 0, gid 0 or 'root'): stages never run as "
                             "root or in the root group; "
                             "use a non-root uid:gid such as 10001:10001")
        if any(isinstance(p, int) and p > 2**31 - 2 for p in parts):
            raise ValueError(f"user {value!r}: ids above 2147483646 are not valid uids/gids")
        return parts[0], parts[1]


class Target(BaseModel):
    """One device + dtype + plugins combination to validate against the reference."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Unique name, used as --target NAME.")
    kind: Literal["torch", "engine"] = Field("torch", description=(
        "What the target is, which decides the stages that apply to it (each stage declares "
        "target_kinds; day0.execution.contract.Stage): torch = the model runs in PyTorch on `device`; engine = "
        "a serving engine behind the OpenAI-compatible API (the `engine` section)."))
    engine: EngineSettings | None = Field(None, description=(
        "With kind: engine, the OpenAI-compatible engine: attached (base_url) or launched "
        "(launch command template), its variants and API key variable."))
    device: str = Field(description="torch device type: cpu, cuda, xpu, mps, npu, ...")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        description="dtype the target runs the model in.")
    claim: Literal["faithful", "int8", "fp8", "int4"] = Field("faithful", description=(
        "What the target claims about its numerics: 'faithful' (the model's own weights at "
        "`dtype`; the default) or a quantized deployment (int8, fp8, int4 weights). Gates with "
        "`by_claim` bounds and the layer tolerances use the claim's bounds: a quantized target "
        "is held to what quantization legitimately costs, not to bf16 rounding."))
    plugins: list[str] = Field(default_factory=list, description=(
        "Python module names or .py file paths exposing apply(model) -> None; run on the target "
        "side after weights load, before any check (ported kernels, patches, fault injection)."))
    runner: Literal["process", "docker", "deployment"] = Field("process", description=(
        "How stages are isolated: 'process' (a subprocess here), 'docker' (a container of "
        "`container.image` via the Docker socket), 'deployment' (a Prefect deployment of the "
        "day0-stage flow on a work pool, possibly on another machine)."))
    container: ContainerSettings | None = Field(None, description="Required with runner: docker.")
    deployment: str | None = Field(None, description=(
        "With runner: deployment, the stage deployment 'day0-stage/NAME' (see deploy/prefect.yaml)."))
    concurrency: int = Field(1, ge=1, description=(
        "Stages of one validation running at once on this target; 1 = the device is never "
        "shared by two stages."))
    timeout_s: float | None = Field(None, gt=0, description=(
        "Wall-clock limit per stage, seconds; exceeded = the stage is killed, verdict ERROR. "
        "None: each stage's time budget derived from the model's size (its folder's budget.yaml)."))
    memory_limit_gib: float | None = Field(None, gt=0, description=(
        "Resident-memory limit per stage (its whole process group), GiB; exceeded = the stage "
        "is killed, verdict ERROR. None: each stage's memory budget derived from the model's "
        "parameter count and dtypes (its folder's budget.yaml)."))
    op_manifest: str | None = Field(None, description=(
        "YAML file listing the aten ops the backend supports; used instead of probing the device."))
    card_memory_gib: float = Field(80.0, gt=0, description="Memory of one accelerator card, GiB.")
    cards: int = Field(8, ge=1, description="Cards available for the parallelism plan.")
    cards_per_domain: int = Field(8, ge=1, description=(
        "Cards sharing the fastest interconnect (e.g. one NVLink node)."))
    description: str = Field("", description="Free text shown in reports.")

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        base = value.split(":")[0]
        if base not in KNOWN_DEVICES:
            raise ValueError(f"unknown device '{value}';{did_you_mean(base, KNOWN_DEVICES)} "
                             f"known: {', '.join(KNOWN_DEVICES)}")
        return value

    @model_validator(mode="after")
    def _runner_settings(self) -> "Target":
        if self.runner == "docker" and self.container is None:
            raise ValueError("runner: docker needs a 'container' section with at least 'image'")
        if self.runner == "deployment" and not self.deployment:
            raise ValueError("runner: deployment needs 'deployment: day0-stage/NAME'")
        if self.kind == "engine" and self.engine is None:
            raise ValueError("kind: engine needs an 'engine' section with base_url or launch")
        if self.engine is not None and self.kind != "engine":
            raise ValueError(f"'engine' is only used with kind: engine (kind is {self.kind})")
        if self.kind == "engine" and self.runner != "process":
            raise ValueError(f"kind: engine runs with runner: process (got {self.runner}): the "
                             "engine itself is the isolated process; launch a container engine "
                             "with a `docker run` launch command")
        if self.container is not None and self.runner != "docker":
            raise ValueError(f"'container' is only used with runner: docker (runner is {self.runner})")
        return self

    @property
    def label(self) -> str:
        return f"{self.name} ({self.device}/{self.dtype})"


REFERENCE = Target(name="reference", device="cpu", dtype="float32",
                   description="cpu/float32 reference")


class TargetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    targets: list[Target] = Field(description="Target profiles.")


def _read_targets(path: Path) -> dict[str, Target]:
    data = read_mapping(path)
    parsed = load_model(TargetsFile, data, str(path))
    names = [t.name for t in parsed.targets]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"duplicate target names {dupes}", file=str(path), field="targets",
                          fix="give each target a unique name")
    return {t.name: t for t in parsed.targets}


def available_targets(root: Path | None = None) -> dict[str, Target]:
    """Built-in targets, overridden by a targets.yaml found under root (default: cwd)."""
    targets = _read_targets(DATA / "targets.yaml")
    root = root or Path.cwd()
    for rel in SEARCH_PATHS:
        if (root / rel).is_file():
            targets.update(_read_targets(root / rel))
    return targets


def resolve_target(name: str | None = None, file: str | None = None) -> Target:
    """--target NAME or --target-file FILE (one target, bare or under 'targets:')."""
    if file:
        data = read_mapping(file)
        if isinstance(data, dict) and "targets" in data:
            found = _read_targets(Path(file))
            if len(found) != 1:
                raise ConfigError(f"holds {len(found)} targets, expected one", file=file,
                                  field="targets", fix="keep one target or use --target NAME")
            return next(iter(found.values()))
        return load_model(Target, data, file)
    targets = available_targets()
    name = name or "cpu-bf16"
    if name not in targets:
        raise ConfigError(f"unknown target '{name}'", field="--target",
                          fix=(did_you_mean(name, targets).strip() or
                               f"choose one of {', '.join(sorted(targets))}"))
    return targets[name]


__all__ = ["Target", "ContainerSettings", "REFERENCE", "available_targets", "resolve_target", "Problem"]
