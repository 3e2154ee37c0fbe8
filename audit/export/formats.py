"""The one registry of export formats. A new format is one module holding its writer and its reader
(and its `FORMAT` entry) plus one line here; exporter, verifier, CLI and API all read this table."""

from __future__ import annotations

from typing import Literal, get_args

from audit.export import csv, jsonl, ocsf
from audit.export.records import Format

FormatName = Literal["jsonl", "csv", "ocsf"]  # for typed signatures and the API schema

FORMATS: dict[str, Format] = {f.name: f for f in (jsonl.FORMAT, csv.FORMAT, ocsf.FORMAT)}
assert set(FORMATS) == set(get_args(FormatName)), "FormatName must list exactly the registered formats"


def detect(first_line: bytes) -> Format:
    """The format of a file from its first line; JSONL when none claims it (its reader then says why)."""
    for fmt in FORMATS.values():
        if fmt.name != "jsonl" and fmt.detects(first_line):
            return fmt
    return FORMATS["jsonl"]
