"""What `day0 hooks serve` writes to its log (issue 11): every refused, ignored and not yet
complete event with its reason, never a secret; the Prefect client's requests are not logged and
it never asks a server without CSRF protection for a token (no `GET /api/csrf-token ... 422`);
one receiver per journal."""

from __future__ import annotations

import json

import httpx
import pytest

from day0.receiver.launch import ReceiverProcess, free_port, write_config
from tests.receiver.conftest import FAST_SUBMIT, SECRETS, make_checkpoint
from tests.receiver.support import post_release, wait_until

pytestmark = pytest.mark.integration


def seaweed_event(key: str, directory: bool = False, size: int = 10) -> dict:
    return {"event_type": "create", "key": key,
            "message": {"new_entry": {"name": key.rsplit("/", 1)[1], "is_directory": directory,
                                      "attributes": {"file_size": size}},
                        "new_parent_path": key.rsplit("/", 1)[0]}}


def post_seaweed(url: str, body: dict, token: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/events/seaweedfs", content=json.dumps(body).encode(),
                      headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_receiver_log_says_why_and_never_a_secret(deployment, s3_server, tmp_path):
    s3_server.create_bucket("models")
    ck = make_checkpoint(tmp_path / "ck", shards=2)
    prefix = "logs/partial"
    s3_server.client().upload_file(str(ck / "config.json"), "models", f"{prefix}/config.json")
    config = write_config(tmp_path / "receiver.yaml", {
        "deployment": deployment.name, "prefect_api_url": deployment.api_url,
        "journal": str(tmp_path / "journal.sqlite"), "secrets": SECRETS, "submit": FAST_SUBMIT,
        "release_sources": ["s3://models"], "s3": s3_server.receiver_s3()})
    receiver = ReceiverProcess(config, port=free_port(), admin_token=SECRETS["admin_token"]).start()
    try:
        url = receiver.url
        key = f"/buckets/models/{prefix}/config.json"
        assert post_seaweed(url, seaweed_event(key), "wrong-token").status_code == 401
        assert post_seaweed(url, seaweed_event("/buckets/models/logs", directory=True),
                            SECRETS["seaweedfs_token"]).json()["status"] == "ignored"
        waiting = post_seaweed(url, seaweed_event(key), SECRETS["seaweedfs_token"])
        assert waiting.json()["status"] == "waiting", waiting.text
        body = {"model": "logs/signed", "revision": "r1", "source": "s3://models/logs/signed"}
        assert post_release(url, body, secret="not-the-secret").status_code == 401
        assert post_release(url, body).status_code == 202
        assert wait_until(lambda: "submitted day0:logs/signed@r1" in receiver.log.read_text(),
                          timeout_s=60), receiver.log_tail()
        # a second receiver on the same journal refuses to start, and says why
        twin = ReceiverProcess(config, port=free_port(), log=tmp_path / "twin.log")
        with pytest.raises(RuntimeError, match="in use by another receiver"):
            twin.start(timeout_s=60)
    finally:
        receiver.stop()
    log = receiver.log.read_text()
    for expected in ("refused POST /v1/events/seaweedfs", "401 invalid bearer token",
                     "ignored POST /v1/events/seaweedfs", "directory entry",
                     f"s3://models/{prefix} not complete yet: waiting for",
                     "refused POST /v1/webhooks/release", "401 invalid signature",
                     "release logs/signed@r1 on cpu-bf16 (webhook): accepted"):
        assert expected in log, f"{expected!r} not in:\n{log}"
    assert "csrf-token" not in log and "HTTP Request" not in log, log
    for value in SECRETS.values():
        assert value not in log


def test_prefect_client_of_the_receiver_asks_for_no_csrf_token():
    """Prefect's server runs without CSRF protection by default and answers a token request
    with 422: the receiver's client (prefect_csrf: false) never sends one; true turns it on."""
    from day0.orchestration import submit
    from day0.receiver.settings import load_settings

    settings = load_settings()
    assert settings.prefect_csrf is False
    for csrf in (False, True):
        with submit.api_url("http://127.0.0.1:9/api", csrf=csrf):
            assert submit.client()._client.enable_csrf_support is csrf
