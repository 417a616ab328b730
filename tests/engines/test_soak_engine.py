"""The soak stage on a real vLLM for CPU serving tiny-llama: a correct engine passes every soak
gate; faults injected through vLLM's own plugin mechanism (tests/fixtures/vllm_faults, on the
engine's PYTHONPATH) fail the gate of their kind; a SIGTERM mid-soak leaves a report with what
was measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from day0.execution.contract import StageInputs
from day0.verdict.gates import evaluate, load_gates
from day0.execution.stage import StageSpec, execute
from tests.conftest import ROOT
from tests.engines.conftest import TINY_LLAMA, engine_target

pytestmark = [pytest.mark.engine, pytest.mark.timing]
FAULTS = ROOT / "tests" / "fixtures" / "vllm_faults"


def soak(endpoint, target=None, **config):
    from day0.stages.soak.core import Result

    outcome = execute(StageSpec(stage="soak", config={"duration": "30s",
                                                      "sample_interval_s": 1.0, **config},
                                inputs=StageInputs(source=str(TINY_LLAMA),
                                                   target=target or engine_target(),
                                                   endpoint=endpoint)))
    assert outcome.ok, outcome.error
    return Result.model_validate(outcome.result)


def gates_of(result):
    judged = evaluate(load_gates(ROOT / "gates.yaml"), result.metrics(), is_moe=False,
                      inapplicable=result.inapplicable)
    return {g.id: g for g in judged if g.metric.startswith("soak.")}


@pytest.fixture(scope="module")
def faulty_engine(tmp_path_factory):
    """One engine for the fault tests: the plugin reads the fault in force from a file, so each
    test switches its own on (and off after) instead of starting an engine of its own (~40 s)."""
    from day0.engines.process import launched

    fault_file = tmp_path_factory.mktemp("vllm-fault") / "fault"
    fault_file.write_text("")
    target = engine_target(env={**engine_target().engine.env, "PYTHONPATH": str(FAULTS),
                                "DAY0_VLLM_FAULT_FILE": str(fault_file)})
    with launched(target.engine, TINY_LLAMA, "bfloat16", name="faults") as running:
        yield target, running.endpoint, fault_file


def soak_with_fault(faulty_engine, fault: str):
    target, endpoint, fault_file = faulty_engine
    fault_file.write_text(fault)
    try:
        return soak(endpoint, target, boundaries=False)
    finally:
        fault_file.write_text("")


def test_a_correct_engine_passes_every_soak_gate(tiny_llama_engine):
    result = soak(tiny_llama_engine)
    assert result.interrupted is None and result.elapsed_s >= 30
    assert len(result.windows) >= 3 and len(result.samples) >= 10
    judged = gates_of(result)
    assert all(g.passed for g in judged.values()), {g.id: g.reason for g in judged.values()
                                                     if not g.passed}
    above = next(b for b in result.boundaries if b.name == "one token above")
    assert 400 <= above.status < 500 and above.healthy_after
    assert [b.passed for b in result.boundaries] == [True] * 4
    assert result.probes and not any(p.changed for p in result.probes)


def test_an_engine_leaking_per_request_fails_the_leak_gates_with_their_interval(faulty_engine):
    result = soak_with_fault(faulty_engine, "leak:1048576")
    judged = gates_of(result)
    gate = judged["soak-memory-leak-per-request"]
    assert not gate.passed, gate.reason
    assert result.metrics()["soak.memory.rss_low_kib_per_request"] > 512  # ~1 MiB/request
    trend = result.rss_trend  # its interval, in MiB/hour
    assert trend.low_per_h > 4096 and trend.low_per_h <= trend.slope_per_h <= trend.high_per_h
    # 30 s is too short to judge a per-hour slope: not applicable, with the reason
    hourly = judged["soak-memory-leak-per-hour"]
    assert not hourly.applicable and "min_hourly_s" in hourly.reason


def test_an_engine_whose_outputs_turn_to_nan_fails_the_probe_gate(faulty_engine):
    result = soak_with_fault(faulty_engine, "nan_after:400")
    judged = gates_of(result)
    assert not judged["soak-probes-unchanged"].passed, judged["soak-probes-unchanged"].reason
    assert any(p.changed for p in result.probes)


def test_sigterm_mid_soak_leaves_a_report_with_the_data_so_far(prefect_server, tmp_path,
                                                               tiny_llama_engine):
    target = tmp_path / "attached.yaml"
    target.write_text(yaml.safe_dump({
        "name": "vllm-attached", "kind": "engine", "device": "cpu", "dtype": "bfloat16",
        "engine": {"base_url": tiny_llama_engine.base_url,
                   "served_name": tiny_llama_engine.served_name}}))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "day0.cli", "validate", str(TINY_LLAMA),
                             "--target-file", str(target), "--stages", "soak", "--duration",
                             "10h", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    try:
        deadline = time.monotonic() + 300
        windows = 0
        for line in proc.stdout:  # one progress line per finished window: wait for two
            lines.append(line)
            windows += "progress: soak" in line
            if windows >= 2 or time.monotonic() > deadline:
                break
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # never leave a 10-hour soak running
            proc.kill()
            proc.wait()
    # the run ends as Prefect ends a terminated one (Crashed, the signal re-sent) after the
    # report was written; day0 exits 143 through a normal shutdown (its temporary server stops:
    # otherwise it would hold this pipe open and communicate() would not return)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines[-20:]) + rest[-3000:]
    assert "SIGTERM: stopping the running stages" in rest
    report = json.loads((out / "report.json").read_text())
    soak_ = report["evidence"]["soak"]
    assert soak_["interrupted"].startswith("SIGTERM") and len(soak_["windows"]) >= 2
    assert soak_["planned_s"] == 36000 and soak_["samples"]
    failed = {g["id"] for g in report["gates"] if not g["passed"]}
    assert "soak-completed" in failed
    assert "interrupted" in (out / "report.md").read_text()
