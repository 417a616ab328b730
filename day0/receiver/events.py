"""What senders POST, as pydantic schemas, normalised to `ObjectEvent` and `Release`.

Accepted shapes (unknown extra fields are ignored, missing required ones are a 422):
- S3 event notifications ``{"Records": [{"eventName", "s3": {"bucket": {"name"}, "object":
  {"key", "size", "eTag"}}}]}`` as AWS S3 and MinIO send them (MinIO adds EventName/Key);
  object keys are URL-encoded by both, so they are decoded here.
- the SNS HTTP envelope ``{"Type": "Notification" | "SubscriptionConfirmation" | ..., "Message"}``
  whose Message is one of the S3 shapes;
- EventBridge ``{"detail-type": "Object Created", "source": "aws.s3", "detail": {...}}``;
- the SeaweedFS filer webhook ``{"key": "/buckets/b/k", "event_type": "create", "message":
  {"old_entry", "new_entry": {"name", "is_directory", "attributes": {"file_size"}}, "new_parent_path"}}``;
- Hugging Face Hub webhooks ``{"event": {"action", "scope"}, "repo": {"type", "name", "headSha"},
  "updatedRefs": [{"ref", "oldSha", "newSha"}]}``;
- the generic signed release ``{"model", "revision"?, "source", "targets"?}``; without a
  revision the receiver names it as a manual run of its source would (day0.store.identity).

Every object key, model name and source passes day0.receiver.safety's grammar (no '..', no
absolute key, no control character) or the whole body is a 422 and nothing is journaled.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from day0.errors import BadRequest  # in day0.errors' tree; imported from here too
from day0.receiver.safety import BUCKET, check_name, parse_source, under


@dataclass(frozen=True)
class ObjectEvent:
    """One object written to a bucket."""

    bucket: str
    key: str
    size: int | None = None
    etag: str | None = None


@dataclass(frozen=True)
class Release:
    """A model revision to validate; `targets` None means the receiver's default targets;
    `revision` None (a signed release that gives none) is resolved from the source before it
    is journaled (day0.receiver.app)."""

    model: str
    revision: str | None
    source: str
    origin: str
    targets: tuple[str, ...] | None = None


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---- S3 (AWS, MinIO), SNS, EventBridge -----------------------------------------------------

class S3Object(_Lenient):
    key: str = Field(min_length=1, max_length=4096)
    size: int | None = Field(None, ge=0)
    eTag: str | None = None


class S3Bucket(_Lenient):
    name: str = Field(min_length=1, max_length=255, pattern=BUCKET)


class S3Entity(_Lenient):
    bucket: S3Bucket
    object: S3Object


class S3Record(_Lenient):
    eventName: str = Field(min_length=1)
    s3: S3Entity


class S3Notification(_Lenient):
    Records: list[S3Record] = Field(min_length=1, max_length=10000)


class SnsEnvelope(_Lenient):
    Type: str
    MessageId: str | None = None
    TopicArn: str | None = None
    Message: str | None = None
    SubscribeURL: str | None = None
    Token: str | None = None


class EbObject(_Lenient):
    key: str = Field(min_length=1, max_length=4096)
    size: int | None = Field(None, ge=0)
    etag: str | None = None


class EbDetail(_Lenient):
    bucket: S3Bucket
    object: EbObject


class EventBridgeEvent(_Lenient):
    detail_type: str = Field(alias="detail-type")
    source: str
    detail: EbDetail


def _validate(model: type[BaseModel], data: Any, what: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(422, f"not a valid {what}: {_reasons(exc)}") from None


def _reasons(exc: ValidationError, limit: int = 5) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_json(body: bytes, max_keys: int | None = None) -> Any:
    """Bytes -> JSON value, or BadRequest(400); 413 for more than `max_keys` ':' (each key has
    one, so this bounds the keys and the work of parsing and validating, before parsing)."""
    if not body.strip():
        raise BadRequest(400, "empty body")
    if max_keys is not None and body.count(b":") > max_keys:
        raise BadRequest(413, f"JSON with more than {max_keys} keys")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(400, f"malformed JSON: {str(exc).splitlines()[0][:200]}") from None


@dataclass
class S3Payload:
    """What an /v1/events/s3 body means: object events, an SNS control message, or a test."""

    objects: list[ObjectEvent]
    sns: SnsEnvelope | None = None
    ignored: str | None = None


def parse_s3(data: Any, sns_type_header: str | None = None) -> S3Payload:
    """Dispatch on the shape of the body (S3 records, SNS envelope, EventBridge, S3 test event)."""
    if not isinstance(data, dict):
        raise BadRequest(422, "expected a JSON object")
    if "Type" in data or sns_type_header:
        sns = _validate(SnsEnvelope, data, "SNS message")
        if sns.Type != "Notification":
            return S3Payload(objects=[], sns=sns)
        if sns.Message is None:
            raise BadRequest(422, "SNS Notification without Message")
        inner = parse_s3(parse_json(sns.Message.encode()))
        if inner.sns is not None:
            raise BadRequest(422, "nested SNS envelope")
        inner.sns = sns
        return inner
    if "Records" in data:
        note = _validate(S3Notification, data, "S3 event notification")
        objects = []
        for i, r in enumerate(note.Records):
            key = unquote_plus(r.s3.object.key)
            if "ObjectCreated" in r.eventName and not key.endswith("/"):  # '/': folder marker
                objects.append(ObjectEvent(bucket=r.s3.bucket.name, key=_key(key, f"Records.{i}"),
                                           size=r.s3.object.size, etag=_etag(r.s3.object.eTag)))
        return S3Payload(objects=objects, ignored=None if objects else "no ObjectCreated records")
    if "detail-type" in data:
        ev = _validate(EventBridgeEvent, data, "EventBridge event")
        if ev.source != "aws.s3" or ev.detail_type != "Object Created":
            return S3Payload(objects=[], ignored=f"{ev.source} {ev.detail_type!r} is not 'Object Created'")
        # EventBridge keys are not URL-encoded (unlike S3 notification records)
        obj = ev.detail.object
        if obj.key.endswith("/"):
            return S3Payload(objects=[], ignored="folder marker")
        key = _key(obj.key, "detail")
        return S3Payload(objects=[ObjectEvent(ev.detail.bucket.name, key, obj.size, _etag(obj.etag))])
    if data.get("Event") == "s3:TestEvent":
        return S3Payload(objects=[], ignored="s3:TestEvent")
    raise BadRequest(422, "not an S3 event: expected Records, an SNS envelope or an EventBridge event")


def _etag(value: str | None) -> str | None:
    return value.strip('"') if value else None


def _key(key: str, where: str) -> str:
    try:
        return check_name(key, f"{where}: object key {key[:200]!r}")
    except ValueError as exc:
        raise BadRequest(422, str(exc)) from None


# ---- SeaweedFS filer webhook ---------------------------------------------------------------

class SwAttributes(_Lenient):
    file_size: int | None = Field(None, ge=0)


class SwEntry(_Lenient):
    name: str = ""
    is_directory: bool = False
    attributes: SwAttributes | None = None
    extended: dict[str, str] | None = None  # values are base64 (Go []byte)

    def s3_etag(self) -> str | None:
        raw = (self.extended or {}).get("Seaweed-X-Amz-ETag")
        try:
            return base64.b64decode(raw, validate=True).decode().strip('"') if raw else None
        except (ValueError, UnicodeDecodeError):
            return None


class SwMessage(_Lenient):
    old_entry: SwEntry | None = None
    new_entry: SwEntry | None = None
    new_parent_path: str | None = None


class SeaweedNotification(_Lenient):
    key: str = Field(min_length=1, max_length=4096)
    event_type: str = Field(min_length=1)
    message: SwMessage


def parse_seaweedfs(data: Any, buckets_dir: str) -> tuple[list[ObjectEvent], str | None]:
    """The filer's notification -> object events under the S3 buckets folder (or why ignored)."""
    if not isinstance(data, dict):
        raise BadRequest(422, "expected a JSON object")
    if "message" not in data and "message_data" in data:  # json tag of the Go struct field
        data = {**data, "message": data["message_data"]}
    note = _validate(SeaweedNotification, data, "SeaweedFS filer notification")
    entry = note.message.new_entry
    if note.event_type not in ("create", "update", "rename") or entry is None:
        return [], f"event_type {note.event_type} does not create an object"
    if entry.is_directory:
        return [], "directory entry"
    path = note.key
    if note.message.new_parent_path and entry.name:
        path = note.message.new_parent_path.rstrip("/") + "/" + entry.name
    root = buckets_dir.rstrip("/") + "/"
    if not path.startswith(root):
        return [], f"{path[:300]!r} is not under {buckets_dir}"
    bucket, _, key = path[len(root):].partition("/")
    if not bucket or not key or not re.match(BUCKET, bucket):  # /buckets/.system/ is internal
        return [], f"{path[:300]!r} is not an object in a bucket"
    if "/.uploads/" in "/" + key:  # multipart parts; the completed object has its own event
        return [], "multipart upload part"
    key = _key(key, "key")
    size = entry.attributes.file_size if entry.attributes else None
    return [ObjectEvent(bucket=bucket, key=key, size=size, etag=entry.s3_etag())], None


