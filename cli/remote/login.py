"""`trustfabric login | logout | status`: sign in like `tsh login`. The token (an API token, or an ID token
from the OIDC issuer the server trusts) is checked against the server, then kept in a named profile of
the config file (cli/config.py: mode 0600), so nobody pastes a raw JWT into an environment variable."""

from __future__ import annotations

import base64
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

from cli.output import API, EXIT_FAILURE, EXIT_USAGE, Col, View, command, emit, fail, machine_output
from cli.params import URL, existing_dir, existing_file, redacted

PROFILES = View("profiles", (
    Col("", lambda p: "*" if p["current"] else ""), Col("profile", "name", kind="id"), Col("server", "server"),
    Col("signed in", lambda p: "yes" if p["token"] else "no"), Col("token expires", "token_expires_at", kind="when"),
    Col("data directory", "home"),
))


def token_expiry(token: str) -> datetime | None:
    """A JWT's `exp` (read, not verified: the server verifies); None for opaque tokens."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        return datetime.fromtimestamp(int(claims["exp"]), UTC)
    except (ValueError, KeyError, TypeError):
        return None


def _read_token(token: str | None, from_stdin: bool) -> str:
    if token and from_stdin:
        fail("give --token or --token-stdin, not both", EXIT_USAGE)
    if from_stdin:
        token = sys.stdin.readline().strip()
    elif not token:
        if not sys.stdin.isatty():
            fail("no token: give --token-stdin (and pipe it in) or --token", EXIT_USAGE)
        import getpass

        token = getpass.getpass("API token (input hidden): ").strip()
    if not token:
        fail("the token is empty", EXIT_USAGE)
    return token


def register(app: typer.Typer) -> None:
    @command(app, "login", API)
    def login(
        server: str = typer.Option(None, "--server", parser=URL, metavar=URL.metavar,
                                   help="API URL, e.g. https://tf.example.org:8443 (kept in the profile)"),
        ca: Path = typer.Option(None, "--ca", "--cacert", help="CA bundle (PEM) to verify an HTTPS server",
                                **existing_file()),
        token: str = typer.Option(None, "--token", help="the token (visible in your shell history: prefer "
                                                        "--token-stdin or the prompt)"),
        token_stdin: bool = typer.Option(False, "--token-stdin", help="read the token from standard input"),
        home: Path = typer.Option(None, "--home", help="the data directory local commands use with this profile",
                                  **existing_dir()),
    ) -> None:
        """Sign in: check the token with the server, then keep server, CA and token in a profile (0600).

        The profile is --profile (before the command), TRUSTFABRIC_PROFILE, or the current one (`default` at
        first). Signing in to a named profile leaves the current profile as it is (the first one becomes
        current): `trustfabric --profile acme ...` then acts as acme."""
        from cli import config
        from cli.remote.client import Client

        conf = config.load()
        name = config.chosen_name(conf)
        known = conf.profiles.get(name) or config.Profile(name)
        url = server or known.server
        if not url:
            fail(f"profile {name!r} has no server yet: give --server URL", EXIT_USAGE)
        secret = _read_token(token, token_stdin)
        ca_file = str(ca.resolve()) if ca else known.ca_file
        who = Client(url, secret, ca_file=ca_file, cert=known.cert, key=known.key).get("/v1/whoami")
        known.server, known.token, known.ca_file = url, secret, ca_file
        if home is not None:
            known.home = str(home.resolve())
        conf.profiles[name] = known
        if conf.current is None or conf.current not in conf.profiles or not config.named_explicitly():
            conf.current = name
        config.save(conf)
        out = {"profile": name, "current": conf.current, "server": redacted(url), "config": str(conf.path),
               "whoami": who, "token_expires_at": _iso(token_expiry(secret))}
        if machine_output():
            emit(out)
            return
        role = who["role"] + (f"@{who['tenant']}" if who.get("tenant") else "")
        print(f"signed in to {redacted(url)} as {who['id']} ({role}); profile {name!r} saved in {conf.path}")
        if conf.current != name:
            print(f"the current profile stays {conf.current!r}: use `trustfabric --profile {name} ...` "
                  f"or TRUSTFABRIC_PROFILE={name}")

    @command(app, "logout", API)
    def logout(all_profiles: bool = typer.Option(False, "--all", help="every profile")) -> None:
        """Forget the token of the profile in use (or of every profile); server, CA and data directory stay."""
        from cli import config

        conf = config.load()
        names = sorted(conf.profiles) if all_profiles else [config.chosen_name(conf)]
        dropped = [n for n in names if n in conf.profiles and conf.profiles[n].token]
        for n in dropped:
            conf.profiles[n].token = None
        if dropped:
            config.save(conf)
        if machine_output():
            emit({"logged_out": dropped, "config": str(conf.path)})
        elif dropped:
            print(f"signed out of {', '.join(repr(n) for n in dropped)} (tokens removed from {conf.path})")
        else:
            print("no token was stored; nothing changed")

    @command(app, "status", API)
    def status(offline: bool = typer.Option(False, "--offline", help="do not ask the server who you are")) -> None:
        """The profiles, the one in use, and who the server says you are with it.

        Exit 1 when the server refuses the token (not signed in) or cannot be reached: the last line says which."""
        from cli import config
        from cli.remote.client import ApiError, Client

        conf = config.load()
        current = config.chosen_name(conf)
        rows: list[dict[str, Any]] = [
            {"name": n, "current": n == current, "server": redacted(p.server) if p.server else None,
             "token": bool(p.token), "home": p.home,
             "ca_file": p.ca_file, "token_expires_at": _iso(token_expiry(p.token)) if p.token else None}
            for n, p in sorted(conf.profiles.items())]
        who: dict[str, Any] | None = None
        problem: str | None = None
        if not offline:
            try:
                who = Client.from_env().get("/v1/whoami")
            except ApiError as exc:
                problem = str(exc)
        out = {"config": str(conf.path), "profile": current, "profiles": rows, "whoami": who, "problem": problem}
        if machine_output():
            emit(out)
        else:
            print(f"config file: {conf.path}")
            if rows:
                PROFILES.table(rows)
            else:
                print("no profiles yet: run `trustfabric login --server URL`")
            if who is not None:
                role = who["role"] + (f"@{who['tenant']}" if who.get("tenant") else "")
                print(f"profile {current!r}: signed in as {who['id']} ({role}, {who['auth']})")
            elif problem is not None:
                print(f"profile {current!r}: {problem}")
        if problem is not None:
            raise typer.Exit(EXIT_FAILURE)


def _iso(value: datetime | None) -> str | None:
    """The API's form of a time (`Z`), as every --json writes one."""
    from cli.output import json_value

    return json_value(value) if value else None
