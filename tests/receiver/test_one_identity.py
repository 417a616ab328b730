"""One checkpoint, one identity (issue 10, part 2), against real SeaweedFS, receiver and Prefect.

The first test uses the session's receiver (its deployment is never served): a signed release
that names no revision gets the one a manual run computes, and merges with the upload of the
same files while its run is pending. The second runs the same checkpoint through all four
entry paths on a served deployment - an upload seen by the receiver, a signed release without a
revision, `prefect deployment run` (run_deployment with source and target only) and
`day0 validate s3://...` - and finds four runs kept under one <model>/<revision>/<target>/ with
latest.json naming the newest; a Hub release with its revision names the folder once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from urllib.parse import quote_plus

import httpx
import pytest

from day0.store import identity
from day0.receiver.launch import ReceiverProcess, free_port, write_config
from tests.conftest import MODELS
from tests.procs import stop_group
from tests.runs import wait_final
from tests.receiver.conftest import FAST_SUBMIT, SECRETS, make_checkpoint, upload_order
from tests.receiver.support import journal_stats, post_release, runs, settled, wait_until
from tests.receiver.test_events import s3_record

pytestmark = pytest.mark.integration
LLAMA = MODELS / "tiny-llama"


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """This process reads the session's store too (day0.store.identity on the test side)."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    s3_server.create_bucket("models")
    return s3_server


def test_release_without_revision_is_named_like_a_manual_run(receiver, deployment, s3_env,
                                                             tmp_path):
    client = s3_env.client()
    ck = make_checkpoint(tmp_path / "ck", shards=2)
    prefix = f"one/{uuid.uuid4().hex[:8]}/tiny"
    source = f"s3://models/{prefix}"
    announce = {"model": prefix, "source": source}
    client.upload_file(str(ck / "config.json"), "models", f"{prefix}/config.json")
    early = post_release(receiver.url, announce)
    assert early.status_code == 409 and "no complete checkpoint" in early.json()["detail"], early.text
    for name in upload_order(ck):
        client.upload_file(str(ck / name), "models", f"{prefix}/{name}")
    manual = identity.resolve(source)
    resp = post_release(receiver.url, announce)
    assert resp.status_code == 202, resp.text
    (listed,) = resp.json()["releases"]
    assert (listed["model"], listed["revision"]) == (manual.model, manual.revision) == (
        prefix, manual.revision)
    assert post_release(receiver.url, announce).json()["status"] == "duplicate"
    # the upload of the same files, while that run is pending: the same release, nothing new
    event = post_s3(receiver.url, {"Records": [s3_record("models", quote_plus(f"{prefix}/{n}"))
                                               for n in upload_order(ck)]})
    assert event.json()["status"] == "complete", event.text
    assert event.json()["prefixes"][0]["revision"] == manual.revision
    settled(receiver.url)
    key = identity.dedupe_key(prefix, manual.revision, "cpu-bf16")
    assert runs(deployment, f"day0:{prefix}@") == {key: 1}
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterIdempotencyKey

    with get_client(sync_client=True) as pc:
        (run,) = pc.read_flow_runs(flow_run_filter=FlowRunFilter(
            idempotency_key=FlowRunFilterIdempotencyKey(any_=[key])))
    assert run.parameters == {"source": source, "target": "cpu-bf16", "model": prefix,
                              "revision": manual.revision}


def post_s3(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/events/s3", content=json.dumps(body).encode(),
                      headers={"Authorization": f"Bearer {SECRETS['s3_token']}"}, timeout=30)


# --------------------------------------------------------------------------- end to end

DEPLOYMENT = "validate/day0-one-identity"
MODEL = "acme/tiny-llama"
SOURCE = f"s3://models/{MODEL}"


@pytest.fixture(scope="module")
def stack(prefect_server, tmp_path_factory):
    """SeaweedFS whose filer posts to a receiver process, `day0 serve` of the deployment, all
    sharing one day0 cache; yields (s3, receiver, env for subprocesses, work folder)."""
    from tests.s3server import start_s3_server  # raises when weed is missing: the test fails

    root = tmp_path_factory.mktemp("one-identity")
    port = free_port()
    s3 = start_s3_server(root / "weed", webhook_url=f"http://127.0.0.1:{port}/v1/events/seaweedfs",
                         webhook_token=SECRETS["seaweedfs_token"])
    env = {**os.environ, **s3.env(), "PREFECT_API_URL": prefect_server,
           "DAY0_CACHE_DIR": str(root / "cache")}
    env.pop("DAY0_RESULTS_URI", None)
    with open(root / "serve.log", "wb") as log:
        served = subprocess.Popen([sys.executable, "-m", "day0.cli", "serve", "--name",
                                   DEPLOYMENT.split("/")[1]], env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    config = write_config(root / "receiver.yaml", {
        "deployment": DEPLOYMENT, "targets": ["cpu-bf16"], "journal": str(root / "journal.sqlite"),
        "secrets": SECRETS, "submit": FAST_SUBMIT,
        # uploads to the Hub mirror are not releases of their own: only its webhook is
        "checkpoint": {"include": ["models/*"]}, "hub": {"source": "s3://hub-mirror/{repo}/{revision}"}})
    receiver = ReceiverProcess(config, port=port, env=env, admin_token=SECRETS["admin_token"]).start()
    if not wait_until(deployment_registered, timeout_s=120, interval_s=1):
        stop_group(served)
        pytest.fail("`day0 serve` registered no deployment:\n" +
                    (root / "serve.log").read_text()[-3000:])
    s3.create_bucket("models")
    s3.create_bucket("hub-mirror")
    try:
        with s3.exported():  # this process reads the bucket too
            yield s3, receiver, env, root
    finally:
        receiver.stop()
        stop_group(served)
        s3.stop()


def deployment_registered() -> bool:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return bool(client.read_deployment_by_name(DEPLOYMENT))
        except ObjectNotFound:
            return False


def flow_runs() -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(DEPLOYMENT)
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=[dep.id])), sort=FlowRunSort.START_TIME_ASC)


