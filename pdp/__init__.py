"""The OPA-compatible policy decision point (`trustfabric pdp`): server.py serves the OPA REST API subset
over any PolicyEngine; sync.py keeps that engine on the database's active version and data."""
