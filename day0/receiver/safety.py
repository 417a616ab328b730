"""One grammar for every name that comes from outside (object keys, model names, sources) and
log-safe rendering of such values.

A name is '/'-separated segments, none empty, '.' or '..', with no backslash and no control,
format or line-separator character: it can never climb out of a folder or a results URI, and
never forge a log line. Sources are 's3://bucket[/key]' or an absolute folder, and a signed
release may only name one under the configured `release_sources`.
"""

from __future__ import annotations

import logging
import re
import unicodedata

BUCKET = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$"  # S3 rules, loosened as MinIO/Ceph allow
MAX_NAME = 1024
# Cc control, Cf format (bidi overrides, zero-width), Zl/Zp line breaks, Cs lone surrogates
_UNSAFE = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))


def name_problem(text: str, max_len: int = MAX_NAME) -> str | None:
    """Why `text` is not a safe relative name, or None."""
    if not text:
        return "is empty"
    if len(text) > max_len:
        return f"is longer than {max_len} characters"
    bad = next((c for c in text if unicodedata.category(c) in _UNSAFE), None)
    if bad is not None:
        return f"contains the control character U+{ord(bad):04X}"
    if "\\" in text:
        return "contains a backslash"
    if text.startswith("/"):
        return "is an absolute path"
    if any(seg in ("", ".", "..") for seg in text.split("/")):
        return "has an empty, '.' or '..' segment"
    return None


def check_name(text: str, what: str, max_len: int = MAX_NAME) -> str:
    """`text`, or ValueError naming `what` and the problem."""
    problem = name_problem(text, max_len)
    if problem:
        raise ValueError(f"{what} {problem}")
    return text


def parse_source(text: str) -> str:
    """A concrete source: 's3://bucket[/key]' or '/abs/folder' in the safe grammar, else ValueError."""
    if text.startswith("s3://"):
        bucket, _, key = text[5:].partition("/")
        if not re.match(BUCKET, bucket):
            raise ValueError("source must be s3://BUCKET/PREFIX with a valid bucket name")
        if key:
            check_name(key, "source prefix")
        return text
    if text.startswith("/") and not text.startswith("//"):
        check_name(text[1:], "source folder")
        return text
    raise ValueError("source must be s3://BUCKET/PREFIX or an absolute folder")


def source_prefix(text: str) -> str:
    """A configured source prefix: like a source, with 's3://*' for any bucket."""
    text = text.rstrip("/") if len(text.rstrip("/")) > len("s3:/") else text
    if text == "s3://*":
        return text
    try:
        return parse_source(text)
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc} (or 's3://*')") from None


def under(source: str, prefixes: list[str]) -> bool:
    """Is `source` (already parsed) at or below one of `prefixes`?"""
    for prefix in prefixes:
        if prefix == "s3://*":
            if source.startswith("s3://"):
                return True
        elif source == prefix or source.startswith(prefix + "/"):
            return True
    return False


def escape(value: object, limit: int = 300) -> str:
    """`value` as one printable line: unsafe characters as \\xNN / \\uNNNN, at most `limit` long."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = f"{text[:limit]}...(+{len(text) - limit} chars)"
    if all(unicodedata.category(c) not in _UNSAFE for c in text):
        return text
    out = []
    for c in text:
        if unicodedata.category(c) in _UNSAFE:
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


class EscapeFilter(logging.Filter):
    """Escapes every argument of a log record, so values from senders stay on one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_safe(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _safe(v) for k, v in record.args.items()}
        return True


def _safe(arg):
    return arg if isinstance(arg, (int, float, type(None))) else escape(arg)
