"""Commands that go through the HTTP API with the caller's token (see cli/__init__.py for the rule)."""
