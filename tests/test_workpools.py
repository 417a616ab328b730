"""deploy/workpools/*.json and the stage deployments of deploy/prefect.yaml on a real Prefect server.

* the Docker and Kubernetes base job templates are accepted by the server (which checks every
  placeholder against the variables schema), a broken one is refused, and each renders with its
  worker's job configuration class (prefect-docker / prefect-kubernetes): accelerator limits,
  /dev/shm, node selection, a V1Job that Kubernetes' own models read back unchanged;
* job variables of a deployment are checked against the pool's schema;
* end to end: a Docker worker on this machine runs the stages of a validation in containers of
  day0:local (runner: deployment), with the verdict and metrics of the process runner.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import DAY0_IMAGE, HELDOUT, MODELS, ROOT
from tests.procs import stop_group

pytestmark = pytest.mark.integration
POOLS = ROOT / "deploy" / "workpools"
PREFECT = str(Path(sys.executable).parent / "prefect")
STAGE_LABEL = "org.day0.role=stage"


def template(kind: str) -> dict:
    return json.loads((POOLS / f"{kind}.json").read_text())


def _prefect(*args, env, timeout=180, check=True):
    proc = subprocess.run([PREFECT, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(ROOT))
    if check:
        assert proc.returncode == 0, (args, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def pools(prefect_server):
    """day0-docker and day0-kubernetes created with the commands deploy/prefect.yaml documents;
    deleted (with their deployments) at the end. Yields the CLI environment."""
    from prefect.client.orchestration import get_client

    env = {**os.environ, "PREFECT_API_URL": prefect_server, "DAY0_HOME": str(ROOT)}
    for kind in ("docker", "kubernetes"):
        _prefect("work-pool", "create", f"day0-{kind}", "--type", kind, "--overwrite",
                 "--base-job-template", f"deploy/workpools/{kind}.json", env=env)
    yield env
    with get_client(sync_client=True) as client:
        for kind in ("docker", "kubernetes"):
            for dep in client.read_deployments():
                if dep.work_pool_name == f"day0-{kind}":
                    client.delete_deployment(dep.id)
            client.delete_work_pool(f"day0-{kind}")


def _pool_template(name: str) -> dict:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_work_pool(name).base_job_template


# ----------------------------------------------------------------------------- Kubernetes

def _render_k8s(base: dict, values: dict):
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    return asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(base, values))


def _pod(config) -> dict:
    return config.job_manifest["spec"]["template"]["spec"]


def _paths(value, prefix="") -> set[str]:
    if isinstance(value, dict):
        return {p for k, v in value.items() for p in _paths(v, f"{prefix}/{k}")} | {prefix}
    if isinstance(value, list):
        return {p for i, v in enumerate(value) for p in _paths(v, f"{prefix}/{i}")} | {prefix}
    return {prefix}


def test_kubernetes_template_is_accepted_and_requests_accelerators(pools):
    base = _pool_template("day0-kubernetes")
    assert base == template("kubernetes")  # the server stored it as validated, unchanged

    config = _render_k8s(base, {"gpu_count": 2, "node_selector": {"nvidia.com/gpu.present": "true"},
                                "data_volume": {"name": "models", "persistentVolumeClaim":
                                                {"claimName": "models", "readOnly": True}},
                                "data_volume_mount": {"name": "models", "mountPath": "/models",
                                                      "readOnly": True}})
    pod = _pod(config)
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 2}  # unset cpu/memory dropped
    assert container["image"] == f"day0:{version('day0')}"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsNonRoot"]

    ascend = _pod(_render_k8s(base, {"gpu_count": 0, "npu_count": "1", "cpu_limit": "8",
                                     "memory_limit": "64Gi"}))
    limits = ascend["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 0, "huawei.com/Ascend910": "1", "cpu": "8", "memory": "64Gi"}
    bare = _pod(_render_k8s(base, {}))
    assert bare["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}  # the pool's default
    assert [m["name"] for m in bare["containers"][0]["volumeMounts"]] == ["dshm"]
    assert "nodeSelector" not in bare


def test_kubernetes_job_is_a_valid_v1job(pools):
    """The worker's final manifest for a flow run, read by the Kubernetes API models: a misspelt
    field (e.g. volumeMount) would be dropped by the round trip and fail the comparison."""
    from uuid import uuid4

    from kubernetes_asyncio.client import ApiClient
    from prefect.client.schemas.objects import FlowRun

    config = _render_k8s(_pool_template("day0-kubernetes"),
                         {"gpu_count": 1, "node_selector": {"pool": "gpu"},
                          "data_volume": {"name": "m", "nfs": {"server": "nfs", "path": "/m"}},
                          "data_volume_mount": {"name": "m", "mountPath": "/models"}})
    config.prepare_for_flow_run(FlowRun(flow_id=uuid4(), name="stage-alignment"))
    manifest = json.loads(json.dumps(config.job_manifest))

    async def round_trip():
        async with ApiClient() as api:  # generated models; client-side validation on
            return api.sanitize_for_serialization(api._ApiClient__deserialize(manifest, "V1Job"))

    back = asyncio.run(round_trip())
    # prefect-kubernetes requires these two on the pod spec (its base manifest check), where
    # Kubernetes ignores them; every other field is a V1Job field
    prefect_quirks = {"/spec/template/spec/parallelism", "/spec/template/spec/completions"}
    assert _paths(back) == _paths(manifest) - prefect_quirks
    container = back["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")
    assert container["args"][:3] == ["prefect", "flow-run", "execute"]


def test_broken_templates_are_rejected(prefect_server):
    """Both failure modes the tests above would miss: the server refuses a placeholder naming an
    undeclared variable; the worker's configuration refuses a manifest without a container."""
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    for kind in ("kubernetes", "docker"):
        broken = template(kind)
        if kind == "kubernetes":
            broken["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0][
                "resources"]["limits"]["nvidia.com/gpu"] = "{{ gpu_cnt }}"
        else:
            broken["job_configuration"]["image"] = "{{ gpu_cnt }}"
        resp = httpx.post(f"{prefect_server}/work_pools/", timeout=30,
                          json={"name": f"day0-broken-{kind}", "type": kind, "base_job_template": broken})
        assert resp.status_code == 422 and "gpu_cnt" in resp.text, resp.text

    no_container = template("kubernetes")
    del no_container["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"]
    with pytest.raises(ValueError, match="containers"):
        asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(no_container, {}))


