"""The operator scan's core: a full-size meta forward recorded op by op, coverage on
the target. What it proves and needs: the face, __init__.py.
"""

from __future__ import annotations

import fnmatch
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from day0.execution.contract import StageInputs, StageResult
from day0.errors import ConfigError
from day0.execution import memory, progress
from day0.stages.scan.match import CheckpointMatch, match_checkpoint
from day0.yamlio import read_mapping

DATA = Path(__file__).parent  # its own op lists
Status = Literal["covered", "uncovered", "unprobed", "manifest"]


class Config(BaseModel):
    """Settings of the operator scan."""

    model_config = ConfigDict(extra="forbid")

    seq_len: int = Field(32, ge=1, le=8192, description=(
        "Tokens in the full-size meta-device forward (batch 1)."))
    probe: bool = Field(True, description=(
        "Probe a shrunk copy of the model on the target device when the target has no "
        "op_manifest; off = every op is reported unprobed and coverage is not computed."))
    probe_hidden_size: int = Field(64, ge=16, description="hidden_size of the probe model.")
    probe_heads: int = Field(4, ge=1, description=(
        "Attention heads of the probe model; KV heads keep the original heads/KV ratio."))
    probe_intermediate_size: int = Field(128, ge=8, description=(
        "Dense MLP width of the probe model (MoE expert widths get a quarter of it)."))
    probe_vocab_size: int = Field(256, ge=16, description="Vocabulary of the probe model.")
    probe_max_layers: int = Field(8, ge=1, description=(
        "Upper bound on probe layers; the probe takes as few as still include every layer kind "
        "(dense and MoE, each attention type)."))
    probe_seq_len: int = Field(16, ge=1, description="Tokens in the probe forward.")
    seed: int = Field(0, description="Seed of the probe's random weights and tokens.")
    experts_implementation: Literal["eager", "grouped_mm", "batched_mm"] | None = Field(
        None, description="transformers MoE experts implementation; None = transformers' default.")
    attn_implementation: Literal["eager", "sdpa"] | None = Field(
        None, description="transformers attention implementation; None = transformers' default.")
    check_shapes: bool = Field(True, description=(
        "Compare every tensor's name and shape with the model transformers builds from config.json."))


class OpRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: str = Field(description="aten overload, e.g. aten.mm.default.")
    packet: str = Field(description="Overload packet, e.g. aten.mm.")
    count: int = Field(description="Calls in the full-size forward (0: seen only in the probe).")
    probe_count: int = Field(0, description="Calls in the probe forward on the target.")
    dtypes: list[str] = Field(description="dtypes of its input and output tensors (full size).")
    module: str | None = Field(None, description="Model module class it first ran in.")
    long_tail: bool = Field(description="Not in day0/stages/scan/common_ops.yaml.")
    status: Status = Field(description="covered | uncovered | unprobed | manifest.")
    error: str | None = Field(None, description="Why it is uncovered.")


class Result(StageResult):
    """What the scan found; JSON-serialisable evidence for reports and gates."""

    ops: list[OpRow] = Field(description="Every op seen, sorted by name.")
    coverage: float | None = Field(description=(
        "(covered + manifest) / all ops; None when neither probe nor manifest ran, or the "
        "full-size forward stopped early (the needed ops are then unknown)."))
    coverage_source: Literal["probe", "manifest", "none"] = Field(description="Where it came from.")
    uncovered: list[str] = Field(description="Ops the target cannot run.")
    unprobed: list[str] = Field(description="Ops needed at full size that the probe never ran.")
    long_tail: list[str] = Field(description="Ops outside the common set.")
    params: int = Field(description="Parameters of the full-size model.")
    dtype: str = Field(description="dtype of the scan (the target's).")
    seq_len: int = Field(description="Tokens of the full-size forward.")
    seconds: float = Field(description="Wall time of the stage.")
    peak_rss_bytes: int = Field(description="Peak resident memory of the scan's process (VmHWM).")
    scan_error: str | None = Field(None, description="Why the full-size forward stopped early.")
    scan_failed_op: str | None = Field(None, description="Op it stopped at, if any.")
    probe_error: str | None = Field(None, description="Why the probe forward stopped early.")
    probe_dims: dict = Field(default_factory=dict, description="Dims of the probe model.")
    notes: list[str] = Field(default_factory=list, description=(
        "Config fallbacks and the assumptions made for data-dependent ops."))
    checkpoint: CheckpointMatch | None = Field(None, description=(
        "Names and shapes against the class; None for a config.json alone or check_shapes off."))

    def metrics(self) -> dict[str, float | None]:
        return {
            "scan.coverage": self.coverage,
            "scan.uncovered_ops": float(len(self.uncovered)),
            "scan.unprobed_ops": float(len(self.unprobed)),
            "scan.long_tail_ops": float(len(self.long_tail)),
            "scan.distinct_ops": float(len(self.ops)),
            "scan.complete": 0.0 if self.scan_error else 1.0,
        }


