"""`trustfabric agent`: its arguments are checked before anything starts (exit 2, one line), and a node
without an SVID and without a join token ends with one line saying what to do (exit 1), never a traceback;
the running command is covered by the end-to-end tests through the same Agent object."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import run_cli


@pytest.mark.parametrize("args, code, says", [
    (["agent"], 2, "--node"),
    (["agent", "--node", "gpu1", "--server", "http://127.0.0.1:1", "--ca", "x"], 2, "HTTPS only"),
    (["agent", "--node", "gpu1", "--server", "https://127.0.0.1:1", "--ca", "x", "--join-token", "a",
      "--join-token-file", "f"], 2, "not both"),
    (["agent", "--node", "gpu1", "--server", "https://127.0.0.1:1", "--ca", "x", "--metrics", "nope"], 2,
     "HOST:PORT"),
    (["agent", "--node", "Not_A_Slug", "--server", "https://127.0.0.1:1", "--ca", "x"], 1, "node name"),
    (["agent", "--node", "gpu1", "--server", "https://127.0.0.1:1", "--ca", "x"], 1, "join token"),
])
def test_bad_arguments_end_in_one_line(tmp_path: Path, args: list[str], code: int, says: str) -> None:
    out = run_cli([*args, "--data-dir", str(tmp_path / "agent")] if len(args) > 1 else args, {})
    assert out.returncode == code, (out.stdout, out.stderr)
    assert says in out.stderr and "Traceback" not in out.stderr + out.stdout
