"""The stage contract and the subprocess runner: crashes, timeouts and OOM become outcomes."""

import json
import subprocess
import sys

import pytest

from day0.execution.contract import StageInputs
from day0.execution.stage import StageOutcome, StageSpec, execute, run_stage
from day0.execution.targets import resolve_target
from tests.conftest import FIXTURES, PLUGINS

CONFIG = str(FIXTURES / "configs" / "Llama-3.1-8B.json")


def spec(stage="analysis", source=CONFIG, config=None, **target):
    tgt = resolve_target("cpu-bf16").model_copy(update=target)
    return StageSpec(stage=stage, config=config or {}, inputs=StageInputs(source=source, target=tgt))


def test_execute_in_process_returns_result_and_metrics():
    outcome = execute(spec())
    assert outcome.ok, outcome.error
    assert outcome.metrics["analysis.params_total"] == pytest.approx(8.03e9, rel=0.01)


def test_subprocess_contract_round_trip(tmp_path):
    spec_file, result_file = tmp_path / "spec.json", tmp_path / "result.json"
    spec_file.write_text(spec().model_dump_json())
    proc = subprocess.run([sys.executable, "-m", "day0.execution.stage", str(spec_file), str(result_file)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    outcome = StageOutcome.model_validate_json(result_file.read_text())
    assert outcome.ok and outcome.result["architecture"] == "LlamaForCausalLM"


def test_bad_input_is_input_failure_with_exit_2(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    outcome = run_stage(spec(source=str(bad)), timeout_s=300)
    assert not outcome.ok and outcome.failure == "input" and outcome.exit_code == 2
    assert str(bad) in outcome.error


def test_unknown_stage_config_field_is_config_failure():
    outcome = run_stage(spec(config={"no_such_field": 1}), timeout_s=300)
    assert not outcome.ok and outcome.failure == "config"
    assert "no_such_field" in outcome.error


def test_crash_becomes_failed_stage_naming_sigkill():
    # the crash plugin SIGKILLs the process that applies it: only the stage child dies
    outcome = run_stage(spec(stage="alignment", source=str(FIXTURES / "models" / "tiny-llama"),
                             plugins=[str(PLUGINS / "crash.py")]), timeout_s=300)
    assert not outcome.ok and outcome.failure == "crash"
    assert "SIGKILL" in outcome.error and "alignment" in outcome.error


def test_timeout_kills_the_stage():
    # the hang plugin sleeps where the target is built: a stage that never ends by itself
    outcome = run_stage(spec(stage="alignment", source=str(FIXTURES / "models" / "tiny-llama"),
                             plugins=[str(PLUGINS / "hang.py")]), timeout_s=3)
    assert not outcome.ok and outcome.failure == "timeout" and "3 s" in outcome.error


def test_memory_limit_kills_the_stage():
    outcome = run_stage(spec(), timeout_s=300, memory_limit_gib=0.02)
    assert not outcome.ok and outcome.failure == "oom" and "memory limit" in outcome.error



def test_nan_metrics_survive_json(tmp_path):
    outcome = StageOutcome(stage="x", ok=True, metrics={"a": float("nan"), "b": float("inf")})
    back = StageOutcome.model_validate_json(outcome.model_dump_json())
    assert json.loads(outcome.model_dump_json())["metrics"]["a"] == "NaN"
    assert back.metrics["a"] != back.metrics["a"] and back.metrics["b"] == float("inf")

def test_log_lines_are_streamed_and_exit_code_reported(tmp_path):
    plugin = tmp_path / "loud_exit.py"
    plugin.write_text("import os, sys\n"
                      "def apply(model):\n"
                      "    print('hello from the plugin', flush=True)\n"
                      "    os._exit(3)\n")
    lines = []
    outcome = run_stage(spec(stage="alignment", source=str(FIXTURES / "models" / "tiny-llama"),
                             plugins=[str(plugin)]), timeout_s=300, log=lines.append)
    assert "hello from the plugin" in lines
    # progress lines are streamed too (models loaded before the plugin ran), never in the tail
    from day0.execution.progress import PREFIX, parse

    assert [p.what for p in map(parse, lines) if p][:1] == ["weights"]
    assert any(p.what == "models" for p in map(parse, lines) if p)
    told = [line for line in lines if not line.startswith(PREFIX)]
    assert outcome.log_tail == told[-len(outcome.log_tail):]
    assert outcome.failure == "crash" and "exit code 3" in outcome.error


def test_a_stage_traceback_stays_in_its_log_tail_and_the_log_shows_its_exception(monkeypatch):
    """The run's log (the CLI, the Prefect UI) shows the exception's line; the frames stay in
    the outcome's log_tail; DAY0_DEBUG=1 shows them too."""
    from day0.execution.stage import TracebackFilter

    lines = ["[stage] working", "Traceback (most recent call last):",
             '  File "x.py", line 1, in <module>', "    boom()", "ValueError: first",
             "", "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", '  File "y.py", line 2, in f',
             "RuntimeError: second", "[stage] after"]
    monkeypatch.delenv("DAY0_DEBUG", raising=False)
    shown = TracebackFilter()
    assert [line for line in lines if shown(line)] == [
        "[stage] working", "ValueError: first", "RuntimeError: second", "[stage] after"]
    monkeypatch.setenv("DAY0_DEBUG", "1")
    assert all(map(TracebackFilter(), lines))


COUNTS_SIGTERM = ("import signal, sys, time\n"
                  "got = []\n"
                  "signal.signal(signal.SIGTERM, lambda *_: (got.append(1), print(len(got), flush=True)))\n"
                  "print('ready', flush=True)\n"
                  "deadline = time.monotonic() + 30\n"
                  "while time.monotonic() < deadline and not got: time.sleep(0.05)\n"
                  "time.sleep(0.5)\n")


def test_interrupting_again_signals_only_the_stages_that_started_since():
    """The flow signals the running stages, then again while it waits for the others: a stage
    forked after the first signal gets one too, and none gets it twice (a soak that stops on the
    first SIGTERM would take a second as an abort)."""
    import signal as signals

    from day0.execution import stage

    started = []

    def child():
        proc = subprocess.Popen([sys.executable, "-c", COUNTS_SIGTERM], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        assert proc.stdout.readline().strip() == "ready"
        stage._RUNNING.add(proc.pid)
        started.append(proc)
        return proc

    try:
        first = child()
        signalled = stage.interrupt_running(signals.SIGTERM)
        assert signalled == {first.pid}
        late = child()  # started after the first signal (its host was still starting)
        signalled = stage.interrupt_running(signals.SIGTERM, signalled)
        assert signalled == {first.pid, late.pid}
        assert stage.interrupt_running(signals.SIGTERM, signalled) == signalled
        for proc in (first, late):
            out, _ = proc.communicate(timeout=60)
            assert out.split() == ["1"], out  # one SIGTERM each
    finally:
        for proc in started:
            stage._RUNNING.discard(proc.pid)
            if proc.poll() is None:
                proc.kill()
