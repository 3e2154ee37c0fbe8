"""Keys: the `KeyStore` protocol (store.py) and its implementations, encrypted files (file.py, the
default), the same files shared through the database by replicas (shared.py, what a server opens) and PKCS#11
tokens (pkcs11.py). It sits below pki (CA keys), audit (the checkpoint key) and the API's token issuer, which all
take a KeyStore and never know which one."""

from keys.errors import KeyExists, KeyNotFound, KeyStoreError, WrongMasterKey
from keys.store import KeyKind, KeyStore, PrivateKey, PublicKey, Signer, hash_for, jwt_alg, kind_of_public_key

__all__ = [
    "KeyExists",
    "KeyKind",
    "KeyNotFound",
    "KeyStore",
    "KeyStoreError",
    "PrivateKey",
    "PublicKey",
    "Signer",
    "WrongMasterKey",
    "hash_for",
    "jwt_alg",
    "kind_of_public_key",
]
