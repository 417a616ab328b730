"""`day0 validate --target vllm-cpu-bf16` end to end on a real vLLM for CPU: a correct engine
PASSes with smoke, alignment, chat and serving-feature gates; the negative controls (a copy of the
fixture served under the same name with a conversion bug) FAIL on the right evidence; a killed
engine, or one that never starts, is ERROR; no engine process is left behind; attach mode gives
launch mode's metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.engines.conftest import TINY_LLAMA, engine_pids, engine_target
from tests.engines import faults

pytestmark = [pytest.mark.engine, pytest.mark.integration, pytest.mark.slow]
API_STAGES = "smoke,api_alignment,chat"


def day0(*args, prefect_server, timeout=1200):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    proc = subprocess.run([sys.executable, "-m", "day0.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    # day0's own lines: an engine's log (streamed into the run's log) may hold its tracebacks
    own = [line for line in proc.stderr.splitlines() if "[engine " not in line]
    assert not any("Traceback" in line for line in own), proc.stderr[-3000:]
    return proc


def attach_target(tmp_path, endpoint, name="vllm-attached") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "kind": "engine", "device": "cpu", "dtype": "bfloat16",
        "engine": {"base_url": endpoint.base_url, "served_name": endpoint.served_name,
                   "max_model_len": 256}}))
    return str(path)


def failing(report) -> set[str]:
    return {g["id"] for g in report["gates"] if not g["passed"] and g["severity"] == "error"}


def metrics_of(report, *prefixes) -> dict[str, float]:
    return {g["metric"]: g["observed"] for g in report["gates"]
            if g["observed"] is not None and g["metric"].startswith(prefixes)}


@pytest.fixture(scope="module")
def launched_report(prefect_server, tmp_path_factory):
    """The built-in target end to end: day0 launches the plain engine and each variant."""
    out = tmp_path_factory.mktemp("vllm-launch")
    before = engine_pids()
    started = time.monotonic()
    proc = day0("validate", TINY_LLAMA, "--target", "vllm-cpu-bf16", "--out", out,
                "--duration", "20s", prefect_server=prefect_server)
    seconds = time.monotonic() - started
    left = engine_pids() - before
    return proc, json.loads((out / "report.json").read_text()), left, seconds


def test_the_builtin_vllm_target_passes_with_every_engine_gate(launched_report):
    proc, report, left, seconds = launched_report
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "verdict: PASS" in proc.stdout
    assert not left, f"engine processes left behind: {left}"
    applicable = {g["metric"].split(".")[0] for g in report["gates"] if g["applicable"]}
    assert {"smoke", "api_alignment", "chat", "serving", "evaluation", "performance",
            "soak"} <= applicable
    assert report["evidence"]["soak"]["planned_s"] == 20 and report["evidence"]["soak"]["windows"]
    assert [r["run"] for r in report["evidence"]["performance"]["runs"]][0] == "short_qa-c1"
    assert report["evidence"]["evaluation"]["target_model"] == "local-completions"
    not_here = [g for g in report["gates"] if g["metric"].startswith(("alignment.", "scan."))]
    assert not_here and all(not g["applicable"] for g in not_here)
    assert all(g["passed"] for g in report["gates"]), failing(report)
    assert report["engine"]["mode"] == "launch" and report["engine"]["ready_s"] > 0
    # the built-in variants agree with the plain configuration and exercised their feature
    rows = {r["name"]: r for r in report["evidence"]["serving"]["variants"]}
    assert set(rows) == {"prefix-caching", "chunked-prefill-64"}
    assert all(r["passed"] for r in rows.values()), [r["reasons"] for r in rows.values()]
    assert all(r["ready_s"] > 0 for r in rows.values())  # each variant was launched and timed
    prefix, chunked = rows["prefix-caching"], rows["chunked-prefill-64"]
    assert prefix["prefix_cache_hits"] > 0 and prefix["prefix_cache_hits_second_pass"] > 0
    assert chunked["token_budget"] == 64 and chunked["prompts_over_budget"] > 0
    metrics = report["metrics"]
    assert metrics["serving.batching.failed"] == 0 and metrics["smoke.tokenizer.mismatches"] == 0


def test_attach_mode_gives_the_metrics_of_launch_mode(prefect_server, tmp_path, launched_report,
                                                       tiny_llama_engine):
    out = tmp_path / "out"
    proc = day0("validate", TINY_LLAMA, "--target-file", attach_target(tmp_path, tiny_llama_engine),
                "--stages", API_STAGES, "--out", out, prefect_server=prefect_server)
    report = json.loads((out / "report.json").read_text())
    assert all(report["stages"][s]["ok"] for s in API_STAGES.split(",")), proc.stderr[-3000:]
    # only these stages were selected: every gate of theirs passes, the others are unjudged
    assert not failing(report) - {g["id"] for g in report["gates"] if g["not_evaluated"]}
    attached = metrics_of(report, "smoke.", "api_alignment.")
    launched = metrics_of(launched_report[1], "smoke.", "api_alignment.")
    assert attached and attached.keys() == launched.keys()
    for metric, value in launched.items():
        assert attached[metric] == pytest.approx(value, rel=1e-6, abs=1e-9), metric


KL = {"api-kl-topk-vs-control", "api-kl-topk-far-vs-control"}


CHAT_LOGPROBS = {"chat-prefill-vs-control", "chat-decode-vs-control"}


@pytest.mark.parametrize("fault, stage, expected", [
    ("rope", ("api_alignment.", "chat."),
     KL | {"api-top1-vs-control", "chat-close-vs-control"} | CHAT_LOGPROBS),
    ("weight", ("api_alignment.", "chat."), KL | {"api-top1-vs-control"} | CHAT_LOGPROBS),
    ("tokenizer", "smoke.", {"smoke-tokenizer-parity", "smoke-chat-template-parity",
                             "smoke-checks-pass", "chat-prompt-ids"}),
    # a request default (generation_config.json's repetition_penalty) reshapes greedy answers;
    # api_alignment's continuations (completions) get it too
    ("defaults", ("chat.", "api_alignment."), {"chat-close-vs-control", "chat-greedy"})],
    ids=["rope", "weight", "tokenizer", "defaults"])
def test_negative_controls_fail_on_the_right_evidence(prefect_server, tmp_path, fault, stage,
                                                      expected):
    """The engine serves a faulty copy under the fixture's name; day0 checks the original."""
    from day0.engines.process import launched

    copy = getattr(faults, f"{fault}_fault")(tmp_path / f"{fault}-copy")
    with launched(engine_target().engine, copy, "bfloat16", name=fault) as engine:
        out = tmp_path / "out"
        # the stages that judge what these faults change; the load stages are the builtin
        # target's test above. Evaluation (~30 s a run) on one fault only: the scaled weight,
        # which costs capabilities (its failing gates may then be evaluation's too)
        with_eval = fault == "weight"
        stages = "smoke,api_alignment,chat" + (",evaluation" if with_eval else "")
        proc = day0("validate", TINY_LLAMA, "--target-file",
                    attach_target(tmp_path, engine.endpoint), "--out", out,
                    "--stages", stages, prefect_server=prefect_server)
        report = json.loads((out / "report.json").read_text())
        assert proc.returncode == 1 and report["verdict"] == "FAIL", (fault, failing(report))
        failed = [g for g in report["gates"] if not g["passed"] and g["severity"] == "error"
                  and not g.get("not_evaluated")]  # gates of stages not selected: not evidence
        assert failed
        assert expected <= {g["id"] for g in failed}, (fault, failed)
        if fault != "tokenizer":  # the engine's EOS id moved too: its generation may part
            allowed = (*stage, "evaluation.") if with_eval else stage
            assert all(g["metric"].startswith(allowed) for g in failed), (fault, failed)
        if fault == "tokenizer":  # the evidence names the text and the ids
            mismatches = report["evidence"]["smoke"]["tokenizer"]["mismatches"]
            bos = next(m for m in mismatches if m["case"] == "special:<|bos|>")
            assert (bos["index"], bos["engine_id"], bos["checkpoint_id"]) == (0, 1, 0)
        if fault == "defaults":  # named where it starts: the request, not prefill or decode
            rows = report["evidence"]["chat"]["conversations"]
            assert {r["where"] for r in rows if not r["close"]} == {"request"}, rows
            assert all(r["prompt_matches"] and r["path_agrees"] for r in rows)
        if fault != "rope":
            return
        # the same engine killed while alignment runs: ERROR naming the stage, not FAIL
        out2 = tmp_path / "killed"
        killer = threading.Thread(target=_kill_when_running, args=(engine, out2), daemon=True)
        killer.start()
        proc = day0("validate", TINY_LLAMA, "--target-file",
                    attach_target(tmp_path, engine.endpoint), "--stages", "api_alignment",
                    "--out", out2, "--no-cache", prefect_server=prefect_server)
        killer.join(timeout=30)
        report = json.loads((out2 / "report.json").read_text())
        assert proc.returncode == 3 and report["verdict"] == "ERROR", proc.stdout[-2000:]
        assert "api_alignment" in proc.stdout + proc.stderr
        stage = report["stages"]["api_alignment"]
        assert not stage["ok"] and "engine" in (stage["error"] or "").lower(), stage