# -- op lists ---------------------------------------------------------------------------------
def _normalise(name: str) -> str:
    return str(name).strip().replace("::", ".")


def _matcher(patterns: list[str]):
    """Entries are overloads (aten.mm.default), packets (aten.mm: all overloads) or globs."""
    exact = {p for p in patterns if not any(c in p for c in "*?[")}
    globs = [p for p in patterns if p not in exact]

    def match(op: str, packet: str) -> bool:
        return (op in exact or packet in exact or packet.rstrip("_") in exact
                or any(fnmatch.fnmatchcase(op, g) for g in globs))
    return match


def read_op_list(path: str | Path, field: str) -> list[str]:
    """A YAML op list: a bare list or {ops: [...]}; ConfigError names the file when malformed."""
    data = read_mapping(path)
    ops = data.get("ops") if isinstance(data, dict) else data
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise ConfigError("must be a list of aten op names (or a mapping with 'ops: [...]')",
                          file=str(path), field=field,
                          fix="write e.g. 'ops: [aten.mm, aten.add.Tensor]'")
    return [_normalise(o) for o in ops]


def common_ops() -> list[str]:
    return read_op_list(DATA / "common_ops.yaml", "ops")


def meta_equivalents() -> dict[str, str]:
    """Full-size (meta) op -> the op a device runs for the same code (meta_equivalents.yaml)."""
    path = DATA / "meta_equivalents.yaml"
    data = read_mapping(path)
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in data.items()):
        raise ConfigError("must map aten op names to aten op names", file=str(path),
                          fix="write e.g. 'aten.scalar_tensor.default: aten.lift_fresh.default'")
    return {_normalise(k): _normalise(v) for k, v in data.items()}


# -- the stage --------------------------------------------------------------------------------
def run(config: Config, inputs: StageInputs) -> Result:
    from day0.checkpoint.files import read_config
    from day0.checkpoint.modeling import resolve_config
    from day0.stages.scan.meta import meta_scan
    from day0.torchkit.dtypes import torch_dtype

    start = time.perf_counter()
    progress.plan({"layers": 4, "probe": 1})
    target = inputs.target
    manifest = None
    if target.op_manifest:
        manifest = _matcher(read_op_list(target.op_manifest, "op_manifest"))
    data, file = read_config(inputs.source)  # s3: one LIST + one GET
    dtype = torch_dtype(target.dtype)

    def resolved():  # the probe needs its own copy: the meta scan sets implementation fields
        return resolve_config(data, trust_remote_code=inputs.trust_remote_code, file=file)

    matched: dict = {}
    meta = meta_scan(resolved(), dtype=dtype, seq_len=config.seq_len,
                     experts_implementation=config.experts_implementation,
                     attn_implementation=config.attn_implementation,
                     before_forward=(lambda model: matched.update(match_checkpoint(inputs, model)))
                     if config.check_shapes else None)
    probe = None
    if manifest is None and config.probe and target.device != "meta":
        from day0.stages.scan.probe import run_probe

        res = resolved()
        if config.experts_implementation:
            res.config._experts_implementation = config.experts_implementation
        if config.attn_implementation:
            res.config._attn_implementation = config.attn_implementation
        progress.update("probe", 0, 1, detail=f"shrunk model on {target.device}")
        probe = run_probe(res, device=target.device, dtype=dtype, plugins=target.plugins,
                          hidden=config.probe_hidden_size, heads=config.probe_heads,
                          intermediate=config.probe_intermediate_size,
                          vocab=config.probe_vocab_size, max_layers=config.probe_max_layers,
                          seq_len=config.probe_seq_len, seed=config.seed)
        progress.update("probe", 1, 1, detail=f"{len(probe.recorder.ops)} ops seen")
    rows = _rows(meta.recorder, probe, manifest, target.op_manifest)
    source = "manifest" if manifest else ("probe" if probe else "none")
    good = sum(r.status in ("covered", "manifest") for r in rows)
    # An unfinished full-size forward leaves the needed ops unknown: no coverage figure then.
    coverage = good / len(rows) if rows and source != "none" and not meta.error else None
    return Result(
        ops=rows, coverage=coverage, coverage_source=source,
        uncovered=[r.op for r in rows if r.status == "uncovered"],
        unprobed=[r.op for r in rows if r.status == "unprobed"],
        long_tail=[r.op for r in rows if r.long_tail],
        params=meta.params, dtype=target.dtype, seq_len=config.seq_len,
        seconds=time.perf_counter() - start,
        peak_rss_bytes=memory.peak_rss_bytes(),
        scan_error=meta.error, scan_failed_op=meta.failed_op,
        probe_error=probe.error if probe else None, probe_dims=probe.dims if probe else {},
        notes=meta.notes, checkpoint=matched.get("match"),
        checkpoint_problems=matched.get("problems", []))


