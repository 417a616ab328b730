"""The Docker backend: one container of the project's image runs the batch (the runner's source
and the request are mounted read-only), with no network, a read-only root, root-owned tmpfs on
/scratch and /dev/shm, no-new-privileges, memory and pids limits and an empty environment.
The runner is root with every capability dropped but switching users, handing out folders and
killing: each program runs as uid 65534 in its own scratch folder, the one place it can write.
The container is always removed; what it printed is the batch's outcome."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from day0.stages.evaluation.sandbox.contract import (RUNNER, Limits, Outcome, SandboxError, parse,
                                                      request)

DEFAULT_IMAGE = "day0:local"  # `make images`; DAY0_IMAGE names another
LABEL = "day0.sandbox"
SCRATCH = "/scratch"


def image_name(image: str | None) -> str:
    return image or os.environ.get("DAY0_IMAGE") or DEFAULT_IMAGE


def _client():
    import docker

    return docker.from_env(timeout=10)


def available(image: str | None = None) -> bool:
    """A Docker daemon answers and has the image (nothing is pulled)."""
    try:
        client = _client()
        client.images.get(image_name(image))
        return True
    except Exception:  # noqa: BLE001 - no SDK, no daemon, no image: the process backend runs
        return False


def run(programs: list[str], limits: Limits, image: str | None = None) -> list[Outcome]:
    import docker

    name = image_name(image)
    budget = len(programs) * (limits.timeout_s + 5) + 60
    folder = Path(tempfile.mkdtemp(prefix="day0-sandbox-"))
    try:
        folder.chmod(0o755)  # read by uid 65534 in the container
        shutil.copy(RUNNER, folder / "runner.py")
        (folder / "request.json").write_text(request(programs, limits, None, isolate=False,
                                                     separate_user=True, scratch_root=SCRATCH))
        for path in folder.iterdir():
            path.chmod(0o644)
        client = _client()
        # root-owned tmpfs (Docker makes a tmpfs on /tmp world-writable whatever its mode: the
        # image's /tmp stays read-only): only the folder handed to a program is its own
        scratch = f"rw,nosuid,nodev,size={limits.scratch_mib}m,mode=0755"
        try:
            container = client.containers.run(
                name, ["python", "-I", "/sandbox/runner.py", "/sandbox/request.json"],
                # the runner: root with no capability but switching each program to uid
                # 65534, handing it its folder and killing what it leaves
                detach=True, network_mode="none", read_only=True, user="0:0",
                cap_drop=["ALL"], cap_add=["SETUID", "SETGID", "CHOWN", "KILL"],
                security_opt=["no-new-privileges"],
                pids_limit=limits.processes + 8, mem_limit=f"{limits.memory_mib + 256}m",
                memswap_limit=f"{limits.memory_mib + 256}m", nano_cpus=1_000_000_000,
                tmpfs={SCRATCH: scratch, "/dev/shm": "rw,nosuid,nodev,size=1m,mode=0755"},
                volumes={str(folder): {"bind": "/sandbox", "mode": "ro"}},
                environment={}, labels={LABEL: "1"}, working_dir=SCRATCH)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker sandbox ({name}): {exc}") from None
        try:
            try:
                status = container.wait(timeout=budget)
            except Exception:  # noqa: BLE001 - the wait timed out (requests' own error types)
                raise SandboxError(f"the sandbox container did not finish {len(programs)} "
                                   f"programs in {budget:.0f} s") from None
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            if status.get("StatusCode") != 0:
                err = container.logs(stdout=False, stderr=True).decode(errors="replace")
                raise SandboxError(f"the sandbox container exited {status.get('StatusCode')}: "
                                   f"{err.strip()[-400:]}")
        finally:
            container.remove(force=True)
        return parse(out, len(programs), f"docker sandbox ({name})")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
