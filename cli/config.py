"""The CLI's config file: named profiles (server, CA, token, data directory), like `tsh` keeps them.

Where: `TRUSTFABRIC_CONFIG`, else `$XDG_CONFIG_HOME/trustfabric/config.yaml`, else
`~/.config/trustfabric/config.yaml` (an older `config.json` beside it is still read). The directory is
made mode 0700 and the file written 0600 (atomically: a temporary file renamed over it). A file that
holds a token and that group or others can read or write is refused, never used.

    current: acme
    profiles:
      acme:
        server: https://tf.example.org:8443
        ca_file: /etc/trustfabric/ca.pem
        token: eyJ...
      ops:
        server: http://127.0.0.1:8443
        token: tfo_...
        home: /var/lib/trustfabric     # the data directory for local commands

Which profile: `--profile NAME` (before the command), else `TRUSTFABRIC_PROFILE`, else `current`.
TRUSTFABRIC_SERVER, TRUSTFABRIC_TOKEN and TRUSTFABRIC_CA_FILE override the profile's values; command-line
flags override both. A flat file (`{"server": ..., "token": ...}`, the older format) is one profile,
`default`.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InvalidInput

FIELDS = ("server", "ca_file", "token", "cert", "key", "home")
DEFAULT_PROFILE = "default"

# set by the root command's --profile (cli/main.py); reset for every invocation
_selected: dict[str, str | None] = {"profile": None}


def select(name: str | None) -> None:
    _selected["profile"] = name


@dataclass
class Profile:
    name: str
    server: str | None = None
    ca_file: str | None = None
    token: str | None = None
    cert: str | None = None
    key: str | None = None
    home: str | None = None

    def fields(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if k != "name" and v}


@dataclass
class Config:
    path: Path
    current: str | None = None
    profiles: dict[str, Profile] = field(default_factory=dict)

    def profile(self, name: str | None = None) -> Profile:
        """The named profile (or the selected one); an empty one when it does not exist."""
        chosen = name or chosen_name(self)
        return self.profiles.get(chosen) or Profile(chosen)

    def to_doc(self) -> dict[str, Any]:
        return {"current": self.current,
                "profiles": {n: p.fields() for n, p in sorted(self.profiles.items())}}


def config_path() -> Path:
    from workflows.settings import ClientSettings

    s = ClientSettings.from_env()
    if s.config:
        return Path(s.config).expanduser()
    base = Path(s.xdg_config_home).expanduser() if s.xdg_config_home else Path("~/.config").expanduser()
    path = base / "trustfabric" / "config.yaml"
    legacy = path.with_name("config.json")
    return legacy if not path.exists() and legacy.exists() else path


def named_explicitly() -> str | None:
    """The profile --profile or TRUSTFABRIC_PROFILE names, if either does."""
    from workflows.settings import ClientSettings

    return _selected["profile"] or ClientSettings.from_env().profile


def chosen_name(config: Config | None = None) -> str:
    from workflows.settings import ClientSettings

    return (_selected["profile"] or ClientSettings.from_env().profile
            or (config.current if config else None) or DEFAULT_PROFILE)


def _parse(path: Path, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)  # the older format, and fast
    except ValueError:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidInput(f"config file {path} is neither YAML nor JSON: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidInput(f"config file {path} must hold a mapping")
    return data


def _holds_token(doc: dict[str, Any]) -> bool:
    if doc.get("token"):
        return True
    profiles = doc.get("profiles")
    return isinstance(profiles, dict) and any(isinstance(p, dict) and p.get("token") for p in profiles.values())


def load(path: Path | None = None) -> Config:
    """The config file (an empty Config when there is none); InvalidInput for an unsafe or broken one."""
    path = path or config_path()
    try:
        st = path.stat()
    except FileNotFoundError:
        return Config(path)
    except OSError as exc:
        raise InvalidInput(f"cannot read config file {path}: {exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"config file {path} is not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read config file {path}: {exc}") from None
    doc = _parse(path, text)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) and _holds_token(doc):
        raise InvalidInput(
            f"config file {path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}) and "
            f"holds a bearer token: run `chmod 600 {path}`"
        )
    return _from_doc(path, doc)


def _from_doc(path: Path, doc: dict[str, Any]) -> Config:
    if "profiles" not in doc:  # the flat, older format: one profile
        flat = {k: str(v) for k, v in doc.items() if k in FIELDS and v}
        return Config(path, DEFAULT_PROFILE, {DEFAULT_PROFILE: Profile(DEFAULT_PROFILE, **flat)} if flat else {})
    profiles: dict[str, Profile] = {}
    raw = doc.get("profiles") or {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"config file {path}: profiles must be a mapping of name -> settings")
    for name, values in raw.items():
        if not isinstance(values, dict):
            raise InvalidInput(f"config file {path}: profile {name!r} must be a mapping")
        unknown = sorted(set(values) - set(FIELDS))
        if unknown:
            raise InvalidInput(f"config file {path}: profile {name!r} has unknown keys {', '.join(unknown)} "
                               f"(known: {', '.join(FIELDS)})")
        profiles[str(name)] = Profile(str(name), **{k: str(v) for k, v in values.items() if v})
    current = doc.get("current")
    return Config(path, str(current) if current else None, profiles)


def save(config: Config) -> None:
    """Write the file 0600 in a 0700 directory, atomically (never a moment with the token readable)."""
    import yaml

    directory = config.path.parent
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = "# trustfabric CLI profiles (written by `trustfabric login`; mode 0600)\n" + yaml.safe_dump(
        config.to_doc(), sort_keys=False, default_flow_style=False)
    fd, tmp = tempfile.mkstemp(prefix=".config-", dir=directory)  # created 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, config.path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def selected_profile() -> Profile:
    """The profile in force for this command (an empty one when there is no config file)."""
    config = load()
    name = chosen_name(config)
    if named_explicitly() and name not in config.profiles:
        login = f"(sign in with `trustfabric --profile {name} login`)"
        if _selected["profile"]:  # --profile NAME: the command line is wrong (exit 2), before any work
            from typer._click.exceptions import UsageError
            from typer._click.globals import get_current_context

            current = get_current_context(silent=True)
            raise UsageError(f"--profile {name}: no such profile in {config.path} {login}",
                             ctx=current.find_root() if current is not None else None)
        raise InvalidInput(f"no profile {name!r} in {config.path} {login}")  # TRUSTFABRIC_PROFILE's: a failure
    return config.profile(name)