def _kill_when_running(engine, out, timeout_s: float = 600.0) -> None:
    """Kill the engine's process group once it has served the stage's first request (the stage
    sends many more), so the kill lands mid-stage."""
    import signal

    from day0.engines.client import EngineClient, EngineError, counter

    client = EngineClient.of(engine.endpoint, timeout_s=5)
    baseline = counter(client.metrics(), "vllm:request_success") or 0.0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (counter(client.metrics(), "vllm:request_success") or 0.0) > baseline:
                break
        except EngineError:
            break
        time.sleep(0.2)
    os.killpg(engine.proc.pid, signal.SIGKILL)


def test_an_engine_that_fails_to_start_is_error_with_its_log(prefect_server, tmp_path):
    target = engine_target().model_copy(update={"name": "vllm-bad-flag"})
    target.engine.launch.append("--no-such-vllm-flag")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(target.model_dump(mode="json", exclude_none=True)))
    before = engine_pids()
    out = tmp_path / "out"
    proc = day0("validate", TINY_LLAMA, "--target-file", path, "--stages", API_STAGES,
                "--out", out, prefect_server=prefect_server)
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 3 and report["verdict"] == "ERROR", proc.stdout[-2000:]
    error = report["stages"]["smoke"]["error"]
    assert "did not come up" in error and "no-such-vllm-flag" in error, error
    assert not engine_pids() - before
