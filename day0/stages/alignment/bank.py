"""The reference bank: what the reference (and the control at each dtype) computed for one
checkpoint on the evaluation windows, stored once and replayed for every later target and
re-validation, so none of them runs a reference or control forward.

Layout: ``<root>/<key>/reference/`` and ``<root>/<key>/control-<dtype>/``, each a folder of
safetensors shards and ``bank.json``, written last (a part without it is incomplete and never
read). Tensors are named ``w<window>/<what>/<first position>``: ``logits`` [positions, vocab],
``h<layer>`` [positions, hidden] (the layer output of a batch of one) and ``r.<router>``
[positions, k]; the resident path stores one piece per KV-cache chunk, the streamed path one
per window, and a reader slices and joins pieces, so a bank built one way serves the other.
The reference part also holds the recorded op inputs (``ops.pt``, loaded weights-only) and the
weight scan's findings; each part holds its greedy continuations.

The key digests the weights (day0.store.identity.weights_key), the reference device and dtype, the
token ids of every window and prompt (text, tokenizer, seq_len, context), the op-check ids,
new_tokens and the torch and transformers versions: what the numbers depend on. Values are
exact: float32 as computed; a control's tensors in its own dtype only where that is lossless
(a bf16 model's outputs are bf16 values), so replayed metrics equal recomputed ones.

root: ``reference_bank_uri``, else $DAY0_REFERENCE_BANK_URI, else ``<results>/<model>/
<revision>/reference-cpu-float32/alignment-bank`` next to the targets' results ($DAY0_RESULTS_URI,
or the s3 source's bucket), else the local cache. Read over ranged GETs from s3 (day0.torchkit.weights), never downloaded whole.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from day0.store import seal as _seal
from day0.store.identity import cache_dir, results_location
from day0.store.retry import read_optional, retrying
from day0.store.s3 import is_s3, put_object

FORMAT = 3  # 3: sealed, file digests, wide tensors. Bump when what a bank records, or how, changes
META = "bank.json"
OPS = "ops.pt"
SHARD_BYTES = 1 << 30
ENV = "DAY0_REFERENCE_BANK_URI"


class BankMeta(BaseModel):
    """bank.json: what one part of a bank holds."""

    model_config = ConfigDict(extra="forbid")

    format: int = Field(description="Bank format version (FORMAT).")
    key: str = Field(description="The bank key (weights, windows, settings, versions).")
    part: str = Field(description="'reference' or 'control-<dtype>'.")
    device: str = Field(description="Device the part was computed on.")
    dtype: str = Field(description="Dtype the part was computed at.")
    windows: list[str] = Field(description="Digest of each window's token ids, in order.")
    n_layers: int = Field(description="Decoder layers recorded per window.")
    routers: list[str] = Field(default_factory=list, description="Routers recorded (MoE).")
    built: str = Field(description="'resident' or 'streamed': how the part was computed.")
    generations: list[list[int]] | None = Field(None, description="Greedy continuations.")
    ops: list[dict] | None = Field(None, description="Ops of the op-check forward (reference).")
    weight_problems: list[str] | None = Field(None, description="Weight scan findings.")
    op_dtypes: dict[str, list[str]] | None = Field(None, description=(
        "Control parts: the dtypes each op ran at in a forward of the model at this dtype "
        "(how the model runs it: an upcast op in float32), which the op replay follows."))
    files: dict[str, str] = Field(default_factory=dict, description=(
        "sha256 of each file of the part (shards, ops): a part is replayed only when every "
        "file is there, none else, and each digest matches."))
    wide: list[str] = Field(default_factory=list, description=(
        "Control parts: floating tensors kept in float32 because their values are not exact "
        "at the part's dtype; every other floating tensor is stored at that dtype."))
    seal: str | None = Field(None, description=(
        "HMAC of this record (day0.store.seal): a part whose seal does not verify is never "
        "replayed."))
    bytes: int = Field(0, description="Size of the part's files.")
    seconds: float = Field(0.0, description="Time it took to compute.")
    created_at: str = Field("", description="UTC time it was stored.")


def window_digest(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:24]


def bank_key(*, weights: str, reference: str, windows: list[list[int]], op_ids: list[int] | None,
             prompts: list[list[int]], new_tokens: int) -> str:
    import transformers

    doc = {"format": FORMAT, "weights": weights, "reference": reference,
           "windows": [window_digest(w) for w in windows], "op_ids": op_ids,
           "prompts": [window_digest(p) for p in prompts], "new_tokens": new_tokens,
           "torch": torch.__version__, "transformers": transformers.__version__}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def bank_root(configured: str | None, source: str, *, revision: str | None, reference: str,
              weights: str) -> str:
    """Where this checkpoint's banks live: configured, $DAY0_REFERENCE_BANK_URI, the
    reference's folder next to the targets' results (as the evaluation stage's stored
    reference results), or the local cache."""
    root = configured or os.environ.get(ENV)
    if root:
        return root.rstrip("/")
    side = "reference-" + reference.replace("/", "-")
    folder = results_location(None, source, side, revision, weights=weights)
    return _join(folder, "alignment-bank") if folder else str(cache_dir() / "reference-bank")


def _join(base: str, *parts: str) -> str:
    if is_s3(base):
        return "/".join([base.rstrip("/"), *parts])
    return str(Path(base).joinpath(*parts))


def _read(uri: str) -> bytes | None:
    if is_s3(uri):  # asked again while the store cannot answer; StoreDown once it stays down
        return read_optional(uri)
    path = Path(uri)
    return path.read_bytes() if path.is_file() else None


def _reader(where: str):
    """The part's reader: over s3, its listing and every ranged read wait out a short outage."""
    from day0.checkpoint.files import open_reader
    from day0.store.s3 import S3Reader

    return S3Reader(where, retry=retrying) if is_s3(where) else open_reader(where)


