"""The evaluation stage's evidence and its metrics."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from day0.execution.contract import Row, StageResult


class FlipRow(Row):
    """An item right on one side and wrong on the other."""

    task: str = Field(description="lm-eval task.")
    doc_id: int = Field(description="lm-eval's doc_id.")
    direction: str = Field(description="'target worse' or 'target better'.")
    gold: str = Field(description="The expected answer (choice index or text).")
    reference_prediction: str = Field(description="The reference's answer.")
    target_prediction: str = Field(description="The target's answer.")
    prompt: str = Field(description="End of the prompt (at most 160 characters).")


class TaskRow(Row):
    """One task on both sides, with what reproduces it."""

    task: str = Field(description="lm-eval task name.")
    category: str = Field(description="Category its gates read (evaluation.<category>.*).")
    origin: str = Field(description="bundled, standard, business, include_path or lm-eval.")
    output_type: str = Field(description="lm-eval output type.")
    items: int = Field(description="Items evaluated on both sides.")
    version: float | str | None = Field(None, description="The task's version (lm-eval).")
    n_shot: int | None = Field(None, description="Few-shot examples per item.")
    config_hash: str = Field(description="sha256 of lm-eval's task config, 16 hex.")
    data_hash: str = Field(description="sha256 of the items' doc hashes, 16 hex.")
    reference_score: float = Field(description="Reference accuracy (the task's per-item metric).")
    target_score: float = Field(description="Target accuracy.")
    b: int = Field(description="Items the reference got right and the target wrong.")
    c: int = Field(description="Items the target got right and the reference wrong.")
    flipped: list[FlipRow] = Field(default_factory=list, description=(
        "Flipped items (the first flipped_listed; all are in the per-item JSONL)."))


class CategoryRow(Row):
    """A category: its tasks pooled (what the gates read)."""

    category: str = Field(description="Capability category, 'all' for every item.")
    tasks: list[str] = Field(description="Its tasks.")
    items: int = Field(description="Paired items.")
    reference_acc: float = Field(description="Reference accuracy.")
    target_acc: float = Field(description="Target accuracy.")
    drop: float = Field(description="reference_acc - target_acc.")
    b: int = Field(description="Reference right, target wrong.")
    c: int = Field(description="Target right, reference wrong.")
    reference_gold_logprob: float | None = Field(None, description=(
        "Multiple choice: mean log-probability of the right choice among the choices."))
    target_gold_logprob: float | None = Field(None, description="The target's.")


class Result(StageResult):
    """Evidence of the evaluation stage; metrics() gives the flat gate inputs, paired_items the
    per-item values of both sides that the paired gates test."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    target: str = Field(description="Target label.")
    reference: str = Field(description="Reference label.")
    target_model: str = Field(description=(
        "The lm-eval model of the target: 'day0' (in process) or 'local-completions' (engine)."))
    lm_eval_version: str = Field(description="lm-eval's version.")
    settings: dict = Field(default_factory=dict, description=(
        "n-shot, limit, seeds, batch size, max length, long-context tokens: what reproduces it."))
    reference_source: str = Field(description="'computed' or 'stored' (not recomputed).")
    reference_uri: str | None = Field(None, description="Where the reference results are kept.")
    tasks: list[TaskRow] = Field(default_factory=list, description="Per task.")
    categories: list[CategoryRow] = Field(default_factory=list, description="Per category.")
    paired_items: dict[str, dict] = Field(default_factory=dict, description=(
        "metric -> {kind, higher_is_better, ids, reference, target}: per-item values of both "
        "sides in the same order, for the paired gates."))
    items: dict[str, list[dict]] = Field(default_factory=dict, description=(
        "task -> per item: ids, gold, and each side's correctness, prediction and gold "
        "log-probability (kept as evaluation/<task>.jsonl next to report.json)."))
    nonfinite: int = Field(0, description="NaN/inf choice log-probabilities of the target.")
    inapplicable: dict[str, str] = Field(default_factory=dict, description=(
        "Metric prefix -> why its gates do not apply: a capability category with no task in "
        "this run's evaluation.tasks (its gates have nothing to judge)."))
    notes: list[str] = Field(default_factory=list, description="What limited the evaluation.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per part.")

    def metrics(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {"evaluation.nonfinite": float(self.nonfinite),
                                        "evaluation.flipped_worse": float(sum(
                                            t.b for t in self.tasks))}
        for row in self.categories:
            p = f"evaluation.{row.category}."
            out |= {p + "acc": row.target_acc, p + "acc_reference": row.reference_acc,
                    p + "acc_drop": row.drop, p + "items": float(row.items),
                    p + "gold_logprob": row.target_gold_logprob}
        return out
