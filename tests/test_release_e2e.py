"""Issue-3 path end to end, all real and on loopback: SeaweedFS (filer webhook) -> receiver ->
Prefect server -> served `validate` deployment -> report in the bucket and as a Prefect artifact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from day0.receiver.auth import sign
from day0.receiver.launch import ReceiverProcess, free_port, write_config
from tests.procs import stop_group
from tests.conftest import MODELS
from tests.runs import wait_final

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DEPLOYMENT = "validate/day0-e2e"
TOKEN, SECRET, ADMIN = "filer-token-e2e", "release-secret-e2e", "admin-e2e"
# its own model name: Prefect keeps idempotency keys per flow, and test_one_identity releases
# acme/tiny-llama with the same weights (the same identity) into the same session server
BUCKET, PREFIX = "models", "acme/e2e-llama"


def flow_runs():
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=[deployment.id])))



@pytest.fixture(scope="module")
def stack(prefect_server, tmp_path_factory):
    from tests.s3server import start_s3_server  # raises when weed is missing: the test fails

    root = tmp_path_factory.mktemp("e2e")
    port = free_port()
    s3 = start_s3_server(root / "weed", webhook_url=f"http://127.0.0.1:{port}/v1/events/seaweedfs",
                         webhook_token=TOKEN)
    env = {**os.environ, **s3.env(), "PREFECT_API_URL": prefect_server,
           "DAY0_CACHE_DIR": str(root / "cache")}
    with open(root / "serve.log", "wb") as log:
        served = subprocess.Popen([sys.executable, "-m", "day0.cli", "serve", "--name", "day0-e2e"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    config = write_config(root / "receiver.yaml", {
        "deployment": DEPLOYMENT, "targets": ["cpu-bf16"], "journal": str(root / "journal.sqlite"),
        "secrets": {"seaweedfs_token": TOKEN, "release_hmac": SECRET, "admin_token": ADMIN}})
    receiver = ReceiverProcess(config, port=port, env=env, admin_token=ADMIN).start()
    s3.create_bucket(BUCKET)
    try:
        with s3.exported():  # this process reads the bucket too
            yield s3, receiver, root
    finally:
        receiver.stop()
        stop_group(served)
        s3.stop()


def test_upload_shard_by_shard_starts_exactly_one_run_after_the_last(stack):
    s3, receiver, root = stack
    client = s3.client()
    files = sorted(p for p in (MODELS / "tiny-llama").iterdir() if p.is_file())
    shards = [p for p in files if p.suffix == ".safetensors"]
    for path in [p for p in files if p not in shards] + shards[:-1]:
        client.upload_file(str(path), BUCKET, f"{PREFIX}/{path.name}")
    time.sleep(3)  # let the filer deliver every event of the partial upload
    assert flow_runs() == [], "a run started before the checkpoint was complete"
    client.upload_file(str(shards[-1]), BUCKET, f"{PREFIX}/{shards[-1].name}")
    # the last shard's event, its completeness check and the submission, on a loaded 2-core box
    deadline = time.monotonic() + 180
    while not flow_runs() and time.monotonic() < deadline:
        time.sleep(1)
    runs = flow_runs()
    assert len(runs) == 1 and runs[0].parameters["source"] == f"s3://{BUCKET}/{PREFIX}"
    run = wait_final(runs[0].id)
    assert run.state.is_completed(), (root / "serve.log").read_text()[-3000:]
    report = run.state.result()
    assert report["verdict"] == "PASS"
    time.sleep(3)
    assert len(flow_runs()) == 1  # late or repeated events start nothing more
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="day0-results/")["Contents"]]
    assert any("/cpu-bf16/runs/" in k and k.endswith("/report.json") for k in keys), keys
    stored = json.loads(client.get_object(Bucket=BUCKET, Key=next(k for k in keys if k.endswith("report.json")))["Body"].read())
    assert stored["verdict"] == "PASS"
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as pc:
        artifacts = pc.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    assert any((a.key or "").startswith("day0-report-") for a in artifacts), [a.key for a in artifacts]


def test_signed_release_webhook_and_rejections(stack):
    s3, receiver, root = stack
    url = f"{receiver.url}/v1/webhooks/release"
    before = len(flow_runs())
    body = json.dumps({"model": "acme/tiny-llama", "revision": "r2", "source": f"s3://{BUCKET}/{PREFIX}"}).encode()
    bad = [
        (body, sign("wrong-secret", body)),
        (body, sign(SECRET, body, timestamp=int(time.time()) - 3600)),
        (b"{" * (2 << 20), sign(SECRET, b"{" * (2 << 20))),
        (b'{"model": ', sign(SECRET, b'{"model": ')),
    ]
    codes = [httpx.post(url, content=b, headers=h, timeout=30).status_code for b, h in bad]
    assert [c // 100 for c in codes] == [4, 4, 4, 4] and codes[0] == 401 and codes[2] == 413, codes
    assert len(flow_runs()) == before
    for _ in range(3):  # a retried delivery is the same release
        assert httpx.post(url, content=body, headers=sign(SECRET, body), timeout=30).status_code in (200, 202)
    deadline = time.monotonic() + 180
    while len(flow_runs()) == before and time.monotonic() < deadline:
        time.sleep(1)
    runs = [r for r in flow_runs() if r.parameters.get("revision") == "r2"]
    assert len(runs) == 1
    run = wait_final(runs[0].id)
    assert run.state.is_completed() and run.state.result()["verdict"] == "PASS"
