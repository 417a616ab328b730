"""Release webhooks against a real receiver (uvicorn on loopback) and a real Prefect server."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.receiver.conftest import SECRETS
from tests.receiver.loadgen import Delivery, send_all
from tests.receiver.support import ADMIN, journal_stats, post_release, runs, settled, wait_until

pytestmark = pytest.mark.integration


def release(model: str, revision: str = "0123abcd", **extra) -> dict:
    return {"model": model, "revision": revision, "source": f"s3://models/{model}", **extra}


def test_signed_release_starts_exactly_one_run(receiver, deployment):
    resp = post_release(receiver.url, release("wh/one", targets=["cpu-bf16", "cpu-fp32"]))
    assert resp.status_code == 202, resp.text
    assert resp.json()["status"] == "accepted"
    assert float(resp.headers["server-timing"].split("dur=")[1]) >= 0
    settled(receiver.url)
    assert runs(deployment, "day0:wh/one@") == {"day0:wh/one@0123abcd:cpu-bf16": 1,
                                                 "day0:wh/one@0123abcd:cpu-fp32": 1}
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterIdempotencyKey

    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            idempotency_key=FlowRunFilterIdempotencyKey(any_=["day0:wh/one@0123abcd:cpu-bf16"])))
        assert run.state.type.value == "SCHEDULED" and run.deployment_id == deployment.id
        assert run.parameters == {"source": "s3://models/wh/one", "target": "cpu-bf16",
                                  "model": "wh/one", "revision": "0123abcd"}
        assert {"day0", "release", "origin:webhook"} <= set(run.tags)


def test_release_event_is_in_the_prefect_feed(receiver, deployment):
    from prefect import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    assert post_release(receiver.url, release("wh/evented")).status_code == 202
    settled(receiver.url)
    flt = EventFilter(event=EventNameFilter(name=["day0.release.accepted"]),
                      resource=EventResourceFilter(id=["day0.release.wh/evented"]))

    def events():
        with get_client(sync_client=True) as client:
            return client.read_events(filter=flt, limit=10).events

    found = wait_until(events, timeout_s=20, interval_s=0.5)
    assert found, "no day0.release.accepted event reached the Prefect server"
    (event,) = found
    assert event.resource["day0.revision"] == "0123abcd"
    assert any(r.role == "flow-run" for r in event.related)


def test_duplicates_sequential_and_concurrent_make_one_run(receiver, deployment):
    codes = [post_release(receiver.url, release("wh/dup-seq")).status_code for _ in range(10)]
    assert codes.count(202) == 1 and codes.count(200) == 9
    body = json.dumps(release("wh/dup-conc")).encode()
    deliveries = [Delivery("duplicate", body, ("wh/dup-conc", "0123abcd"), SECRETS["release_hmac"])
                  for _ in range(50)]
    asyncio.run(send_all(receiver.url, deliveries, concurrency=50, deadline_s=60))
    statuses = [d.status for d in deliveries]
    assert statuses.count(202) == 1 and statuses.count(200) == 49, statuses
    settled(receiver.url)
    assert runs(deployment, "day0:wh/dup-") == {"day0:wh/dup-seq@0123abcd:cpu-bf16": 1,
                                                 "day0:wh/dup-conc@0123abcd:cpu-bf16": 1}


def _big(n: int) -> bytes:
    return json.dumps(release("wh/bad-big", source="x" * n)).encode()


@pytest.mark.parametrize("case,status,why", [
    ("wrong_secret", 401, "invalid signature"),
    ("stale", 401, "stale timestamp"),
    ("future", 401, "in the future"),
    ("unsigned", 401, "missing X-Day0-Signature"),
    ("oversize", 413, "larger than"),
    ("oversize_undeclared", 413, "larger than"),
    ("malformed", 400, "malformed JSON"),
    ("not_utf8", 400, "malformed JSON"),
    ("schema", 422, "revision"),
    ("unknown_target", 422, "unknown target"),
    ("hub_wrong_secret", 401, "invalid X-Webhook-Secret"),
])
def test_bad_requests_get_4xx_and_start_nothing(receiver, deployment, case, status, why):
    url = f"{receiver.url}/v1/webhooks/release"
    before = journal_stats(receiver.url)["releases"]
    good = release(f"wh/bad-{case}")
    if case == "wrong_secret":
        resp = post_release(receiver.url, good, secret="not-the-secret")
    elif case == "stale":
        resp = post_release(receiver.url, good, ts=int(time.time()) - 301)
    elif case == "future":
        resp = post_release(receiver.url, good, ts=int(time.time()) + 3600)
    elif case == "unsigned":
        resp = httpx.post(url, json=good)
    elif case == "oversize":
        resp = post_release(receiver.url, _big(70_000))
    elif case == "oversize_undeclared":  # chunked: no Content-Length to refuse up front
        from day0.receiver.auth import sign

        body = _big(70_000)
        resp = httpx.post(url, content=iter([body[:1000], body[1000:]]), headers=sign(
            SECRETS["release_hmac"], body))
    elif case == "malformed":
        resp = post_release(receiver.url, b'{"model": "wh/bad-malformed", ')
    elif case == "not_utf8":
        resp = post_release(receiver.url, b'{"model": "\xff\xfe"}')
    elif case == "schema":
        resp = post_release(receiver.url, {**good, "revision": "../x"})  # a revision is optional
    elif case == "unknown_target":
        resp = post_release(receiver.url, {**good, "targets": ["cpu-bf61"]})
    else:
        hub = {"event": {"action": "update", "scope": "repo.content"},
               "repo": {"type": "model", "name": "wh/bad-hub", "headSha": "a" * 40}}
        resp = httpx.post(url, json=hub, headers={"X-Webhook-Secret": "guess"})
    assert resp.status_code == status, resp.text
    assert why in resp.json()["detail"]
    assert journal_stats(receiver.url)["releases"] == before  # nothing journaled
    time.sleep(0.3)  # a wrongly queued submission would have been made by now
    assert not runs(deployment, f"day0:wh/bad-{case}")


def test_hugging_face_hub_webhook(receiver, deployment):
    url = f"{receiver.url}/v1/webhooks/release"
    sha = "9" * 40
    hook = {"event": {"action": "update", "scope": "repo.content"},
            "repo": {"type": "model", "name": "acme/hub-model", "id": "x", "headSha": sha,
                     "url": {"web": "https://huggingface.co/acme/hub-model"}},
            "webhook": {"id": "abc", "version": 3},
            "updatedRefs": [{"ref": "refs/heads/main", "oldSha": "1" * 40, "newSha": sha}]}
    headers = {"X-Webhook-Secret": SECRETS["hf_webhook"]}
    first = httpx.post(url, json=hook, headers=headers)
    assert first.status_code == 202 and first.json()["status"] == "accepted"
    assert httpx.post(url, json=hook, headers=headers).json()["status"] == "duplicate"
    dev = {**hook, "updatedRefs": [{"ref": "refs/heads/dev", "oldSha": sha, "newSha": "2" * 40}]}
    ignored = httpx.post(url, json=dev, headers=headers)
    assert ignored.status_code == 200 and ignored.json()["status"] == "ignored"
    settled(receiver.url)
    assert runs(deployment, "day0:acme/hub-model@") == {f"day0:acme/hub-model@{sha}:cpu-bf16": 1}


def test_every_endpoint_requires_credentials(receiver):
    base = receiver.url
    assert httpx.get(f"{base}/healthz").status_code == 401
    assert httpx.get(f"{base}/healthz", headers={"Authorization": "Bearer nope"}).status_code == 401
    health = httpx.get(f"{base}/healthz", headers=ADMIN)
    assert health.status_code == 200 and health.json()["worker_alive"] is True
    records = {"Records": []}
    assert httpx.post(f"{base}/v1/events/s3", json=records).status_code == 401
    assert httpx.post(f"{base}/v1/events/s3", json=records,
                      headers={"Authorization": f"Bearer {SECRETS['seaweedfs_token']}"}).status_code == 401
    assert httpx.post(f"{base}/v1/events/seaweedfs", json={}).status_code == 401
    assert httpx.post(f"{base}/v1/events/seaweedfs", json={},
                      headers={"Authorization": f"Bearer {SECRETS['s3_token']}"}).status_code == 401
    # authenticated but bad: 4xx with a reason, never 5xx
    s3 = {"Authorization": f"Bearer {SECRETS['s3_token']}"}
    assert httpx.post(f"{base}/v1/events/s3", json=records, headers=s3).status_code == 422
    assert httpx.post(f"{base}/v1/events/s3", content=b"x" * 70_000, headers=s3).status_code == 413
    assert httpx.post(f"{base}/v1/events/s3", content=b"\x00", headers=s3).status_code == 400


def test_public_healthz_shows_status_only(deployment, tmp_path):
    from day0.receiver.launch import ReceiverThread
    from tests.receiver.conftest import receiver_settings

    settings = receiver_settings(tmp_path, deployment, public_healthz=True)
    with ReceiverThread(settings) as receiver:
        assert httpx.get(f"{receiver.url}/healthz").json() == {"status": "ok"}
        assert "journal" in httpx.get(f"{receiver.url}/healthz", headers=ADMIN).json()
        # the webhooks stay closed without their secrets
        assert httpx.post(f"{receiver.url}/v1/webhooks/release", json={}).status_code == 401
