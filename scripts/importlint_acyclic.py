"""An import-linter contract: no import cycles between modules of the given packages.

import-linter's own ``acyclic_siblings`` squashes each package into one node, so it reports
cycles between packages, not between modules, and says nothing about a module pair inside one
package (``day0.checkpoint.headers`` <-> ``day0.checkpoint.match``). This contract finds every strongly
connected component of the module graph (imports inside functions count: grimp sees them, and a
function-level import that closes a loop is still a loop) and reports each as the shortest
chain that closes it, with line numbers.

    [importlinter]
    contract_types = ["acyclic_modules: scripts.importlint_acyclic:AcyclicModulesContract"]

    [[importlinter.contracts]]
    name = "no import cycles"
    type = "acyclic_modules"
    packages = ["day0", "flows", "tasks"]
"""

from __future__ import annotations

from collections import deque

import grimp
from importlinter import Contract, ContractCheck, fields, output
from importlinter.application import contract_utils


class AcyclicModulesContract(Contract):
    """No module of `packages` reaches itself through imports of modules of `packages`."""

    type_name = "acyclic_modules"

    packages = fields.ListField(subfield=fields.StringField())
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph, ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=contract_utils.AlertLevel.ERROR)
        roots = tuple(self.packages)  # type: ignore[arg-type]
        unknown = [r for r in roots if r not in graph.modules]
        if unknown:  # a typo would otherwise check nothing and pass
            raise ValueError(f"acyclic_modules: no package {', '.join(unknown)} in the graph")
        inside = {m for m in graph.modules if m in roots or m.startswith(tuple(r + "." for r in roots))}
        edges = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in inside}
        cycles = []
        for component in _components(edges):
            chain = _shortest_cycle(min(component), edges, component)
            cycles.append({"modules": sorted(component),
                           "chain": [(a, b, _lines(graph, a, b)) for a, b in zip(chain, chain[1:])]})
        return ContractCheck(kept=not cycles, warnings=list(removal.warnings),
                             ignored_import_count=removal.ignored_import_count,
                             metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"Import cycle among {len(cycle['modules'])} modules: "
                               + ", ".join(cycle["modules"]))
            for importer, imported, lines in cycle["chain"]:
                output.indent_cursor()
                output.print_error(f"{importer} -> {imported} (l. {lines})", bold=False)
            output.new_line()


def _lines(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    return ", ".join(str(d["line_number"]) for d in details) or "?"


def _components(edges: dict[str, list[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return sorted(found, key=min)


def _shortest_cycle(start: str, edges: dict[str, list[str]], component: set[str]) -> list[str]:
    """start -> ... -> start, fewest imports first (breadth-first inside the component)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in edges[node]:
            if nxt not in component:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    return [start, start]  # unreachable for a component of two or more modules