class BankWriter:
    """Collects one part's tensors into shards in a private folder; commit() publishes them and
    bank.json last; abort() (or no commit) leaves nothing behind."""

    def __init__(self, root: str, key: str, part: str, *, compact: torch.dtype | None = None):
        self.where = _join(root, key, part)
        self.key, self.part, self.compact = key, part, compact
        staging_root = cache_dir() / "reference-bank-staging"
        staging_root.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=f"{part}-", dir=staging_root))
        self.pending: dict[str, torch.Tensor] = {}
        self.wide: list[str] = []  # floating tensors a compact part keeps in float32
        self.pending_bytes = 0
        self.shards = 0
        self.started = time.monotonic()
        self.unsupported: str | None = None  # why this part cannot be banked, if it cannot

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach().to("cpu").contiguous()
        if self.compact is not None and t.is_floating_point() and t.dtype != self.compact:
            small = t.to(self.compact)
            if torch.equal(small.to(t.dtype), t):  # lossless only: replay must equal recompute
                t = small
            else:
                self.wide.append(name)
        self.pending[name] = t
        self.pending_bytes += t.numel() * t.element_size()
        if self.pending_bytes >= SHARD_BYTES:
            self._flush()

    def flush(self) -> None:
        """What is held so far to a shard on disk (memory back before the next phase)."""
        self._flush()

    def put_ops(self, ops: dict) -> None:
        torch.save(ops, self.staging / OPS)

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if self.pending:
            self.shards += 1
            save_file(self.pending, str(self.staging / f"bank-{self.shards:05d}.safetensors"))
            self.pending, self.pending_bytes = {}, 0

    def commit(self, meta: dict) -> BankMeta:
        from day0.store import seal

        self._flush()
        files = sorted(p for p in self.staging.iterdir() if p.is_file())
        doc = BankMeta(format=FORMAT, key=self.key, part=self.part,
                       bytes=sum(p.stat().st_size for p in files),
                       files={p.name: seal.file_digest(p) for p in files}, wide=self.wide,
                       seconds=round(time.monotonic() - self.started, 1),
                       created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       **meta)
        sealed = seal.seal(doc.model_dump(mode="json", exclude={"seal"}))
        doc = BankMeta.model_validate(sealed)
        (self.staging / META).write_text(json.dumps(sealed))
        try:
            if is_s3(self.where):
                for path in files:
                    put_object(_join(self.where, path.name), path)
                put_object(_join(self.where, META), self.staging / META)
            else:
                self._replace_local(Path(self.where))
        finally:
            self.abort()
        return doc

    def _replace_local(self, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        if dest.exists():
            dest.rename(old)  # a reader sees the old part or the new one, never a mix
        shutil.copytree(self.staging, dest.with_name(f".{dest.name}.new-{os.getpid()}"))
        dest.with_name(f".{dest.name}.new-{os.getpid()}").rename(dest)
        shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


class Bank:
    """One part of a bank, read tensor by tensor (byte ranges; ranged GETs on s3)."""

    def __init__(self, where: str, meta: BankMeta, store):
        self.where, self.meta, self.store = where, meta, store
        self.pieces: dict[tuple[int, str], list[tuple[int, int, str]]] = {}
        for name in store.tensors:
            w, what, start = name.split("/")
            rows = store.shape(name)[0]
            self.pieces.setdefault((int(w[1:]), what), []).append((int(start), int(start) + rows,
                                                                   name))
        for found in self.pieces.values():
            found.sort()

    @classmethod
    def open(cls, root: str, key: str, part: str, log=print,
             rejected: dict[str, str] | None = None) -> "Bank | None":
        """The part if it is complete, readable and verified (its seal, every file's digest,
        its dtypes); None otherwise, said in the log and, for a stored part that fails, why
        in rejected[part]."""
        from day0.errors import Day0Error, StoreDown
        from day0.checkpoint.safetensors_header import read_header
        from day0.torchkit.weights import WeightStore

        where = _join(root, key, part)
        try:
            raw = _read(_join(where, META))
            if raw is None:
                return None
            record = json.loads(raw)
            if isinstance(record, dict) and record.get("format") != FORMAT:
                raise ValueError(f"bank.json is format {record.get('format')}, not {FORMAT}")
            meta = BankMeta.model_validate(record)
            if meta.key != key or meta.part != part:
                raise ValueError(f"bank.json names key {meta.key}, part {meta.part}")
            if why := _seal.broken(record):
                raise ValueError(f"bank.json is not trusted: {why}")
            reader = _reader(where)
            _verify_files(meta, reader, where)
            tensors, problems = {}, []
            for shard in sorted(n for n in meta.files if n.endswith(".safetensors")):
                tensors.update(read_header(reader, shard, problems) or {})
            if problems:
                raise ValueError(problems[0].message)
            _verify_dtypes(meta, tensors)
            if meta.ops is not None and OPS not in meta.files:
                raise ValueError(f"{OPS} is missing")
            return cls(where, meta, WeightStore(where, tensors=tensors, reader=reader))
        except StoreDown:  # the store's trouble, not the part's: the stage's ERROR, named
            raise
        except (Day0Error, ValidationError, ValueError, OSError) as exc:
            why = f"fails verification: {str(exc).splitlines()[0][:240]}"
            log(f"reference bank: {where} {why}; not replayed: recomputing it")
            if rejected is not None:
                rejected[part] = why
            return None

    def window(self, ids: list[int]) -> int:
        return self.meta.windows.index(window_digest(ids))

    def rows(self, w: int, what: str, a: int, b: int) -> torch.Tensor | None:
        """Positions [a, b) of window w's ``what`` in float32 (int64 for routes); None when the
        bank holds none of it."""
        parts = []
        for start, end, name in self.pieces.get((w, what), []):
            lo, hi = max(a, start), min(b, end)
            if lo < hi:
                parts.append(self.store.read(name, rows=(lo - start, hi - start)))
        if not parts:
            return None
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        if out.shape[0] != b - a:
            raise ValueError(f"{self.where}: window {w} {what} covers {out.shape[0]} of "
                             f"positions {a}-{b}")
        return out.float() if out.is_floating_point() else out

    def ops(self) -> dict | None:
        raw = _read(_join(self.where, OPS))
        if raw is None:
            return None
        import io

        return torch.load(io.BytesIO(raw), weights_only=True)  # never unpickle code from a store


def _verify_files(meta: BankMeta, reader, where: str) -> None:
    """Every file bank.json lists is there with its digest, and no other shard or ops file."""
    present = set(reader.names()) - {META}
    if extra := sorted(present - set(meta.files)):
        raise ValueError(f"{extra[0]} is not one of the part's files")
    for name, digest in meta.files.items():
        if name not in present:
            raise ValueError(f"{name} is missing")
        path = _join(where, name)
        found = (_seal.bytes_digest(_read(path) or b"") if is_s3(path)
                 else _seal.file_digest(path))
        if found != digest:
            raise ValueError(f"{name} differs from the digest bank.json records")


# safetensors' dtype codes of the dtypes a part holds
_CODES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
          "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def _verify_dtypes(meta: BankMeta, tensors: dict) -> None:
    """Floating tensors at the part's dtype (as computed where bank.json lists them as wide),
    routes as integers: values of another dtype are not this part's."""
    declared = _CODES.get(meta.dtype, meta.dtype)
    wide = set(meta.wide)
    for name, info in tensors.items():
        if "/r." in name:
            ok, expected = info.dtype[0] in "IU", "an integer dtype"
        elif name in wide:
            ok, expected = info.dtype.startswith("F") and info.dtype != declared, "wide"
        else:
            ok, expected = info.dtype == declared, declared
        if not ok:
            raise ValueError(f"tensor {name} is stored as {info.dtype}, the part declares "
                             f"{expected}")


def size_text(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


__all__ = ["Bank", "BankWriter", "BankMeta", "bank_key", "bank_root", "window_digest",
           "size_text", "FORMAT"]
