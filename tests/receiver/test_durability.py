"""Durability and exactly-once submission: kill -9 under load, Prefect down, crash after submit."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
import uuid
from urllib.parse import urlsplit

import pytest

from day0.receiver.journal import Journal, ReleaseRow
from day0.receiver.launch import ReceiverProcess, ReceiverThread, free_port, write_config
from tests.receiver.conftest import FAST_SUBMIT, SECRETS, receiver_settings
from tests.receiver.loadgen import (flow_run_keys, make_deliveries, send_all, summarize,
                                    wait_drained)
from tests.receiver.support import journal_stats, post_release, runs, settled, wait_until

pytestmark = pytest.mark.integration


def journal_releases(path) -> set[tuple[str, str]]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return set(db.execute("SELECT model, revision FROM releases"))
    finally:
        db.close()


@pytest.mark.parametrize("total,unique", [
    pytest.param(400, 80, id="400"),
    pytest.param(1200, 200, id="1200", marks=pytest.mark.slow),
])
def test_kill_9_under_load_loses_no_accepted_release(deployment, tmp_path, total, unique):
    """Half-way through, SIGKILL; every release acknowledged before it must be in the journal,
    and after a restart every acknowledged release has exactly one flow run."""
    dead_api = f"http://127.0.0.1:{free_port()}/api"  # Prefect unreachable: all stays pending
    settings = {"journal": str(tmp_path / "journal.sqlite"), "deployment": deployment.name,
                "prefect_api_url": dead_api, "secrets": SECRETS, "submit": FAST_SUBMIT}
    config = write_config(tmp_path / "receiver.yaml", settings)
    proc = ReceiverProcess(config, admin_token=SECRETS["admin_token"]).start()
    prefix = f"kill-{uuid.uuid4().hex[:6]}"
    deliveries = make_deliveries(total, unique, SECRETS["release_hmac"], prefix=prefix, seed=7)
    killed: dict = {}

    async def on_done(done: int) -> None:
        if done == total // 2 and not killed:
            killed["acked"] = {d.release for d in deliveries if d.release and d.status in (200, 202)}

            def bounce() -> None:
                proc.kill()
                killed["journal"] = journal_releases(tmp_path / "journal.sqlite")
                write_config(config, {**settings, "prefect_api_url": deployment.api_url})
                proc.start()
                killed["restarted"] = True

            killed["future"] = asyncio.get_running_loop().run_in_executor(None, bounce)

    try:
        asyncio.run(send_all(proc.url, deliveries, concurrency=50, deadline_s=90, on_done=on_done))
        assert wait_until(lambda: killed.get("restarted"), timeout_s=60), proc.log_tail()
        stats = wait_drained(proc.url, SECRETS["admin_token"], timeout_s=180)  # a loaded 2-core CI
        keys = flow_run_keys(deployment.id, f"day0:{prefix}/")
    finally:
        proc.stop()
    s = summarize(deliveries)
    assert not s.wrong, s.wrong[:10]
    assert not [c for c in s.by_status if c is None or c >= 500], s.by_status
    assert killed["acked"] and killed["acked"] <= killed["journal"]  # durable before the 2xx
    assert stats["releases"]["pending"] == 0, stats
    assert len(s.acknowledged) == len(s.unique_valid) == unique
    assert len(keys) == unique and set(keys.values()) == {1}  # one run each, none twice
    assert {k.split(":", 1)[1].rsplit(":", 1)[0] for k in keys} == {
        f"{m}@{r}" for m, r in s.acknowledged}


class Forwarder:
    """A TCP forwarder on a fixed loopback port that can be switched on later (Prefect 'up')."""

    def __init__(self, port: int, upstream: tuple[str, int]):
        self.port, self.upstream = port, upstream
        self.sock: socket.socket | None = None

    def start(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def test_prefect_down_then_up_is_retried_without_restart(deployment, tmp_path):
    api = urlsplit(deployment.api_url)
    port = free_port()
    forwarder = Forwarder(port, (api.hostname, api.port))
    settings = receiver_settings(tmp_path, deployment, prefect_api_url=f"http://127.0.0.1:{port}/api")
    try:
        with ReceiverThread(settings) as receiver:
            release = {"model": "down/m", "revision": "r1", "source": "s3://models/down/m"}
            assert post_release(receiver.url, release).status_code == 202
            journal = Journal(settings.journal)
            failed_twice = wait_until(lambda: (journal.releases()[0]["attempts"] >= 2), timeout_s=30)
            assert failed_twice, journal.releases()
            assert journal_stats(receiver.url)["last_submit_error"].startswith("ConnectError")
            assert not runs(deployment, "day0:down/m@")
            forwarder.start()  # Prefect reachable again
            settled(receiver.url, timeout_s=30)
            assert runs(deployment, "day0:down/m@") == {"day0:down/m@r1:cpu-bf16": 1}
    finally:
        forwarder.close()


def test_resubmission_after_a_crash_reuses_the_flow_run(deployment, tmp_path):
    """Crash between Prefect creating the run and the journal recording it: on restart the
    release is still pending, is submitted again with the same idempotency key, and Prefect
    answers with the run it already has."""
    from prefect.deployments import run_deployment

    row = ReleaseRow(model="crash/m", revision="r9", target="cpu-bf16", source="s3://b/crash/m",
                     origin="webhook")
    settings = receiver_settings(tmp_path, deployment)
    Journal(settings.journal).accept([row])
    first = run_deployment(deployment.name, parameters={"source": row.source, "target": row.target,
                                                        "revision": row.revision},
                           timeout=0, idempotency_key=row.idempotency_key, as_subflow=False)
    with ReceiverThread(settings) as receiver:
        settled(receiver.url)
    (journaled,) = Journal(settings.journal).releases()
    assert journaled["status"] == "submitted" and journaled["flow_run_id"] == str(first.id)
    assert runs(deployment, "day0:crash/m@") == {row.idempotency_key: 1}


def test_recorded_object_events_are_checked_on_start(deployment, s3_server, tmp_path):
    """A receiver killed after journaling an object event but before checking the prefix: the
    next one checks it on start and submits the then complete checkpoint."""
    from tests.receiver.conftest import make_checkpoint, upload_order
    from tests.receiver.test_object_events import BUCKET

    client = s3_server.client()
    s3_server.create_bucket(BUCKET)
    ck = make_checkpoint(tmp_path / "ck", shards=2)
    prefix = f"restart/{uuid.uuid4().hex[:6]}"
    for name in upload_order(ck):
        client.upload_file(str(ck / name), BUCKET, f"{prefix}/{name}")
    settings = receiver_settings(tmp_path, deployment, s3=s3_server.receiver_s3())
    Journal(settings.journal).record_objects([(BUCKET, prefix)])  # the last upload's event
    with ReceiverThread(settings) as receiver:
        settled(receiver.url)
    assert sum(runs(deployment, f"day0:{prefix}@").values()) == 1
