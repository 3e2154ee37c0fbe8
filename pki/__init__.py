"""Workload identity: trust domain CAs, X.509- and JWT-SVIDs, rotation, revocation, node attestation."""
