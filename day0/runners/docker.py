"""Docker runner: one stage in a container of ``target.container.image`` via the Docker SDK.

The container runs the same contract as the process runner (``python -m day0.stage SPEC
RESULT``) with:

* the weights mounted read-only (a local folder, or the materialized snapshot of an s3://
  source: with ``network: none`` the stage downloads nothing itself) and file plugins read-only;
* a per-stage scratch folder (spec, result, TMPDIR, HF_HOME) mounted read-write and removed after;
* no network unless the target asks for it, a non-root user, the target's memory limit (swap
  included), shm size, GPU requests and device nodes;
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
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from day0.plugins import is_file_plugin
from day0.stage import StageOutcome, StageSpec
from day0.targets import Target

LABEL = "day0.stage"
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


def _prepare(spec: StageSpec, log: Callable[[str], None]) -> tuple[StageSpec, dict[str, bool]]:
    """Spec with absolute local paths, and the paths to mount read-only."""
    from day0 import sources

    inputs = spec.inputs
    mounts: dict[str, bool] = {}
    source = inputs.source
    if sources.is_s3(source) and inputs.target.container.network == "none":
        source = sources.local_checkpoint(source, log=log)  # the container has no network
        mounts[str(sources.cache_root().resolve())] = True  # snapshot symlinks point into blobs/
    elif not sources.is_s3(source):
        source = str(Path(source).resolve())
        mounts[source if Path(source).is_dir() else str(Path(source).parent)] = True
    plugins = []
    for plugin in inputs.target.plugins:
        if is_file_plugin(plugin):
            plugin = str(Path(plugin).resolve())
            mounts[plugin] = True
        plugins.append(plugin)
    manifest = inputs.target.op_manifest
    if manifest and Path(manifest).is_file():
        manifest = str(Path(manifest).resolve())
        mounts[manifest] = True
    target = inputs.target.model_copy(update={"plugins": plugins, "op_manifest": manifest})
    config = _with_files_mounted(spec.config, mounts)
    return spec.model_copy(update={"config": config, "inputs": inputs.model_copy(
        update={"source": source, "target": target})}), mounts


def _with_files_mounted(value, mounts: dict[str, bool]):
    """Stage config values naming an existing local file or folder (e.g. text_file) become
    absolute paths, mounted read-only at the same place."""
    if isinstance(value, dict):
        return {k: _with_files_mounted(v, mounts) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_files_mounted(v, mounts) for v in value]
    if isinstance(value, str) and value and "://" not in value and Path(value).exists():
        value = str(Path(value).resolve())
        mounts[value] = True
    return value


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
        spec, ro_paths = _prepare(spec, log)
    except Exception as exc:  # e.g. the object store is unreachable: name it, do not crash
        return failed("input", f"could not prepare the weights for the container: {exc}")
    if unreadable := _unreadable(spec.inputs.source):
        return failed("input", f"{unreadable} is not readable by others, and the stage runs as "
                      f"uid {settings.user} in its container: chmod -R a+rX {spec.inputs.source}")
    workdir = Path(tempfile.mkdtemp(prefix=f"day0-{spec.stage}-", dir=os.environ.get("DAY0_DOCKER_WORKDIR")))
    try:
        return _run(client, spec, target, workdir, ro_paths, log, failed, started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(client, spec, target, workdir, ro_paths, log, failed, started) -> StageOutcome:
    from docker.errors import APIError
    from requests.exceptions import ConnectionError, ReadTimeout

    settings = target.container
    (workdir / "tmp").mkdir()
    for path in (workdir, workdir / "tmp"):
        path.chmod(0o777)  # the stage runs as a non-root uid that does not own the folder
    spec_file, result_file = workdir / "spec.json", workdir / "result.json"
    spec_file.write_text(spec.model_dump_json())
    limit = f"{int(target.memory_limit_gib * 2**30)}b" if target.memory_limit_gib else None
    env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TMPDIR": str(workdir / "tmp"),
           "HF_HOME": str(workdir / "tmp" / "hf"), "HOME": str(workdir / "tmp"), **settings.env}
    try:
        container = client.containers.create(
            settings.image, command=["python", "-m", "day0.stage", str(spec_file), str(result_file)],
            mounts=_mounts({**ro_paths, str(workdir): False}), user=settings.user,
            network_mode=settings.network, environment=env, mem_limit=limit, memswap_limit=limit,
            shm_size=settings.shm_size, device_requests=_device_requests(settings.gpus),
            devices=_devices(settings.devices) or None, working_dir=str(workdir),
            labels={LABEL: spec.stage, "day0.target": target.name}, detach=True)
    except APIError as exc:
        return failed("image", f"could not create a container of '{settings.image}': {exc.explanation or exc}")
    tail: list[str] = [f"[docker] container {container.short_id} of {settings.image}"]
    log(tail[0])
    killed_for = None
    try:
        container.start()
        reader = threading.Thread(target=_pump, args=(container, tail, log), daemon=True)
        reader.start()
        remaining = target.timeout_s - (time.monotonic() - started)
        try:
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
        return failed("timeout", f"stage '{spec.stage}' exceeded its timeout of {target.timeout_s:g} s "
                      f"in container {container.short_id} and was killed", code, tail)
    if oom:
        return failed("oom", f"stage '{spec.stage}' was OOM-killed by the kernel in its container "
                      f"(memory limit {target.memory_limit_gib:g} GiB)" if target.memory_limit_gib else
                      f"stage '{spec.stage}' was OOM-killed by the kernel in its container", code, tail)
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
    tail.append(line)
    del tail[:-40]
    log(line)


__all__ = ["run_in_container", "shared_volumes", "image_id", "LABEL"]
