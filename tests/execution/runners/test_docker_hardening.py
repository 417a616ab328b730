"""Docker runner hardening against untrusted input (issue 9), on the real engine.

* A root user in any spelling, a user name that is root in the image, and a stage config or
  checkpoint naming a host path outside the allowlist (the Docker socket, /etc) are refused with
  a one-line day0 error (exit code 2) before any container of the image exists: the engine's own
  event stream and container list are the proof, not a mock.
* A real stage container is confined: no capabilities, no-new-privileges, a read-only root with
  a writable tmpfs /tmp, read-only weights, and the pids, memory and CPU limits of the stage
  budget, all read from inside it (cgroup v1 or v2 files) by a plugin while the stage runs.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from contextlib import contextmanager

import pytest

from day0.execution.contract import StageInputs
from day0.execution.runners.docker import LABEL, run_in_container
from day0.execution.runners.docker_policy import PROBE_LABEL, create_options, resolve_user
from day0.execution.stage import StageSpec
from day0.execution.targets import ContainerSettings, Target
from tests.conftest import DAY0_IMAGE, MODELS

pytestmark = pytest.mark.docker
SOURCE = MODELS / "tiny-llama"


@pytest.fixture(scope="module")
def image(docker_client):
    """day0:local under a tag only this module uses, so that every container event of that
    image during a test comes from the runner under test."""
    tag = f"day0-test/hardening:{uuid.uuid4().hex[:12]}"
    docker_client.images.get(DAY0_IMAGE).tag(tag)
    yield tag
    docker_client.images.remove(tag)


@pytest.fixture(scope="module")
def rooted_image(docker_client):
    """The day0 image plus a second name for uid 0 and one for gid 0, as a careless or hostile
    image could ship."""
    tag = f"day0-test/rooted:{uuid.uuid4().hex[:12]}"
    dockerfile = (f"FROM {DAY0_IMAGE}\nUSER root\n"
                  "RUN echo 'toor:x:0:0::/root:/bin/sh' >> /etc/passwd"
                  " && echo 'admins:x:0:' >> /etc/group"
                  " && echo 'svc:x:10002:0::/home/svc:/bin/sh' >> /etc/passwd\n"
                  "USER 10001:10001\n")
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True,
                               network_mode="none")
    yield tag
    docker_client.images.remove(tag, force=True)


@contextmanager
def engine_activity(client, image_tag):
    """Records every container event of image_tag on the engine while the block runs."""
    seen: dict = {"events": []}
    before = client.containers.list(all=True, filters={"ancestor": image_tag})
    since = time.time()
    yield seen
    until = time.time() + 0.5
    events = client.events(since=since, until=until, filters={"type": "container"}, decode=True)
    seen["events"] = [(e["Action"], e["Actor"]["Attributes"]) for e in events
                      if e["Actor"]["Attributes"].get("image") == image_tag]
    seen["containers"] = len(client.containers.list(all=True, filters={"ancestor": image_tag}))
    seen["before"] = len(before)


def target_with(image_tag, *, user="10001:10001", plugins=(), **extra):
    """A docker target; ContainerSettings.model_construct skips validation, as a target built in
    code could, so that the runner's own check is what is tested."""
    target = Target(name="hardening-test", device="cpu", dtype="bfloat16", runner="docker",
                    container={"image": image_tag}, plugins=[str(p) for p in plugins], **extra)
    settings = ContainerSettings.model_construct(**{**target.container.model_dump(), "user": user})
    return target.model_copy(update={"container": settings})


def run(docker_client, target, stage="alignment", source=SOURCE, log=None, **config):
    spec = StageSpec(stage=stage, config=config,
                     inputs=StageInputs(source=str(source), target=target))
    return run_in_container(spec, target, log=log, client=docker_client)


def assert_refused(outcome, kind: str, *words: str):
    assert not outcome.ok and outcome.failure == kind, outcome
    assert outcome.exit_code == 2 and "\n" not in outcome.error and "(fix: " in outcome.error
    for word in words:
        assert word in outcome.error, outcome.error


