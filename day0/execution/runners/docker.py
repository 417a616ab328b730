"""Docker runner: one stage in a container of ``target.container.image`` via the Docker SDK.

The container runs the same contract as the process runner (``python -m day0.execution.stage SPEC
RESULT``) with:

* only checked mounts, read-only: the weights (a local folder, or the materialized snapshot of an
  s3:// source: with ``network: none`` the stage downloads nothing itself), file plugins and the
  files the stage config declares (``day0.execution.runners.docker_policy`` says which and refuses the rest);
* a per-stage scratch folder (spec, result, TMPDIR, HF_HOME) mounted read-write and removed after;
* no network unless the target asks for it, a non-root uid:gid resolved before the container
  exists, no capabilities, no-new-privileges, a read-only root with a tmpfs /tmp, memory (swap
  included), CPU and pids limits, shm size, GPU requests and device nodes;
* refused input (a root user, a forbidden mount, an invalid stage config) is a failed
  StageOutcome (failure ``config``/``input``, exit code 2) before any container is created;
* its log lines streamed to ``log`` (the Prefect task log) as they come;
* always removed afterwards; a non-zero exit, an OOM kill, a timeout, a missing image or an image
  lacking a dependency is a failed StageOutcome with that reason, never an exception.

When this process itself runs in a container (the compose worker), paths it hands to sibling
containers must live on named volumes: ``DAY0_DOCKER_VOLUMES="vol:/path,..."`` says paths under
/path are in volume vol (mounted at the same path), and ``DAY0_DOCKER_WORKDIR`` puts the scratch
folders on such a path.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from day0.execution import lifecycle, progress
from day0.errors import ConfigError, Day0Error
from day0.execution.runners.docker_policy import (check_user, create_options, prepare, resolve_user,
                                                  with_weights)
from day0.execution.stage import StageOutcome, StageSpec
from day0.execution.targets import Target
from day0.store.seal import ENV as EVIDENCE_SECRET

LABEL = "day0.stage"
OWNER_LABEL, HOST_LABEL = "day0.owner", "day0.host"   # who started it: a dead owner's is removed
WORKDIR_ENV = "DAY0_DOCKER_WORKDIR"
# Only when a caller hands over a target without its time budget (the flow always fills it).
DEFAULT_TIMEOUT_S = 1800.0
MISSING_MODULE = re.compile(r"(ModuleNotFoundError|ImportError): (.*)")


def shared_volumes() -> list[tuple[str, str]]:
    """(volume, path) pairs from DAY0_DOCKER_VOLUMES, longest path first."""
    pairs = []
    for item in filter(None, os.environ.get("DAY0_DOCKER_VOLUMES", "").split(",")):
        volume, _, path = item.strip().partition(":")
        if volume and path:
            pairs.append((volume, path.rstrip("/") or "/"))
    return sorted(pairs, key=lambda p: -len(p[1]))


def _mount_for(path: str, read_only: bool):
    from docker.types import Mount

    for volume, prefix in shared_volumes():
        if path == prefix or path.startswith(prefix + "/"):
            return Mount(target=prefix, source=volume, type="volume", read_only=read_only)
    return Mount(target=path, source=path, type="bind", read_only=read_only)


def _mounts(paths: dict[str, bool]) -> list:
    """One mount per target path; read-write wins when a path is wanted both ways."""
    by_target = {}
    for path, read_only in paths.items():
        mount = _mount_for(path, read_only)
        if mount["Target"] not in by_target or not read_only:
            by_target[mount["Target"]] = mount
    return list(by_target.values())


def _unreadable(source: str) -> str | None:
    """The first checkpoint file a non-owner cannot read (0600 files are common after a copy)."""
    folder = Path(source)
    for path in (folder.iterdir() if folder.is_dir() else [folder]):
        if path.is_file() and not path.stat().st_mode & 0o004:
            return str(path)
    return None


def _device_requests(gpus):
    from docker.types import DeviceRequest

    if gpus is None:
        return None
    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if isinstance(gpus, int):
        return [DeviceRequest(count=gpus, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=list(gpus), capabilities=[["gpu"]])]


def _devices(devices: list[str]) -> list[str]:
    """'HOST[:CONTAINER[:PERMS]]' completed to the SDK's 'HOST:CONTAINER:PERMS'."""
    out = []
    for device in devices:
        parts = device.split(":")
        if len(parts) == 1:
            parts.append(parts[0])
        if len(parts) == 2:
            parts.append("rwm")
        out.append(":".join(parts))
    return out


