"""Build the fixture training corpus from docstrings shipped with CPython.

Used by scripts/make_fixtures.py --corpus-from-stdlib. The output is committed under
tests/fixtures/text/ because docstrings differ between Python versions: retraining always reads
the committed files, regenerating them is an explicit, rare step.
"""

from __future__ import annotations

import importlib
import inspect
import re
import unicodedata
import warnings
from pathlib import Path

# Fixed, sorted module list (not sys.stdlib_module_names, which changes between versions).
# Pure-Python, import-without-side-effects modules with substantial prose docstrings.
# A module missing on the running Python is skipped and reported.
TRAIN_MODULES = (
    "abc", "argparse", "ast", "asyncio", "base64", "bdb", "binascii", "builtins", "bz2",
    "calendar", "cmd", "code", "codecs", "codeop", "collections", "colorsys", "compileall",
    "concurrent.futures", "configparser", "contextlib", "contextvars", "copy", "copyreg",
    "csv", "ctypes", "dataclasses", "datetime", "dbm", "decimal", "difflib", "dis",
    "doctest", "email", "email.message", "email.utils", "encodings", "enum", "filecmp",
    "fileinput", "fnmatch", "ftplib", "functools", "gc", "getopt", "getpass", "gettext",
    "glob", "graphlib", "gzip", "hashlib", "hmac", "html", "html.parser", "http",
    "http.client", "http.cookiejar", "http.server", "imaplib", "importlib",
    "importlib.abc", "importlib.metadata", "importlib.resources", "inspect", "io",
    "ipaddress", "itertools", "json", "json.decoder", "json.encoder", "keyword",
    "linecache", "locale", "logging", "logging.handlers", "lzma", "mailbox", "marshal",
    "math", "mimetypes", "modulefinder", "multiprocessing", "netrc", "numbers",
    "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pickletools", "pkgutil",
    "platform", "plistlib", "poplib", "pprint", "profile", "pstats", "py_compile",
    "pyclbr", "pydoc", "queue", "quopri", "random", "re", "reprlib", "rlcompleter",
    "runpy", "sched", "secrets", "selectors", "shelve", "shutil", "signal", "site",
    "smtplib", "socket", "socketserver", "sqlite3", "ssl", "stat", "string",
    "stringprep", "struct", "subprocess", "symtable", "sys", "sysconfig", "tabnanny",
    "tarfile", "tempfile", "threading", "time", "timeit", "token", "tokenize", "trace",
    "traceback", "tracemalloc", "types", "typing", "unittest", "unittest.mock",
    "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref",
    "webbrowser", "wsgiref.handlers", "xml.dom.minidom", "xml.etree.ElementTree",
    "xmlrpc.client", "zipapp", "zipfile", "zipimport", "zlib",
)
# Held out by whole module so no held-out docstring is ever a training docstring (also
# de-duplicated globally below). Chosen to total a few tens of KB of prose.
HELDOUT_MODULES = ("bisect", "fractions", "heapq", "shlex", "statistics", "textwrap")

MIN_DOC_CHARS = 40
_BLANKS = re.compile(r"\n{3,}")


def _normalise(doc: str) -> str:
    doc = unicodedata.normalize("NFC", inspect.cleandoc(doc))
    doc = "\n".join(line.rstrip() for line in doc.splitlines())
    return _BLANKS.sub("\n\n", doc).strip()


def _own_docs(mod) -> list[str]:
    """Docstrings of the module and of the classes/functions it defines, in a fixed order.

    Uses __doc__, not inspect.getdoc, so docstrings inherited from other modules are not copied.
    """
    docs = [mod.__doc__]
    for name in sorted(vars(mod)):
        obj = vars(mod)[name]
        if getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isclass(obj):
            docs.append(obj.__doc__)
            for attr in sorted(vars(obj)):
                member = vars(obj)[attr]
                member = getattr(member, "__func__", member)  # classmethod/staticmethod
                if callable(member) or isinstance(member, property):
                    docs.append(getattr(member, "__doc__", None))
        elif inspect.isroutine(obj):
            docs.append(obj.__doc__)
    return [d for d in docs if isinstance(d, str)]


def build(out_dir: Path) -> dict[str, object]:
    """Write train.txt and heldout.txt under out_dir; return a small report."""
    seen: set[str] = set()
    parts: dict[str, list[str]] = {"heldout": [], "train": []}
    missing: list[str] = []
    # Held-out modules first, so a docstring shared with a training module stays held out
    # and is dropped from train (global de-duplication).
    order = [("heldout", m) for m in HELDOUT_MODULES] + [("train", m) for m in TRAIN_MODULES]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for split, name in order:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                missing.append(name)
                continue
            for raw in _own_docs(mod):
                doc = _normalise(raw)
                if len(doc) < MIN_DOC_CHARS or doc in seen:
                    continue
                seen.add(doc)
                parts[split].append(doc)
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for split, docs in parts.items():
        text = "\n\n".join(docs) + "\n"
        (out_dir / f"{split}.txt").write_text(text, encoding="utf-8", newline="\n")
        sizes[split] = len(text.encode("utf-8"))
    return {"bytes": sizes, "docs": {k: len(v) for k, v in parts.items()}, "missing": missing}


if __name__ == "__main__":
    # make_fixtures.py runs this as `python -I -S fixture_corpus.py OUT_DIR`: a fresh interpreter
    # without site-packages, because imported libraries (e.g. transformers patching logging)
    # change stdlib objects and therefore the harvested docstrings.
    import json
    import sys

    print(json.dumps(build(Path(sys.argv[1]))))
