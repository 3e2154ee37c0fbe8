"""FastAPI app and CLI: composes the domain packages; the only place HTTP, env and config live."""