def owner_labels() -> dict[str, str]:
    return {OWNER_LABEL: lifecycle.owner_token(), HOST_LABEL: socket.gethostname()}


def remove_orphaned_containers(client=None) -> list[str]:
    """Remove stage containers started on this host by a process that is dead (a SIGKILLed
    validate runs no cleanup); returns their names. Other hosts' owners mean nothing here."""
    import docker

    client = client or docker.from_env(timeout=10)
    removed = []
    for container in client.containers.list(all=True, filters={
            "label": [LABEL, OWNER_LABEL, f"{HOST_LABEL}={socket.gethostname()}"]}):
        owner = container.labels.get(OWNER_LABEL, "")
        if not re.fullmatch(r"[0-9]+-[0-9]+", owner) or lifecycle.alive(owner):
            continue
        container.remove(force=True)
        removed.append(container.name)
    return removed


def image_id(image: str) -> str | None:
    """The local image's content id (part of the stage cache key), None when unavailable."""
    try:
        import docker

        return docker.from_env().images.get(image).id
    except Exception:  # no engine or no image: the stage itself will say why
        return None


def run_in_container(spec: StageSpec, target: Target, log: Callable[[str], None] | None = None,
                     client=None) -> StageOutcome:
    """Run spec in a fresh container of the target's image; always returns an outcome."""
    import docker
    from docker.errors import DockerException, ImageNotFound

    log = log or (lambda line: None)
    settings = target.container
    started = time.monotonic()

    def failed(kind: str, message: str, code: int | None = None, tail=()) -> StageOutcome:
        return StageOutcome(stage=spec.stage, ok=False, failure=kind, error=message, exit_code=code,
                            seconds=time.monotonic() - started, log_tail=list(tail)[-20:],
                            ran_in=f"docker:{settings.image}")

    def refused(exc: Day0Error) -> StageOutcome:
        kind = "config" if isinstance(exc, ConfigError) else "input"
        log(f"[docker] refused before any container: {exc}")
        return failed(kind, str(exc), exc.exit_code)

    try:  # refused input is found before the engine is even asked
        check_user(target)
        spec, ro_paths = prepare(spec, target)
    except Day0Error as exc:
        return refused(exc)
    except OSError as exc:  # e.g. a folder on the way that this user may not read
        return failed("input", f"could not check the paths to mount: {exc}")
    try:
        client = client or docker.from_env()
        client.ping()
    except DockerException as exc:
        return failed("error", f"Docker engine not reachable ({exc}); start dockerd "
                      "(make docker-engine) or set DOCKER_HOST")
    try:
        client.images.get(settings.image)
    except ImageNotFound:
        return failed("image", f"image '{settings.image}' of target '{target.name}' is not on this "
                      "machine: build it (make images) or `docker pull` it; day0 never pulls")
    try:
        user = resolve_user(client, settings.image, target)
    except Day0Error as exc:
        return refused(exc)
    except DockerException as exc:  # the image's /etc/passwd could not be read
        return failed("error", f"could not resolve user '{settings.user}' in '{settings.image}': {exc}")
    try:
        spec = with_weights(spec, ro_paths, log)
    except Day0Error as exc:
        return refused(exc)
    except Exception as exc:  # e.g. the object store is unreachable: name it, do not crash
        return failed("input", f"could not prepare the weights for the container: {exc}")
    if unreadable := _unreadable(spec.inputs.source):
        return failed("input", f"{unreadable} is not readable by others, and the stage runs as "
                      f"uid {user} in its container: chmod -R a+rX {spec.inputs.source}")
    # owner-named: if this process dies, the next validate start sweeps it (day0.execution.lifecycle)
    workdir = lifecycle.make_scratch(spec.stage, root=os.environ.get(WORKDIR_ENV))
    try:
        return _run(client, spec, target, user, workdir, ro_paths, log, failed, started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(client, spec, target, user, workdir, ro_paths, log, failed, started) -> StageOutcome:
    from docker.errors import APIError
    from requests.exceptions import ConnectionError, ReadTimeout

    settings = target.container
    (workdir / "tmp").mkdir()
    for path in (workdir, workdir / "tmp"):
        path.chmod(0o777)  # the stage runs as a non-root uid that does not own the folder
    spec_file, result_file = workdir / "spec.json", workdir / "result.json"
    spec_file.write_text(spec.model_dump_json())
    hardening, memory_gib = create_options(client, target, log)
    timeout_s = target.timeout_s or DEFAULT_TIMEOUT_S
    env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TMPDIR": str(workdir / "tmp"),
           "HF_HOME": str(workdir / "tmp" / "hf"), "HOME": str(workdir / "tmp"), **settings.env}
    if secret := os.environ.get(EVIDENCE_SECRET):  # the stage seals and verifies stored evidence
        env[EVIDENCE_SECRET] = secret
    try:
        container = client.containers.create(
            settings.image, command=["python", "-m", "day0.execution.stage", str(spec_file), str(result_file)],
            mounts=_mounts({**ro_paths, str(workdir): False}), user=user,
            network_mode=settings.network, environment=env, **hardening,
            shm_size=settings.shm_size, device_requests=_device_requests(settings.gpus),
            devices=_devices(settings.devices) or None, working_dir=str(workdir),
            labels={LABEL: spec.stage, "day0.target": target.name, **owner_labels()},
            detach=True)
    except APIError as exc:
        return failed("image", f"could not create a container of '{settings.image}': {exc.explanation or exc}")
    tail: list[str] = [f"[docker] container {container.short_id} of {settings.image}"]
    log(tail[0])
    killed_for = None
    beat = progress.Heartbeat(spec.stage, log, rss=lambda: _container_rss(container))

    def seen(line: str) -> None:
        beat.seen(line)
        log(line)

    try:
        container.start()
        reader = threading.Thread(target=_pump, args=(container, tail, seen), daemon=True)
        reader.start()
        remaining = timeout_s - (time.monotonic() - started)
        try:
            with beat.ticking():  # container.wait blocks: heartbeats from a thread
                code = container.wait(timeout=max(remaining, 1))["StatusCode"]
        except (ReadTimeout, ConnectionError):
            killed_for = "timeout"
            container.kill()
            code = container.wait(timeout=30)["StatusCode"]
        reader.join(timeout=10)
        container.reload()
        oom = container.attrs["State"].get("OOMKilled", False)
    except APIError as exc:
        return failed("error", f"Docker failed running stage '{spec.stage}': {exc.explanation or exc}",
                      tail=tail)
    finally:
        try:
            container.remove(force=True)
        except APIError:
            pass
    seconds = time.monotonic() - started
    if killed_for == "timeout":
        return failed("timeout", f"stage '{spec.stage}' exceeded its timeout of {timeout_s:g} s "
                      f"in container {container.short_id} and was killed", code, tail)
    if oom:
        return failed("oom", f"stage '{spec.stage}' was OOM-killed by the kernel in its container "
                      f"(memory limit {memory_gib:.3g} GiB)", code, tail)
    if result_file.is_file():
        outcome = StageOutcome.model_validate_json(result_file.read_text())
        if outcome.failure == "image":
            return failed("image", _lacks(settings.image, spec.stage, outcome.error), code, tail)
        return outcome.model_copy(update={"seconds": seconds, "log_tail": tail[-20:],
                                          "ran_in": f"docker:{settings.image}:{container.short_id}"})
    missing = next((m for line in reversed(tail) if (m := MISSING_MODULE.search(line))), None)
    if missing:
        return failed("image", _lacks(settings.image, spec.stage, missing.group(2)), code, tail)
    return failed("crash", f"stage '{spec.stage}' exited with code {code} in its container "
                  "without a result", code, tail)


