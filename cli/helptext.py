"""Command help as paragraphs that wrap at the terminal's width.

Typer (0.29) keeps every line break of a help text after its first paragraph, so a docstring wrapped at the
source's width broke mid-sentence on a terminal of any other width (`serve --help` at 100 columns: "With
several workers their" / "metrics are summed ..."). Each paragraph is joined into one line for rich to wrap;
a line that starts a list item (`- `, `* `, `1. `) keeps its own line, and a paragraph marked with click's
`\\b` is left as written."""

from __future__ import annotations

import re

from typer._click.core import Command

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


def reflow_tree(command: Command) -> None:
    """Every help text of a click command tree, reflowed in place (the text after a `\\f` is not shown)."""
    if command.help:
        shown, cut, rest = command.help.partition("\f")
        command.help = reflow(shown) + cut + rest
    subcommands = getattr(command, "commands", None)  # a group (typer.core.TyperGroup)
    if isinstance(subcommands, dict):
        for sub in subcommands.values():
            reflow_tree(sub)