@pytest.mark.parametrize("user", ["0", "root", "00:00", "+0", " 0", "", "0:0", "10001:0"])
def test_root_user_is_refused_before_any_container(docker_client, image, user):
    with engine_activity(docker_client, image) as seen:
        outcome = run(docker_client, target_with(image, user=user))
    assert_refused(outcome, "config", "target 'hardening-test': container.user:", repr(user))
    assert seen["events"] == [] and seen["containers"] == seen["before"] == 0


@pytest.mark.parametrize("user, why", [
    ("toor", "is uid 0, gid 0 in the image"), ("svc", "is uid 10002, gid 0 in the image"),
    ("10001:admins", "is uid 10001, gid 0 in the image"), ("nobody-here", "has no /etc/passwd entry"),
    ("10003", "has no /etc/passwd entry")])
def test_user_name_resolving_to_root_in_the_image_is_refused(docker_client, rooted_image, user, why):
    with engine_activity(docker_client, rooted_image) as seen:
        outcome = run(docker_client, target_with(rooted_image, user=user))
    assert_refused(outcome, "config", "container.user:", why)
    # the name was read from the image's files: one container per file, created with the probe
    # label, never started, removed again; no stage container was ever created
    actions = [action for action, _ in seen["events"]]
    assert "start" not in actions and set(actions) <= {"create", "archive-path", "destroy"}, actions
    assert all(PROBE_LABEL in attrs and LABEL not in attrs for _, attrs in seen["events"])
    assert actions.count("create") == actions.count("destroy") >= 1
    assert seen["containers"] == seen["before"] == 0


def test_user_names_of_the_image_resolve_to_its_ids(docker_client, rooted_image):
    assert resolve_user(docker_client, rooted_image, target_with(rooted_image, user="day0")) == "10001:10001"
    assert resolve_user(docker_client, rooted_image, target_with(rooted_image, user="10001")) == "10001:10001"
    assert resolve_user(docker_client, rooted_image,
                        target_with(rooted_image, user="10002:10001")) == "10002:10001"


@pytest.mark.parametrize("config, kind, words", [
    ({"text_file": "/var/run/docker.sock"}, "config", ["alignment stage config: text_file:"]),
    ({"text_file": "/etc/passwd"}, "config", ["system folder /etc", "not mounted: /etc/passwd"]),
    ({"tolerance_file": "/etc"}, "config", ["system folder /etc"]),
    ({"extra_mount": "/var/run/docker.sock"}, "config", ["extra_mount"]),  # undeclared: refused
    ({"source": "/etc"}, "input", ["source:", "system folder /etc"]),
])
def test_forbidden_mount_is_refused_before_any_container(docker_client, image, config, kind, words):
    source = config.pop("source", SOURCE)
    with engine_activity(docker_client, image) as seen:
        outcome = run(docker_client, target_with(image), source=source, **config)
    assert_refused(outcome, kind, *words)
    assert seen["events"] == [] and seen["containers"] == seen["before"] == 0


PROBE_PLUGIN = '''
"""Reads what confines this stage container, from inside it, and prints it as one line."""
import errno, json, os


def _read(*paths):
    for path in paths:
        try:
            return open(path).read().strip()
        except OSError:
            pass
    return None


def _write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))


def apply(model):
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    mounts = {f[1]: (f[2], f[3].split(",")) for f in map(str.split, open("/proc/mounts"))}
    print("DAY0-PROBE " + json.dumps({
        "status": {k: status[k].split() for k in
                   ("CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs", "Uid", "Gid", "Groups")},
        "root": mounts["/"][1][0], "tmp": mounts.get("/tmp", (None, []))[0],
        "write_root": _write("/day0-probe"), "write_app": _write("/opt/day0/probe"),
        "write_tmp": _write("/tmp/day0-probe"), "write_weights": _write(WEIGHTS + "/probe"),
        "pids_max": _read("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
        "memory_max": _read("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                            "/sys/fs/cgroup/memory.max"),
        "memsw_max": _read("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes",
                           "/sys/fs/cgroup/memory.swap.max"),
        "cpu_quota": _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"),
        "cpu_period": _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"),
        "cpu_max": _read("/sys/fs/cgroup/cpu.max"),
    }), flush=True)
'''


