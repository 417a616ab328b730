"""Tables generated into hand-written pages: the package layout, the registered stages and the
shipped gates (each replaces a `<!-- day0:NAME -->` marker; docs/hooks.py)."""

from __future__ import annotations

import importlib
from pathlib import Path

from day0docs.source import cell, code, docstring, find, first_sentence, modules, package_dir, table


def package_layout() -> str:
    """One row per package and module under day0/, flows/ and tasks/, nested as on disk."""
    rows, shown_packages = [], set()
    for name, path in modules():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        if not is_package and package not in shown_packages:  # a folder without __init__.py
            rows.append([f"{'&nbsp;' * 4 * package.count('.')}**{code(package)}**",
                         "(a namespace package: no `__init__.py`)"])
        shown_packages.add(package)
        shown = f"**{code(name)}**" if is_package else code(name)
        what = first_sentence(docstring(path)) or "(no docstring)"
        rows.append([f"{'&nbsp;' * 4 * name.count('.')}{shown}", cell(what, emphasis=True)])
    return table(["package (bold) / module", "what it is"], rows)


def stage_table() -> str:
    """What `day0 stages` lists, one row per registered stage."""
    stages = importlib.import_module("day0.stages")
    rows = []
    for name in stages.names():
        stage = stages.get(name)
        needs = ", ".join(code(s) for s in (*stage.requires, *stage.after)) or "—"
        rows.append([f"[`{name}`](configuration.md#stage-{name.replace('_', '-')})",
                     cell(stage.summary), ", ".join(stage.target_kinds), needs])
    return table(["stage (its settings)", "what it proves", "runs on", "runs after"], rows)


def _bound(gate) -> str:
    if gate.paired is not None:
        spec = gate.paired
        return f"paired {spec.test}: drop < {spec.allowed_drop} (alpha {spec.alpha})"
    bound = f"{gate.op} {gate.threshold:g}"
    claims = ", ".join(f"{claim} {value:g}" for claim, value in gate.by_claim.items())
    return f"{bound} ({claims})" if claims else bound


def shipped_gates() -> str:
    """The gates of the gates.yaml shipped at the project root (next to the day0 package)."""
    load = find("load_gates")
    shipped = Path(package_dir("day0")).parent / "gates.yaml"
    if load is None or not shipped.is_file():
        return "(no shipped gates.yaml found)"
    rows = [[code(g.id), code(g.metric), cell(code(_bound(g))), g.severity, g.applies_to,
             cell(g.description)] for g in load(shipped).gates]
    return table(["gate", "metric", "bound (by claim)", "severity", "applies to", "why"], rows)


MARKERS = {"package-layout": package_layout, "stage-table": stage_table,
           "shipped-gates": shipped_gates}
