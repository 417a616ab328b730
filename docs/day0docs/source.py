"""Finding things in the code by name, and turning docstrings and values into Markdown.

Classes and functions are found by name anywhere under the packages (an AST index, no imports),
so a module that moves into a subpackage is still found; only the one module that defines the
name is imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
import re
from functools import lru_cache
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.day0")  # under "mkdocs": --strict counts its warnings

PACKAGES = ("day0", "flows", "tasks")


def package_dir(name: str) -> Path | None:
    """Where an installed top-level package lives (the checkout for an editable install)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def modules() -> list[tuple[str, Path]]:
    """(dotted name, file) of every module of PACKAGES, packages first within their folder."""
    found = []
    for package in PACKAGES:
        root = package_dir(package)
        if root is None:
            continue
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def docstring(path: Path) -> str:
    return ast.get_docstring(_tree(path)) or ""


@lru_cache(maxsize=None)
def find(name: str):
    """The class or function called name, defined at the top of exactly one module; None (and a
    warning, which fails a strict build) when no module or several define it."""
    where = [module for module, path in modules()
             if any(isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name
                    for node in _tree(path).body)]
    if len(where) != 1:
        log.warning("day0 docs: %s defined in %s; the generated reference needs exactly one",
                    name, ", ".join(where) or "no module")
        return None
    return getattr(importlib.import_module(where[0]), name)


_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "cf")


def first_sentence(text: str) -> str:
    """The first sentence of a docstring's first paragraph, as Markdown."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    for match in re.finditer(r"[.?!](?=\s)", paragraph):
        if not paragraph[:match.start()].lower().endswith(_ABBREVIATIONS):
            paragraph = paragraph[:match.end()]
            break
    return rst(paragraph)


def rst(text: str) -> str:
    """reStructuredText inline markup as Markdown: ``x`` and :role:`x` become `x`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def cell(text: str, emphasis: bool = False) -> str:
    """text for one table cell: one line, `|` and `<` escaped outside code spans, and `*` unless
    the text uses it for emphasis (docstrings do; field descriptions write globs with it)."""
    parts = " ".join(str(text).split()).split("`")
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;")
        if not emphasis:
            parts[i] = parts[i].replace("*", "\\*")
    return "`".join(parts)


def code(value) -> str:
    """A value as an inline code span, long ones shortened."""
    text = str(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
