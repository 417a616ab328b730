"""Stage progress: the line format and its parser, rate limiting, heartbeats, the Prefect side."""

from __future__ import annotations

import io
import json

import pytest

from day0.execution import progress
from day0.execution.progress import Heartbeat, Progress, Reporter, format_line, parse


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def lines(out: io.StringIO) -> list[Progress]:
    return [parse(line) for line in out.getvalue().splitlines()]


def test_line_round_trips_and_describes_itself():
    p = Progress("alignment", "windows", 3, 8, "window 4: positions 1024/8192", 41.25)
    line = format_line(p)
    assert line.startswith("day0-progress {")
    assert json.loads(line.split(" ", 1)[1]) == {
        "stage": "alignment", "what": "windows", "done": 3, "total": 8,
        "detail": "window 4: positions 1024/8192", "percent": 41.2}
    back = parse(line)
    assert (back.stage, back.what, back.done, back.total, back.percent) == (
        "alignment", "windows", 3, 8, 41.2)
    assert back.describe() == "windows 3/8 (window 4: positions 1024/8192)"
    assert parse("\rLoading weights:  50%|#####     | 2/4" + line) == back  # after a bar's \r
    assert Progress("scan", "ops", 120).describe() == "ops 120" and Progress("s", "x", 1).overall is None
    assert Progress("s", "x", 2, 8).overall == 25.0


@pytest.mark.parametrize("line", [
    "stage finished", "day0-progress", "day0-progress {not json", "day0-progress []",
    'day0-progress {"stage": "a", "what": "w"}', 'day0-progress {"stage": 1, "what": "w", "done": 1}',
    'day0-progress {"stage": "a", "what": "w", "done": "x"}',
    'day0-progress {"stage": "a", "what": "w", "done": 1, "detail": "' + "x" * 3000 + '"}'])
def test_anything_else_is_not_progress(line):
    assert parse(line) is None


def test_reporter_rate_limits_per_part_and_never_drops_the_last():
    clock, out = Clock(), io.StringIO()
    r = Reporter("alignment", out=out, clock=clock)
    for i in range(1, 6):            # five in the same second: the first goes out, the rest held
        r.update("ops", i, 100)
    r.update("models", 1, 3)         # another part has its own limit
    assert [(p.what, p.done) for p in lines(out)] == [("ops", 1), ("models", 1)]
    clock.now += 1.0
    r.update("ops", 6, 100)
    r.update("ops", 7, 100)
    r.update("ops", 100, 100)        # finished: out at once
    assert [(p.what, p.done) for p in lines(out)][2:] == [("ops", 6), ("ops", 100)]
    r.update("windows", 1, 4)
    r.update("windows", 2, 4)        # held ...
    r.flush()                        # ... until the stage ends
    assert [(p.what, p.done) for p in lines(out)][-2:] == [("windows", 1), ("windows", 2)]


def test_planned_parts_give_the_percent_of_the_whole_stage():
    out = io.StringIO()
    r = Reporter("alignment", out=out, min_interval_s=0)
    r.plan({"models": 1, "ops": 1, "windows": 2})
    r.update("models", 1, 2)
    r.update("windows", 1, 4, fraction=0.5)   # ops skipped: counted as over once windows run
    r.update("other", 5)                      # not planned: no percent
    assert [p.percent for p in lines(out)] == [12.5, 75.0, None]


def test_module_level_update_prints_only_inside_a_stage(capsys):
    progress.update("ops", 1, 2)
    assert capsys.readouterr().out == ""
    progress.start("scan")
    try:
        progress.update("ops", 1, 2)
    finally:
        progress.stop()
    assert parse(capsys.readouterr().out).what == "ops"
    progress.update("ops", 2, 2)
    assert capsys.readouterr().out == ""


