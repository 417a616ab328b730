"""Object-store events against a real S3 server (SeaweedFS): completeness, S3/SNS/EventBridge
bodies, and the SeaweedFS filer's own webhook pointed at a receiver."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import quote_plus

import httpx
import pytest

from day0.receiver.completeness import HeaderCache, check_prefix
from day0.receiver.journal import Journal
from day0.receiver.launch import ReceiverThread, free_port
from day0.receiver.settings import CheckpointSettings
from tests.receiver.conftest import SECRETS, make_checkpoint, receiver_settings, upload_order
from tests.receiver.support import runs, settled, wait_until
from tests.receiver.test_events import s3_record

pytestmark = pytest.mark.integration
# one bucket for all: each SeaweedFS bucket is a collection that takes volume slots
BUCKET = "day0-receiver"
S3_AUTH = {"Authorization": f"Bearer {SECRETS['s3_token']}"}


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_completeness_is_decided_by_the_store(s3_server, tmp_path):
    client = s3_server.client()
    bucket = s3_server.create_bucket(BUCKET)
    ck = make_checkpoint(tmp_path / "ck", shards=3)
    rules, cache = CheckpointSettings(), HeaderCache()
    prefix = unique("org/model")
    seen = []
    for name in upload_order(ck):
        client.upload_file(str(ck / name), bucket, f"{prefix}/{name}")
        seen.append(check_prefix(client, bucket, prefix, rules, cache))
    assert [r.detail for r in seen[:-1]] == [
        "waiting for model.safetensors.index.json", "waiting for 3 shards",
        "waiting for 2 shards", "waiting for 1 shard"]
    done = seen[-1]
    assert done.complete and len(done.files) == 5 and len(done.revision) == 16
    # identical bytes uploaded again: same ETags, same revision (the same release)
    client.upload_file(str(ck / "config.json"), bucket, f"{prefix}/config.json")
    assert check_prefix(client, bucket, prefix, rules, cache).revision == done.revision

    # a shard whose bytes stop short of what its header promises is not complete
    shard = sorted(ck.glob("*.safetensors"))[1]
    client.put_object(Bucket=bucket, Key=f"{prefix}/{shard.name}", Body=shard.read_bytes()[:-64])
    partial = check_prefix(client, bucket, prefix, rules, cache)
    assert not partial.complete and "upload incomplete" in partial.detail
    assert check_prefix(client, bucket, prefix, rules.model_copy(update={"verify_headers": False}),
                        cache).complete  # size > 0 is all that is asked without header checks
    # a shard with different content is a different revision
    changed = make_checkpoint(tmp_path / "changed", shards=3, rows=48)
    client.upload_file(str(changed / shard.name), bucket, f"{prefix}/{shard.name}")
    other = check_prefix(client, bucket, prefix, rules, cache)
    assert other.complete and other.revision != done.revision

    extra = check_prefix(client, bucket, prefix, rules.model_copy(update={"require": ["tokenizer.json"]}))
    assert extra.detail == "waiting for tokenizer.json"
    single, single_prefix = make_checkpoint(tmp_path / "single", single=True), unique("single")
    for name in ("config.json", "model.safetensors"):
        client.upload_file(str(single / name), bucket, f"{single_prefix}/{name}")
    assert check_prefix(client, bucket, single_prefix, rules).complete
    assert check_prefix(client, bucket, "nothing-here", rules).detail == (
        "waiting for config.json, model.safetensors.index.json")


def post_s3(url: str, body: dict, headers: dict | None = None, query: str = "") -> httpx.Response:
    return httpx.post(f"{url}/v1/events/s3{query}", content=json.dumps(body).encode(),
                      headers={**S3_AUTH, **(headers or {})}, timeout=30)


def test_s3_records_wait_for_the_last_shard(receiver, deployment, s3_server, tmp_path):
    client = s3_server.client()
    bucket = s3_server.create_bucket(BUCKET)
    ck = make_checkpoint(tmp_path / "ck", shards=3)
    prefix = unique("org/my model")  # a space: S3 URL-encodes keys in events
    answers = []
    for name in upload_order(ck):
        key = f"{prefix}/{name}"
        client.upload_file(str(ck / name), bucket, key)
        size = (ck / name).stat().st_size
        resp = post_s3(receiver.url, {"Records": [s3_record(bucket, quote_plus(key), size)]})
        assert resp.status_code == 202, resp.text
        answers.append(resp.json())
        if name != upload_order(ck)[-1]:
            assert not runs(deployment, f"day0:{prefix}@")
    assert [a["status"] for a in answers] == ["waiting"] * 4 + ["accepted"]
    assert answers[2]["detail"].endswith("waiting for 2 shards")
    revision = answers[-1]["prefixes"][0]["revision"]
    again = post_s3(receiver.url, {"Records": [s3_record(bucket, quote_plus(f"{prefix}/config.json"))]})
    assert again.json()["status"] == "complete"  # redelivery: nothing new
    settled(receiver.url)
    assert runs(deployment, f"day0:{prefix}@") == {
        f"day0:{prefix}@{revision}:cpu-bf16": 1}
    ignored = post_s3(receiver.url, {"Records": [s3_record(bucket, quote_plus(f"{prefix}/README.md"))]})
    assert ignored.status_code == 200 and ignored.json()["status"] == "ignored"


class Listener:
    """A loopback HTTP server that records the GETs it receives (a stand-in for SNS)."""

    def __init__(self):
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"<ConfirmSubscriptionResponse/>")

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def sns(kind: str, **fields) -> dict:
    return {"Type": kind, "MessageId": str(uuid.uuid4()), "TopicArn": "arn:aws:sns:us-east-1:1:day0",
            "Timestamp": "2026-01-01T00:00:00.000Z", "SignatureVersion": "1", "Signature": "x",
            "SigningCertURL": "https://sns.us-east-1.amazonaws.com/cert.pem", **fields}


def test_sns_subscription_confirmation_only_for_allowed_hosts(receiver):
    listener = Listener()
    try:
        allowed = f"http://127.0.0.1:{listener.port}/?Action=ConfirmSubscription&Token=t1"
        header = {"x-amz-sns-message-type": "SubscriptionConfirmation"}
        resp = post_s3(receiver.url, sns("SubscriptionConfirmation", Token="t1", SubscribeURL=allowed),
                       {**S3_AUTH, **header})
        assert resp.status_code == 200 and resp.json()["status"] == "confirmed"
        assert listener.hits == ["/?Action=ConfirmSubscription&Token=t1"]
        for url in (f"http://localhost:{listener.port}/?Token=t2",  # host not in the allow-list
                    "https://sns.evil.example/?Token=t3"):
            resp = post_s3(receiver.url, sns("SubscriptionConfirmation", Token="t", SubscribeURL=url),
                           {**S3_AUTH, **header})
            assert resp.status_code == 202 and resp.json()["status"] == "unconfirmed"
        assert len(listener.hits) == 1  # never called out for those
        bad = post_s3(receiver.url, sns("SubscriptionConfirmation", Token="t", SubscribeURL="http://[::1/"))
        assert bad.status_code == 422 and "not a URL" in bad.json()["detail"]
        unsub = post_s3(receiver.url, sns("UnsubscribeConfirmation", Token="t", SubscribeURL=allowed))
        assert unsub.json()["status"] == "ignored" and len(listener.hits) == 1
    finally:
        listener.close()


def test_sns_notification_with_basic_auth_and_eventbridge(receiver, deployment, s3_server, tmp_path):
    client = s3_server.client()
    bucket = s3_server.create_bucket(BUCKET)
    ck = make_checkpoint(tmp_path / "ck", shards=2)
    prefix = unique("org/sns")
    for name in upload_order(ck):
        client.upload_file(str(ck / name), bucket, f"{prefix}/{name}")
    records = {"Records": [s3_record(bucket, quote_plus(f"{prefix}/{n}")) for n in upload_order(ck)]}
    basic = "Basic " + base64.b64encode(f"sns:{SECRETS['s3_token']}".encode()).decode()
    resp = post_s3(receiver.url, sns("Notification", Message=json.dumps(records)),
                   {"Authorization": basic, "x-amz-sns-message-type": "Notification",
                    "Content-Type": "text/plain; charset=UTF-8"})
    assert resp.status_code == 202 and resp.json()["status"] == "accepted", resp.text
    # SNS without header auth: the token may ride in the query string of the endpoint
    assert post_s3(receiver.url, sns("Notification", Message=json.dumps(records)), headers={
        "Authorization": ""}, query=f"?token={SECRETS['s3_token']}").json()["status"] == "complete"
    # EventBridge (API destination) for a single-file checkpoint
    single = make_checkpoint(tmp_path / "single", single=True)
    eb_prefix = unique("org/eb")
    for name in ("config.json", "model.safetensors"):
        client.upload_file(str(single / name), bucket, f"{eb_prefix}/{name}")
    event = {"version": "0", "id": "1", "detail-type": "Object Created", "source": "aws.s3",
             "detail": {"bucket": {"name": bucket},
                        "object": {"key": f"{eb_prefix}/model.safetensors", "size": 1, "etag": "e"}}}
    assert post_s3(receiver.url, event).json()["status"] == "accepted"
    settled(receiver.url)
    assert sum(runs(deployment, f"day0:{prefix}@").values()) == 1
    assert sum(runs(deployment, f"day0:{eb_prefix}@").values()) == 1


def test_seaweedfs_filer_webhook_submits_after_the_last_shard(deployment, tmp_path):
    """The filer itself POSTs every event (bearer token) to a receiver; uploads go one by one."""
    from tests.s3server import start_s3_server  # raises when weed is missing: the test fails

    port = free_port()
    weed = start_s3_server(tmp_path / "weed", webhook_url=f"http://127.0.0.1:{port}/v1/events/seaweedfs",
                           webhook_token=SECRETS["seaweedfs_token"])
    try:
        settings = receiver_settings(tmp_path, deployment, port=port, s3=weed.receiver_s3())
        with ReceiverThread(settings) as receiver:
            client = weed.client()
            bucket = weed.create_bucket("filer-events")
            ck = make_checkpoint(tmp_path / "ck", shards=3)
            journal = Journal(settings.journal)
            expected = ["waiting for model.safetensors.index.json", "waiting for 3 shards",
                        "waiting for 2 shards", "waiting for 1 shard"]
            for name, detail in zip(upload_order(ck), expected + ["complete"]):
                client.upload_file(str(ck / name), bucket, f"org/m1/{name}")

                def checked(detail=detail):  # the filer's event for this file was handled
                    state = journal.prefix(bucket, "org/m1")
                    return state if state and state.checked == state.generation and \
                        (state.detail or "").startswith(detail) else None

                assert wait_until(checked, timeout_s=20), (name, journal.prefix(bucket, "org/m1"))
                if detail != "complete":
                    assert not runs(deployment, "day0:org/m1@")
            settled(receiver.url)
            revision = journal.prefix(bucket, "org/m1").revision
            assert runs(deployment, "day0:org/m1@") == {
                f"day0:org/m1@{revision}:cpu-bf16": 1}
            (row,) = journal.releases()
            assert row["origin"] == "s3" and row["source"] == f"s3://{bucket}/org/m1"
    finally:
        weed.stop()


@pytest.mark.parametrize("settle_s", [None, 0], ids=["default", "no-window"])
def test_a_name_ordered_upload_is_one_release(deployment, s3_server, tmp_path, settle_s):
    """`aws s3 cp --recursive` order: the index lands before tokenizer.json, so the checkpoint is
    complete one file early. The settle window (checkpoint.settle_s) makes that one release with
    the whole upload's revision, the one a manual run computes; without it the release names
    the partial listing."""
    client = s3_server.client()
    bucket = s3_server.create_bucket(BUCKET)
    ck = make_checkpoint(tmp_path / "ck", shards=2)
    (ck / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    prefix = unique("org/named")
    extra = {} if settle_s is None else {"checkpoint": {"settle_s": settle_s}}
    settings = receiver_settings(tmp_path, deployment, s3=s3_server.receiver_s3(), **extra)
    order = sorted(p.name for p in ck.iterdir())
    assert order.index("model.safetensors.index.json") < order.index("tokenizer.json")
    with ReceiverThread(settings) as receiver:
        answers = []
        for name in order:
            client.upload_file(str(ck / name), bucket, f"{prefix}/{name}")
            answers.append(post_s3(receiver.url, {"Records": [s3_record(
                bucket, quote_plus(f"{prefix}/{name}"))]}).json()["status"])
        settled(receiver.url)
        whole = check_prefix(client, bucket, prefix, CheckpointSettings()).revision
        keys = runs(deployment, f"day0:{prefix}@")
        assert sum(keys.values()) == 1, (answers, keys)
        (released,) = [row["revision"] for row in Journal(settings.journal).releases()]
        if settle_s is None:
            assert answers[-2:] == ["settling", "settling"], answers
            assert released == whole and keys == {f"day0:{prefix}@{whole}:cpu-bf16": 1}, keys
        else:  # what the window prevents: a release of the listing without tokenizer.json
            assert answers[-2:] == ["accepted", "ignored"], answers
            assert released != whole, keys


def test_every_check_that_runs_logs_its_outcome_once(s3_server, tmp_path, caplog):
    """The receiver's log has a line per check, not only per check an event's answer waited
    for: under load the answer says "check pending" and the worker's later pass checks, and
    that pass logs "not complete yet" (docs/releases.md, "The receiver's log"). A check that
    an earlier one already covered runs nothing and logs nothing."""
    from day0.receiver.completeness import Checker

    client = s3_server.client()
    bucket = s3_server.create_bucket(BUCKET)
    ck = make_checkpoint(tmp_path / "ck", shards=2)
    prefix = unique("org/logged")
    journal = Journal(tmp_path / "journal.sqlite")
    checker = Checker(journal, lambda: client, CheckpointSettings(settle_s=0), ["cpu-bf16"])
    *first, last = upload_order(ck)
    for name in first:
        client.upload_file(str(ck / name), bucket, f"{prefix}/{name}")
    caplog.set_level("INFO", logger="day0.receiver")
    (gen,) = journal.record_objects([(bucket, prefix)]).values()
    checker.ensure_checked(bucket, prefix, gen)
    checker.ensure_checked(bucket, prefix, gen)  # covered: nothing runs
    client.upload_file(str(ck / last), bucket, f"{prefix}/{last}")
    (gen,) = journal.record_objects([(bucket, prefix)]).values()
    state, fresh = checker.ensure_checked(bucket, prefix, gen)
    lines = [r.getMessage() for r in caplog.records if prefix in r.getMessage()]
    assert lines == [f"s3://{bucket}/{prefix} not complete yet: waiting for 1 shard",
                     f"s3://{bucket}/{prefix} complete (revision {state.revision}): 1 new "
                     "release(s)"], lines
    assert fresh == [True]
