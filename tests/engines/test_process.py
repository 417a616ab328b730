"""Engine launch and stop without a real engine: commands that fail, hang or fork must end as
ERROR with their last log lines and leave no process behind; bad engine config is a config
error naming the field."""

from __future__ import annotations

import os
import sys
import time

import pytest

from day0.engines.client import EngineStartError, EngineUnreachable, EngineClient
from day0.engines.process import command, launched
from day0.engines.settings import EngineSettings
from day0.errors import ConfigError
from day0.execution.targets import resolve_target
from day0.yamlio import load_model


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _settings(script: str, **extra) -> EngineSettings:
    return EngineSettings(launch=[sys.executable, "-c", script, "{port}"], **extra)


def test_an_engine_that_exits_is_an_error_with_its_last_log_lines(tmp_path):
    settings = _settings("import sys; print('loading weights'); print('KeyError: \\'w.bias\\'');"
                         " [print('traceback line', i) for i in range(60)];"
                         " print('CUDA error: no device'); sys.exit(7)")
    with pytest.raises(EngineStartError) as err:
        with launched(settings, tmp_path, "bfloat16"):
            pass
    assert "exited with status 7" in str(err.value)
    assert "CUDA error: no device" in str(err.value)  # the last lines
    assert "(KeyError: 'w.bias')" in str(err.value)  # and the root cause, long scrolled away
    assert err.value.exit_code == 3  # a StageError: the verdict is ERROR, not FAIL


def test_an_engine_that_never_answers_is_stopped_with_its_children(tmp_path):
    marker = tmp_path / "child.pid"
    script = ("import os, subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"open({str(marker)!r}, 'w').write(str(c.pid)); print('warming up', flush=True); "
              "time.sleep(600)")
    started = time.monotonic()
    with pytest.raises(EngineStartError) as err:
        with launched(_settings(script, ready_timeout_s=3), tmp_path, "bfloat16") as engine:
            pass
    assert time.monotonic() - started < 40
    assert "did not answer" in str(err.value) and "warming up" in str(err.value)
    assert _gone(int(marker.read_text()))  # the engine's own worker went with it


def test_a_command_that_does_not_exist_names_the_fix(tmp_path):
    settings = EngineSettings(launch=["/nonexistent/engine", "--port", "{port}"])
    with pytest.raises(EngineStartError, match="engine.launch"):
        with launched(settings, tmp_path, "bfloat16"):
            pass


def test_a_running_engine_is_stopped_and_then_unreachable(tmp_path):
    # a minimal OpenAI-compatible /v1/models, enough for readiness and stop
    script = ("import http.server, json, sys\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        body = json.dumps({'data': [{'id': 'm'}]}).encode()\n"
              "        self.send_response(200); self.send_header('content-length', str(len(body)))\n"
              "        self.end_headers(); self.wfile.write(body)\n"
              "    def log_message(self, *a): pass\n"
              "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    lines: list[str] = []
    with launched(_settings(script), tmp_path, "bfloat16", log=lines.append) as engine:
        client = EngineClient.of(engine.endpoint, timeout_s=5)
        assert client.models() == ["m"]
        pid = engine.proc.pid
    assert _gone(pid)
    with pytest.raises(EngineUnreachable):
        client.models()
    assert any("ready after" in line for line in lines) and lines[-1].endswith("stopped")


def test_placeholders_are_filled_and_the_context_capped_by_the_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 256}')
    settings = EngineSettings(launch=["eng", "--model", "{model}", "--port", "{port}", "--dtype",
                                      "{dtype}", "--len", "{max_model_len}", "--name",
                                      "{served_name}"], max_model_len=4096)
    assert command(settings, str(tmp_path), "bfloat16", 9999, ["--x"]) == [
        "eng", "--model", str(tmp_path), "--port", "9999", "--dtype", "bfloat16", "--len", "256",
        "--name", "day0-model", "--x"]


@pytest.mark.parametrize("engine, field, words", [
    ({}, "engine", "exactly one of base_url"),
    ({"base_url": "http://x:1", "launch": ["a", "{port}"]}, "engine", "exactly one"),
    ({"launch": ["vllm", "--model", "{model}"]}, "engine.launch", "{port}"),
    ({"launch": ["vllm", "{port}", "{modle}"]}, "engine.launch", "{modle}"),
    ({"base_url": "127.0.0.1:8000"}, "engine.base_url", "http"),
    ({"base_url": "http://x:1", "variants": {"a": ["--b"]}}, "engine", "launch"),
    ({"launch": ["a", "{port}"], "ready_timout_s": 5}, "ready_timout_s", "ready_timeout_s"),
])
def test_bad_engine_config_is_a_config_error_naming_the_field(tmp_path, engine, field, words):
    data = {"name": "e", "kind": "engine", "device": "cpu", "dtype": "bfloat16", "engine": engine}
    with pytest.raises(ConfigError) as err:
        load_model(__import__("day0.execution.targets").execution.targets.Target, data, "targets.yaml")
    assert field in str(err.value) and words in str(err.value)


def test_the_builtin_vllm_target_is_an_engine_target():
    target = resolve_target("vllm-cpu-bf16")
    assert target.kind == "engine" and target.engine.mode == "launch"
    assert set(target.engine.variants) == {"prefix-caching", "chunked-prefill-64"}


def test_the_api_key_comes_from_its_variable_and_is_never_logged(tmp_path, monkeypatch):
    """The key reaches the engine as a bearer token; the settings, endpoint, launch log and
    errors only ever name the variable."""
    key = "sk-day0-test-0123456789"
    monkeypatch.setenv("DAY0_TEST_ENGINE_KEY", key)
    script = ("import http.server, json, os, sys\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        ok = self.headers.get('Authorization') == 'Bearer ' + os.environ['DAY0_TEST_ENGINE_KEY']\n"
              "        body = json.dumps({'data': [{'id': 'm'}]} if ok else {'error': 'unauthorized'}).encode()\n"
              "        self.send_response(200 if ok else 401)\n"
              "        self.send_header('content-length', str(len(body))); self.end_headers()\n"
              "        self.wfile.write(body)\n"
              "    def log_message(self, *a): pass\n"
              "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    lines: list[str] = []
    settings = _settings(script, api_key_env="DAY0_TEST_ENGINE_KEY")
    with launched(settings, tmp_path, "bfloat16", log=lines.append) as engine:
        assert EngineClient.of(engine.endpoint).models() == ["m"]
        with pytest.raises(Exception) as err:  # without the key: the engine's 401, keyless
            EngineClient(engine.endpoint.base_url).models()
        assert "401" in str(err.value)
        shown = "\n".join(lines) + engine.endpoint.model_dump_json() + settings.model_dump_json()
    assert key not in shown and key not in str(err.value)
    monkeypatch.delenv("DAY0_TEST_ENGINE_KEY")
    with pytest.raises(Exception, match=r"\$DAY0_TEST_ENGINE_KEY, which is not set"):
        EngineClient("http://127.0.0.1:1", api_key_env="DAY0_TEST_ENGINE_KEY")
