"""scripts/compare_reports.py: a refactor keeps every verdict and every metric, except the figures
a stage marks as measured on this machine (latencies, rates), which differ between any two runs."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "compare_reports.py"


def _report(folder, verdict="PASS", **metrics):
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({"verdict": verdict, "metrics": metrics}))
    return folder.parent


def _compare(before, after, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), str(before), str(after), *extra],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_measured_figures_are_left_out_and_everything_else_is_compared(tmp_path):
    timing = "performance.short_qa.decode_ms_per_token"  # measured: true in its metrics.yaml
    before = _report(tmp_path / "a" / "m", **{"alignment.perplexity.rel_delta": 0.01, timing: 5.0})
    after = _report(tmp_path / "b" / "m", **{"alignment.perplexity.rel_delta": 0.01, timing: 9.0})
    same = _compare(before, after)
    assert same.returncode == 0, same.stdout
    assert "0 differences" in same.stdout and "1 measured figures not compared" in same.stdout
    assert _compare(before, after, "--measured").returncode == 1

    changed = _report(tmp_path / "c" / "m", "FAIL", **{"alignment.perplexity.rel_delta": 0.02,
                                                       timing: 5.0})
    differs = _compare(before, changed)
    assert differs.returncode == 1
    assert "verdict PASS -> FAIL" in differs.stdout
    assert "alignment.perplexity.rel_delta 0.01 -> 0.02" in differs.stdout
