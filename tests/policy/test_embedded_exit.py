"""No "Engine is unsendable" at interpreter exit: engines built on threads still running when the process
exits (daemon server and worker threads) are not dropped from the exiting thread."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = """
import threading, time
from policy.engines.embedded import RegorusEngine, compile_modules
engine = RegorusEngine({"a.rego": "package a\\nx := 1\\n"})
ready = threading.Event()
def work():
    assert engine.evaluate("data.a.x") == 1
    ready.set()
    time.sleep(60)
def parse_only():  # keeps only its parsed copy of the modules (policy.engines.embedded.new_engine)
    compile_modules({"b.rego": "package b\\ny := 2\\n"})
    parsed.set()
    time.sleep(60)
parsed = threading.Event()
threading.Thread(target=work, daemon=True).start()
threading.Thread(target=parse_only, daemon=True).start()
assert engine.evaluate("data.a.x") == 1
ready.wait(10)
parsed.wait(10)
print("done")
"""


def test_no_unsendable_engine_message_at_exit() -> None:
    """Neither a thread's engines nor its parsed module sets are dropped from the exiting thread."""
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr
    assert "unsendable" not in r.stderr, r.stderr
    assert r.stderr == ""
