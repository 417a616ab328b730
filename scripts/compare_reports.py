"""Compare the verdicts and metrics of two report.json files (or two folders of them).

    python scripts/compare_reports.py BEFORE AFTER [--tol 1e-6]

Prints one line per metric that differs by more than tol (relative to max(1, |before|)), and
per verdict that differs; exit 1 when anything does. Figures of the machine at that moment (a
stage's metrics.yaml marks them ``measured: true``: latencies, rates, memory slopes) differ
between any two runs and are not compared (counted; --measured compares them too), nor are the
metrics named with --ignore.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from day0.verdict.gates import catalog_entry, metric_catalog


def reports(path: Path) -> dict[str, dict]:
    if path.is_file():
        return {path.name: json.loads(path.read_text())}
    return {str(p.relative_to(path)): json.loads(p.read_text()) for p in sorted(path.rglob("report.json"))}


def number(value):
    if isinstance(value, str):  # "NaN"/"Infinity" as report.json writes them
        return float(value)
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--tol", type=float, default=1e-6)
    parser.add_argument("--ignore", nargs="*", default=["analysis.bytes_read"],
                        help="metrics not compared (default: analysis.bytes_read)")
    parser.add_argument("--measured", action="store_true",
                        help="compare the measured figures too (latencies, rates, slopes)")
    args = parser.parse_args(argv)
    before, after = reports(args.before), reports(args.after)
    differences, compared, measured = [], 0, set()
    catalog = metric_catalog()
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            differences.append(f"{name}: only in {'after' if name in after else 'before'}")
            continue
        b, a = before[name], after[name]
        if b["verdict"] != a["verdict"]:
            differences.append(f"{name}: verdict {b['verdict']} -> {a['verdict']}")
        for metric in sorted(set(b["metrics"]) | set(a["metrics"])):
            if metric in args.ignore:
                continue
            if not args.measured and (catalog_entry(metric, catalog) or {}).get("measured"):
                measured.add(metric)
                continue
            x, y = number(b["metrics"].get(metric)), number(a["metrics"].get(metric))
            compared += 1
            if x is None or y is None or (isinstance(x, float) and math.isnan(x)):
                same = x is y or (x is not None and y is not None and math.isnan(x) and math.isnan(y))
            else:
                same = abs(x - y) <= args.tol * max(1.0, abs(x))
            if not same:
                differences.append(f"{name}: {metric} {x} -> {y}")
    for line in differences:
        print(line)
    print(f"{len(before)} reports, {compared} metrics compared, {len(differences)} differences "
          f"(tol {args.tol:g})" + (f"; {len(measured)} measured figures not compared (--measured)"
                                   if measured else ""))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
