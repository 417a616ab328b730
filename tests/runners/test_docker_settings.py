"""Docker runner settings that need no engine: target validation, mounts, device strings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from day0.runners.docker import _devices, _mounts, shared_volumes
from day0.targets import Target, available_targets


def test_docker_runner_needs_an_image_and_a_non_root_user():
    with pytest.raises(ValidationError, match="needs a 'container' section"):
        Target(name="t", device="cpu", dtype="bfloat16", runner="docker")
    with pytest.raises(ValidationError, match="non-root"):
        Target(name="t", device="cpu", dtype="bfloat16", runner="docker",
               container={"image": "x", "user": "0:0"})
    with pytest.raises(ValidationError, match="only used with runner: docker"):
        Target(name="t", device="cpu", dtype="bfloat16", container={"image": "x"})
    with pytest.raises(ValidationError, match="needs 'deployment"):
        Target(name="t", device="cpu", dtype="bfloat16", runner="deployment")


def test_builtin_docker_target_uses_the_local_image():
    target = available_targets()["cpu-bf16-docker"]
    assert target.runner == "docker" and target.container.image == "day0:local"
    assert target.container.network == "none" and target.container.user == "10001:10001"


def test_device_nodes_are_completed_to_host_container_perms():
    assert _devices(["/dev/davinci0", "/dev/a:/dev/b", "/dev/c:/dev/d:r"]) == [
        "/dev/davinci0:/dev/davinci0:rwm", "/dev/a:/dev/b:rwm", "/dev/c:/dev/d:r"]


def test_paths_on_shared_volumes_mount_the_volume(monkeypatch):
    monkeypatch.setenv("DAY0_DOCKER_VOLUMES", "day0-cache:/var/cache/day0,day0-work:/var/lib/day0/work")
    assert shared_volumes()[0] == ("day0-work", "/var/lib/day0/work")
    mounts = _mounts({"/var/cache/day0/weights": True, "/var/lib/day0/work/x": False,
                      "/models/llama": True})
    by_target = {m["Target"]: m for m in mounts}
    assert by_target["/var/cache/day0"]["Type"] == "volume"
    assert by_target["/var/cache/day0"]["Source"] == "day0-cache" and by_target["/var/cache/day0"]["ReadOnly"]
    assert by_target["/var/lib/day0/work"]["Source"] == "day0-work"
    assert not by_target["/var/lib/day0/work"]["ReadOnly"]
    assert by_target["/models/llama"]["Type"] == "bind" and by_target["/models/llama"]["ReadOnly"]


def test_read_write_wins_when_one_volume_is_wanted_both_ways(monkeypatch):
    monkeypatch.setenv("DAY0_DOCKER_VOLUMES", "day0-data:/data")
    (mount,) = _mounts({"/data/weights": True, "/data/work/1": False})
    assert mount["Source"] == "day0-data" and not mount["ReadOnly"]
