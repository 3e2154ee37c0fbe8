"""Cross-domain operations a route and a CLI command both run, and the composition root they share.

`settings` (the one module that reads the environment) and `context` (database, key store, clock,
policy engine factory) live here, below `api`, `pdp` and `cli`, so none of those imports another to
get them. Each workflow takes an AppContext (or a session), an actor and the time; none speaks HTTP.
"""
