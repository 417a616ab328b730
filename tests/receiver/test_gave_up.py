"""A release whose every run crashed still ends in a published verdict (issue 28): after
submit.crash_attempts crashed runs the receiver publishes its ERROR report, naming each attempt,
under the release's results folder with latest.json pointing at it."""

from __future__ import annotations

import json
import uuid

import pytest

from day0.receiver.journal import Journal, ReleaseRow
from day0.receiver.launch import ReceiverThread
from day0.store import identity
from tests.receiver.conftest import receiver_settings
from tests.receiver.support import wait_until

pytestmark = pytest.mark.integration


def crash(run_id: str) -> None:
    """What Prefect's zombie automation does to a run whose process died."""
    from prefect import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(uuid.UUID(run_id), Crashed(message="worker died (test)"),
                                  force=True)


def test_a_release_given_up_after_crashed_runs_publishes_its_error_verdict(
        deployment, s3_server, tmp_path, monkeypatch):
    for key, value in s3_server.env().items():  # the receiver publishes with this environment
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DAY0_RESULTS_URI", raising=False)
    monkeypatch.setenv("DAY0_OUTBOX_DIR", str(tmp_path / "outbox"))
    s3_server.create_bucket("models")
    model = f"gaveup/{uuid.uuid4().hex[:8]}"
    source = f"s3://models/{model}"
    settings = receiver_settings(tmp_path, deployment,
                                 submit={"poll_s": 0.5, "backoff_initial_s": 0.2, "crash_attempts": 2})
    journal = Journal(settings.journal)
    journal.accept([ReleaseRow(model=model, revision="r1", target="cpu-bf16", source=source,
                               origin="webhook")])

    def submitted(seq: int) -> str | None:
        rows = [r for r in journal.releases() if r["seq"] == seq and r["flow_run_id"]]
        return rows[0]["flow_run_id"] if rows else None

    with ReceiverThread(settings):
        first = wait_until(lambda: submitted(1), timeout_s=30)
        assert first, journal.releases()
        assert identity.read_latest(source=source, target_name="cpu-bf16", model=model,
                                    revision="r1") is None
        crash(first)
        second = wait_until(lambda: submitted(2), timeout_s=30)  # run again at once
        assert second, journal.releases()
        crash(second)
        published = wait_until(lambda: journal.releases()[-1]["verdict_uri"], timeout_s=60)
        assert published and published.startswith("s3://models/"), journal.releases()
    latest = identity.read_latest(source=source, target_name="cpu-bf16", model=model, revision="r1")
    assert latest and latest["uri"] == published, (latest, published)
    client = s3_server.client()
    key = published.removeprefix("s3://models/")
    report = json.loads(client.get_object(Bucket="models", Key=key + "report.json")["Body"].read())
    assert report["verdict"] == "ERROR" and report["exit_status"] == 3
    assert report["identity"]["model"] == model and report["identity"]["revision"] == "r1"
    (error,) = report["errors"]
    assert error.startswith("ERROR: gave up after 2 crashed run(s)") and first in error and second in error
    markdown = client.get_object(Bucket="models", Key=key + "report.md")["Body"].read().decode()
    assert "gave up after 2 crashed run(s)" in markdown
    # published once: a restarted receiver finds nothing left to publish
    assert Journal(settings.journal).verdicts_to_publish() == []
