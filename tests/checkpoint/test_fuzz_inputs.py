"""Issue 9: `day0 analyze` on a seeded corpus of a few hundred hostile checkpoints
(tests/fuzz/mutants.py) must answer like a tool, never like a crash: exit 0, 1 or 2 (never 3 or
4), no traceback, at most one line on stderr of at most 500 characters, within a memory ceiling
and a timeout per mutant. Runs in a pool of forked workers (tests/fuzz/worker.py).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import pytest

from tests.conftest import MODELS
from tests.fuzz.harness import run_all
from tests.fuzz.mutants import FIXTURES, corpus, materialize

MEM_BYTES = 1 << 30     # address space a mutant's analysis may add (RLIMIT_AS) and its RSS growth
TIMEOUT_S = 30          # per mutant; clean ones take well under a second on a loaded 2-core machine
MAX_LINE = 500


def fixture_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(MODELS.rglob("*")):
        if path.is_file():
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def problems_of(name: str, result: dict) -> list[str]:
    """What is wrong with one mutant's run; empty when it answered like a tool."""
    found = []
    err = result["stderr"]
    if result["killed"]:
        found.append(f"killed: {result['killed']}")
    elif result["rc"] not in (0, 1, 2, 5):  # 5: a broken checkpoint (BROKEN), said on stdout
        found.append(f"exit {result['rc']}")
    if "Traceback" in err:
        found.append("traceback on stderr")
    lines = err.strip().splitlines()
    if len(lines) > 1:
        found.append(f"{len(lines)} lines on stderr")
    if any(len(line) > MAX_LINE for line in lines):
        found.append(f"a line of {max(map(len, lines))} characters")
    said = lines[0] if lines else ""
    if result["rc"] == 2 and not (said.startswith("day0: error:") and "(fix: " in said):
        found.append("exit 2 without 'day0: error: ... (fix: ...)'")
    if (result["rss_growth"] or 0) > MEM_BYTES:
        found.append(f"RSS grew by {result['rss_growth'] / 2**20:.0f} MiB")
    return [f"{name}: {p}: {err.strip()[-300:]!r}" for p in found]


def test_corpus_is_seeded_and_covers_every_kind():
    first, second = corpus(), corpus()
    assert [m.name for m in first] == [m.name for m in second]
    assert len(first) >= 300
    kinds = Counter(m.kind for m in first)
    assert set(kinds) == {"config", "json", "header", "index"} and min(kinds.values()) >= 40
    assert {m.fixture for m in first} == set(FIXTURES)


@pytest.mark.slow
def test_every_mutant_is_answered_like_a_tool(tmp_path):
    before = fixture_digest()
    mutants = corpus()
    jobs = [(m.name, materialize(m, tmp_path)) for m in mutants]
    assert fixture_digest() == before, "materializing a mutant changed a committed fixture"
    started = time.monotonic()
    results = run_all(jobs, warmup=[MODELS / f for f in FIXTURES], timeout_s=TIMEOUT_S,
                      mem_bytes=MEM_BYTES, workers=2)
    elapsed = time.monotonic() - started
    assert set(results) == {m.name for m in mutants}
    bad = [p for name, result in sorted(results.items()) for p in problems_of(name, result)]
    codes = Counter(r["rc"] for r in results.values())
    print(f"{len(mutants)} mutants in {elapsed:.0f} s: exit codes {dict(codes)}")
    assert not bad, f"{len(bad)} problems:\n" + "\n".join(bad[:40])
    assert codes[2] >= len(mutants) // 2  # most mutants are bad input; a no-op corpus fails here


def test_the_harness_catches_memory_timeouts_and_crashes(tmp_path):
    """The promises above are checked, not assumed: a child over its memory ceiling or its
    timeout is reported, and a clean run is not."""
    from tests.fuzz.harness import Worker

    clean = MODELS / "tiny-llama"
    # 100,000 bogus header entries: ~140 MiB of Python objects to report them
    (heavy,) = [m for m in corpus() if m.name.startswith("header/extra-100k@")]
    worker = Worker([clean])
    try:
        ok = worker.run(clean, TIMEOUT_S, MEM_BYTES)
        starved = worker.run(materialize(heavy, tmp_path), TIMEOUT_S, 16 << 20)
        slow = worker.run(clean, 0.001, MEM_BYTES)
    finally:
        worker.close()
    assert ok["rc"] == 0 and problems_of("clean", ok) == []
    assert starved["rc"] not in (0, 1, 2) and problems_of("starved", starved)
    assert slow["killed"] == "timeout" and problems_of("slow", slow)
