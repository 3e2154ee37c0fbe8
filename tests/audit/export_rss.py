"""Run one export in a fresh process and report its memory: `python -m tests.audit.export_rss URL OUT FMT`.

Prints JSON: resident memory when the export starts and the peak during it (KiB), and the events written.
The kernel's peak-RSS mark is reset first (Linux clear_refs), because ru_maxrss survives exec and would
report the parent's peak.
"""

from __future__ import annotations

import json
import sys


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def main() -> None:
    url, out, fmt = sys.argv[1], sys.argv[2], sys.argv[3]
    from audit.export import export_events
    from store.db import Database
    from tests.audit.conftest import KeySigner

    db = Database(url)
    signer = KeySigner()
    with db.read_session() as s:  # warm the engine and mappers so only the export itself is measured
        s.connection()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    with open(out, "wb") as fh:
        result = export_events(db, signer, fh, fmt=fmt)
    after = _status("VmHWM")
    print(json.dumps({"before_kib": before, "after_kib": after, "events": result.events}))


if __name__ == "__main__":
    main()
