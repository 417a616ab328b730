"""Before any model loads: can the configured tasks carry the evaluation gates at all?"""

from __future__ import annotations

from day0.errors import Problem


def check_gates(config: dict, gates: list) -> list[Problem]:
    """Before the run: every paired gate on an evaluation metric must be able to detect its
    allowed drop with the items the configured tasks have (business rows are read and checked
    here too: a bad row is an input error before any model loads)."""
    from day0.verdict import statistics
    from day0.stages.evaluation.config import Config
    from day0.stages.evaluation.tasks import planned

    mine = [g for g in gates if g.paired and g.metric.startswith("evaluation.")]
    if not mine:
        return []
    sizes = planned(Config.model_validate(config))
    problems = []
    for gate in mine:
        category = gate.metric.split(".")[1]
        n = sizes.get(category)
        if not n or gate.paired.test != "mcnemar":
            continue  # unknown until the run (lm-eval tasks, bootstrap sd): judged then
        spec = gate.paired
        mde = statistics.mcnemar_mde(n, alpha=spec.alpha, power=spec.power,
                                      discordance=spec.discordance)
        if mde > spec.allowed_drop:
            need = statistics.mcnemar_items_needed(spec.allowed_drop, alpha=spec.alpha,
                                                    power=spec.power,
                                                    discordance=spec.discordance)
            problems.append(Problem(
                f"gate {gate.id}: {n} items of '{category}' cannot detect a drop of "
                f"{spec.allowed_drop:g} (MDE {mde:.3g} at alpha {spec.alpha:g}, power "
                f"{spec.power:g}, discordance {spec.discordance:g}); it needs {need} items",
                field=f"gate {gate.id}.paired.allowed_drop",
                fix=f"allow a drop of at least {mde:.3g}, or give the category {need} items"))
    return problems


def work(config: dict):
    """The standard tasks' items and the tokens their generative ones may generate (the bundled
    tasks are the default work its budget.yaml sizes): added to its time budget."""
    from day0.execution.contract import Work
    from day0.stages.evaluation import benchmarks
    from day0.stages.evaluation.config import Config
    from day0.stages.evaluation.tasks import standard_items

    parsed = Config.model_validate(config)
    items = tokens = 0
    for name in parsed.tasks:
        if name in benchmarks.standard_tasks():
            n = standard_items(name, parsed)
            items += n
            tokens += n * (benchmarks.generated_tokens(name) or 0)
    return Work(items=items, generated_tokens=tokens)