def new_run(before: int, timeout_s: float = 120):
    """The flow run of the deployment that appears after `before` runs, once final."""
    found = wait_until(lambda: len(flow_runs()) > before and flow_runs(), timeout_s=timeout_s,
                       interval_s=1)
    assert found and len(found) == before + 1, [r.name for r in found or []]
    return wait_final(sorted(found, key=lambda r: r.created)[-1].id)


def keys_under(client, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def finished(url: str, count: int) -> bool:
    return journal_stats(url)["releases"]["finished"] >= count


@pytest.mark.slow
def test_four_entry_paths_one_folder_four_runs(stack):
    s3, receiver, env, root = stack
    client = s3.client()
    log = root / "serve.log"

    # (a) an upload, seen by the receiver through the filer's webhook
    s3.upload_dir(LLAMA, "models", MODEL)
    first = new_run(0)
    assert first.state.is_completed(), log.read_text()[-3000:]
    revision = identity.resolve(SOURCE).revision
    assert first.parameters == {"source": SOURCE, "target": "cpu-bf16", "model": MODEL,
                                "revision": revision}
    # (b) a signed release of the same weights, no revision given, after that run ended
    assert wait_until(lambda: finished(receiver.url, 1), timeout_s=30), journal_stats(receiver.url)
    resp = post_release(receiver.url, {"model": MODEL, "source": SOURCE})
    assert resp.status_code == 202 and resp.json()["releases"][0]["revision"] == revision, resp.text
    second = new_run(1)
    assert second.state.is_completed() and second.idempotency_key.endswith("#2")
    # (c) `prefect deployment run 'validate/...' -p source=... -p target=cpu-bf16`
    from prefect.deployments import run_deployment

    started = run_deployment(name=DEPLOYMENT, parameters={"source": SOURCE, "target": "cpu-bf16"},
                             timeout=0, as_subflow=False)
    third = wait_final(started.id)
    assert third.state.is_completed(), log.read_text()[-3000:]
    # (d) `day0 validate s3://...` on the command line
    cli = subprocess.run([sys.executable, "-m", "day0.cli", "validate", SOURCE, "--target",
                          "cpu-bf16", "--json"], env=env, capture_output=True, text=True,
                         timeout=900)
    assert cli.returncode == 0, cli.stderr[-3000:]
    fourth = json.loads(cli.stdout)

    folder = f"day0-results/{MODEL}/{revision}/cpu-bf16/"
    # the reference side's stored results, next to the targets, one folder per revision: the
    # evaluation stage's reference results and the alignment stage's reference bank
    reference = f"day0-results/{MODEL}/{revision}/reference-cpu-float32/"
    keys = every_key = keys_under(client, "models", "day0-results/")
    # one per weights key: an s3:// source's (object ETags) and a local copy's (bytes) differ
    assert [k for k in keys if k.startswith(reference + "evaluation/") and k.endswith(".json")]
    assert [k for k in keys if k.startswith(reference + "alignment-bank/")
            and k.endswith("/reference/bank.json")], keys
    keys = [k for k in keys if not k.startswith(reference)]
    assert {k for k in keys if not k.startswith(folder)} == set(), keys  # one folder for all
    run_ids = sorted({k[len(folder + "runs/"):].split("/")[0] for k in keys
                      if k.startswith(folder + "runs/")})
    assert len(run_ids) == 4, keys
    for rid in run_ids:
        report = json.loads(client.get_object(
            Bucket="models", Key=f"{folder}runs/{rid}/report.json")["Body"].read())
        assert report["verdict"] == "PASS" and report["identity"]["revision"] == revision
    latest = json.loads(client.get_object(Bucket="models", Key=folder + "latest.json")["Body"].read())
    assert latest["run_id"] == run_ids[-1] == fourth["identity"]["run_id"]
    assert latest["uri"] == f"s3://models/{folder}runs/{run_ids[-1]}/" == fourth["results_uri"]

    # a Hub release names its revision: the folder holds it once (not <rev>/<rev>)
    sha = "c0ffee" + "0" * 34
    s3.upload_dir(LLAMA, "hub-mirror", f"{MODEL}/{sha}")
    hook = {"event": {"action": "update", "scope": "repo.content"},
            "repo": {"type": "model", "name": MODEL, "headSha": sha},
            "updatedRefs": [{"ref": "refs/heads/main", "oldSha": "1" * 40, "newSha": sha}]}
    before = len(flow_runs())
    hub = httpx.post(f"{receiver.url}/v1/webhooks/release", json=hook,
                     headers={"X-Webhook-Secret": SECRETS["hf_webhook"]}, timeout=30)
    assert hub.status_code == 202, hub.text
    fifth = new_run(before)
    assert fifth.state.is_completed(), log.read_text()[-3000:]
    (report_key,) = [k for k in keys_under(client, "hub-mirror", "day0-results/")
                     if k.endswith("/report.json")]
    assert report_key.startswith(f"day0-results/{MODEL}/{sha}/cpu-bf16/runs/")
    assert report_key.count(sha) == 1
    assert len(keys_under(client, "models", "day0-results/")) == len(every_key)  # nothing else ran