def _rows(meta_rec, probe, manifest, manifest_path) -> list[OpRow]:
    common = _matcher(common_ops())
    probe_ops = probe.recorder.ops if probe else {}
    equivalent = meta_equivalents()
    failures = dict(probe.recorder.failures) if probe else {}
    blamed = _matcher(list(probe.blamed)) if probe and probe.blamed else None
    rows = []
    for name in sorted(set(meta_rec.ops) | set(probe_ops)):
        full = meta_rec.ops.get(name)
        small = probe_ops.get(name) or probe_ops.get(equivalent.get(name, ""))
        stats = full or small
        status: Status
        error = None
        if manifest is not None:
            status = "manifest" if manifest(name, stats.packet) else "uncovered"
            error = None if status == "manifest" else f"not listed in op manifest {manifest_path}"
        elif probe is None:
            status = "unprobed"
        elif name in failures:
            status, error = "uncovered", failures[name]
        elif small is not None:
            status = "covered"
        elif blamed is not None and blamed(name, stats.packet):
            status, error = "uncovered", next(iter(probe.blamed.values()))
        else:
            status = "unprobed"
        rows.append(OpRow(
            op=name, packet=stats.packet, count=full.count if full else 0,
            probe_count=small.count if small else 0, dtypes=sorted(stats.dtypes),
            module=stats.module, long_tail=not common(name, stats.packet), status=status,
            error=error))
    return rows


def summary_text(result: Result) -> str:
    """A few lines for the CLI."""
    cov = "n/a" if result.coverage is None else f"{result.coverage:.1%}"
    lines = [f"operator scan: {len(result.ops)} distinct aten ops, {result.params / 1e9:.2f}B "
             f"params, {result.dtype}, seq {result.seq_len} "
             f"({result.seconds:.1f} s, peak RSS {result.peak_rss_bytes / 2**30:.2f} GiB)",
             f"coverage ({result.coverage_source}): {cov}"]
    if result.scan_error:
        lines.append(f"full-size forward stopped early at {result.scan_failed_op}: "
                     f"{result.scan_error} (ops after it are missing)")
    if result.probe_error:
        lines.append(result.probe_error)
    for r in result.ops:
        if r.status == "uncovered":
            lines.append(f"  UNCOVERED {r.op} ({r.module or '?'}): {r.error}")
    if result.unprobed:
        lines.append(f"  unprobed ({len(result.unprobed)}): {', '.join(result.unprobed)}")
    if result.long_tail:
        lines.append(f"  long-tail ({len(result.long_tail)}): {', '.join(result.long_tail)}")
    lines += [f"  note: {n}" for n in result.notes]
    ck = result.checkpoint
    if ck:
        lines.append(f"checkpoint: {ck.tensors} tensors match transformers' {ck.model_class}"
                     + (f" ({ck.unused_params:,} parameters it does not use)"
                        if ck.unused_params else ""))
        lines += [f"  note: {n}" for n in ck.notes]
    lines += [f"the checkpoint is broken: {p}" for p in result.checkpoint_problems]
    return "\n".join(lines)
