"""Key store errors; below pki, audit and token signing, so each of them can name these."""

from __future__ import annotations

from core.errors import Conflict, NotFound, Unavailable


class KeyNotFound(NotFound):
    """The key store holds no key with this id."""


class KeyExists(Conflict):
    """A key with this id exists already; keys are never overwritten."""


class KeyStoreError(Unavailable):
    """The key store cannot be opened or used (wrong passphrase, unsafe key file, token missing): the
    server cannot sign until an operator fixes it (HTTP 503)."""


class WrongMasterKey(KeyStoreError):
    """A key another replica published (keys/shared.py) does not decrypt under this key store's master key: this
    data directory was not given the trust domain's master key (or passphrase and master.salt)."""
