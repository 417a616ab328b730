"""The process backend (unshare): HumanEval's canonical solutions pass, wrong ones fail, and a
hostile program is contained."""

from __future__ import annotations

import pytest

from day0.errors import ConfigError
from day0.stages.evaluation import sandbox
from day0.stages.evaluation.sandbox import namespace
from tests.stages.evaluation.sandbox.hostile import (assert_canonical_passes_and_wrong_fails,
                                                      assert_contained)


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    assert_canonical_passes_and_wrong_fails("process")


@pytest.mark.slow  # 1,000 sandboxed programs: make test, not the inner loop's make test-fast
def test_mbpp_canonical_solutions_pass_and_wrong_ones_fail():
    assert_canonical_passes_and_wrong_fails("process", "mbpp", 500)


def test_a_hostile_program_is_contained(tmp_path, monkeypatch):
    assert_contained("process", tmp_path, monkeypatch)


def test_no_isolation_means_nothing_runs(monkeypatch):
    monkeypatch.setattr(namespace, "_checked", {namespace._as_root(): "`unshare` failed: x"})
    with pytest.raises(ConfigError, match="no sandbox for model-written code") as caught:
        sandbox.run(["print(1)"], backend="process")
    assert "make images" in caught.value.fix


def test_limits_are_checked_config():
    with pytest.raises(ValueError, match="extra"):
        sandbox.Limits(timeout=3)
    with pytest.raises(ValueError):
        sandbox.Limits(timeout_s=0)
