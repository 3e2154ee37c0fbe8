"""Verifiable exports: `stream.export_events` selects and streams; each format module (jsonl, csv, ocsf)
holds its writer and its reader; `formats.FORMATS` is the one registry of them.

The names below load on first use (core/lazy.py): the offline verifier reads the formats without the
database code of `stream`."""

from typing import TYPE_CHECKING

from core.lazy import lazy_exports

if TYPE_CHECKING:
    from audit.export.formats import FORMATS, FormatName, detect
    from audit.export.records import (
        EXPORT_FORMAT,
        EXPORT_VERSION,
        Event,
        Format,
        Gap,
        Header,
        Record,
        context_positions,
    )
    from audit.export.stream import ExportFilter, ExportResult, export_events, seq_range

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "FORMATS",
    "Event",
    "ExportFilter",
    "ExportResult",
    "Format",
    "FormatName",
    "Gap",
    "Header",
    "Record",
    "context_positions",
    "detect",
    "export_events",
    "seq_range",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("FORMATS", "FormatName", "detect"), "audit.export.formats"),
    **dict.fromkeys(("EXPORT_FORMAT", "EXPORT_VERSION", "Event", "Format", "Gap", "Header", "Record",
                     "context_positions"), "audit.export.records"),
    **dict.fromkeys(("ExportFilter", "ExportResult", "export_events", "seq_range"), "audit.export.stream"),
})
