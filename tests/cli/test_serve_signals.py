"""Issue 13, item 12: `trustfabric serve --tls` removes its TLS temporary directory (the server key, encrypted
under a one-time password, and its certificate) however it is stopped: SIGTERM, SIGINT or SIGHUP sent to
the real process. uvicorn re-raised the signal it had handled with the default handler restored, which
ended the process before the cleanup ran."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.conftest import run_cli
from tests.policy.conftest import free_port

BIN = str(Path(sys.executable).parent / "trustfabric")
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def test_serve_tls_removes_its_temporary_directory_on_every_signal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")}
    env.update(TRUSTFABRIC_HOME=str(home), TRUSTFABRIC_MODE="development")
    assert run_cli(["init", "--trust-domain", "example.org"], {"TRUSTFABRIC_HOME": str(home)}).returncode == 0
    servers = []
    for sig in SIGNALS:  # started together, stopped one signal each
        tmp = tmp_path / f"tmp-{sig.name}"
        tmp.mkdir()
        port = free_port()
        proc = subprocess.Popen([BIN, "serve", "--tls", "--port", str(port), "--log-level", "warning"],
                                env={**env, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        servers.append((sig, tmp, port, proc))
    try:
        for sig, tmp, port, proc in servers:
            deadline = time.monotonic() + 60
            while not _listening(port):
                assert proc.poll() is None, proc.communicate()[0].decode()
                assert time.monotonic() < deadline, f"serve --tls did not start ({sig.name})"
                time.sleep(0.1)
            made = list(tmp.glob("tf-tls-*"))
            assert len(made) == 1 and (made[0] / "server.key").exists()  # the directory the test is about
            proc.send_signal(sig)
        for sig, tmp, _port, proc in servers:
            out = proc.communicate(timeout=30)[0].decode()
            assert proc.returncode in (0, -sig), (sig.name, proc.returncode, out)
            assert list(tmp.iterdir()) == [], f"{sig.name} left {list(tmp.iterdir())} behind"
    finally:
        for _sig, _tmp, _port, proc in servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_first_start_says_how_to_sign_in_with_its_token(tmp_path: Path) -> None:
    """A first `serve` showed (or filed) the bootstrap token and then only log lines: it now names the line that
    signs in with it, at this server's own address, and the console's; a later start makes no token, says nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")}
    env.update(TRUSTFABRIC_HOME=str(tmp_path / "home"), TRUSTFABRIC_MODE="development")
    outputs = []
    for _start in range(2):
        port = free_port()
        proc = subprocess.Popen([BIN, "serve", "--port", str(port), "--log-level", "warning"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not _listening(port):
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            outputs.append((port, proc.communicate(timeout=30)[0].decode()))
    (port, first), (_, second) = outputs
    token_file = tmp_path / "home" / "bootstrap-admin-token"
    assert (f"`trustfabric login --server http://127.0.0.1:{port} --token-stdin < {token_file}`" in first
            and f"http://127.0.0.1:{port}/console/" in first), first
    assert "next:" not in second and "admin API token" not in second, second
