"""The whole schema: every domain's frozen steps in version order, run by store.migrations.migrate.

The numbering is global and historical (1 audit, 2 inventory, 3 pki, 4 policy, 5 API tokens, 6 audit,
9 policy data counters, 10 inventory fabric, 11 enforcer, 12 audit, 13 keys shared by replicas, 14 policy: grants'
Idempotency-Keys scoped by the requester's tenant, 15 audit: an event's actor names its tenant, 16 keys: the
deployment id marking a PKCS#11 token's keys, 17 keys: the intents committed before a token's keys are made, 18 keys:
whether a deployment's keys predate markers, 19 keys: the unmarked keys an upgraded deployment adopts, 20 enforcer:
a status report's sequence number). 7 and 8 are unused: the fabric and enforcer steps held them on their branch and
moved to 10 and 11 when the hardening's step 9 landed first, since a database already at version 9 never runs a step
numbered below it. A new step of any domain takes the next free number in its own `<domain>/migrations.py` and is
listed here.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Engine

from audit import migrations as audit
from enforcer import migrations as enforcer
from inventory import migrations as inventory
from keys import migrations as keys
from pki import migrations as pki
from pki.tokens import migrations as tokens
from policy import migrations as policy
from store.migrations import Migration
from store.migrations import migrate as run

STEPS: Sequence[Migration] = tuple(
    sorted((*audit.STEPS, *inventory.STEPS, *pki.STEPS, *policy.STEPS, *tokens.STEPS, *enforcer.STEPS, *keys.STEPS),
           key=lambda m: m.version)
)


def migrate(engine: Engine) -> list[int]:
    """Bring the database to the current schema; returns the versions applied (none on a second run)."""
    return run(engine, STEPS)
