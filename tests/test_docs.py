"""The documentation site builds with `mkdocs build --strict` (a broken link or anchor, an unknown
marker or a model field without a description fails it), and strict mode does fail on a broken
link; the README's links to docs/ resolve. Fast: no Prefect, a few seconds of mkdocs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

MKDOCS = Path(sys.executable).with_name("mkdocs")


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    assert MKDOCS.is_file(), "mkdocs is not installed in this venv: `make install` (the test extra)"
    # NO_MKDOCS_2_WARNING: Material's end-of-life banner, printed on every build otherwise
    return subprocess.run([str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_site_builds_strict(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert 'id="day0-validate"' in cli and "--target-file" in cli  # generated from the parser
    config = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert 'id="stage-alignment"' in config and 'id="validate-request"' in config
    built = (tmp_path / "site" / "how-it-is-built" / "index.html").read_text()
    assert "day0.stages.alignment" in built and "day0:package-layout" not in built


def test_strict_build_fails_on_a_broken_link(tmp_path):
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md)\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    said = done.stdout + done.stderr  # the abort line goes to stdout, the warning to stderr
    assert "no-such-page.md" in said and "strict mode" in said, said


def test_readme_links_resolve():
    """The README is the door to docs/: each relative link names an existing file, and an
    anchor in it names a heading of that page (the anchors mkdocs' toc gives headings)."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert links
    for target, anchor in links:
        if "://" in target:
            continue
        page = ROOT / target
        assert page.is_file(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
            slugs = {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h.lower()).strip())
                     for h in headings}
            assert anchor in slugs, f"{target}#{anchor}"
