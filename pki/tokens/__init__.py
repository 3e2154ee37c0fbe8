"""API tokens as their own small domain: models.py (the `api_tokens` table), service.py (mint, revoke,
list, the opaque bootstrap token), migrations.py (their frozen schema step). They live under pki because
they are credentials signed by a key in the same KeyStore, below workflows (init makes the first one)
and below api (which only checks them)."""
