"""The offline verifier: `verify_export(file, public_key)` (steps.py), with a fast whole-file pass
for unfiltered JSONL exports (fast.py)."""

from audit.verify.report import VerifyReport
from audit.verify.steps import verify_export

__all__ = ["VerifyReport", "verify_export"]
