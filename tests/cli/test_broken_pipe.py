"""`trustfabric ... | head`: when the reader of the output stops reading, the command ends as cat or grep do --
quietly (no error line, no traceback) and with exit 0 -- whichever way the output was being written (rich's
console, typer's help, click, the interpreter's flush at exit). The installed binary, as a shell runs it, its
stdout a pipe whose reading end is closed before it writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from policy.shipped import REGO_DIR

BINARY = str(Path(sys.executable).with_name("trustfabric"))


def _into_a_closed_pipe(*args: str) -> tuple[int, str]:
    process = subprocess.Popen([BINARY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the command (~0.3 s to start) writes anything
    err = process.stderr.read().decode()
    process.stderr.close()
    return process.wait(timeout=60), err


@pytest.mark.parametrize("args", [
    ("--help",),
    ("policy", "eval", "data", "--data", str(REGO_DIR)),
    ("policy", "eval", "data", "--data", str(REGO_DIR), "--json"),
], ids=["help", "table", "json"])
def test_a_reader_that_went_away_ends_the_command_quietly(args: tuple[str, ...]) -> None:
    code, err = _into_a_closed_pipe(*args)
    assert (code, err) == (0, "")


def test_an_error_is_still_an_error_with_its_line() -> None:
    code, err = _into_a_closed_pipe("policy", "eval", "data", "--data", "/nonexistent-dir")
    assert code == 2 and err.startswith("error:") and "Traceback" not in err, err
