"""MkDocs hooks of the day0 site (mkdocs.yml `hooks:`): the reference pages, generated from the
code at build time so that they cannot drift from it.

- `cli.md` and `configuration.md` are added as generated files (day0docs.cli, day0docs.config);
- a `<!-- day0:NAME -->` marker in a hand-written page is replaced by a generated table
  (day0docs.tables.MARKERS); an unknown marker is a warning, so `mkdocs build --strict` fails.
"""

from __future__ import annotations

import re

from mkdocs.structure.files import File

from day0docs import cli, tables
from day0docs import config as configuration
from day0docs.source import log

GENERATED = {"cli.md": cli.page, "configuration.md": configuration.page}
MARKER = re.compile(r"<!-- day0:([a-z-]+) -->")


def on_files(files, config, **kwargs):
    for name, build in GENERATED.items():
        files.append(File.generated(config, name, content=build()))
    return files


def on_page_markdown(markdown, page, **kwargs):
    def table(match: re.Match) -> str:
        build = tables.MARKERS.get(match.group(1))
        if build is None:
            log.warning("day0 docs: %s has an unknown marker %r", page.file.src_uri, match.group(0))
            return match.group(0)
        return build()

    return MARKER.sub(table, markdown)
