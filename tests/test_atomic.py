"""Temp files get unpredictable names created with O_EXCL: a symlink planted at the name an
older day0 would have used (or at the destination) never redirects a write."""

from __future__ import annotations

import os

from day0.execution import cache
from day0.atomic import write_atomic
from day0.execution.runners.deployment import write_outcome
from day0.execution.stage import StageOutcome
from day0.store.s3 import write_results


def plant(path, victim):
    """A symlink at path pointing at victim, as another user of a shared folder could make."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, path)


def test_cache_store_ignores_a_planted_symlink(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_CACHE_DIR", str(tmp_path / "cache"))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    stages = tmp_path / "cache" / "stages"
    plant(stages / f"k1.{os.getpid()}.tmp", victim)        # the old predictable temp name
    plant(stages / f".k1.json.{os.getpid()}.tmp", victim)  # and the new prefix with a pid
    cache.store("k1", StageOutcome(stage="scan", ok=True, metrics={"scan.coverage": 1.0}))
    assert victim.read_text() == "precious"
    assert cache.load("k1").metrics == {"scan.coverage": 1.0}
    assert not [p for p in stages.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_destination_symlink_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    dest = tmp_path / "shared" / "report.json"
    plant(dest, victim)
    write_atomic(dest, '{"ok": true}')
    assert victim.read_text() == "precious"
    assert not dest.is_symlink() and dest.read_text() == '{"ok": true}'
    assert oct(dest.stat().st_mode & 0o777) == oct(0o644)


def test_results_and_stage_outcomes_ignore_planted_symlinks(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    where = tmp_path / "results"
    plant(where / f".report.json.{os.getpid()}.tmp", victim)
    write_results(str(where) + "/", {"report.json": b"{}"})
    assert victim.read_text() == "precious" and (where / "report.json").read_text() == "{}"

    uri = tmp_path / "stages" / "alignment.json"
    plant(uri.with_name(f".{uri.name}.{os.getpid()}.tmp"), victim)
    write_outcome(str(uri), StageOutcome(stage="alignment", ok=True))
    assert victim.read_text() == "precious"
    assert StageOutcome.model_validate_json(uri.read_text()).ok


def test_failed_write_leaves_no_temp_file(tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", refuse)
    try:
        write_atomic(tmp_path / "x.json", "data")
    except OSError:
        pass
    assert list(tmp_path.iterdir()) == []