# ----------------------------------------------------------------------------- Docker

def test_docker_template_renders_for_prefect_docker(pools):
    from docker.types import HostConfig
    from prefect_docker.worker import DockerWorkerJobConfiguration

    base = _pool_template("day0-docker")
    assert base == template("docker")
    gpus = [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    config = asyncio.run(DockerWorkerJobConfiguration.from_template_and_values(
        base, {"volumes": ["/models:/models:ro"], "device_requests": gpus,
               "env": {"DAY0_S3_ENDPOINT": "http://127.0.0.1:8333"}}))
    assert config.image == "day0:local" and config.image_pull_policy == "IfNotPresent"
    assert config.auto_remove is True and config.network_mode == "host"
    assert config.volumes == ["/models:/models:ro"]
    assert config.env == {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                          "DAY0_CACHE_DIR": "/tmp/day0-cache", "DAY0_S3_ENDPOINT": "http://127.0.0.1:8333"}
    assert config.container_create_kwargs == {"shm_size": "1g", "device_requests": gpus}
    host = HostConfig(version="1.44", **config.container_create_kwargs)  # what docker-py sends
    assert host["DeviceRequests"][0]["Driver"] == "nvidia" and host["ShmSize"] == 2**30
    ascend = asyncio.run(DockerWorkerJobConfiguration.from_template_and_values(
        base, {"devices": ["/dev/davinci0"], "shm_size": "8g"}))
    assert ascend.container_create_kwargs == {"shm_size": "8g", "devices": ["/dev/davinci0"]}


def test_prefect_yaml_stage_deployments_register(pools):
    """`prefect deploy --all` once the three pools exist; the server checks the stage
    deployments' job variables against the pools' schemas (a wrong type is refused)."""
    from prefect.client.orchestration import get_client

    recipe = yaml.safe_load((ROOT / "deploy" / "prefect.yaml").read_text())
    by_name = {d["name"]: d for d in recipe["deployments"]}
    _prefect("work-pool", "create", "day0-process", "--type", "process", "--overwrite", env=pools)
    _prefect("--no-prompt", "deploy", "--prefect-file", "deploy/prefect.yaml", "--all", env=pools)
    with get_client(sync_client=True) as client:
        assert client.read_deployment_by_name("validate/day0").work_pool_name == "day0-process"
        for kind in ("docker", "kubernetes"):
            dep = client.read_deployment_by_name(f"day0-stage/{kind}")
            assert dep.work_pool_name == f"day0-{kind}"
            assert dep.entrypoint == "flows/stage.py:day0_stage"
            assert dep.job_variables == by_name[kind]["work_pool"]["job_variables"]
            assert dep.pull_steps == [{"prefect.deployments.steps.set_working_directory":
                                       {"directory": "/opt/day0/app"}}]
    refused = _prefect("--no-prompt", "deploy", "--prefect-file", "deploy/prefect.yaml", "--name",
                       "day0-stage/kubernetes", "--job-variable", "gpu_count=two", env=pools, check=False)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "two" in output
    assert "is not valid under any of the given schemas" in output
    with get_client(sync_client=True) as client:
        assert client.read_deployment_by_name("day0-stage/kubernetes").job_variables["gpu_count"] == 1


# ----------------------------------------------------------------------------- end to end

def _shared_inputs(root: Path) -> tuple[Path, Path, Path]:
    """Copies of the fixture and the text readable by the image's uid 10001, plus a results
    folder it can write: the job sees them at the same absolute paths (bind mounts)."""
    model, text, results = root / "tiny-llama", root / "heldout.txt", root / "stage-results"
    shutil.copytree(MODELS / "tiny-llama", model)
    shutil.copyfile(HELDOUT, text)
    results.mkdir()
    for path in (root, model):
        path.chmod(0o755)
    for path in [*model.iterdir(), text]:
        path.chmod(0o644)
    results.chmod(0o777)
    return model, text, results


def _validate(model: Path, text: Path, target: dict, tmp_path: Path) -> dict:
    from flows.results import report_of
    from flows.validate import validate

    tfile = tmp_path / f"{target['name']}.yaml"
    tfile.write_text(yaml.safe_dump(target))
    # one window, one short generation: where a stage runs is the point, not how much it reads
    small = {"text_file": str(text), "max_windows": 1, "generation_prompts": 1, "new_tokens": 8}
    state = validate(source=str(model), target_file=str(tfile), use_cache=False,
                     stage_configs={"alignment": small}, return_state=True)
    return report_of(state)


@pytest.mark.docker
@pytest.mark.slow
def test_docker_worker_runs_stages_in_containers(pools, docker_client, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, LogFilter,
                                                LogFilterFlowRunId)

    assert DAY0_IMAGE == "day0:local", "deploy/prefect.yaml's docker stage deployment runs day0:local"
    model, text, results = _shared_inputs(tmp_path / "share")
    monkeypatch.setenv("DAY0_STAGE_RESULTS_URI", str(results))
    monkeypatch.setenv("DAY0_STAGE_START_GRACE_S", "180")

    # the stage deployment as deploy/prefect.yaml declares it, plus this machine's mounts and
    # host networking (the test server listens on 127.0.0.1 only)
    _prefect("--no-prompt", "deploy", "--prefect-file", "deploy/prefect.yaml", "--name",
             "day0-stage/docker", env=pools)
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("day0-stage/docker")
        assert dep.job_variables == {"image": "day0:local", "image_pull_policy": "Never"}
        client.update_deployment(dep.id, DeploymentUpdate(job_variables={
            **dep.job_variables, "network_mode": "host",
            "volumes": [f"{model}:{model}:ro", f"{text}:{text}:ro", f"{results}:{results}"]}))

    reference = _validate(model, text, {"name": "cpu-bf16-here", "device": "cpu",
                                        "dtype": "bfloat16", "concurrency": 2}, tmp_path)

    # Docker's own record of the containers the worker starts: a live event stream (the daemon
    # keeps only its last 256 events, too few to ask afterwards on a busy engine)
    started_for: dict[str, dict] = {}
    stream = docker_client.events(decode=True, filters={"type": "container", "event": "start",
                                                        "label": STAGE_LABEL})

    def collect():
        try:
            for event in stream:
                attributes = event["Actor"]["Attributes"]
                started_for[attributes.get("io.prefect.flow-run-id")] = {**attributes, "id": event["id"]}
        except Exception:  # the stream closed under us: done
            pass

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    worker_log = tmp_path / "worker.log"
    with open(worker_log, "w") as fh:
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", "day0-docker", "--type", "docker",
             "--name", "day0-test-docker-worker", "--limit", "4"],
            env={**pools, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "5"},
            stdout=fh, stderr=subprocess.STDOUT, cwd=str(tmp_path), start_new_session=True)
    try:
        started = time.monotonic()
        report = _validate(model, text, {"name": "cpu-bf16-pool", "device": "cpu", "dtype": "bfloat16",
                                         "runner": "deployment", "deployment": "day0-stage/docker",
                                         "concurrency": 2, "timeout_s": 300}, tmp_path)
        pool_seconds = time.monotonic() - started
        assert worker.poll() is None, worker_log.read_text()[-3000:]
    finally:
        stop_group(worker)
        stream.close()
        collector.join(timeout=10)
        leftovers = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            leftovers = docker_client.containers.list(all=True, filters={"label": STAGE_LABEL})
            if not leftovers:
                break
            time.sleep(1)
        for container in leftovers:
            container.remove(force=True)
    assert not leftovers, f"containers left behind: {[c.name for c in leftovers]}"

    log = worker_log.read_text()
    assert report["verdict"] == reference["verdict"] == "PASS", (report["errors"], log[-3000:])
    for name in ("analysis", "scan", "alignment", "evaluation", "performance"):
        stage = report["stages"][name]
        assert stage["ok"] and stage["ran_in"].startswith("deployment:day0-stage/docker:"), stage
        assert reference["stages"][name]["ran_in"] == "process"
    assert set(report["metrics"]) == set(reference["metrics"])
    # the same numbers; only the kernel profile's timings are the machine's at that moment
    assert ({k: v for k, v in report["metrics"].items() if not k.startswith("performance.")}
            == {k: v for k, v in reference["metrics"].items() if not k.startswith("performance.")})
    assert report["evidence"]["alignment"]["first_divergent_layer"] == reference["evidence"]["alignment"]["first_divergent_layer"]

    # each stage was a Completed flow run of the deployment, in a container of day0:local that
    # the worker started (Docker's own event log), and it said so from inside
    run_ids = {name: report["stages"][name]["ran_in"].rsplit(":", 1)[1] for name in report["stages"]}
    assert len({started_for[run_id]["id"] for run_id in run_ids.values()}) == len(run_ids) == 5, started_for
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))
        assert {str(r.id) for r in runs} == set(run_ids.values())
        for name, run_id in run_ids.items():
            run = next(r for r in runs if str(r.id) == run_id)
            assert run.state.is_completed() and run.parameters["spec"]["stage"] == name
            assert run.infrastructure_pid, run
            container = started_for[run_id]
            assert container["image"] == "day0:local"
            assert container["io.prefect.work-pool-name"] == "day0-docker"
            assert container["id"] in run.infrastructure_pid, (container["id"], run.infrastructure_pid)
            logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
            assert any(f"day0-stage {name} for" in line.message and "in container" in line.message
                       and "uid 10001" in line.message for line in logs), [line.message for line in logs]
    assert not any(results.rglob("*.json")), "stage outcome files are removed once read"
    timings = {label: ", ".join(f"{n} {s['seconds']:.1f} s" for n, s in r["stages"].items())
               for label, r in (("pool", report), ("process", reference))}
    print(f"\nvalidate on day0-docker: {pool_seconds:.1f} s to verdict; stages on the pool: "
          f"{timings['pool']}; with the process runner: {timings['process']}")
