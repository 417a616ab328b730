"""What a stage container may see and do: its user, its mounts and its limits.

Everything here runs before a stage container is created, and refuses bad input with a
``day0.errors`` error (exit code 2) that names the file, the field and the fix:

* ``user``: ``ContainerSettings.parse_user`` refuses root in any spelling Docker accepts
  ('0', '00:00', '+0', ' 0', '', '0:0', 'root', gid 0); a user or group *name* is resolved in
  the image's own /etc/passwd and /etc/group (read from a created, never started container) and
  refused when it is uid or gid 0 there, so Docker never resolves a name itself.
* mounts, all read-only: the checkpoint (a folder holding config.json), the target's file
  plugins and op manifest, and the stage-config fields declared as files (every ``*_file`` field
  of the stage's Config, e.g. alignment's text_file), which must be regular files inside
  ``container.mount_roots`` (default: the working directory and the checkpoint's folder). The
  stage config is validated against its Config first; no other config value is ever mounted.
  System trees (/etc, /proc, /var/run, ...), credential folders (.ssh, .docker, ...) and
  anything that is not a regular file or folder (the Docker socket) are refused everywhere.
* limits (``create_options``): all capabilities dropped, no-new-privileges, read-only root with a
  tmpfs /tmp, a pids limit, and memory and CPU limits from the stage budget.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Callable

from day0.errors import ConfigError, Day0Error, InputError, PluginError
from day0.execution.plugins import is_file_plugin
from day0 import stages
from day0.execution.stage import StageSpec, stage_module
from day0.execution.targets import ContainerSettings, Target

PROBE_LABEL = "day0.probe"
# Host trees never mounted into a stage container, nor any folder above them.
FORBIDDEN = ("/etc", "/proc", "/sys", "/dev", "/run", "/var/run", "/boot", "/root", "/usr",
             "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/var/lib/docker", "/var/lib/containerd",
             "/var/lib/kubelet", "/var/log", "/var/spool", "/snap")
# Credential folders and files, wherever they are (a home folder may be a mount root).
SECRETS = {".ssh", ".aws", ".docker", ".kube", ".gnupg", ".azure", ".netrc", ".git-credentials",
           ".pypirc", ".config"}
DEFAULT_MEMORY_SHARE = 0.75  # of the Docker host's memory, split among concurrent stages
PASSWD_MAX_BYTES = 2**20
_resolved: dict[tuple[str, str], str] = {}  # (image id, user) -> "uid:gid"


def _forbidden(path: Path) -> str | None:
    """Why path (resolved) may not be mounted, or None."""
    text = str(path)
    for tree in FORBIDDEN:
        if text == tree or text.startswith(tree + "/") or tree.startswith(text.rstrip("/") + "/"):
            return f"in or above the system folder {tree}"
    if secret := next((p for p in path.parts if p in SECRETS), None):
        return f"in the credentials folder {secret}"
    return None


def _host_path(value: str, what: str, error: type[Day0Error], file: str | None, field: str,
               kind: str) -> Path:
    """value resolved (symlinks followed) after checking it may be mounted as kind 'file'/'dir'."""
    path = Path(value).expanduser().resolve()
    why = _forbidden(path) or (None if path.exists() else "does not exist")
    if why is None:
        mode = path.stat().st_mode
        wanted = stat.S_ISREG(mode) if kind == "file" else stat.S_ISDIR(mode)
        if not wanted:
            why = f"not a regular {'file' if kind == 'file' else 'folder'} (socket, device?)"
    if why:
        raise error(f"{what} {why}; not mounted: {path}", file=file, field=field,
                    fix=f"name a {kind} of your own outside system and credential folders")
    return path


def mount_roots(settings: ContainerSettings, target: str, checkpoint: Path | None) -> list[Path]:
    """The folders stage-config files must lie in; each checked like a mount itself."""
    named = settings.mount_roots or [os.getcwd()] + ([str(checkpoint)] if checkpoint else [])
    roots = []
    for root in named:
        path = Path(root).expanduser().resolve()
        if why := _forbidden(path):
            if not settings.mount_roots:
                continue  # e.g. a worker whose working directory is /: that default is dropped
            raise ConfigError(f"mount root {why}; not allowed: {path}", file=f"target '{target}'",
                              field="container.mount_roots",
                              fix="list only folders holding your own stage files")
        roots.append(path)
    return roots


def file_fields(spec: StageSpec | str) -> list[str]:
    """The stage Config's fields that name a host file (by convention: ``*_file``)."""
    module = stages.get(spec).load() if isinstance(spec, str) else stage_module(spec)
    return sorted(n for n in module.Config.model_fields if n.endswith("_file"))


