"""Receiver errors are day0.errors' tree; S3 errors and safetensors headers have one mapping and
one parser, shared with analysis."""

from __future__ import annotations

import json
import struct
from types import SimpleNamespace

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from day0 import errors
from day0.checkpoint.headers import read_header
from day0.receiver import completeness
from day0.receiver.journal import Journal
from day0.checkpoint.safetensors_header import HeaderError, max_header_bytes


@pytest.mark.parametrize("cls,status", [
    (errors.AuthError, 401), (errors.TooLarge, 413), (errors.ClientGone, 400),
    (errors.Unavailable, 503), (errors.StoreError, 503), (errors.JournalError, 503)])
def test_receiver_errors_are_day0_errors_with_their_http_status(cls, status):
    exc = cls("why")
    assert isinstance(exc, errors.ReceiverError) and isinstance(exc, errors.Day0Error)
    assert exc.status == status and exc.reason == "why" and str(exc) == "why"


def test_bad_request_carries_its_status():
    exc = errors.BadRequest(422, "not a valid release")
    assert isinstance(exc, errors.ReceiverError) and (exc.status, exc.reason) == (422, "not a valid release")


def test_the_receiver_modules_raise_the_tree_s_classes():
    from day0.receiver import auth, events

    assert auth.AuthError is errors.AuthError
    assert events.BadRequest is errors.BadRequest
    assert completeness.StoreError is errors.StoreError


def test_journal_failures_are_journal_errors(tmp_path):
    journal = Journal(tmp_path / "j.sqlite")
    journal.close()  # every later statement fails in SQLite
    with pytest.raises(errors.JournalError, match="journal unavailable") as err:
        journal.stats()
    assert err.value.status == 503


def _client(get_object):
    return SimpleNamespace(meta=SimpleNamespace(endpoint_url="http://store:8333"),
                           get_object=get_object)


def _raise(exc):
    def get_object(**kwargs):
        raise exc
    return get_object


def test_store_errors_are_mapped_by_day0_storage():
    missing = ClientError({"Error": {"Code": "NoSuchKey", "Message": "gone"}}, "GetObject")
    with pytest.raises(FileNotFoundError):
        completeness._get(_client(_raise(missing)), "models", "m/model.safetensors")
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "GetObject")
    with pytest.raises(errors.StoreError, match=r"access denied \(AccessDenied\)"):
        completeness._get(_client(_raise(denied)), "models", "m/model.safetensors")
    down = EndpointConnectionError(endpoint_url="http://store:8333")
    with pytest.raises(errors.StoreError, match="cannot reach the S3 endpoint http://store:8333"):
        completeness._get(_client(_raise(down)), "models", "m/model.safetensors")


def _shard(length: int, header: bytes = b"") -> bytes:
    return struct.pack("<Q", length) + header


def _serving(data: bytes):
    def get_object(Bucket, Key, Range=None):
        start, end = (int(x) for x in Range.split("=")[1].split("-")) if Range else (0, len(data) - 1)
        return {"Body": SimpleNamespace(read=lambda: data[start:end + 1])}
    return _client(get_object)


class _Bytes:
    """A day0.checkpoint.files Reader over one in-memory file."""

    def __init__(self, data: bytes, size: int | None = None):
        self.data, self._size = data, size if size is not None else len(data)

    def names(self):
        return ["model.safetensors"]

    def size(self, name):
        return self._size  # may claim more than data holds: only the header is read

    def read_range(self, name, start, length):
        return self.data[start:start + length]

    def location(self, name):
        return name


def test_one_header_limit_for_analysis_and_the_receiver():
    over = max_header_bytes() + 1
    data = _shard(over) + b"\0" * 64
    with pytest.raises(HeaderError, match=f"exceeds safetensors' limit {max_header_bytes()}"):
        completeness._expected_size(_serving(data), "models", "m/model.safetensors")
    problems = []
    assert read_header(_Bytes(_shard(over), size=over + 64), "model.safetensors", problems) is None
    assert f"exceeds safetensors' limit {max_header_bytes()}" in problems[0].message


def test_the_receiver_reads_the_expected_size_from_the_shared_parser():
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    data = _shard(len(header), header) + b"\0" * 8
    assert completeness._expected_size(_serving(data), "models", "m/model.safetensors") == len(data)
    problems = []
    assert set(read_header(_Bytes(data), "model.safetensors", problems)) == {"w"} and not problems
