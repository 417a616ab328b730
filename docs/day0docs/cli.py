"""The CLI reference page: every command, argument, default and help text of the `day0` parser.

The parser is the one the `day0` console script's module builds (found through the installed
entry point, so a CLI module that moves is still found): the function there that returns an
ArgumentParser and takes no arguments. Subcommands are walked to any depth.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect

from day0docs.source import cell, code, log, table

SCRIPT = "day0"


def build_parser() -> argparse.ArgumentParser | None:
    points = [ep for ep in importlib.metadata.entry_points(group="console_scripts")
              if ep.name == SCRIPT]
    if not points:
        log.warning("day0 docs: no console script %r installed (pip install -e .)", SCRIPT)
        return None
    module = importlib.import_module(points[0].module)
    # callable without arguments; annotated as returning a parser first, then any that builds one
    callable_ = [fn for _, fn in inspect.getmembers(module, inspect.isfunction)
                 if fn.__module__ == module.__name__ and not any(
                     p.default is p.empty for p in inspect.signature(fn).parameters.values())]
    annotated = [fn for fn in callable_
                 if "ArgumentParser" in str(inspect.signature(fn).return_annotation)]
    builds = [fn for fn in callable_ if "ArgumentParser(" in inspect.getsource(fn)]
    for fn in dict.fromkeys(annotated + builds):
        parser = fn()
        if isinstance(parser, argparse.ArgumentParser):
            return parser
    log.warning("day0 docs: %s defines no function returning its ArgumentParser", module.__name__)
    return None


def _subcommands(parser: argparse.ArgumentParser):
    """(name, help, subparser) of each subcommand, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name) or "", sub


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "flag"
    if action.required:
        return "required"
    if action.default in (None, argparse.SUPPRESS):
        return "—"
    return code(action.default)


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return code(action.metavar or action.dest)
    takes = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    return ", ".join(code(option + takes) for option in action.option_strings)


def _arguments(parser: argparse.ArgumentParser) -> str:
    formatter = parser._get_formatter()
    exclusive = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        notes = [formatter._expand_help(action)] if action.help else []
        if action.choices:
            notes.append("choices: " + ", ".join(code(c) for c in action.choices))
        if isinstance(action, argparse._AppendAction):
            notes.append("repeatable")
        group = exclusive.get(id(action))
        if group:
            others = [o.option_strings[0] for o in group._group_actions if o is not action]
            notes.append("not with " + ", ".join(code(o) for o in others))
        rows.append([_argument(action), _default(action), cell("; ".join(notes))])
    return table(["argument", "default", "what it does"], rows) if rows else ""


def _section(path: str, help_text: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    anchor = path.replace(" ", "-")
    lines = [f"{'#' * min(depth, 6)} `{path}` {{#{anchor}}}", ""]
    for text in dict.fromkeys(t for t in (help_text, parser.description) if t):
        lines += [cell(text), ""]
    usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
    lines += ["```text", usage, "```", ""]
    arguments = _arguments(parser)
    if arguments:
        lines += [arguments, ""]
    for name, sub_help, sub in _subcommands(parser):
        lines += _section(f"{path} {name}", sub_help, sub, depth + 1)
    return lines


def page() -> str:
    parser = build_parser()
    lines = ["# CLI reference", "",
             "Generated from the `day0` argparse parser when this site is built: every command, "
             "argument, default and help text. `day0 COMMAND --help` prints the same.", ""]
    if parser is None:
        return "\n".join(lines)
    commands = [f"[`{SCRIPT} {name}`](#{SCRIPT}-{name}): {cell(help_text)}"
                for name, help_text, _ in _subcommands(parser)]
    lines += ["- " + c for c in commands] + [""]
    lines += _section(SCRIPT, "", parser, 2)
    return "\n".join(lines)
