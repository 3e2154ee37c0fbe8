"""A server process's app settles its start-up heap (api/app.py's settle: gc.freeze) as it starts, and only it:
an app the tests build leaves the collector as it was (frozen objects are never collected as cycles)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_server_app_freezes_its_start_up_heap_and_a_test_app_does_not(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import gc, sys
        from pathlib import Path
        from fastapi.testclient import TestClient
        from api.app import create_app
        from tests.api.conftest import make_settings, open_context

        ctx = open_context(make_settings(Path(sys.argv[1])))
        for settle in (False, True):
            with TestClient(create_app(ctx, settle_heap=settle)):
                print(gc.get_freeze_count(), flush=True)
        ctx.close()
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "home")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = (int(line) for line in out.stdout.split())
    assert before == 0
    assert after > 50_000  # the modules, the app and its machinery: ~190,000 objects
