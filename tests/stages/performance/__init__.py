"""Tests of the performance stage (device targets' kernel profile here; engine runs in
tests/engines/test_performance_engine.py)."""

from tests.conftest import ROOT


def performance_gates(result) -> dict:
    """The shipped gates on a performance Result's metrics, by id (performance gates only)."""
    from day0.verdict.gates import evaluate, load_gates

    judged = evaluate(load_gates(ROOT / "gates.yaml"), result.metrics(), is_moe=False,
                      inapplicable=result.inapplicable)
    return {g.id: g for g in judged if g.metric.startswith("performance.")}
