"""Fixtures for the receiver: a deployment on the session's Prefect server (registered, never
served, so its runs stay SCHEDULED and can be counted), in-process receivers on loopback, a
SeaweedFS whose filer posts its events to a receiver, small safetensors checkpoints."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from day0.receiver.launch import ReceiverThread, free_port
from day0.receiver.settings import load_settings

SECRETS = {"release_hmac": "test-release-secret", "hf_webhook": "test-hf-secret",
           "seaweedfs_token": "test-seaweedfs-token", "s3_token": "test-s3-token",
           "admin_token": "test-admin-token"}
FAST_SUBMIT = {"backoff_initial_s": 0.2, "backoff_max_s": 2.0, "poll_s": 0.5}


@dataclass
class Deployment:
    name: str
    id: object
    api_url: str


@pytest.fixture(scope="session")
def deployment(prefect_server) -> Deployment:
    from flows.validate import validate

    dep_id = validate.to_deployment(name="receiver-tests").apply()
    return Deployment(name="validate/receiver-tests", id=dep_id, api_url=prefect_server)


def receiver_settings(tmp: Path, deployment: Deployment, **overrides):
    base = dict(port=free_port(), journal=str(tmp / "journal.sqlite"), deployment=deployment.name,
                prefect_api_url=deployment.api_url, secrets=dict(SECRETS), submit=dict(FAST_SUBMIT),
                sns_allowed_hosts=["127.0.0.1"], max_body_bytes=64 << 10,
                release_sources=["s3://models"])
    return load_settings(None, **{**base, **overrides})


@pytest.fixture(scope="session")
def receiver(tmp_path_factory, deployment, s3_server):
    """One receiver for the webhook and S3-event tests; its store is the session's SeaweedFS."""
    tmp = tmp_path_factory.mktemp("receiver")
    # settle_s 0: these tests read a release's acceptance in the event's own answer; the settle
    # window has its own test (test_object_events.py::test_a_name_ordered_upload_is_one_release)
    settings = receiver_settings(tmp, deployment, s3=s3_server.receiver_s3(),
                                 checkpoint={"settle_s": 0})
    with ReceiverThread(settings) as running:
        yield running


def make_checkpoint(folder: Path, shards: int = 3, rows: int = 32, single: bool = False) -> Path:
    """config.json + index + `shards` safetensors files (float32 ones), or one model.safetensors."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": rows}))
    if single:
        save_file({"w": np.ones((rows, rows), np.float32)}, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({f"layer{i}.w": np.full((rows, rows), i, np.float32),
                   f"layer{i}.b": np.zeros(rows, np.float32)}, str(folder / name))
        weight_map.update({f"layer{i}.w": name, f"layer{i}.b": name})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def upload_order(folder: Path) -> list[str]:
    """config, index, then shards: the index arrives before the shards it names."""
    names = sorted(p.name for p in folder.iterdir())
    first = [n for n in ("config.json", "model.safetensors.index.json") if n in names]
    return first + [n for n in names if n not in first]
