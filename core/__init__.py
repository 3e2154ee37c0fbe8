"""Small pieces every domain package shares: time, canonical JSON, slugs, the error base."""