def _lacks(image: str, stage: str, what: str) -> str:
    what = what.split(": ", 1)[-1] if "lacks a dependency" in what else what
    return (f"image '{image}' lacks a dependency of stage '{stage}': {what} "
            "(install it in the image; see Dockerfile)")


def _pump(container, tail: list[str], log: Callable[[str], None]) -> None:
    """Container output to log, line by line as it arrives."""
    pending = b""
    try:
        for chunk in container.logs(stream=True, follow=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                _emit(raw, tail, log)
    except Exception:  # the container went away mid-stream: what arrived is kept
        pass
    if pending:
        _emit(pending, tail, log)


def _emit(raw: bytes, tail: list[str], log: Callable[[str], None]) -> None:
    line = raw.decode(errors="replace").rstrip()
    if not line.startswith(progress.PREFIX):  # the tail explains failures; progress does not
        tail.append(line)
        del tail[:-40]
    log(line)


def _container_rss(container) -> int | None:
    """Resident memory of the container's processes, seen from the host's /proc (None when
    the engine runs elsewhere)."""
    from day0.execution.memory import group_rss_bytes, rss_bytes

    container.reload()
    pid = int(container.attrs.get("State", {}).get("Pid") or 0)
    if not pid:
        return None
    return group_rss_bytes(pid) or rss_bytes(pid) or None


__all__ = ["run_in_container", "shared_volumes", "image_id", "LABEL"]
