"""One side's lm-eval run and its per-item records (what both sides are paired on)."""

from __future__ import annotations

import hashlib
import json
import math

from day0.stages.evaluation.config import Config


def evaluate(lm, task_names: list[str], manager, config: Config) -> dict:
    """lm-eval's simple_evaluate with per-item samples, the same seeds on every side."""
    from lm_eval import simple_evaluate

    warm()
    return simple_evaluate(
        model=lm, tasks=task_names, task_manager=manager, num_fewshot=config.num_fewshot,
        limit=config.limit, log_samples=True, bootstrap_iters=0, cache_requests=False,
        random_seed=config.seed, numpy_random_seed=config.seed, torch_random_seed=config.seed,
        fewshot_random_seed=config.seed, verbosity="WARNING")


def warm() -> None:
    """What every side pays once per process: lm-eval's templates compiled once, its
    environment report taken once (the warm stage host calls this before it forks: each forked
    evaluation inherits both)."""
    _compile_templates_once()
    _env_info_once()


def _env_info_once() -> None:
    """lm-eval adds an environment report to every results dict (torch's collect_env: about 20
    subprocesses, 0.5 s a side): it describes the process, not the run, so it is taken once per
    working directory (its upper_git_hash reads the parent folder) and copied into each."""
    import os

    from lm_eval import evaluator

    if getattr(evaluator.add_env_info, "day0_once", False):
        return
    add_env_info, taken = evaluator.add_env_info, {}

    def once(storage: dict) -> None:
        cwd = os.getcwd()
        if cwd not in taken:
            taken[cwd] = {}
            add_env_info(taken[cwd])
        storage.update(taken[cwd])

    once.day0_once = True
    evaluator.add_env_info = once
    once({})


def _compile_templates_once() -> None:
    """lm-eval compiles a task's Jinja template again for every document and field
    (utils.apply_template: Environment.from_string, ~0.35 ms each, 4,300 times a side for the
    bundled tasks, a third of a small model's evaluation): the same environment, each template
    string compiled once. Rendering, and so every prompt, is unchanged."""
    from functools import lru_cache

    from lm_eval import utils

    if getattr(utils.apply_template, "day0_compiled_once", False):
        return
    compiled = lru_cache(maxsize=1024)(utils.env.from_string)

    def apply_template(template: str, doc: dict) -> str:
        return compiled(template).render(**doc)

    apply_template.day0_compiled_once = True
    utils.apply_template = apply_template


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if not math.isfinite(top):
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def item(sample: dict, output_type: str) -> dict:
    """What is kept of one lm-eval sample: ids, correctness, the gold choice's log-probability
    among the choices (multiple choice), the prediction."""
    metric = "acc" if "acc" in sample else next(
        (m for m in sample.get("metrics", []) if m in sample), None)
    record = {"doc_id": int(sample["doc_id"]), "doc_hash": sample.get("doc_hash"),
              "metric": metric,
              # None: lm-eval scored nothing (`bypass`: a code task, scored by codeexec)
              "correct": float(sample[metric]) if metric and sample[metric] is not None
              else None,
              "target": str(sample.get("target"))}
    args = sample.get("arguments") or []
    record["prompt"] = str(args[0][0])[-200:] if args and isinstance(args[0], (list, tuple)) \
        else ""
    resps = sample.get("filtered_resps") or []
    if output_type == "multiple_choice":
        lls = [float(r[0]) for r in resps]
        record["choice_logprobs"] = lls
        record["nonfinite"] = sum(not math.isfinite(v) for v in lls)
        gold = sample.get("target")
        gold = int(gold) if isinstance(gold, int) or str(gold).isdigit() else None
        finite = record["nonfinite"] == 0 and lls
        record["prediction"] = max(range(len(lls)), key=lls.__getitem__) if finite else None
        record["gold_logprob"] = (lls[gold] - _logsumexp(lls)) if finite and gold is not None \
            and gold < len(lls) else None
    else:
        text = resps[0] if resps else ""
        record["prediction"] = text if isinstance(text, str) else json.dumps(text)
        record["nonfinite"] = 0
        record["gold_logprob"] = None
    return record


def side_records(results: dict) -> dict:
    """Per task: its items (in doc order) and lm-eval's provenance (version, n-shot, config
    hash); JSON-ready, as the reference store keeps it."""
    out: dict[str, dict] = {}
    configs = results.get("configs", {})
    for task, samples in (results.get("samples") or {}).items():
        cfg = configs.get(task, {})
        output_type = cfg.get("output_type", "")
        # a task with several filters (gsm8k_cot: strict-match, flexible-extract) has a sample
        # per doc and filter: its first filter (lm-eval's order, the task's primary) is judged
        first = samples[0].get("filter") if samples else None
        items = sorted((item(s, output_type) for s in samples if s.get("filter") == first),
                       key=lambda r: r["doc_id"])
        out[task] = {
            "items": items, "output_type": output_type, "filter": first,
            "version": (results.get("versions") or {}).get(task),
            "n_shot": (results.get("n-shot") or {}).get(task),
            "config_hash": hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str)
                                          .encode()).hexdigest()[:16],
            "data_hash": hashlib.sha256("".join(str(r["doc_hash"]) for r in items)
                                        .encode()).hexdigest()[:16]}
    return out
