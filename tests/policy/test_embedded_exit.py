"""No "Engine is unsendable" at interpreter exit: engines built on threads still running when the process
exits (daemon server and worker threads) are not dropped from the exiting thread."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = """
import threading, time
from policy.engines.embedded import RegorusEngine
engine = RegorusEngine({"a.rego": "package a\\nx := 1\\n"})
ready = threading.Event()
def work():
    assert engine.evaluate("data.a.x") == 1
    ready.set()
    time.sleep(60)
threading.Thread(target=work, daemon=True).start()
assert engine.evaluate("data.a.x") == 1
ready.wait(10)
print("done")
"""


def test_no_unsendable_engine_message_at_exit() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr
    assert "unsendable" not in r.stderr, r.stderr
    assert r.stderr == ""