@pytest.mark.integration
def test_stage_container_is_confined(docker_client, image, tmp_path):
    plugin = tmp_path / "confinement_probe.py"
    plugin.write_text(PROBE_PLUGIN.replace("WEIGHTS", repr(str(SOURCE))))
    plugin.chmod(0o644)
    cpus = min(1.5, docker_client.info()["NCPU"])
    target = Target(name="hardening-test", device="cpu", dtype="bfloat16", runner="docker",
                    plugins=[str(plugin)], memory_limit_gib=3.25, timeout_s=300,
                    container={"image": image, "pids_limit": 321, "cpus": cpus})
    lines: list[str] = []
    outcome = run(docker_client, target, stage="scan", log=lines.append)
    assert outcome.ok, (outcome.error, outcome.log_tail)  # the stage itself works so confined
    (probe,) = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("DAY0-PROBE ")]
    status = probe["status"]
    assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == status["CapAmb"] == ["0" * 16]
    assert status["NoNewPrivs"] == ["1"]
    assert set(status["Uid"]) == set(status["Gid"]) == {"10001"} and "0" not in status["Groups"]
    assert probe["root"] == "ro" and probe["tmp"] == "tmpfs"
    assert probe["write_root"] == probe["write_app"] == probe["write_weights"] == "EROFS"
    assert probe["write_tmp"] == "ok"
    assert probe["pids_max"] == "321"
    limit = str(int(3.25 * 2**30))
    assert probe["memory_max"] == limit
    assert probe["memsw_max"] in (limit, "0", None)  # v1 memsw (when swap accounting is on) or v2
    if probe["cpu_max"]:  # cgroup v2: "quota period"
        quota, period = map(int, probe["cpu_max"].split())
    else:  # cgroup v1 (this engine)
        quota, period = int(probe["cpu_quota"]), int(probe["cpu_period"])
    assert quota / period == pytest.approx(cpus)
    assert not docker_client.containers.list(all=True, filters={"label": LABEL})


def test_default_limits_come_from_the_engine_host(docker_client, image):
    """No memory budget anywhere: 75% of the engine host's memory per concurrent stage."""
    info = docker_client.info()
    target = Target(name="t", device="cpu", dtype="bfloat16", runner="docker", concurrency=2,
                    container={"image": image})
    options, gib = create_options(docker_client, target, print)
    assert gib == pytest.approx(info["MemTotal"] * 0.75 / 2 / 2**30)
    assert options["nano_cpus"] == int(max(info["NCPU"] / 2, 1) * 1e9)


def test_containers_of_a_dead_owner_are_removed_and_live_ones_kept(docker_client, image):
    """A SIGKILLed validate leaves its stage container: the next start removes it (by owner)."""
    import socket
    import subprocess
    import sys

    from day0.execution import lifecycle
    from day0.execution.runners.docker import HOST_LABEL, OWNER_LABEL, remove_orphaned_containers

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner = lifecycle.owner_token(gone.pid)   # read while it runs: pid and start time
    gone.wait()
    host = socket.gethostname()
    made = {}
    for who, owner in (("dead", dead_owner), ("alive", lifecycle.owner_token())):
        made[who] = docker_client.containers.create(
            image, command=["true"], labels={LABEL: "alignment", OWNER_LABEL: owner,
                                             HOST_LABEL: host})
    try:
        removed = remove_orphaned_containers(docker_client)
        assert made["dead"].name in removed and made["alive"].name not in removed
        names = {c.name for c in docker_client.containers.list(all=True)}
        assert made["dead"].name not in names and made["alive"].name in names
    finally:
        for container in made.values():
            try:
                container.remove(force=True)
            except Exception:
                pass