# ---- Hugging Face Hub and generic releases -------------------------------------------------

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/@:+=-]*$"
_REVISION = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class HfEvent(_Lenient):
    action: str
    scope: str


class HfRepo(_Lenient):
    type: str
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    headSha: str | None = Field(None, pattern=r"^[0-9a-f]{7,64}$")

    _safe_name = field_validator("name")(lambda v: check_name(v, "repo name"))


class HfRef(_Lenient):
    ref: str
    oldSha: str | None = None
    newSha: str | None = Field(None, pattern=r"^[0-9a-f]{7,64}$")


class HfWebhook(_Lenient):
    event: HfEvent
    repo: HfRepo
    updatedRefs: list[HfRef] | None = None


class GenericRelease(BaseModel):
    """Body of a signed release webhook."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=300, pattern=_NAME, description="Model id.")
    revision: str | None = Field(None, min_length=1, max_length=128, pattern=_REVISION, description=(
        "Immutable revision (commit sha, digest, version tag); default: the digest of the "
        "source's objects a manual run computes (s3:// sources only)."))
    source: str = Field(min_length=1, max_length=2048, description="Where the flow reads it.")
    targets: list[str] | None = Field(None, min_length=1, max_length=32,
                                      description="Targets to validate (default: receiver's).")

    _safe_model = field_validator("model")(lambda v: check_name(v, "model name"))
    _safe_source = field_validator("source")(lambda v: parse_source(v))


def parse_hf(data: Any, branches: list[str], repo_types: list[str], source_template: str
             ) -> tuple[list[Release], str | None]:
    """A Hub webhook -> one release per updated branch we watch (or why it is ignored)."""
    hook = _validate(HfWebhook, data, "Hugging Face webhook")
    if hook.event.scope != "repo.content" or hook.event.action not in ("create", "update"):
        return [], f"event {hook.event.scope}/{hook.event.action} is not a content update"
    if hook.repo.type not in repo_types:
        return [], f"repo type {hook.repo.type} is not watched"
    shas: list[str] = []
    if hook.updatedRefs:
        watched = {f"refs/heads/{b}" for b in branches}
        shas = [r.newSha for r in hook.updatedRefs if r.ref in watched and r.newSha]
    elif hook.repo.headSha:
        shas = [hook.repo.headSha]
    if not shas:
        return [], f"no update of a watched branch ({', '.join(branches)})"
    releases = []
    for sha in dict.fromkeys(shas):
        source = source_template.format(repo=hook.repo.name, revision=sha)
        releases.append(Release(model=hook.repo.name, revision=sha, source=source, origin="hf"))
    return releases, None


def parse_release(data: Any, sources: list[str] | None = None) -> Release:
    """A signed release body; its source must lie under one of `sources` (None: any)."""
    body = _validate(GenericRelease, data, "release")
    if sources is not None and not under(body.source, sources):
        raise BadRequest(422, f"source {body.source[:200]!r} is not under release_sources "
                              f"({', '.join(sources) or 'none configured'})")
    targets = tuple(dict.fromkeys(body.targets)) if body.targets else None
    return Release(model=body.model, revision=body.revision, source=body.source,
                   origin="webhook", targets=targets)