def _stage_files(spec: StageSpec, roots: list[Path], mounts: dict[str, bool]) -> dict:
    """spec.config validated, its declared files made absolute and added to mounts."""
    from day0.yamlio import load_model

    where = f"{spec.stage} stage config"
    load_model(stage_module(spec).Config, spec.config, where)  # ConfigError, nothing mounted
    config = dict(spec.config)
    for name in file_fields(spec):
        value = config.get(name)
        if not value or not Path(value).expanduser().exists():
            continue  # not on this host: the stage resolves it in the image, nothing is mounted
        path = _host_path(value, name, ConfigError, where, name, "file")
        if not any(path.is_relative_to(root) for root in roots):
            raise ConfigError(f"not in a folder stage files may come from; not mounted: {path}",
                              file=where, field=name, fix="put it in the working directory or "
                              "checkpoint, or its folder in container.mount_roots")
        config[name] = str(path)
        mounts[str(path)] = True
    return config


def prepare(spec: StageSpec, target: Target) -> tuple[StageSpec, dict[str, bool]]:
    """Spec with absolute host paths, and the host paths to mount read-only (all checked);
    an s3:// source is left for ``with_weights``."""
    from day0.store import sources

    inputs = spec.inputs
    mounts: dict[str, bool] = {}
    source, checkpoint = inputs.source, None
    if not sources.is_s3(source):
        source, checkpoint = _checkpoint(source)
        mounts[str(checkpoint)] = True
    plugins = []
    stage_target = inputs.target  # what the stage loads in the container: exactly what is mounted
    for plugin in stage_target.plugins:
        if is_file_plugin(plugin):
            plugin = str(_host_path(plugin, "plugin", PluginError, None, "plugins", "file"))
            mounts[plugin] = True
        plugins.append(plugin)
    manifest = stage_target.op_manifest
    if manifest and Path(manifest).expanduser().exists():
        manifest = str(_host_path(manifest, "op_manifest", ConfigError, f"target '{target.name}'",
                                  "op_manifest", "file"))
        mounts[manifest] = True
    config = _stage_files(spec, mount_roots(target.container, target.name, checkpoint), mounts)
    new_target = stage_target.model_copy(update={"plugins": plugins, "op_manifest": manifest})
    return spec.model_copy(update={"config": config, "inputs": inputs.model_copy(
        update={"source": source, "target": new_target})}), mounts


def with_weights(spec: StageSpec, mounts: dict[str, bool], log: Callable[[str], None]
                 ) -> StageSpec:
    """An s3:// source materialized here when the container has no network to fetch it."""
    from day0.store import sources

    source = spec.inputs.source
    if not sources.is_s3(source) or spec.inputs.target.container.network != "none":
        return spec
    source = sources.local_checkpoint(source, log=log)
    cache = sources.cache_root().resolve()  # snapshot symlinks point into blobs/
    mounts[str(_host_path(str(cache), "weights cache", InputError, None, "DAY0_CACHE_DIR",
                          "dir"))] = True
    return spec.model_copy(update={"inputs": spec.inputs.model_copy(update={"source": source})})


def _checkpoint(source: str) -> tuple[str, Path]:
    """(source as an absolute path, the folder to mount): a folder holding config.json, or a
    .json file in one; never a system or credentials folder, nor one holding credentials."""
    path = Path(source).expanduser().resolve()
    folder = path if path.is_dir() else path.parent
    problem = _forbidden(folder) or (None if path.exists() else "does not exist")
    if problem is None and not (folder / "config.json").is_file() and not (
            path.is_file() and path.suffix == ".json"):
        problem = "holds no config.json"
    if problem is None and (secret := next((p.name for p in folder.iterdir()
                                            if p.name in SECRETS), None)):
        problem = f"holds the credentials {secret}"
    if problem:
        raise InputError(f"checkpoint folder {problem}; not mounted: {folder}", file=source,
                         field="source", fix="give the checkpoint's own folder (config.json, "
                         "*.safetensors)")
    return str(path), folder


def check_user(target: Target) -> tuple[int | str, int | str | None]:
    """target.container.user parsed; ConfigError for root in any spelling, or a malformed one.
    Checked again here because a Target built with model_construct/model_copy skips validation."""
    try:
        return ContainerSettings.parse_user(target.container.user)
    except ValueError as exc:
        raise ConfigError(str(exc).split("; use")[0], file=f"target '{target.name}'",
                          field="container.user",
                          fix="use a non-root uid:gid such as 10001:10001") from None


