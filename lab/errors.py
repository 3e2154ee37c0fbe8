"""The lab's errors: each says what is wrong and what to do (the CLI prints it as one line, exit 1)."""

from __future__ import annotations

from core.errors import InvalidInput, TrustfabricError


class LabError(TrustfabricError):
    """The lab could not be built, changed or asked (a tool failed, it is not up, it needs root)."""


class LabInputError(InvalidInput):
    """The fabric file cannot be realised here, or a probe names a workload the lab does not have."""
