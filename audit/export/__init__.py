"""Verifiable exports: `stream.export_events` selects and streams; each format module (jsonl, csv, ocsf)
holds its writer and its reader; `formats.FORMATS` is the one registry of them."""

from audit.export.formats import FORMATS, FormatName, detect
from audit.export.records import EXPORT_FORMAT, EXPORT_VERSION, Event, Format, Gap, Header, Record
from audit.export.stream import ExportFilter, ExportResult, context_positions, export_events, seq_range

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
