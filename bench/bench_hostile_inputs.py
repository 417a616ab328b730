"""How fast, and in how much memory, day0 refuses each hostile input of issue 27.

Run: .venv/bin/python bench/bench_hostile_inputs.py

Each case is a copy of tests/fixtures/models/tiny-llama made hostile in one way (temp dir,
deleted afterwards), run through the CLI as a user runs it, without a Prefect server (the
refusals come before one would start). Prints per case: the command, its exit code, wall
seconds, the peak resident memory of the process and of what it waited for (wait4), and the
first line that names the problem. The issue's bounds: exit 2 (or 5 for a checkpoint finding),
within 10 s, under 1 GiB. Figures only, no asserts (tests/hardening holds the behaviour).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "models" / "tiny-llama"


def _template(folder: Path, text: str) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = text
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)


def _added_tokens(folder: Path, count: int) -> None:
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["added_tokens"] += [{"id": 512 + i, "content": f"<x{i}>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False,
                             "special": False} for i in range(count)]
    (folder / "tokenizer.json").write_text(json.dumps(doc))


def _business(folder: Path, work: Path) -> list[str]:
    rows = work / "business.jsonl"
    rows.write_text(json.dumps({"prompt": "Say a", "answer": "^(a|a)*$", "match": "regex"}) + "\n")
    settings = work / "settings.yaml"
    settings.write_text(f"evaluation: {{business_file: '{rows}'}}\n")
    return ["validate", str(folder), "--stages", "evaluation", "--config", str(settings)]


CASES = {
    "chat template spins (nested range(99999))": (
        lambda f, w: _template(f, "{% for i in range(99999) %}{% for j in range(99999) %}"
                                  "{% endfor %}{% endfor %}"), "analyze"),
    "chat template grows (10 MB a step)": (
        lambda f, w: _template(f, "{% set ns = namespace(k=[]) %}{% for i in range(99999) %}"
                                  "{% set ns.k = ns.k + [('x' * 10000000) ~ i] %}{% endfor %}"),
        "analyze"),
    "heldout.txt of 1 GB (sparse)": (lambda f, w: _sparse(f / "heldout.txt", 1 << 30),
                                     "validate-alignment"),
    "heldout.txt -> /etc/passwd": (lambda f, w: (f / "heldout.txt").symlink_to("/etc/passwd"),
                                   "validate-alignment"),
    "a shard -> /etc/passwd": (
        lambda f, w: ((f / "model-00002-of-00004.safetensors").unlink(),
                      (f / "model-00002-of-00004.safetensors").symlink_to("/etc/passwd")),
        "analyze"),
    "business regex ^(a|a)*$": (None, "business"),
    "tokenizer.json: 300k ids past vocab_size": (lambda f, w: _added_tokens(f, 300_000),
                                                 "analyze"),
}


def run(argv: list[str]) -> tuple[int, float, float, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    with tempfile.TemporaryFile("w+") as out:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "day0.cli", *argv], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        out.seek(0)
        lines = out.read().splitlines()
    said = next((x.strip() for x in lines if "error:" in x or "cannot be served" in x
                 or "token id(s)" in x), lines[-1] if lines else "")
    return os.waitstatus_to_exitcode(status), seconds, usage.ru_maxrss / 1024, said


def main() -> int:
    print(f"{'case':44} {'exit':>4} {'seconds':>8} {'peak MiB':>9}  what it said")
    for name, (make, how) in CASES.items():
        with tempfile.TemporaryDirectory(prefix="day0-bench-hostile-") as tmp:
            work = Path(tmp)
            folder = work / "tiny-llama"
            shutil.copytree(FIXTURE, folder)
            if how == "business":
                argv = _business(folder, work)
            else:
                make(folder, work)
                argv = (["analyze", str(folder)] if how == "analyze" else
                        ["validate", str(folder), "--stages", "alignment"])
            code, seconds, peak, said = run(argv)
        print(f"{name:44} {code:>4} {seconds:>8.2f} {peak:>9.0f}  {said[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
