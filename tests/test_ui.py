"""Acceptance of issue 11: the verdict in the Prefect UI, seen by a real browser.

A real ``prefect server start`` (own PREFECT_HOME, a free port, the UI told to call that port),
three ``day0 validate`` runs against it - PASS (tiny-llama on cpu-bf16), FAIL (a perturbed layer:
tests/plugins/perturb_layer.py) and ERROR (a plugin that SIGKILLs its stage process:
tests/plugins/crash.py) - then headless Chromium (``make browser``) opens the flow-runs page,
each run's page, the FAIL run's report artifact and a plot artifact. Screenshots and DOM dumps
are kept under the test's tmp dir (printed at the end).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from tests.browser import IMAGES_JS, LOADED_PNG_JS, Chromium, find_chromium
from tests.conftest import HELDOUT, MODELS, PLUGINS
from tests.procs import stop_group

pytestmark = [pytest.mark.integration, pytest.mark.browser]
STARTUP_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UiServer:
    def __init__(self, home, port: int):
        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{port}"
        self.api = self.url + "/api"
        self.env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": self.api,
                    "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
                    # the UI's own API address: without it the pages call port 4200
                    "PREFECT_SERVER_UI_API_URL": self.api, "PREFECT_UI_API_URL": self.api,
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}

    def post(self, path: str, body: dict) -> list | dict:
        request = urllib.request.Request(self.api + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)


@pytest.fixture
def ui_server(tmp_path):
    server = UiServer(tmp_path / "prefect-home", free_port())
    server.home.mkdir()
    log = open(server.home / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                             "127.0.0.1", "--port", str(server.port), "--analytics-off"],
                            env=server.env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                with urllib.request.urlopen(server.api + "/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("prefect server did not start: "
                                + (server.home / "server.log").read_text()[-2000:])
                time.sleep(0.3)
        yield server
    finally:
        stop_group(proc, grace_s=20)
        log.close()


def _target(tmp_path, name: str, *plugins: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "device": "cpu", "dtype": "bfloat16",
                                    "plugins": [str(PLUGINS / p) for p in plugins]}))
    return str(path)


# one window and one short generation: the verdicts are as clear, the runs shorter
SMALL = {"alignment": {"max_windows": 1, "generation_prompts": 1, "new_tokens": 8}}


def _validate_all(server: UiServer, tmp_path, runs: dict[str, list[str]]) -> dict:
    """`day0 validate` per verdict, one after the other (at once they only contend for the 2
    cores); verdict -> (returncode, stdout, stderr, seconds)."""
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(SMALL))
    done = {}
    for verdict, target_args in runs.items():
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "day0.cli", "validate", str(MODELS / "tiny-llama"),
             *target_args, "--text", str(HELDOUT), "--config", str(config),
             "--out", str(tmp_path / verdict.lower())],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=server.env,
            start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=600)
        finally:
            stop_group(proc, grace_s=10)  # and its stage processes, should it time out
        done[verdict] = (proc.returncode, stdout, stderr, time.monotonic() - t0)
    return done


def _logs_when_finished(ui_server, run_id: str, wait_s: float = 30) -> list[str]:
    """The run's log lines once its closing line ("Finished in state ...") has arrived."""
    deadline = time.monotonic() + wait_s
    while True:
        logs = [log["message"] for log in ui_server.post("/logs/filter", {
            "logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200})]
        if any(line.startswith("Finished in state") for line in logs[-5:]):
            return logs
        assert time.monotonic() < deadline, f"run {run_id}: no closing log line in {wait_s} s"
        time.sleep(0.5)


def test_verdicts_and_plots_show_in_the_prefect_ui(ui_server, tmp_path):
    chromium = find_chromium()
    if not chromium:
        pytest.fail("no chromium: `make test` installs it (`make browser`)")
    shots = tmp_path / "shots"
    shots.mkdir()

    runs = _validate_all(ui_server, tmp_path, {
        "PASS": ["--target", "cpu-bf16"],
        "FAIL": ["--target-file", _target(tmp_path, "cpu-bf16-perturbed", "perturb_layer.py")],
        # a partial run (issue 27): the state and tags say so, its verdict is over what ran
        "ERROR": ["--target-file", _target(tmp_path, "cpu-bf16-crashing", "crash.py"),
                  "--stages", "alignment"]})
    print("\nvalidate wall seconds: " + ", ".join(f"{v} {r[3]:.0f}" for v, r in runs.items()))
    codes = {verdict: run[0] for verdict, run in runs.items()}
    assert codes == {"PASS": 0, "FAIL": 1, "ERROR": 3}, {v: r[2][-1500:] for v, r in runs.items()}
    # the CLI's closing lines: first divergent layer, report path
    fail_out = runs["FAIL"][1]
    assert "first divergent layer: 2" in fail_out, fail_out
    assert f"report: {tmp_path / 'fail' / 'report.md'}" in fail_out
    assert (tmp_path / "fail" / "plots" / "alignment-layers.png").is_file()

    found = ui_server.post("/flow_runs/filter", {"limit": 20})
    by_verdict = {r["state"]["name"]: r for r in found}
    assert set(by_verdict) == {"PASS", "FAIL", "ERROR"}, [r["state"] for r in found]
    assert by_verdict["PASS"]["state"]["type"] == "COMPLETED"
    assert by_verdict["FAIL"]["state"]["type"] == "FAILED"
    assert by_verdict["ERROR"]["state"]["type"] == "FAILED"
    assert "layers-aligned" in by_verdict["FAIL"]["state"]["message"]
    assert by_verdict["ERROR"]["state"]["message"].startswith(
        "ERROR: partial: stages analysis, alignment; stage alignment could not finish")
    assert "partial" in by_verdict["ERROR"]["tags"] and "partial" not in by_verdict["PASS"]["tags"]
    assert "partial" not in by_verdict["PASS"]["state"]["message"]
    tasks = ui_server.post("/task_runs/filter", {"flow_runs": {"id": {
        "any_": [by_verdict["ERROR"]["id"]]}}})
    stage_states = {t["name"]: (t["state"]["type"], t["state"]["name"]) for t in tasks}
    assert stage_states.get("alignment") == ("FAILED", "ERROR"), stage_states  # could not finish
    assert stage_states.get("analysis") == ("COMPLETED", "Completed"), stage_states
    names = {v: r["name"] for v, r in by_verdict.items()}
    assert names["PASS"].startswith("tiny-llama@") and names["PASS"].endswith(" on cpu-bf16")
    assert names["FAIL"].endswith(" on cpu-bf16-perturbed"), names  # the target file's profile
    for verdict, run in by_verdict.items():
        assert f"verdict:{verdict}" in run["tags"] and "model:tiny-llama" in run["tags"], run["tags"]
    artifacts = ui_server.post("/artifacts/filter", {"artifacts": {"flow_run_id": {
        "any_": [by_verdict["FAIL"]["id"]]}}})
    keys = {a["key"]: a for a in artifacts}
    ours = {f"day0-{kind}-tiny-llama-cpu-bf16-perturbed" for kind in (
        "report", "gates", "layers", "plot-alignment-layers", "plot-alignment-kl-buckets")}
    assert ours <= set(keys), sorted(keys)
    assert all(keys[k]["flow_run_id"] == by_verdict["FAIL"]["id"] and keys[k]["task_run_id"] is None
               for k in ours)  # attached to the run, not to a task
    report = keys["day0-report-tiny-llama-cpu-bf16-perturbed"]
    plot = keys["day0-plot-alignment-layers-tiny-llama-cpu-bf16-perturbed"]

    # the partial run says so in its logs, which reach the server after its state: wait for them
    # there before a page loads them
    partial = "partial: stages analysis, alignment"
    for verdict, run in by_verdict.items():
        logs = _logs_when_finished(ui_server, run["id"])
        assert any(partial in line for line in logs) == (verdict == "ERROR"), logs
    with Chromium(tmp_path / "chromium") as browser:
        with browser.page(f"{ui_server.url}/runs", height=1300) as page:
            page.wait_for("['PASS', 'FAIL', 'ERROR'].every(s => document.body.innerText"
                          ".split(/\\s+/).includes(s))", what="the states PASS, FAIL and ERROR")
            page.screenshot(shots / "runs.png")
            page.dump_dom(shots / "runs.html")
        for verdict, run in by_verdict.items():
            with browser.page(f"{ui_server.url}/runs/flow-run/{run['id']}") as page:
                expected = [run["name"], partial] if verdict == "ERROR" else [run["name"]]
                page.wait_for(" && ".join(f"document.body.innerText.includes({json.dumps(t)})"
                                          for t in expected) +
                              f" && document.body.innerText.split(/\\s+/).includes('{verdict}')",
                              what=f"run {run['name']} in state {verdict}")
                page.screenshot(shots / f"run-{verdict.lower()}.png")
                page.dump_dom(shots / f"run-{verdict.lower()}.html")
                assert (partial in page.text()) == (verdict == "ERROR"), page.text()[:2000]
        with browser.page(f"{ui_server.url}/artifacts/artifact/{report['id']}",
                          height=2400) as page:
            page.wait_for("document.body.innerText.includes('day0 validation: FAIL')",
                          what="the report's markdown")
            text = page.text()
            assert "FAIL" in text and "layers-aligned" in text
            page.wait_for(LOADED_PNG_JS, what="a loaded plot in the report")
            page.screenshot(shots / "report-artifact.png")
            page.dump_dom(shots / "report-artifact.html")
        with browser.page(f"{ui_server.url}/artifacts/artifact/{plot['id']}") as page:
            page.wait_for(LOADED_PNG_JS, what="a loaded data:image/png <img>")
            images = page.evaluate(IMAGES_JS)
            page.screenshot(shots / "plot-artifact.png")
            html = page.dump_dom(shots / "plot-artifact.html")
    plots = [i for i in images if i["src"].startswith("data:image/png")]
    assert plots and all(i["naturalWidth"] > 0 and i["complete"] for i in plots), images
    assert '<img src="data:image/png;base64,' in html or "data:image/png;base64," in html
    print(f"\nscreenshots in {shots}: " + ", ".join(sorted(p.name for p in shots.glob("*.png"))))
