"""What each sender POSTs, parsed and normalised (no server needed)."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote_plus

import pytest

from day0.receiver.events import (BadRequest, ObjectEvent, parse_hf, parse_json, parse_release,
                                  parse_s3, parse_seaweedfs)


def s3_record(bucket: str, key: str, size: int = 10, name: str = "ObjectCreated:Put") -> dict:
    """A record as AWS S3 sends it (key URL-encoded, ETag without quotes)."""
    return {"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
            "eventTime": "2026-01-01T00:00:00.000Z", "eventName": name,
            "userIdentity": {"principalId": "AWS:X"}, "requestParameters": {"sourceIPAddress": "1.2.3.4"},
            "responseElements": {"x-amz-request-id": "R", "x-amz-id-2": "I"},
            "s3": {"s3SchemaVersion": "1.0", "configurationId": "day0",
                   "bucket": {"name": bucket, "ownerIdentity": {"principalId": "O"},
                              "arn": f"arn:aws:s3:::{bucket}"},
                   "object": {"key": key, "size": size, "eTag": "0123abcd", "sequencer": "0A1B"}}}


def test_aws_records_decode_keys_and_skip_removals():
    body = {"Records": [s3_record("models", "org/my+model%2Bv2/config.json"),
                        s3_record("models", "org/x/old.safetensors", name="ObjectRemoved:Delete")]}
    payload = parse_s3(body)
    assert payload.objects == [ObjectEvent("models", "org/my model+v2/config.json", 10, "0123abcd")]
    assert payload.sns is None and payload.ignored is None


def test_minio_webhook_body():
    rec = s3_record("models", "org/m/model-00001-of-00002.safetensors", name="s3:ObjectCreated:Put")
    rec["s3"]["object"]["eTag"] = '"quoted"'
    payload = parse_s3({"EventName": "s3:ObjectCreated:Put", "Key": "models/org/m/x", "Records": [rec]})
    assert payload.objects[0].key == "org/m/model-00001-of-00002.safetensors"
    assert payload.objects[0].etag == "quoted"


def test_only_removals_are_ignored_not_rejected():
    payload = parse_s3({"Records": [s3_record("b", "k", name="ObjectRemoved:Delete")]})
    assert payload.objects == [] and "no ObjectCreated" in payload.ignored


def test_sns_notification_wraps_records_and_control_messages_pass_through():
    inner = json.dumps({"Records": [s3_record("b", "p/config.json")]})
    note = parse_s3({"Type": "Notification", "MessageId": "1", "TopicArn": "arn:t", "Message": inner,
                     "Timestamp": "2026-01-01T00:00:00Z", "SignatureVersion": "1"})
    assert note.objects == [ObjectEvent("b", "p/config.json", 10, "0123abcd")]
    assert note.sns.TopicArn == "arn:t"
    confirm = parse_s3({"Type": "SubscriptionConfirmation", "Token": "t", "TopicArn": "arn:t",
                        "SubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription"})
    assert confirm.objects == [] and confirm.sns.Type == "SubscriptionConfirmation"
    test_event = parse_s3({"Type": "Notification", "Message": json.dumps(
        {"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "b"})})
    assert test_event.ignored == "s3:TestEvent"


def test_eventbridge_object_created():
    ev = {"version": "0", "id": "x", "detail-type": "Object Created", "source": "aws.s3",
          "account": "1", "time": "t", "region": "r", "resources": [],
          "detail": {"version": "0", "bucket": {"name": "b"},
                     "object": {"key": "p/q/model.safetensors", "size": 5, "etag": "e-2"},
                     "reason": "PutObject"}}
    assert parse_s3(ev).objects == [ObjectEvent("b", "p/q/model.safetensors", 5, "e-2")]
    assert parse_s3({**ev, "detail-type": "Object Deleted"}).ignored


@pytest.mark.parametrize("body,status,why", [
    ([1, 2], 422, "JSON object"),
    ({"Records": []}, 422, "Records"),
    ({"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {}}}]}, 422, "s3.bucket.name"),
    ({"Type": "Notification"}, 422, "without Message"),
    ({"Type": "Notification", "Message": "{not json"}, 400, "malformed JSON"),
    ({"hello": "world"}, 422, "not an S3 event"),
    ({"Records": [s3_record("a/b", "k/config.json")]}, 422, "s3.bucket.name"),
])
def test_bad_s3_bodies(body, status, why):
    with pytest.raises(BadRequest) as err:
        parse_s3(body)
    assert err.value.status == status and why in err.value.reason


def filer_event(key: str, event_type: str = "create", *, directory: bool = False, size: int = 7,
                etag: str | None = "bb6cd8", parent: str | None = None) -> dict:
    """What the SeaweedFS 4.x filer POSTs (see tests/s3server.py)."""
    name = key.rsplit("/", 1)[1]
    entry = {"name": name, "chunks": [{"size": size, "e_tag": "x"}],
             "attributes": {"file_size": size, "mtime": 1795951709, "file_mode": 432}}
    if directory:
        entry = {"name": name, "is_directory": True, "attributes": {"mtime": 1}}
    if etag:
        entry["extended"] = {"Seaweed-X-Amz-ETag": base64.b64encode(etag.encode()).decode()}
    message = {"new_entry": entry, "delete_chunks": False,
               "new_parent_path": parent or key.rsplit("/", 1)[0], "signatures": [-222949030]}
    if event_type in ("update", "delete"):
        message["old_entry"] = dict(entry)
    if event_type == "delete":
        del message["new_entry"]
    return {"event_type": event_type, "key": key, "message": message}


def test_seaweedfs_filer_events():
    events, why = parse_seaweedfs(filer_event("/buckets/models/org/m1/config.json"), "/buckets")
    assert why is None and events == [ObjectEvent("models", "org/m1/config.json", 7, "bb6cd8")]
    events, _ = parse_seaweedfs(filer_event("/buckets/models/org/m1/config.json", "update"), "/buckets")
    assert events[0].key == "org/m1/config.json"
    renamed = filer_event("/buckets/models/tmp/a.safetensors", "rename", parent="/buckets/models/org/m2")
    renamed["message"]["old_entry"] = {"name": "a.safetensors"}
    events, _ = parse_seaweedfs(renamed, "/buckets")
    assert events[0].key == "org/m2/a.safetensors"
    for body, reason in [
        (filer_event("/buckets/models/org/m1", directory=True), "directory"),
        (filer_event("/buckets/models/org/m1/config.json", "delete"), "does not create"),
        (filer_event("/buckets/models/.uploads/abc/0001.part"), "multipart"),
        (filer_event("/buckets/.system/x/y"), "not an object"),
        (filer_event("/elsewhere/f/config.json"), "not under /buckets"),
    ]:
        events, why = parse_seaweedfs(body, "/buckets")
        assert events == [] and reason in why


def test_seaweedfs_schema_errors():
    with pytest.raises(BadRequest) as err:
        parse_seaweedfs({"event_type": "create", "message": {}}, "/buckets")
    assert err.value.status == 422 and "key" in err.value.reason


def hub_payload(**repo) -> dict:
    return {"event": {"action": "update", "scope": "repo.content"},
            "repo": {"type": "model", "name": "acme/llm-7b", "id": "1", "private": False,
                     "headSha": "a" * 40, **repo},
            "webhook": {"id": "w", "version": 3},
            "updatedRefs": [{"ref": "refs/heads/main", "oldSha": "b" * 40, "newSha": "c" * 40},
                            {"ref": "refs/heads/dev", "oldSha": "b" * 40, "newSha": "d" * 40}]}


def test_hub_webhook_takes_watched_branches():
    releases, why = parse_hf(hub_payload(), ["main"], ["model"], "s3://mirror/{repo}/{revision}")
    assert why is None and len(releases) == 1
    rel = releases[0]
    assert (rel.model, rel.revision, rel.source) == ("acme/llm-7b", "c" * 40, f"s3://mirror/acme/llm-7b/{'c' * 40}")
    no_refs = {**hub_payload(), "updatedRefs": None}
    assert parse_hf(no_refs, ["main"], ["model"], "{repo}")[0][0].revision == "a" * 40


@pytest.mark.parametrize("change,reason", [
    ({"event": {"action": "create", "scope": "discussion"}}, "not a content update"),
    ({"repo": {"type": "dataset", "name": "acme/d"}}, "not watched"),
    ({"updatedRefs": [{"ref": "refs/heads/dev", "newSha": "d" * 40}]}, "watched branch"),
    ({"updatedRefs": [{"ref": "refs/heads/main", "oldSha": "b" * 40, "newSha": None}]}, "watched branch"),
])
def test_hub_webhooks_that_are_not_releases(change, reason):
    releases, why = parse_hf({**hub_payload(), **change}, ["main"], ["model"], "{repo}")
    assert releases == [] and reason in why


def test_hub_schema_errors():
    with pytest.raises(BadRequest, match="repo"):
        parse_hf({"event": {"action": "update", "scope": "repo.content"}}, ["main"], ["model"], "{repo}")
    with pytest.raises(BadRequest, match="newSha"):
        parse_hf({**hub_payload(), "updatedRefs": [{"ref": "refs/heads/main", "newSha": "zz"}]},
                 ["main"], ["model"], "{repo}")


def test_generic_release_schema():
    rel = parse_release({"model": "acme/m", "revision": "v1.0", "source": "s3://b/p",
                         "targets": ["cpu-bf16", "cpu-bf16", "cpu-fp32"]})
    assert rel.targets == ("cpu-bf16", "cpu-fp32") and rel.origin == "webhook"
    for bad, why in [({"model": "m", "revision": "r"}, "source"),
                     ({"model": "m", "revision": "r", "source": "s", "extra": 1}, "extra"),
                     ({"model": "m", "revision": "../x", "source": "s"}, "revision"),
                     ({"model": " m", "revision": "r", "source": "s"}, "model"),
                     ({"model": "m", "revision": "r", "source": "s", "targets": []}, "targets")]:
        with pytest.raises(BadRequest, match=why) as err:
            parse_release(bad)
        assert err.value.status == 422


@pytest.mark.parametrize("raw", [b"", b"  ", b"{", b"\xff\xfe", b"[" * 100000])
def test_malformed_json_is_400(raw):
    with pytest.raises(BadRequest) as err:
        parse_json(raw)
    assert err.value.status == 400


@pytest.mark.parametrize("key", [
    "models/../../etc/config.json", "org/./m/config.json", "org//m/config.json",
    "/abs/config.json", "org/m\n2026-01-01 INFO forged/config.json", "org/m\x00/config.json",
    "org\\..\\m/config.json", "org/\u202em/config.json"])
def test_unsafe_object_keys_are_422_in_every_shape(key):
    bodies = [
        {"Records": [s3_record("models", quote_plus(key))]},
        {"detail-type": "Object Created", "source": "aws.s3",
         "detail": {"bucket": {"name": "models"}, "object": {"key": key}}},
    ]
    for body in bodies:
        with pytest.raises(BadRequest) as err:
            parse_s3(body)
        assert err.value.status == 422 and "object key" in err.value.reason
        assert "\n" not in err.value.reason  # the reason is shown and logged: one line
    with pytest.raises(BadRequest) as err:
        parse_seaweedfs(filer_event(f"/buckets/models/{key}"), "/buckets")
    assert err.value.status == 422


def test_folder_markers_are_ignored_not_refused():
    assert parse_s3({"Records": [s3_record("models", "org/m1/")]}).ignored == "no ObjectCreated records"


@pytest.mark.parametrize("name", ["acme/../../etc", "../x", "acme/x\ny", "/acme/x"])
def test_unsafe_model_and_repo_names_are_422(name):
    with pytest.raises(BadRequest) as err:
        parse_release({"model": name, "revision": "r1", "source": "s3://models/m"})
    assert err.value.status == 422 and "model" in err.value.reason
    hub = {**hub_payload(), "repo": {"type": "model", "name": name, "headSha": "a" * 40}}
    with pytest.raises(BadRequest) as err:
        parse_hf(hub, ["main"], ["model"], "s3://mirror/{repo}/{revision}")
    assert err.value.status == 422 and "repo" in err.value.reason


@pytest.mark.parametrize("source,why", [
    ("/etc", "not under release_sources"),
    ("file:///etc/passwd", "s3://BUCKET/PREFIX or an absolute folder"),
    ("http://169.254.169.254/latest/meta-data", "s3://BUCKET/PREFIX or an absolute folder"),
    ("s3://models/../secrets", "'..' segment"),
    ("s3://other-bucket/m", "not under release_sources"),
    ("s3://models-evil/m", "not under release_sources"),  # a prefix of the name is not the bucket
    ("//host/share", "absolute folder"),
])
def test_release_sources_are_restricted(source, why):
    allowed = ["s3://models", "/srv/checkpoints"]
    with pytest.raises(BadRequest) as err:
        parse_release({"model": "m", "revision": "r", "source": source}, allowed)
    assert err.value.status == 422 and why in err.value.reason
    for ok in ("s3://models", "s3://models/acme/m1", "/srv/checkpoints/acme"):
        assert parse_release({"model": "m", "revision": "r", "source": ok}, allowed).source == ok
    assert parse_release({"model": "m", "revision": "r", "source": "s3://any/x"}, ["s3://*"])


def test_json_key_bound_is_checked_before_parsing():
    body = json.dumps({f"k{i}": 0 for i in range(50)}).encode()
    assert parse_json(body, max_keys=50) == {f"k{i}": 0 for i in range(50)}
    with pytest.raises(BadRequest) as err:
        parse_json(body, max_keys=49)
    assert err.value.status == 413 and "more than 49 keys" in err.value.reason
