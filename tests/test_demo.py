"""`make demo`'s script: one Prefect server for every model, a verdict per model, server stopped."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def test_demo_validates_against_one_server_and_stops_it(tmp_path, day0_cache):
    env = {**os.environ, "DAY0_CACHE_DIR": str(day0_cache)}
    env.pop("PREFECT_API_URL", None)  # the session harness's is not the demo's
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "scripts/demo.py", "tiny-llama", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    servers = re.findall(r"one Prefect server for the demo: http://127\.0\.0\.1:(\d+)/api", text)
    assert len(servers) == 1, text[-4000:]
    assert re.search(r"tiny-llama\s+PASS", text), text[-4000:]
    assert (out / "tiny-llama" / "report.json").is_file()
    assert (day0_cache / "demo-prefect" / "server.log").is_file()
    with socket.socket() as s:  # stopped: nothing listens on its port any more
        assert s.connect_ex(("127.0.0.1", int(servers[0]))) != 0
