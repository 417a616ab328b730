"""Programs a model could write that must not get out of the sandbox, and the checks both
backends are held to (test_namespace.py, test_container.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from day0.stages.evaluation import codeexec, sandbox

ROOT = Path(__file__).resolve().parents[4]
LIMITS = sandbox.Limits(timeout_s=3, memory_mib=256)
SECRET = "DAY0_SANDBOX_TEST_SECRET"


def code_problems(scorer: str) -> list[codeexec.Problem]:
    """The real HumanEval or MBPP test set (scripts/fetch_benchmarks.py; cached per machine, not
    per session)."""
    env = {k: v for k, v in os.environ.items() if k != "DAY0_CACHE_DIR"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_benchmarks.py"),
                           scorer],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return codeexec.load(scorer, Path(done.stdout.strip().splitlines()[-1]))


WRONG = {  # plausible wrong answers: nothing returned, and giving up (one suffices for MBPP's
    # 500: its asserts call a function the answer does not define)
    "humaneval": ("    return None\n", "    raise NotImplementedError\n"),
    "mbpp": ("def solution(*args):\n    return None\n",)}


def assert_canonical_passes_and_wrong_fails(backend: str, scorer: str = "humaneval",
                                            count: int = 164) -> None:
    problems = code_problems(scorer)
    assert len(problems) == count
    score, outcomes = codeexec.score(problems, [p.canonical for p in problems], backend=backend)
    assert score == 1.0, [(problems[o.index].task_id, o.status, o.stderr[-300:])
                          for o in outcomes if not o.passed][:5]
    for wrong in WRONG[scorer]:
        score, outcomes = codeexec.score(problems, [wrong] * len(problems), backend=backend)
        assert score == 0.0, [problems[o.index].task_id for o in outcomes if o.passed]


class Listener:
    """A loopback TCP server in this process: it counts the connections it accepts."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.accepted = self.sock.getsockname()[1], 0
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def assert_contained(backend: str, tmp_path: Path, monkeypatch) -> None:
    """Network, writes outside the scratch folder, secrets, a loop, a memory bomb, a fork bomb:
    each program is stopped or refused and scored failed; a well-behaved one passes."""
    monkeypatch.setenv(SECRET, "s3cr3t")
    outside = tmp_path / "outside.txt"
    private = tmp_path / "private.txt"
    private.write_text("secret")
    private.chmod(0o600)
    tmp_path.chmod(0o755)
    listener = Listener()
    programs = {
        "socket": f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), 2)",
        "write_outside": f"open({str(outside)!r}, 'w').write('x')",
        "write_tmp": "open('/tmp/escape.txt', 'w').write('x')",
        "write_repo": f"open({str(ROOT / 'escape.txt')!r}, 'w').write('x')",
        "read_private": f"print(open({str(private)!r}).read())",
        "secret": f"import os, sys\nsys.exit(1 if {SECRET!r} in os.environ else 0)",
        "loop": "while True:\n    pass",
        "memory": "block = bytearray(1 << 30)",
        "fork_bomb": "import os, time\nfor _ in range(10000):\n    os.fork()\ntime.sleep(30)",
        "scratch": "open('notes.txt', 'w').write('ok')\nassert open('notes.txt').read() == 'ok'",
    }
    try:
        outcomes = dict(zip(programs, sandbox.run(list(programs.values()), LIMITS, backend)))
    finally:
        listener.close()
    status = {name: o.status for name, o in outcomes.items()}
    assert status["scratch"] == "passed" and status["secret"] == "passed", outcomes
    for name in ("socket", "write_outside", "write_tmp", "write_repo", "memory", "fork_bomb"):
        assert status[name] != "passed", (name, outcomes[name])
    if os.geteuid() == 0:  # a separate user reads no file that is not world-readable
        assert status["read_private"] != "passed", outcomes["read_private"]
    assert status["loop"] == "timeout" and outcomes["loop"].seconds < LIMITS.timeout_s + 5
    assert listener.accepted == 0
    assert not outside.exists() and not (ROOT / "escape.txt").exists()
