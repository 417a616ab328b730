"""The evaluation stage's core: the same lm-eval tasks on the reference and on the target,
paired item by item (see the package docstring)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from day0.checkpoint.configview import trained_context
from day0.store import identity
from day0.execution import progress
from day0.checkpoint.files import read_config_dict
from day0.execution.contract import Laps, StageInputs
from day0.engines.process import max_model_len
from day0.errors import ConfigError, Day0Error, StageError, TargetFault, did_you_mean
from day0.store.sources import local_checkpoint
from day0.stages.evaluation import refstore, sides, tasks as tasking
from day0.stages.evaluation.config import Config
from day0.stages.evaluation.result import CategoryRow, FlipRow, Result, TaskRow
from day0.torchkit.evaltext import load_tokenizer

# lm-eval must never reach for a hub: datasets come from local files or the datasets cache
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
RESERVED_TOKENS = 8  # the answer tokens (and the engine's one generated token) must still fit


def run(config: Config, inputs: StageInputs) -> Result:
    os.environ.update(OFFLINE)  # before datasets is imported: it reads them once
    import lm_eval
    from lm_eval.tasks import TaskManager

    laps = Laps()
    lap = laps.lap

    target, reference = inputs.target, inputs.reference
    if target.kind == "engine" and (inputs.endpoint is None or target.engine is None):
        raise ConfigError("an engine target needs its endpoint", field="target.engine",
                          fix="run it through the flow (it attaches or launches the engine)")
    progress.plan({"sides": 2})
    source = local_checkpoint(inputs.source, log=print)
    notes: list[str] = []
    max_length, long_tokens = _context_lengths(config, target, source, notes)
    batch = config.batch_size or max(1, min(64, config.batch_tokens // max(long_tokens, 256)))
    config = config.model_copy(update={"batch_size": batch})
    tokenizer = load_tokenizer(source, inputs.trust_remote_code)
    version = lm_eval.__version__
    weights = identity.weights_key(inputs.source)

    with tempfile.TemporaryDirectory(prefix="day0-eval-") as tmp:
        run_tasks = tasking.prepare(config, Path(tmp), tokenizer=tokenizer,
                                    long_context_tokens=long_tokens, lm_eval_version=version)
        _check_generation_fits(config.tasks, max_length)
        external = any(t.origin == "lm-eval" for t in run_tasks)
        include = [tmp] + ([config.include_path] if config.include_path else [])
        manager = TaskManager(include_path=include, include_defaults=external)
        names = [t.name for t in run_tasks]
        _check_known(names, manager)
        lap("tasks")

        key = refstore.key(weights=weights, tasks=run_tasks, reference=reference, config=config,
                           lm_eval_version=version, long_context_tokens=long_tokens)
        where = refstore.location(config, inputs.source, inputs.revision, reference, weights)
        ref_records, ref_source = _reference_side(config, inputs, source, max_length, names,
                                                  manager, where, key, version, notes)
        lap("reference")

        progress.update("sides", 1, 2, detail=f"target {target.label}")
        tgt_records = _target_side(config, inputs, source, max_length, names, manager)
        progress.update("sides", 2, 2, detail="target done")
        lap("target")

    task_rows, items, categories, paired = _pair_sides(run_tasks, ref_records, tgt_records,
                                                       config.flipped_listed)
    lap("pairing")
    chosen = {t.category for t in run_tasks}
    inapplicable = {f"evaluation.{c}": f"no task of category '{c}' in this run's "
                    f"evaluation.tasks ({', '.join(config.tasks)})"
                    for c in sorted(tasking.known_categories() - chosen)}
    return Result(
        target=target.label, reference=reference.label,
        target_model="local-completions" if target.kind == "engine" else "day0",
        lm_eval_version=version,
        settings={"num_fewshot": config.num_fewshot, "limit": config.limit,
                  "seeds": {"random": config.seed, "numpy": config.seed,
                            "torch": config.seed, "fewshot": config.seed},
                  "batch_size": config.batch_size, "max_length": max_length,
                  "long_context_tokens": long_tokens, "reference_key": key,
                  **({"concurrency": config.concurrency} if target.kind == "engine" else {})},
        reference_source=ref_source, reference_uri=f"{where}{key}.json", tasks=task_rows,
        categories=categories, paired_items=paired, items=items,
        nonfinite=sum(t.get("nonfinite", 0) for rec in tgt_records.values()
                      for t in rec["items"]),
        inapplicable=inapplicable, notes=notes, timings=laps.timings)


def _context_lengths(config: Config, target, source: str, notes: list[str]) -> tuple[int, int]:
    """(max_length: the trained context, or the engine's when shorter; the tokens a
    long-context prompt may have)."""
    trained = int(trained_context(read_config_dict(source)) or 2048)
    max_length = trained
    if target.kind == "engine":
        max_length = min(max_length, max_model_len(target.engine, source))
    long_tokens = min(config.long_context_max_tokens, max_length) - RESERVED_TOKENS
    if config.long_context_max_tokens < max_length:
        notes.append(f"long-context prompts capped at {config.long_context_max_tokens} tokens "
                     f"(long_context_max_tokens) of the model's {max_length}")
    return max_length, long_tokens


def _reference_side(config: Config, inputs: StageInputs, source: str, max_length: int,
                    names: list[str], manager, where: str, key: str, version: str,
                    notes: list[str]) -> tuple[dict, str]:
    """(the reference's records, "stored" or "computed"): read from the reference store, or
    evaluated here in process and stored for the next target."""
    stored = None if config.reference == "run" else refstore.load(where, key, notes)
    if stored is None and config.reference == "stored":
        raise ConfigError(f"no stored reference results at {where}{key}.json",
                          field="reference", fix="use reference: auto (compute and store)")
    if stored is not None:
        from day0.store.seal import keyed_by

        print(f"evaluation: reference results read from {where}{key}.json (not recomputed; "
              f"seal verified with {keyed_by()})")
        progress.update("sides", 1, 2, detail="reference read from the store")
        return stored["tasks"], "stored"
    progress.update("sides", 0, 2, detail="reference (lm-eval, in process)")
    from day0.stages.evaluation.lmodels import torch_side

    lm = torch_side(source, inputs.reference, batch_size=config.batch_size,
                    max_length=max_length, trust_remote_code=inputs.trust_remote_code,
                    share_from=refstore.shared_from(config), fit_to_budget=config.fit_to_budget)
    records = _evaluate(lm, names, manager, config)
    del lm  # freed before the store is written
    try:
        refstore.save(where, key, {"tasks": records, "lm_eval": version})
    except Exception as exc:  # the run's verdict never depends on the store
        notes.append(f"reference results not stored at {where}: {exc}")
    progress.update("sides", 1, 2, detail="reference done")
    return records, "computed"


def _pair_sides(run_tasks, ref_records: dict, tgt_records: dict, listed: int) -> tuple:
    """(task rows, items per task, category rows, paired items): both sides item by item."""
    task_rows, items, per_task = [], {}, {}
    for task in run_tasks:
        ref, tgt = ref_records.get(task.name), tgt_records.get(task.name)
        if ref is None or tgt is None:
            raise StageError(f"task {task.name}: lm-eval returned no samples for the "
                             f"{'reference' if ref is None else 'target'}")
        pairs = _pairs(task.name, ref["items"], tgt["items"])
        per_task[task.name] = pairs
        items[task.name] = [_item_row(r, t) for r, t in pairs]
        task_rows.append(_task_row(task, ref, tgt, pairs, listed))
    categories, paired = _categories(run_tasks, per_task)
    return task_rows, items, categories, paired


def _check_generation_fits(names: list[str], max_length: int) -> None:
    """A generative standard task's answer must fit the context (lm-eval asserts it midway)."""
    from day0.stages.evaluation import benchmarks

    for name in names:
        standard = name in benchmarks.standard_tasks()
        tokens = benchmarks.generated_tokens(name) if standard else None
        if tokens and tokens >= max_length:
            raise ConfigError(f"task {name} generates up to {tokens} tokens, as many as "
                              f"this model's context of {max_length} or more",
                              field="evaluation.tasks",
                              fix=f"drop {name} for this model (its answers need a "
                                  f"context over {tokens} tokens)")


def _check_known(names: list[str], manager) -> None:
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            raise ConfigError(f"unknown lm-eval task '{name}'", field="tasks",
                              fix=did_you_mean(name, sorted(known)).strip()
                              or "name a bundled task, one in include_path or lm-eval's")


def _evaluate(lm, names: list[str], manager, config: Config) -> dict:
    """sides.evaluate with lm-eval's offline failures said as what to do."""
    try:
        records = sides.side_records(sides.evaluate(lm, names, manager, config))
    except ConnectionError as exc:  # datasets: not in the local cache, and no hub
        raise ConfigError(f"a task's dataset is not available offline ({exc})", field="tasks",
                          fix="pre-populate the datasets cache (docs/evaluation.md) or "
                              "use day0's bundled tasks") from None
    from day0.stages.evaluation import benchmarks, codeexec

    data_dir = benchmarks.data_dir(config.benchmarks_dir)
    codeexec.score_records(records, data_dir, config.sandbox_limits, config.sandbox)
    return records


def _target_side(config: Config, inputs: StageInputs, source: str, max_length: int,
                 names: list[str], manager) -> dict:
    """The target's records; an in-process target whose forward raises is a finding about the
    target (FAIL), like alignment's; an engine's failures stay errors of the stage."""
    target = inputs.target
    if target.kind == "engine":
        return _evaluate(_target_model(config, inputs, source, max_length), names, manager,
                         config)
    lm = _target_model(config, inputs, source, max_length)
    try:
        return _evaluate(lm, names, manager, config)
    except Day0Error:
        raise
    except Exception as exc:
        raise TargetFault(f"target forward raised {type(exc).__name__}: {exc}",
                          field="target.plugins" if target.plugins else "target",
                          fix="fix the target's kernels/plugins (lm-eval's batched forward)"
                          ) from exc


def _target_model(config: Config, inputs: StageInputs, source: str, max_length: int):
    from day0.stages.evaluation import benchmarks, lmodels

    target = inputs.target
    if target.kind == "engine":
        # a task that names no max_gen_toks (gsm8k_cot, mbpp) gets lm-eval's default, as the
        # in-process reference does (business tasks carry config.max_gen_toks in their YAML)
        return lmodels.engine_side(source, inputs.endpoint, target, max_length=max_length,
                                   concurrency=config.concurrency,
                                   max_gen_toks=benchmarks.LM_EVAL_GEN_TOKS)
    return lmodels.torch_side(source, target, batch_size=config.batch_size,
                              max_length=max_length, trust_remote_code=inputs.trust_remote_code,
                              share_from=refstore.shared_from(config),
                              fit_to_budget=config.fit_to_budget)


def _pairs(task: str, ref: list[dict], tgt: list[dict]) -> list[tuple[dict, dict]]:
    """Items of both sides by doc_id; the same items, or a StageError (e.g. stored reference
    results of other data)."""
    by_id = {r["doc_id"]: r for r in tgt}
    if len(by_id) != len(ref) or any(r["doc_id"] not in by_id for r in ref):
        raise StageError(f"task {task}: reference and target evaluated different items "
                         f"({len(ref)} vs {len(tgt)})")
    pairs = [(r, by_id[r["doc_id"]]) for r in ref]
    differ = [r["doc_id"] for r, t in pairs if r.get("doc_hash") != t.get("doc_hash")]
    if differ:
        raise StageError(f"task {task}: items differ between reference and target (doc "
                         f"{differ[0]}); stored reference results of other data? rerun with "
                         "reference: run")
    return pairs


def _item_row(r: dict, t: dict) -> dict:
    side = ("correct", "prediction", "gold_logprob", "choice_logprobs", "status")
    return {"doc_id": r["doc_id"], "doc_hash": r.get("doc_hash"), "gold": r.get("target"),
            "metric": r.get("metric"), "prompt": r.get("prompt", ""),
            "reference": {k: r.get(k) for k in side}, "target": {k: t.get(k) for k in side}}


def _task_row(task, ref: dict, tgt: dict, pairs, listed: int) -> TaskRow:
    n = len(pairs)
    b = sum(1 for r, t in pairs if r["correct"] and not t["correct"])
    c = sum(1 for r, t in pairs if t["correct"] and not r["correct"])
    flips = [FlipRow(task=task.name, doc_id=r["doc_id"],
                     direction="target worse" if r["correct"] else "target better",
                     gold=str(r.get("target")), reference_prediction=str(r.get("prediction")),
                     target_prediction=str(t.get("prediction")),
                     prompt=str(r.get("prompt", ""))[-160:])
             for r, t in pairs if bool(r["correct"]) != bool(t["correct"])]
    flips.sort(key=lambda f: f.direction != "target worse")
    return TaskRow(task=task.name, category=task.category, origin=task.origin,
                   output_type=ref.get("output_type", ""), items=n, version=tgt.get("version"),
                   n_shot=tgt.get("n_shot"), config_hash=tgt["config_hash"],
                   data_hash=tgt["data_hash"],
                   reference_score=sum(float(r["correct"] or 0) for r, _ in pairs) / max(n, 1),
                   target_score=sum(float(t["correct"] or 0) for _, t in pairs) / max(n, 1),
                   b=b, c=c, flipped=flips[:listed])


def _categories(run_tasks, per_task: dict) -> tuple[list[CategoryRow], dict[str, dict]]:
    groups: dict[str, list[str]] = {}
    for task in run_tasks:
        groups.setdefault(task.category, []).append(task.name)
    groups["all"] = [t.name for t in run_tasks]
    rows, paired = [], {}
    for category, names in groups.items():
        pairs = [(name, r, t) for name in names for r, t in per_task[name]]
        if not pairs:
            continue
        ids = [f"{name}:{r['doc_id']}" for name, r, _ in pairs]
        ref = [float(r["correct"] or 0) for _, r, _ in pairs]
        tgt = [float(t["correct"] or 0) for _, _, t in pairs]
        p = f"evaluation.{category}."
        paired[p + "acc"] = {"kind": "binary", "higher_is_better": True, "ids": ids,
                             "reference": ref, "target": tgt}
        scored = [(i, r["gold_logprob"], t["gold_logprob"]) for i, (_, r, t) in zip(ids, pairs)
                  if r.get("gold_logprob") is not None and t.get("gold_logprob") is not None]
        if scored:
            paired[p + "gold_logprob"] = {
                "kind": "continuous", "higher_is_better": True, "ids": [s[0] for s in scored],
                "reference": [s[1] for s in scored], "target": [s[2] for s in scored]}
        n = len(pairs)
        rows.append(CategoryRow(
            category=category, tasks=names, items=n, reference_acc=sum(ref) / n,
            target_acc=sum(tgt) / n, drop=(sum(ref) - sum(tgt)) / n,
            b=sum(1 for r, t in zip(ref, tgt) if r > t), c=sum(1 for r, t in zip(ref, tgt) if t > r),
            reference_gold_logprob=(sum(s[1] for s in scored) / len(scored)) if scored else None,
            target_gold_logprob=(sum(s[2] for s in scored) / len(scored)) if scored else None))
    return rows, paired


__all__ = ["Config", "Result", "run"]