def test_heartbeat_only_after_silence_and_at_most_every_period():
    clock, said = Clock(), []
    beat = Heartbeat("alignment", said.append, rss=lambda: 3 * 2**30, clock=clock)
    clock.now += 9.9
    assert not beat.tick()
    beat.seen('day0-progress {"stage": "alignment", "what": "windows", "done": 1, "total": 4}')
    clock.now += 9.9
    assert not beat.tick() and not said           # it spoke 9.9 s ago
    clock.now += 0.2
    assert beat.tick()
    for _ in range(50):                           # polled every 0.1 s: one line per 10 s
        clock.now += 0.1
        beat.tick()
    assert len(said) == 1
    clock.now += 5.1
    assert beat.tick() and len(said) == 2
    assert said[0].startswith("[heartbeat] stage alignment still running: 20 s elapsed, silent 10 s")
    assert "RSS 3.00 GiB" in said[0] and "last progress: windows 1/4" in said[0]


def test_heartbeat_thread_for_runners_without_a_loop():
    said = []
    beat = Heartbeat("scan", said.append, every_s=0.05)
    with beat.ticking(interval_s=0.01):
        import time
        time.sleep(0.3)
    assert 2 <= len(said) <= 7 and all("[heartbeat] stage scan" in s for s in said)


class FakeLogger:
    def __init__(self):
        self.lines = []

    def info(self, msg, *args):
        self.lines.append(msg % args)

    warning = error = info


def test_stage_progress_keeps_progress_lines_out_of_the_log(monkeypatch):
    from tasks import progress as task_progress

    calls = []
    monkeypatch.setattr(task_progress.StageProgress, "_create",
                        lambda self, d: (calls.append(("create", self.percent, d)),
                                         setattr(self, "artifact_id", "id"))[0])
    monkeypatch.setattr(task_progress.StageProgress, "_update",
                        lambda self, d: calls.append(("update", self.percent, d)))
    clock, log = Clock(), FakeLogger()
    sp = task_progress.StageProgress("alignment", log, clock=clock)
    sp.line("loading weights")
    for i in range(1, 4):
        sp.line(format_line(Progress("alignment", "windows", i, 4, percent=20.0 * i)))
        clock.now += 0.5
    clock.now += 10
    sp.line(format_line(Progress("alignment", "windows", 4, 4, percent=90.0)))
    sp.finish(True)
    assert log.lines[0] == "[alignment] loading weights"
    assert not any("day0-progress" in line for line in log.lines)
    # readable lines: the first, then none for 10 s, then the finished part
    assert log.lines[1:] == ["[alignment] progress: windows 1/4, 20 %",
                             "[alignment] progress: windows 4/4, 90 %"]
    assert calls[0] == ("create", 0.0, "alignment: started")
    assert [c[1] for c in calls[1:]] == [20.0, 60.0, 90.0, 100.0]  # at most one per second
    assert calls[-1][2] == "alignment: done"
    assert task_progress.artifact_key("My_Stage.v2") == "day0-progress-my-stage-v2"


def test_stage_progress_survives_an_api_failure(monkeypatch):
    from tasks import progress as task_progress

    def broken(self, d):
        raise RuntimeError("API down")

    monkeypatch.setattr(task_progress.StageProgress, "_create", broken)
    log = FakeLogger()
    sp = task_progress.StageProgress("scan", log)
    sp.line(format_line(Progress("scan", "ops", 1, 2)))
    sp.finish(False, "timeout")
    assert sum("progress artifact create failed" in line for line in log.lines) == 1


def test_follow_summary_and_url():
    from day0.orchestration import follow

    assert follow.summary("Running", {"day0-progress-scan": (100.0, "scan: done"),
                                      "day0-progress-alignment": (40.0, "")}) == \
        "Running | scan: done | day0-progress-alignment: 40 %"
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4310/api"},
                            restore_defaults={PREFECT_UI_URL}):
        assert follow.run_url("abc") == "http://127.0.0.1:4310/runs/flow-run/abc"
    with temporary_settings(updates={PREFECT_UI_URL: "https://ui.example/"}):
        assert follow.run_url("abc") == "https://ui.example/runs/flow-run/abc"
