"""Write day0's bundled lm-eval tasks (evaluation stage) into day0/stages/evaluation/data/.

Deterministic (fixed seeds, sorted inputs, stdlib only): rerunning gives byte-identical files.
One small multiple-choice task per capability category (4 choices, answer = index):

  day0_knowledge  cloze of Python-documentation sentences (tests/fixtures/text/train.txt)
  day0_code       completion of Python doctest lines seen in the same documentation
  day0_math       the same cloze on sentences about numbers and arithmetic (no computation)
  day0_agent      multi-turn tool-calling conversations: pick the tool call the last turn asks for
  day0_long_context  generated at run time by day0/stages/evaluation/long_context.py (YAML only)

Distractors are word-/token-order corruptions of the true answer: the repo's tiny fixture models
(trained on CPython docstrings, 256 tokens of context) learnt local word order but cannot copy
from their context nor compute, so distractors drawn from other sentences or numbers left them
at chance. Easy for real models, but every item still flips when a model's stack breaks. Usage:

    python scripts/make_eval_tasks.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "text" / "train.txt"
EVAL_TEXT = ROOT / "day0" / "data" / "eval_text.txt"
DEFAULT_OUT = ROOT / "day0" / "stages" / "evaluation" / "data"
SEED = 20240601
N_ITEMS = 120
MAX_PROMPT_CHARS = 380  # agent prompts: ~190 tokens of the fixtures' BPE (~2 chars a token)
FILLER_CHARS = 48_000

DESCRIPTIONS = {
    "knowledge": "Documentation-language cloze: a passage of Python's documentation and the start "
                 "of its next sentence; pick the true next four words among word-order scrambles "
                 "of them. Measures fluency in the domain's written language (easy for real "
                 "models; the tiny fixtures learnt word order from these docstrings).",
    "code": "Doctest completion: documentation lines and the start of a '>>>' line; pick its true "
            "rest among minimal pairs with two code tokens swapped (syntax / API-usage sense).",
    "math": "Mathematical-language cloze: like knowledge, restricted to documentation sentences "
            "about numbers and arithmetic (fractions, rounding, roots, statistics, ...). Not "
            "computation: the fixtures cannot compute, and number tasks stayed at chance.",
    "agent": "Multi-turn tool calling (User/Assistant turns, JSON tool calls): pick the call the "
             "last user turn asks for among malformed versions of it (two JSON tokens swapped) "
             "and, in every other item, the same tool called with the conversation's other "
             "argument.",
    "long_context": "Passkey retrieval: key/value facts hidden at varied depths in filler text up "
                    "to ~95% of the model's context; pick the asked key's value among the other "
                    "keys' values, which are in the context too. Needs copying from context.",
}


# --------------------------------------------------------------------------------------------
# corpus helpers

def paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def sentences(paragraph: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", paragraph) if s]


def words_ok(words: list[str]) -> bool:
    return all(w.isascii() and w.isprintable() for w in words)


# --------------------------------------------------------------------------------------------
# distractors: word-order / token-order corruptions of the true answer (the fixtures know local
# word order of documentation English and Python, not facts: see the module docstring)

def scrambles(rng: random.Random, parts: list[str], joiner: str, n: int = 3) -> list[str] | None:
    """n distinct re-orderings of parts, all different from the original (None if impossible)."""
    original, outs = joiner.join(parts), []
    for _ in range(200):
        x = parts[:]
        rng.shuffle(x)
        s = joiner.join(x)
        if s != original and s not in outs:
            outs.append(s)
            if len(outs) == n:
                return outs
    return None


def swaps(rng: random.Random, toks: list[str], n: int = 3) -> list[str] | None:
    """n distinct versions of toks with two non-space tokens swapped (minimal pairs)."""
    original, outs = "".join(toks), []
    idx = [i for i, t in enumerate(toks) if not t.isspace()]
    for _ in range(200):
        i, j = sorted(rng.sample(idx, 2))
        x = toks[:]
        x[i], x[j] = x[j], x[i]
        s = "".join(x)
        if s != original and s not in outs:
            outs.append(s)
            if len(outs) == n:
                return outs
    return None


def mc(rng: random.Random, question: str, correct: str, others: list[str]) -> dict:
    choices = [correct, *others]
    rng.shuffle(choices)
    return {"question": question, "choices": choices, "answer": choices.index(correct)}


TOKEN = re.compile(r"\w+|[^\w\s]|\s+")

# --------------------------------------------------------------------------------------------
# knowledge / math: cloze of documentation sentences

MATH_WORDS = re.compile(r"\b(integer|integers|floating[- ]point|sum|product|square|root|"
                        r"fraction|fractions|divisor|exponent|logarithm|modulo|remainder|"
                        r"rounded|rounding|infinity|precision|median|variance|arithmetic|"
                        r"quotient|numerator|denominator|multiplication|division|addition|"
                        r"subtraction|digits|absolute value|radians|degrees|mean|number|"
                        r"numbers|float|zero|negative|positive)\b", re.I)


def cloze_candidates(math_only: bool) -> list[tuple[str, list[str]]]:
    out = []
    for p in paragraphs(CORPUS.read_text(encoding="utf-8")):
        sents = sentences(p)
        for i in range(1, len(sents)):
            words = sents[i].split()
            ctx = " ".join(sents[:i])
            if not (8 <= len(words) <= 22 and words_ok(words) and 60 <= len(ctx) <= 240):
                continue
            if bool(MATH_WORDS.search(sents[i])) != math_only:
                continue
            out.append((ctx, words))
    return out


def cloze(rng: random.Random, math_only: bool) -> list[dict]:
    cands = cloze_candidates(math_only)
    rng.shuffle(cands)
    items = []
    for ctx, words in cands:
        cut = len(words) // 2
        rest = words[cut:cut + 4]
        others = scrambles(rng, rest, " ")
        if others is None:
            continue
        items.append(mc(rng, f"{ctx} {' '.join(words[:cut])}", " ".join(rest), others))
        if len(items) == N_ITEMS:
            break
    return items


def knowledge(rng: random.Random) -> list[dict]:
    return cloze(rng, math_only=False)


def math(rng: random.Random) -> list[dict]:
    return cloze(rng, math_only=True)


# --------------------------------------------------------------------------------------------
# code: doctest line completion

def code(rng: random.Random) -> list[dict]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    cands = []
    for i, line in enumerate(lines):
        s = line.strip()
        if not s.startswith(">>> ") or not s.isascii() or not 14 <= len(s) <= 60:
            continue
        ctx = "\n".join(x.rstrip() for x in lines[max(0, i - 4):i] if x.strip())[-200:]
        toks = TOKEN.findall(s[4:])
        spaces = [i for i, t in enumerate(toks) if t.isspace()]
        if not spaces:
            continue
        # cut at a space (lm-eval puts the " " between question and choice)
        cut = min(spaces, key=lambda i: (abs(i - len(toks) / 3), i))
        cands.append((f"{ctx}\n>>> {''.join(toks[:cut])}".lstrip("\n"), toks[cut + 1:]))
    rng.shuffle(cands)
    items, seen = [], set()
    for question, rest in cands:
        others = swaps(rng, rest) if sum(not t.isspace() for t in rest) >= 3 else None
        if others is None or question in seen:
            continue
        seen.add(question)
        items.append(mc(rng, question, "".join(rest), others))
        if len(items) == N_ITEMS:
            break
    return items


# --------------------------------------------------------------------------------------------
# agent: multi-turn tool calling

TOOLS = {
    "get_weather": ("city", ["Paris", "Berlin", "Madrid", "Oslo", "Lima", "Cairo", "Tokyo",
                             "Austin", "Dublin", "Quito"]),
    "read_file": ("path", ["setup.py", "README.md", "data.csv", "config.ini", "main.py",
                           "notes.txt", "index.html", "test_io.py"]),
    "search_docs": ("query", ["asyncio", "pathlib", "decimal", "codecs", "logging", "heapq",
                              "bisect", "struct", "zipfile", "shlex"]),
    "send_email": ("to", ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]),
}
ASK = {
    "get_weather": "What is the weather in {v}?",
    "read_file": "Show me the file {v}.",
    "search_docs": "Find the docs for {v}.",
    "send_email": "Send the report to {v}.",
}


def call(tool: str, value: str) -> str:
    return json.dumps({"tool": tool, TOOLS[tool][0]: value})


def agent(rng: random.Random) -> list[dict]:
    """Correct call vs. malformed versions of it (two JSON tokens swapped) and, in every other
    item, a valid call with the other argument of the same tool used in the conversation."""
    items = []
    names = sorted(TOOLS)
    for k in range(N_ITEMS):
        tool = rng.choice(names)
        values = rng.sample(TOOLS[tool][1], 2)
        other = rng.choice([n for n in names if n != tool])
        turns = [(tool, v) for v in values]
        if rng.random() < 0.5:  # sometimes a call of another tool in between (prompt budget)
            turns.append((other, rng.choice(TOOLS[other][1][:4])))
        rng.shuffle(turns)
        convo = [f"Tools: {', '.join(names)}."]
        for t, v in turns:
            convo.append(f"User: {ASK[t].format(v=v)}\nAssistant: {call(t, v)}")
        asked = rng.choice(values)
        convo.append(f"User: {ASK[tool].format(v=asked)}\nAssistant:")
        correct = call(tool, asked)
        if len("\n".join(convo)) > MAX_PROMPT_CHARS and len(turns) == 3:  # fit 256 tokens
            convo = [c for c in convo if other not in c]
        if len("\n".join(convo)) > MAX_PROMPT_CHARS - 60:
            convo = convo[1:]  # without the tool list line
        wrong = call(tool, values[1 - values.index(asked)])
        # every other item: argument choice (a valid call with the other argument) + format;
        # the rest: format only (three malformed versions of the correct call)
        others = ([wrong, *swaps(rng, TOKEN.findall(correct), 2)] if k % 2 == 0
                  else swaps(rng, TOKEN.findall(correct), 3))
        items.append(mc(rng, "\n".join(convo), correct, others))
    return items


# --------------------------------------------------------------------------------------------
# output

YAML = """\
task: day0_{name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: day0_{name}.jsonl
test_split: test
output_type: multiple_choice
description: ""
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
metadata:
  version: 1.0
  category: {name}
  measures: "{measures}"
"""

BUILDERS = {"knowledge": knowledge, "code": code, "math": math, "agent": agent}


def filler_text() -> str:
    """Plain English filler for long-context items: eval_text.txt paragraphs (no digits)."""
    paras = [p for p in paragraphs(EVAL_TEXT.read_text(encoding="utf-8"))
             if not any(ch.isdigit() for ch in p)]
    out, total = [], 0
    for p in paras:
        if total + len(p) + 2 > FILLER_CHARS:
            break
        out.append(p)
        total += len(p) + 2
    return "\n\n".join(out) + "\n"


def write(out: Path) -> list[Path]:
    tasks = out / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    written = []
    for i, (name, build) in enumerate(BUILDERS.items()):
        rng = random.Random(SEED + i)
        rows = build(rng)
        assert len(rows) == N_ITEMS and all(len(r["question"]) <= 600 for r in rows), name
        jsonl = tasks / f"day0_{name}.jsonl"
        with jsonl.open("w", encoding="utf-8", newline="\n") as f:
            for j, row in enumerate(rows):
                rec = {"id": f"{name}-{j:03d}", "category": name, **row}
                f.write(json.dumps(rec, ensure_ascii=True, sort_keys=False) + "\n")
        written.append(jsonl)
    for name in [*BUILDERS, "long_context"]:
        yaml = tasks / f"day0_{name}.yaml"
        yaml.write_text(YAML.format(name=name, measures=DESCRIPTIONS[name]), encoding="utf-8",
                        newline="\n")
        written.append(yaml)
    filler = out / "long_context_filler.txt"
    filler.write_text(filler_text(), encoding="utf-8", newline="\n")
    written.append(filler)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="output folder (default: %(default)s)")
    args = ap.parse_args(argv)
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
