"""The Docker backend (the project's image, no network, read-only root, uid 65534): HumanEval's
canonical solutions pass, wrong ones fail, a hostile program is contained, and `auto` picks it
where the daemon has the image. No container is left behind."""

from __future__ import annotations

import pytest

from day0.stages.evaluation import sandbox
from day0.stages.evaluation.sandbox import container
from tests.conftest import DAY0_IMAGE
from tests.stages.evaluation.sandbox.hostile import (assert_canonical_passes_and_wrong_fails,
                                                      assert_contained)

pytestmark = [pytest.mark.docker]


def left(docker_client) -> list:
    return docker_client.containers.list(all=True, filters={"label": container.LABEL})


def test_humaneval_and_mbpp_canonical_solutions_pass_and_wrong_ones_fail(docker_client):
    assert container.available(DAY0_IMAGE)
    assert_canonical_passes_and_wrong_fails("docker")
    assert_canonical_passes_and_wrong_fails("docker", "mbpp", 500)
    assert left(docker_client) == []


def test_a_hostile_program_is_contained(docker_client, tmp_path, monkeypatch):
    assert_contained("docker", tmp_path, monkeypatch)
    assert left(docker_client) == []


def test_auto_takes_docker_where_the_image_is(docker_client, monkeypatch):
    calls = []
    monkeypatch.setattr(container, "run", lambda *a, **k: calls.append(a) or [])
    sandbox.run(["print(1)"], image=DAY0_IMAGE)
    assert calls, "auto did not take the Docker backend"
    assert not container.available("day0-no-such-image:never")
