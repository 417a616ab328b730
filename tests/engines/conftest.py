"""One real vLLM for CPU for the tests in this package, serving the tiny-llama fixture (bf16) as
the built-in `vllm-cpu-bf16` target launches it; tests of engine stages attach to it.

`make test` installs the engine venv first (`make engine`). DAY0_TEST_ENGINE_URL attaches to an
engine you started yourself instead (faster while developing; same model, served as
'day0-model', prefix caching off)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import MODELS

TINY_LLAMA = MODELS / "tiny-llama"


def engine_target(**engine):
    """The built-in vllm-cpu-bf16 target with its engine section updated."""
    from day0.execution.targets import resolve_target

    target = resolve_target("vllm-cpu-bf16")
    return target.model_copy(update={"engine": target.engine.model_copy(update=engine)})


@pytest.fixture(scope="package", autouse=True)
def engine_core_runs_its_worker():
    """Every vLLM these tests launch (the built-in target's included: its env adds to ours) runs
    its model worker inside the engine-core process instead of a third spawned process that
    imports vLLM and torch again: measured alone on the 2-core machine, tiny-llama ready in 19.6
    s instead of 28.4, 19 CPU-seconds instead of 30, per launch (one per fixture, fault copy and
    serving variant). The kernels, the API and day0's side are the same; a user's engine keeps
    vLLM's default."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield


@pytest.fixture(scope="package")  # stopped after tests/engines: idle, it still holds ~2 GiB
def tiny_llama_engine():
    """Endpoint of a running vLLM serving tiny-llama as 'day0-model' (plain configuration)."""
    from day0.engines.process import engine_python, launched
    from day0.engines.settings import Endpoint

    if url := os.environ.get("DAY0_TEST_ENGINE_URL"):
        yield Endpoint(base_url=url, served_name="day0-model", mode="attach")
        return
    settings = engine_target().engine
    try:
        engine_python(settings)
    except Exception as exc:
        pytest.fail(f"{exc} (`make test` runs `make engine` first)")
    with launched(settings, TINY_LLAMA, "bfloat16", log=None, name="test-session") as engine:
        yield engine.endpoint


def engine_pids() -> set[int]:
    """Live processes of any vLLM engine on this machine (API server, EngineCore, workers)."""
    from pathlib import Path

    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in "ZX" and (b"vllm" in cmdline or cmdline.startswith(b"VLLM::")):
            found.add(int(proc.name))
    return found


def pytest_collection_modifyitems(config, items):
    """A test on the package's engine is an engine test, marked or not: `make test-fast`
    (-m "not engine") never starts vLLM for it."""
    for item in items:
        if "tiny_llama_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)
