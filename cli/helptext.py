"""Command help as paragraphs that wrap at the terminal's width.

Typer (0.29) keeps every line break of a help text after its first paragraph, so a docstring wrapped at the
source's width broke mid-sentence on a terminal of any other width (`serve --help` at 100 columns: "With
several workers their" / "metrics are summed ..."). Each paragraph is joined into one line for rich to wrap;
a line that starts a list item (`- `, `* `, `1. `) keeps its own line, and a paragraph marked with click's
`\\b` is left as written.

Typer 0.29 also labels each parameter's type with Python's name for it: `--json <bool>` (a flag, which takes no
value, read as one that wants `true`), `<str>`, `<list[Path]>`, `<int range>`. A flag shows no type, an argument
of text none beside its own name, and the others click's words (TEXT, INTEGER, FILE, ...)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from typer._click.core import Command, Context

_ITEM = re.compile(r"(?:[-*]|\d+\.)\s")


def reflow(text: str) -> str:
    paragraphs = []
    for paragraph in text.split("\n\n"):
        if paragraph.lstrip("\n").startswith("\b"):
            paragraphs.append(paragraph)
            continue
        lines: list[str] = []
        for raw in paragraph.splitlines():
            line = raw.strip()
            if lines and line and not _ITEM.match(line):
                lines[-1] = f"{lines[-1]} {line}"
            elif line:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(p for p in paragraphs if p)


_TYPE_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "file": "FILE", "dir": "DIR", "path": "PATH"}


def plain_type(label: str | None, *, flag: bool, argument: bool) -> str | None:
    """The type label help shows for a parameter: None for a flag and for a text argument (its name says what it
    is), click's word for typer's Python names (`<list[Path]>` -> PATH: a repeatable option takes one per use),
    any other label (an explicit metavar, a choice list) as it is."""
    if flag:
        return None
    if label is None or not (label.startswith("<") and label.endswith(">")):
        return label
    inner = label[1:-1].removesuffix(" range")
    while inner.startswith("list[") and inner.endswith("]"):
        inner = inner[5:-1]
    if argument and inner == "str":
        return None
    return _TYPE_WORDS.get(inner.lower(), inner.upper())


def _plain_types(command: Command) -> None:
    # --help is made on first use and kept (click's get_help_option): made here, so that it is relabelled too
    help_option = command.get_help_option(Context(command))
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        shown: Callable[..., str | None] | None = getattr(param, "display_type_rich", None)
        if shown is None:  # a plain click parameter: click shows no Python names
            continue

        def plain(ctx: Context, _shown: Callable[..., str | None] = shown, _param: Any = param) -> str | None:
            return plain_type(_shown(ctx=ctx), flag=bool(getattr(_param, "is_flag", False)),
                              argument=_param.param_type_name == "argument")

        param.display_type_rich = plain  # type: ignore[attr-defined]  # again: plain_type(plain label) is itself


def reflow_tree(command: Command) -> None:
    """Every help text of a click command tree, reflowed in place (the text after a `\\f` is not shown), and its
    parameters' type labels in click's words (plain_type)."""
    if command.help:
        shown, cut, rest = command.help.partition("\f")
        command.help = reflow(shown) + cut + rest
    _plain_types(command)
    subcommands = getattr(command, "commands", None)  # a group (typer.core.TyperGroup)
    if isinstance(subcommands, dict):
        for sub in subcommands.values():
            reflow_tree(sub)
