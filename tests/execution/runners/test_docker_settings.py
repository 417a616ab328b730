"""Docker runner settings that need no engine: target validation, the user guard, the mount
allowlist, hardening options and limits, mounts, device strings."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from day0.execution.runners.docker import _devices, _mounts, shared_volumes
from day0.execution.targets import Target, available_targets
from tests.conftest import MODELS, ROOT


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


# ---- hardening that needs no engine: user strings, mount allowlist, limits (issue 9) ----

ROOT_SPELLINGS = ["0", "root", "00:00", "+0", " 0", "", "0:0", "10001:0", "10001:root", "0:10001",
                  "-0", "0 ", "\t0", "1e3:1e3 ", "10001:", ":10001"]


@pytest.mark.parametrize("user", ROOT_SPELLINGS)
def test_root_in_any_spelling_is_refused_by_the_target(user):
    with pytest.raises(ValidationError, match="names root|is not 'UID:GID'") as err:
        Target(name="t", device="cpu", dtype="bfloat16", runner="docker",
               container={"image": "x", "user": user})
    assert "10001:10001" in str(err.value)  # the fix is named


@pytest.mark.parametrize("user, parsed", [("10001:10001", (10001, 10001)), ("010001", (10001, None)),
                                          ("day0", ("day0", None)), ("day0:staff", ("day0", "staff"))])
def test_non_root_users_parse(user, parsed):
    from day0.execution.targets import ContainerSettings

    assert ContainerSettings.parse_user(user) == parsed
    assert Target(name="t", device="cpu", dtype="bfloat16", runner="docker",
                  container={"image": "x", "user": user}).container.user == user


def test_limits_and_scratch_folders_are_checked_settings():
    base = {"name": "t", "device": "cpu", "dtype": "bfloat16", "runner": "docker"}
    for bad in ({"cpus": 0}, {"memory_gib": -1}, {"pids_limit": 10}, {"tmpfs_size": "1g,exec"},
                {"tmpfs": ["relative"]}, {"tmpfs": ["/"]}, {"tmpfs": ["/a/../etc"]},
                {"read_only": False}):
        with pytest.raises(ValidationError):
            Target(**base, container={"image": "x", **bad})
    ok = Target(**base, container={"image": "x", "cpus": 1.5, "memory_gib": 4, "pids_limit": 256,
                                   "tmpfs_size": "2g", "tmpfs": ["/var/log/vendor"]})
    assert ok.container.tmpfs == ["/var/log/vendor"]


def _spec(stage="alignment", source=MODELS / "tiny-llama", plugins=(), roots=(), **config):
    from day0.execution.contract import StageInputs
    from day0.execution.stage import StageSpec

    target = Target(name="t", device="cpu", dtype="bfloat16", runner="docker",
                    plugins=[str(p) for p in plugins],
                    container={"image": "x", "mount_roots": [str(r) for r in roots]})
    return StageSpec(stage=stage, config=config, inputs=StageInputs(source=str(source),
                                                                      target=target)), target


def _unix_socket(path):
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


def test_only_declared_stage_files_inside_the_allowed_roots_are_mounted(tmp_path, monkeypatch):
    from day0.execution.runners.docker_policy import file_fields, prepare

    assert file_fields("alignment") == ["text_file", "tolerance_file"]
    assert file_fields("scan") == file_fields("analysis") == []
    monkeypatch.chdir(ROOT)
    spec, target = _spec(text_file="tests/fixtures/text/heldout.txt", max_windows=1)
    prepared, mounts = prepare(spec, target)
    text = str(ROOT / "tests/fixtures/text/heldout.txt")
    assert prepared.config == {"text_file": text, "max_windows": 1}
    assert mounts == {str(MODELS / "tiny-llama"): True, text: True}
    # a path the host lacks stays as it is (the image may hold it) and mounts nothing
    spec, target = _spec(text_file="/opt/day0/app/text.txt")
    assert prepare(spec, target)[1] == {str(MODELS / "tiny-llama"): True}


@pytest.mark.parametrize("config, message", [
    ({"text_file": "/etc/passwd"}, "text_file: text_file in or above the system folder /etc; "
                                   "not mounted: /etc/passwd"),
    ({"tolerance_file": "/etc"}, "system folder /etc"),
    ({"text_file": "/proc/self/environ"}, "system folder /proc"),
    ({"evil": "/etc/shadow"}, "evil"),  # only declared fields: an unknown key is a config error
    ({"text_file": 3}, "text_file"),
])
def test_stage_config_naming_system_files_is_refused(config, message, monkeypatch):
    from day0.errors import ConfigError
    from day0.execution.runners.docker_policy import prepare

    monkeypatch.chdir("/")  # even a worker started in / does not make / an allowed root
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        prepare(*_spec(**config))
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith("alignment stage config: ")


def test_stage_files_outside_the_roots_sockets_and_credentials_are_refused(tmp_path, monkeypatch):
    from day0.errors import ConfigError
    from day0.execution.runners.docker_policy import prepare

    monkeypatch.chdir(ROOT)
    outside = tmp_path / "text.txt"
    outside.write_text("hello world")
    with pytest.raises(ConfigError, match="not in a folder stage files may come from") as err:
        prepare(*_spec(text_file=str(outside)))
    assert "container.mount_roots" in str(err.value)
    assert prepare(*_spec(roots=[tmp_path], text_file=str(outside)))[1][str(outside)]
    sock = _unix_socket(tmp_path / "docker.sock")  # like /var/run/docker.sock, in an allowed root
    try:
        with pytest.raises(ConfigError, match="not a regular file"):
            prepare(*_spec(roots=[tmp_path], text_file=str(tmp_path / "docker.sock")))
    finally:
        sock.close()
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_rsa").write_text("key")
    with pytest.raises(ConfigError, match="credentials folder .ssh"):
        prepare(*_spec(roots=[tmp_path], text_file=str(tmp_path / ".ssh" / "id_rsa")))
    (tmp_path / "link.txt").symlink_to("/etc/hostname")  # symlinks are followed before checking
    with pytest.raises(ConfigError, match="system folder /etc"):
        prepare(*_spec(roots=[tmp_path], text_file=str(tmp_path / "link.txt")))
    with pytest.raises(ConfigError, match="container.mount_roots: mount root in or above"):
        prepare(*_spec(roots=["/"], text_file=str(outside)))


def test_checkpoint_and_plugins_outside_the_allowlist_are_refused(tmp_path):
    from day0.errors import InputError, PluginError
    from day0.execution.runners.docker_policy import prepare

    for source, why in (("/etc", "system folder /etc"), ("/", "system folder"),
                        ("/var", "above the system folder /var/"), (tmp_path, "holds no config.json")):
        with pytest.raises(InputError, match=re.escape(why)) as err:
            prepare(*_spec(stage="analysis", source=source))
        assert err.value.field == "source" and "fix:" in str(err.value)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / ".aws").mkdir()
    with pytest.raises(InputError, match="holds the credentials .aws"):
        prepare(*_spec(stage="analysis", source=tmp_path))
    (tmp_path / "evil.py").symlink_to("/etc/hostname")
    with pytest.raises(PluginError, match="plugins: plugin .* system folder /etc"):
        prepare(*_spec(stage="scan", plugins=[tmp_path / "evil.py"]))


class _Engine:
    """The two figures create_options reads from the engine (`docker info`)."""

    def __init__(self, cpus, memory):
        self._info = {"NCPU": cpus, "MemTotal": memory}

    def info(self):
        return self._info


def test_hardening_and_limits_follow_the_stage_budget():
    from day0.execution.runners.docker_policy import create_options

    def target(**extra):
        container = {"image": "x", **extra.pop("container", {})}
        return Target(name="t", device="cpu", dtype="bfloat16", runner="docker",
                      container=container, **extra)

    engine = _Engine(8, 64 * 2**30)
    options, gib = create_options(engine, target(memory_limit_gib=3), print)
    assert options["cap_drop"] == ["ALL"] and options["security_opt"] == ["no-new-privileges:true"]
    assert options["read_only"] and "size=1g" in options["tmpfs"]["/tmp"]
    assert options["pids_limit"] == 4096 and options["nano_cpus"] == 8 * 10**9
    assert options["mem_limit"] == options["memswap_limit"] == f"{3 * 2**30}b" and gib == 3
    # the stage budget wins over the container default; without either: 75% of the host per slot
    assert create_options(engine, target(memory_limit_gib=3, container={"memory_gib": 9}), print)[1] == 3
    assert create_options(engine, target(container={"memory_gib": 9}), print)[1] == 9
    options, gib = create_options(engine, target(concurrency=2), print)
    assert gib == 64 * 0.75 / 2 and options["nano_cpus"] == 4 * 10**9
    lines = []
    options, _ = create_options(_Engine(2, 2**33), target(container={
        "cpus": 6, "pids_limit": 128, "tmpfs": ["/var/log/npu"], "tmpfs_size": "256m"}), lines.append)
    assert options["nano_cpus"] == 2 * 10**9 and "more than the host's 2" in lines[0]
    assert options["pids_limit"] == 128 and set(options["tmpfs"]) == {"/tmp", "/var/log/npu"}
    assert "size=256m" in options["tmpfs"]["/var/log/npu"]


def test_missing_checkpoint_and_plugin_files_are_named(tmp_path):
    from day0.errors import InputError, PluginError
    from day0.execution.runners.docker_policy import prepare

    with pytest.raises(InputError, match="checkpoint folder does not exist"):
        prepare(*_spec(stage="analysis", source=tmp_path / "nothing-here"))
    with pytest.raises(PluginError, match="plugin does not exist; not mounted: .*gone.py"):
        prepare(*_spec(stage="scan", plugins=[tmp_path / "gone.py"]))
