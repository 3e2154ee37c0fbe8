"""Commands that run on the server host, against the data directory (see cli/__init__.py for the rule)."""