def resolve_user(client, image: str, target: Target) -> str:
    """target.container.user as the numeric 'uid:gid' handed to Docker (never 0)."""
    user = target.container.user
    where = dict(file=f"target '{target.name}'", field="container.user")
    uid, gid = check_user(target)
    if isinstance(uid, int) and isinstance(gid, int):
        return f"{uid}:{gid}"
    key = (client.images.get(image).id, user)
    if key not in _resolved:
        _resolved[key] = _from_image(client, image, user, uid, gid, where)
    return _resolved[key]


def _from_image(client, image, user, uid, gid, where) -> str:
    passwd = _parse(_image_file(client, image, "/etc/passwd"))
    entry = next((e for e in passwd if (e[0] if isinstance(uid, str) else e[2]) == str(uid)), None)
    if entry is None and (isinstance(uid, str) or gid is None):
        raise ConfigError(f"user '{user}': the image '{image}' has no /etc/passwd entry for "
                          f"{uid}", **where, fix="give numbers, 'UID:GID' such as 10001:10001")
    uid = int(entry[2]) if isinstance(uid, str) else uid
    if isinstance(gid, str):
        group = next((e for e in _parse(_image_file(client, image, "/etc/group")) if e[0] == gid),
                     None)
        if group is None:
            raise ConfigError(f"user '{user}': the image '{image}' has no group '{gid}'", **where,
                              fix="give numbers, 'UID:GID' such as 10001:10001")
        gid = int(group[2])
    elif gid is None:
        if not entry[3].isdigit():
            raise ConfigError(f"user '{user}': its /etc/passwd entry in '{image}' has no numeric "
                              "group", **where, fix="give numbers, 'UID:GID' such as 10001:10001")
        gid = int(entry[3])
    if uid == 0 or gid == 0:
        raise ConfigError(f"user '{user}' is uid {uid}, gid {gid} in the image '{image}': "
                          "stages never run as root or in the root group", **where,
                          fix="use a non-root uid:gid such as 10001:10001")
    return f"{uid}:{gid}"


def _parse(text: str | None) -> list[list[str]]:
    rows = [line.split(":") for line in (text or "").splitlines() if not line.startswith("#")]
    return [r for r in rows if len(r) >= 4 and r[2].isdigit()]


def _image_file(client, image: str, path: str) -> str | None:
    """A small file of the image, read from a container that is created and never started."""
    from docker.errors import NotFound

    container = client.containers.create(image, command=["/day0-probe-never-runs"],
                                         network_disabled=True, labels={PROBE_LABEL: path})
    try:
        stream, info = container.get_archive(path)
        if info.get("size", 0) > PASSWD_MAX_BYTES:
            return None
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()  # a symlink in the image is not followed: unreadable, refused
            return tar.extractfile(member).read().decode(errors="replace") if (
                member and member.isfile()) else None
    except NotFound:
        return None
    finally:
        container.remove(force=True)


def create_options(client, target: Target, log: Callable[[str], None]
                   ) -> tuple[dict, float]:
    """The hardening and resource limits of a stage container (docker-py create() kwargs), and
    its memory limit in GiB."""
    settings = target.container
    info = client.info()
    share = max(target.concurrency, 1)
    if target.memory_limit_gib:
        memory = target.memory_limit_gib * 2**30
    elif settings.memory_gib:
        memory = settings.memory_gib * 2**30
    else:
        memory = info["MemTotal"] * DEFAULT_MEMORY_SHARE / share
    host_cpus = float(info.get("NCPU") or os.cpu_count() or 1)
    cpus = settings.cpus or max(host_cpus / share, 1.0)
    if cpus > host_cpus:
        log(f"[docker] container.cpus {cpus:g} is more than the host's {host_cpus:g}: using {host_cpus:g}")
        cpus = host_cpus
    limit = f"{int(memory)}b"
    scratch = f"rw,nosuid,nodev,size={settings.tmpfs_size},mode=1777"
    return dict(
        cap_drop=["ALL"], security_opt=["no-new-privileges:true"], read_only=True,
        tmpfs={path: scratch for path in ["/tmp", *settings.tmpfs]},
        pids_limit=settings.pids_limit, mem_limit=limit, memswap_limit=limit,
        nano_cpus=int(cpus * 1e9)), memory / 2**30


__all__ = ["check_user", "prepare", "with_weights", "resolve_user", "create_options", "file_fields", "mount_roots",
           "FORBIDDEN", "SECRETS", "PROBE_LABEL"]
