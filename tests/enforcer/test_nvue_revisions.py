"""The NVUE backend against revision ids as Cumulus Linux 5.0-5.3 issue them (`changeset/<user>/<time>`).

NVIDIA's NVUE API guide (docs.nvidia.com/networking-ethernet-software/cumulus-linux-512/System-Configuration/
NVIDIA-User-Experience-NVUE/NVUE-API/) has its client percent-encode the id (`quote(changeset, safe="")`) in
`/nvue_v1/revision/<id>`; sent raw, the slashes make a different path and the apply is never requested.
"""

from __future__ import annotations

from enforcer.backends.nvue import NvueBackend
from tests.enforcer.helpers import compile_small
from tests.enforcer.nvue_standin import NvueStandIn


def test_apply_works_with_changeset_style_revision_ids() -> None:
    compiled, _ = compile_small()
    rs = compiled.devices["leaf:leaf1"]
    with NvueStandIn(ports=("swp1", "swp2", "swp31"), changeset_ids=True) as standin:
        backend = NvueBackend(standin.url, timeout=5.0)
        assert backend.apply(rs) == rs.content_hash
        assert backend.drift(rs) == []
        (rev, body), = standin.revisions.items()
        assert rev.startswith("changeset/") and body["state"] == "applied"
